"""Tiny Llama-architecture policies built from a preset (no download), for CPU runs and tests.

The presets live in ``registry/models/*.yaml`` with ``kind: tiny`` (the single source of the
numbers): ``tiny-0.5m``, ``tiny-2m``, ``tiny-8m``, ``tiny-20m``, and ``llama-308m`` (issue 14's
GPU benchmark model). Files with ``kind: hf`` there hold hub models' architecture numbers for
``mlmt-bench plan`` (:mod:`mlmt_bench.models.configs`). The vocabulary, pad and EOS ids come
from the tokenizer; there is no BOS; input and output embeddings are tied.

A preset is found, in order, in ``$MLMT_BENCH_REGISTRY/models/``, ``./registry/models/``, the
``registry/models/`` folder of the source checkout this module was imported from, and
``<sys.prefix>/share/mlmt-bench/registry/models/``, where a wheel or ``pip install .`` puts
the presets. A path to a ``.yaml`` file is accepted as the preset too.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from mlmt_bench.errors import UserError

#: Keys of a preset's ``config:`` mapping, passed to ``LlamaConfig`` (``rope_theta`` is
#: translated to ``rope_parameters``).
#: The ``kind:`` of a file in registry/models/: a preset built here (the default), or a published
#: hub model's architecture (``mlmt-bench plan`` reads it; ``model: hf`` loads the model).
PRESET_KIND, HUB_KIND = "tiny", "hf"

CONFIG_KEYS = (
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "max_position_embeddings", "rope_theta", "rms_norm_eps", "initializer_range", "tie_word_embeddings",
    "head_dim", "hidden_act",
)


def registry_dirs() -> list[Path]:
    """Folders searched for ``<preset>.yaml``, first match wins."""
    dirs: list[Path] = []
    env = os.environ.get("MLMT_BENCH_REGISTRY")
    if env:
        dirs.append(Path(env) / "models")
    dirs.append(Path.cwd() / "registry" / "models")
    dirs.append(Path(__file__).resolve().parents[2] / "registry" / "models")
    dirs.append(Path(sys.prefix) / "share" / "mlmt-bench" / "registry" / "models")
    out: list[Path] = []
    for d in dirs:
        if d not in out:
            out.append(d)
    return out


def preset_names() -> list[str]:
    """Presets built from config (``kind: tiny``, the default); ``kind: hf`` files describe hub models."""
    from mlmt_bench.io.bounded_input import load_yaml, read_text

    names: set[str] = set()
    for d in registry_dirs():
        if d.is_dir():
            for p in d.glob("*.yaml"):
                try:
                    data = load_yaml(read_text(p), str(p))
                except UserError:  # unreadable or invalid: not listed (load_preset names the problem)
                    continue
                if isinstance(data, dict) and data.get("kind", PRESET_KIND) == PRESET_KIND:
                    names.add(p.stem)
    return sorted(names)


def load_preset(preset: str | os.PathLike[str]) -> dict[str, Any]:
    """The preset's YAML as a dict (``name``, ``kind``, ``description``, ``config``)."""
    path: Path | None = None
    p = Path(preset)
    if p.suffix in (".yaml", ".yml") and p.is_file():
        path = p
    else:
        for d in registry_dirs():
            cand = d / f"{preset}.yaml"
            if cand.is_file():
                path = cand
                break
    from mlmt_bench.io.bounded_input import did_you_mean, load_yaml, read_text, short_repr, shorten

    if path is None:
        known = preset_names()
        name = str(preset)  # the spec's: shown shortened, and only a plain one is worth a hint
        raise UserError(f"unknown tiny model preset {short_repr(name)}{did_you_mean(name, known)} "
                        f"(known: {', '.join(known) or 'none'}; "
                        f"searched {', '.join(str(d) for d in registry_dirs())})")
    data = load_yaml(read_text(path), str(path))
    if not isinstance(data, dict) or not isinstance(data.get("config"), dict):
        raise UserError(f"{path}: expected a mapping with a 'config:' mapping of LlamaConfig numbers")
    if data.get("kind", PRESET_KIND) != PRESET_KIND:
        raise UserError(f"{path}: kind {data.get('kind')!r} describes a hub model's architecture, not a preset "
                        f"to build (use model: hf with path {data.get('hub', '?')!r})")
    unknown = sorted(str(k) for k in set(data["config"]) - set(CONFIG_KEYS))
    if unknown:
        raise UserError(f"{path}: config: unknown key(s) {shorten(', '.join(unknown), 200)} "
                        f"(known: {', '.join(CONFIG_KEYS)})")
    data.setdefault("name", path.stem)
    return data


def tiny_config(preset: str | os.PathLike[str], tokenizer: Any) -> Any:
    """The ``LlamaConfig`` of a preset, with vocabulary and special ids from ``tokenizer``."""
    from transformers import LlamaConfig

    cfg = dict(load_preset(preset)["config"])
    rope_theta = float(cfg.pop("rope_theta", 10000.0))
    return LlamaConfig(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
        use_cache=True,
        **cfg,
    )


def build_tiny_model(preset: str | os.PathLike[str], tokenizer: Any, seed: int = 0) -> Any:
    """A freshly initialised ``LlamaForCausalLM`` (float32, train mode) for ``preset``.

    Initialisation is deterministic for ``seed`` and does not touch the global RNG.
    """
    import torch
    from transformers import LlamaForCausalLM

    from mlmt_bench.models import cpu_attention

    cpu_attention.install()

    config = tiny_config(preset, tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = None
    model.train()
    return model


def num_parameters(model: Any) -> int:
    """Distinct parameters (tied embeddings counted once)."""
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def save_checkpoint(model: Any, tokenizer: Any, directory: str | os.PathLike[str]) -> Path:
    """Write model and tokenizer as an ordinary HF checkpoint directory."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    return directory


def load_checkpoint(directory: str | os.PathLike[str]) -> tuple[Any, Any]:
    """``(model, tokenizer)`` from a checkpoint directory (float32, eval mode)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mlmt_bench.models import cpu_attention

    cpu_attention.install()
    model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    return model, tokenizer

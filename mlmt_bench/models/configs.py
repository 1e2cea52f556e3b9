"""A policy's architecture without its weights: parameter counts and shapes, offline.

``mlmt-bench plan`` sizes a run before anything is loaded; a policy's model factory says where its
architecture comes from (``ModelFactory.shape``, models/factory.py). For the built-in ones:

- ``model: tiny``: the ``config.json`` of the checkpoint at ``path``, or (``path`` unset) the
  preset of the shared base (``base.preset``);
- ``model: hf`` with a local directory: its ``config.json``;
- ``model: hf`` with a hub name: the file in ``registry/models/`` whose ``hub:`` is that name
  (``kind: hf``: the published config numbers, each file citing its source). Nothing is downloaded;
  an unknown hub name is an error that says which file to add.

Llama-family models (llama, qwen2, qwen3, mistral) are counted from the config numbers; any other
type is built on the meta device (no memory, no weights) and its parameters counted, so every
architecture transformers knows is counted exactly, tied embeddings once. LoRA adapters are counted
from the linear layers peft would wrap.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlmt_bench.errors import UserError
from mlmt_bench.models.tiny import HUB_KIND


@dataclass(frozen=True)
class ModelShape:
    """What sizing needs of one model. Dimensions are counts; ``params`` counts tied weights once.

    linears: (module name, in_features, out_features) of every linear layer but the output head,
    for LoRA counts.
    """

    name: str
    source: str
    params: int
    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    linears: tuple[tuple[str, int, int], ...]

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def lora_params(self, lora: Any) -> int:
        """Parameters of a LoRA adapter (``LoraSpec``): r·(in + out) per wrapped linear layer.
        ``all-linear`` wraps every linear layer but the output head (peft's rule)."""
        return sum(lora.r * (fan_in + fan_out) for fan_in, fan_out in self._wrapped(lora))

    def adapted_params(self, lora: Any) -> int:
        """Parameters of the base weights a LoRA adapter (``LoraSpec``) wraps: in·out per wrapped
        linear layer (what a merged copy of them holds, ``backend.options.merge_lora``)."""
        return sum(fan_in * fan_out for fan_in, fan_out in self._wrapped(lora))

    def _wrapped(self, lora: Any) -> list[tuple[int, int]]:
        """(in, out) of each linear layer ``lora`` wraps; none without an adapter."""
        if lora is None:
            return []
        targets = lora.target_modules
        return [(fan_in, fan_out) for name, fan_in, fan_out in self.linears
                if targets == "all-linear" or name.rsplit(".", 1)[-1] in targets
                or any(name.endswith("." + t) for t in targets)]


def hf_registry() -> dict[str, Path]:
    """Lower-cased hub name -> the ``registry/models`` file describing it (``kind: hf``)."""
    from mlmt_bench.io.bounded_input import load_yaml, read_text
    from mlmt_bench.models.tiny import registry_dirs

    out: dict[str, Path] = {}
    for d in reversed(registry_dirs()):  # earlier folders win
        if not d.is_dir():
            continue
        for p in sorted(d.glob("*.yaml")):
            try:
                data = load_yaml(read_text(p), str(p))
            except UserError:  # unreadable or invalid: not a hub model's config
                continue
            if isinstance(data, dict) and data.get("kind") == HUB_KIND and data.get("hub"):
                out[str(data["hub"]).lower()] = p
    return out


#: model types whose parameters :func:`_llama_family_counts` computes from the config alone (the
#: modelling code of other types is imported to build the model on the meta device)
LLAMA_FAMILY = ("llama", "qwen2", "qwen3", "mistral")


def _llama_family_counts(cfg: Any) -> tuple[int, tuple[tuple[str, int, int], ...]]:
    """Parameters and linear layers of a Llama-family decoder from its config: embeddings (the
    output head once more unless tied), per layer q/k/v/o (biases: qwen2's q/k/v, or
    ``attention_bias``), Qwen3's per-head q/k norms, the SwiGLU MLP and two RMSNorms, and the final
    norm. Equal to counting a model built from the config (tests/test_plan.py)."""
    h, inter, heads = cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    d = getattr(cfg, "head_dim", None) or h // heads
    qkv_bias = cfg.model_type == "qwen2" or bool(getattr(cfg, "attention_bias", False))
    o_bias = bool(getattr(cfg, "attention_bias", False))
    mlp_bias = bool(getattr(cfg, "mlp_bias", False))
    per_layer = (h * heads * d + 2 * h * kv * d + heads * d * h + 3 * h * inter + 2 * h
                 + (heads * d + 2 * kv * d if qkv_bias else 0) + (h if o_bias else 0)
                 + (2 * inter + h if mlp_bias else 0) + (2 * d if cfg.model_type == "qwen3" else 0))
    embed = cfg.vocab_size * h
    params = embed * (1 if cfg.tie_word_embeddings else 2) + cfg.num_hidden_layers * per_layer + h
    linears = []
    for i in range(cfg.num_hidden_layers):
        a, m = f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp"
        linears += [(f"{a}.q_proj", h, heads * d), (f"{a}.k_proj", h, kv * d), (f"{a}.v_proj", h, kv * d),
                    (f"{a}.o_proj", heads * d, h), (f"{m}.gate_proj", h, inter), (f"{m}.up_proj", h, inter),
                    (f"{m}.down_proj", inter, h)]
    return params, tuple(linears)


def _meta_counts(config: Any) -> tuple[int, tuple[tuple[str, int, int], ...]]:
    """Parameters and linear layers of a model built from ``config`` on the meta device."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    head = model.get_output_embeddings()
    return params, tuple((n, m.in_features, m.out_features) for n, m in model.named_modules()
                         if isinstance(m, torch.nn.Linear) and m is not head)


def _shape_of_config(config: Any, name: str, source: str) -> ModelShape:
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    params, linears = (_llama_family_counts(cfg) if cfg.model_type in LLAMA_FAMILY else _meta_counts(config))
    heads = cfg.num_attention_heads
    return ModelShape(
        name=name, source=source, params=params, vocab=cfg.vocab_size, hidden=cfg.hidden_size,
        intermediate=getattr(cfg, "intermediate_size", 4 * cfg.hidden_size), layers=cfg.num_hidden_layers,
        heads=heads, kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
        head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads, linears=linears)


@functools.lru_cache(maxsize=32)
def shape_from_registry_file(path: Path) -> ModelShape:
    """The shape of a ``kind: hf`` registry file's ``config:`` (``model_type`` + config.json fields)."""
    from transformers import AutoConfig

    from mlmt_bench.io.bounded_input import load_yaml, read_text

    data = load_yaml(read_text(path), str(path))
    if not isinstance(data, dict) or not isinstance(data.get("config"), dict):
        raise UserError(f"{path}: expected a mapping with a 'config:' mapping (a model's config.json numbers)")
    cfg = dict(data["config"])
    model_type = cfg.pop("model_type", None)
    if model_type is None:
        raise UserError(f"{path}: config: needs model_type")
    cfg.pop("torch_dtype", None)
    return _shape_of_config(AutoConfig.for_model(model_type, **cfg), str(data.get("hub") or path.stem), str(path))


def shape_from_directory(directory: Path) -> ModelShape:
    """The shape of a local checkpoint (reads only its config.json; an adapter directory's base
    model is resolved from adapter_config.json)."""
    from transformers import AutoConfig

    adapter = directory / "adapter_config.json"
    if adapter.is_file() and not (directory / "config.json").is_file():
        base = json.loads(adapter.read_text()).get("base_model_name_or_path")
        if not base:
            raise UserError(f"{adapter}: no base_model_name_or_path")
        return shape_of_path(base)
    if not (directory / "config.json").is_file():
        raise UserError(f"{directory}: no config.json")
    return _shape_of_config(AutoConfig.from_pretrained(str(directory)), directory.name, str(directory / "config.json"))


def shape_of_path(path: str) -> ModelShape:
    """A local directory's shape, or a hub name's from the registry (never downloads)."""
    from mlmt_bench.models.hub import missing_local

    local = Path(path).expanduser()
    if local.exists():
        return shape_from_directory(local)
    if missing_local(path):  # a local path is never looked up as a hub name
        raise UserError(f"model {path!r}: {missing_local(path)}")
    reg = hf_registry()
    hit = reg.get(path.lower())
    if hit is None:
        known = ", ".join(sorted(reg)) or "none"
        raise UserError(f"model {path!r}: not a local directory and no registry/models/*.yaml with hub: {path} "
                        f"(known hub models: {known}); add one with the model's config.json numbers (kind: hf)")
    return shape_from_registry_file(hit)


@functools.lru_cache(maxsize=32)
def shape_of_preset(preset: str) -> ModelShape:
    """A tiny preset's shape (vocabulary from the character tokenizer)."""
    from mlmt_bench.models.tiny import tiny_config
    from mlmt_bench.models.tokenizer import build_char_tokenizer

    return _shape_of_config(tiny_config(preset, build_char_tokenizer()), preset, f"preset {preset}")

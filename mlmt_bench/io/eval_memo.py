"""The starting point's evaluation, computed once for every run that starts from the same weights.

Every arm and every seed of an experiment on one warm start (METHOD v4) begins from the same
checkpoint: a fresh LoRA adapter adds exactly zero (its B matrices are zero), and evaluation is
greedy. So the step-0 evaluation of the same program on the same problems, with the same weights,
templates, token limits and code, gives the same result in every run; on the SmolLM2 testbed it
costs about 16 minutes a run. :func:`evaluate_once` keys an evaluation by all of that and keeps its
result in ``<cache>/eval-memo/<key>.json``; a run that finds its key reads the result instead of
generating it (the trainer then names the key in the run's manifest, ``eval_memo``).

What the key holds (:func:`memo_key`): each actor's weights as :func:`weights_identity` reads them
(the sha256 of every parameter outside LoRA adapters, and refused while any adapter's B is not
zero), its config, tokenizer and chat template; the program, the problems (id, prompt, answer),
the sampling, the evaluation options and the spec's benchmark, feedback and backend sections;
the CPU, the versions of torch, transformers, peft and the other packages that compute, and a
fingerprint of mlmt-bench's own source (:func:`mlmt_bench.tracking.code_fingerprint`). Only greedy
evaluations are kept (a sampled one draws on the run's random state). ``eval.memo: false`` or
``MLMT_BENCH_EVAL_MEMO=0`` turns it off; the memo is a cache, so a wiped machine only evaluates again.

A run's manifest names the keys it read (``eval_memo``) and stored (``eval_memo_stored``);
``report --raw`` publishes those entries with the runs (``eval-memo/<key>.json.gz``) and
``run --restore`` puts them back (:mod:`mlmt_bench.report.publish`), so an experiment continued
in another session, on a fresh machine with the same CPU, code and weights, reads its starting
evaluations instead of repeating them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

_FORMAT = 1
#: the most bytes a memo entry is read with (a 500-problem evaluation with every episode is a few MB)
MAX_ENTRY_BYTES = 64 << 20
#: a memo key: the hex sha256 :func:`memo_key` returns
KEY = re.compile(r"[0-9a-f]{64}")
#: an evaluation's result: a dataclass with ``samples`` (a list) and JSON fields (mlmt_bench.evaluate.EvalResult)
R = TypeVar("R")


#: ``MLMT_BENCH_EVAL_MEMO``: the memo's directory, or 0 / off / false / no for none
SWITCH = "MLMT_BENCH_EVAL_MEMO"


def default_dir() -> Path | None:
    """``$MLMT_BENCH_EVAL_MEMO`` (None when it says 0, off, false or no), else
    ``$MLMT_BENCH_CACHE/eval-memo``, else ``~/.cache/mlmt-bench/eval-memo``."""
    from mlmt_bench.tracking import cache_env_dir

    chosen = os.environ.get(SWITCH, "").strip()
    if chosen.lower() in ("0", "off", "false", "no"):
        return None
    if chosen:
        return Path(chosen).expanduser()
    env = cache_env_dir()
    return (env / "eval-memo") if env is not None else Path.home() / ".cache" / "mlmt-bench" / "eval-memo"


def entry_path(key: str, directory: Path | None = None) -> Path | None:
    """The file that holds (or would hold) ``key``'s result in ``directory`` (default
    :func:`default_dir`); None when the memo is off."""
    directory = Path(directory) if directory is not None else default_dir()
    return None if directory is None else directory / f"{key}.json"


def weights_identity(model: Any) -> str | None:
    """sha256 of ``model``'s parameters outside LoRA adapters (names as without peft's wrapping,
    dtypes, shapes and bytes, in order: a frozen copy and a fresh adapter on it agree), or None
    when a LoRA adapter is not a no-op (a ``lora_B`` that is not all zero): the weights then differ
    from the start's, and no memo applies."""
    import torch

    h = hashlib.sha256()
    for name, p in model.named_parameters():
        if "lora_" in name:
            if "lora_B" in name and bool(torch.any(p.detach() != 0)):
                return None
            continue
        t = p.detach().cpu().contiguous()
        plain = name.removeprefix("base_model.model.").replace(".base_layer.", ".")  # as outside peft
        h.update(f"{plain}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def actor_identity(actor: Any) -> dict[str, Any] | None:
    """What of an actor decides its greedy outputs: weights, config, tokenizer; None: no memo."""
    weights = weights_identity(actor.model)
    if weights is None:
        return None
    tok = actor.tokenizer
    config: Any = getattr(actor.model, "config", None)
    shown = config.to_json_string() if hasattr(config, "to_json_string") else repr(config)
    return {"weights": weights, "config": shown,
            "tokenizer": [type(tok).__name__, len(tok), getattr(tok, "chat_template", None),
                          getattr(tok, "pad_token_id", None), getattr(tok, "eos_token_id", None)]}


def memo_key(parts: dict[str, Any]) -> str:
    """sha256 of ``parts`` (JSON, keys sorted; anything not JSON by its repr) with the format, the
    code fingerprint, the CPU and the versions of the packages that compute (torch, transformers,
    peft, ...: :data:`mlmt_bench.tracking.COMPUTING_PACKAGES`). The CPU is its model name, the instruction set
    torch dispatches its kernels on and its bfloat16 instructions: one model name can cover several
    generations ("AMD EPYC" is a Zen 3 with AVX2 only and a Zen 4 with AVX-512 on this project's
    machines), whose kernels round differently."""
    import platform

    import torch

    from mlmt_bench.machine.cpus import bf16_instructions
    from mlmt_bench.machine.reproducible import cpu_model
    from mlmt_bench.tracking import code_fingerprint, computing_versions, package_versions

    payload = {"format": _FORMAT, "code": code_fingerprint(), "versions": computing_versions(package_versions()),
               "cpu": [cpu_model(), platform.machine(), torch.backends.cpu.get_cpu_capability(),
                       *bf16_instructions()], **parts}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=repr).encode()).hexdigest()


def _stored(result: Any) -> dict[str, Any]:
    """A result's fields as stored (JSON), less those marked ``metadata={"memo": False}`` (kept in
    memory only: a read result has their defaults)."""
    return {f.name: getattr(result, f.name) for f in dataclasses.fields(result) if f.metadata.get("memo", True)}


def evaluate_once(key: str | None, n_samples: int, n_problems: int, run: Callable[[int], R], result: type[R],
                  directory: Path | None = None) -> tuple[R, bool]:
    """``run(n)`` (an evaluation logging ``n`` episodes) unless ``<directory>/<key>.json`` holds its
    result; returns the result (a ``result`` dataclass) with ``n_samples`` episodes and whether it
    was read. A result is stored with every problem's episode, so runs that log fewer read the same
    entry. ``key`` None, or the memo switched off: no memo. An unreadable entry is evaluated again
    and replaced."""
    path = entry_path(key, directory) if key is not None else None
    if path is None:
        return run(n_samples), False
    from mlmt_bench.errors import UserError
    from mlmt_bench.io.bounded_input import read_json

    try:
        data = read_json(path, MAX_ENTRY_BYTES)  # a regular file, bounded: never a link or a device
        data["samples"] = data["samples"][:n_samples]
        return result(**data), True
    except (OSError, ValueError, KeyError, TypeError, UserError):
        pass
    res: Any = run(n_problems)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(_stored(res)))
    os.replace(tmp, path)
    return dataclasses.replace(res, samples=res.samples[:n_samples]), False

"""Warm starts shipped with mlmt-bench: a built warm start's record, critic gate and LoRA adapter
copied into the package, so that runs made in different sessions, on different machines, start
from one checkpoint (METHOD v4: one checkpoint for every seed).

Why ship it: an SFT warm start of SmolLM2 costs about 1.9 CPU hours here, and its weights depend on
the CPU that trained it (bfloat16 autocast on a CPU with bfloat16 instructions, float32 elsewhere;
other matrix kernels), so the same config built on an Intel and on an AMD machine gives two
checkpoints, and an experiment continued on another machine (``run --restore``) would mix them.
The adapter alone is shipped (float32, about 19 MB for SmolLM2-135M at r 16), not the merged model
(540 MB): :func:`install` merges it into the pretrained weights exactly
(:mod:`mlmt_bench.warmstart.lora_merge`), and :func:`mlmt_bench.warmstart.pretrained_base.load`
checks the result against the sha256 recorded when the warm start was built: one adapter, one
checkpoint, on any CPU.

Layout: ``mlmt_bench/data/warm-starts/<key>/`` with ``warm_start.json``, ``gate.json`` where the
gate was measured, ``adapter/`` and ``files.json`` (each file's sha256, as for shipped bases:
:mod:`mlmt_bench.warmstart.shipped_bases`, whose switch ``MLMT_BENCH_SHIPPED_BASES=0`` ignores
shipped warm starts too). :func:`ship` makes one from a cache entry:
``python -m mlmt_bench.warmstart.shipped_warm_starts ~/.cache/mlmt-bench/warm-start/<key>``.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from mlmt_bench.errors import UserError
from mlmt_bench.warmstart import shipped_bases
from mlmt_bench.warmstart.lora_merge import ADAPTER_SCALES, ADAPTER_TENSORS
from mlmt_bench.warmstart.shared_base import GATE_FILE

#: where shipped warm starts live (package data)
SHIPPED_DIR = Path(__file__).resolve().parents[1] / "data" / "warm-starts"
#: a warm start's record, and its adapter's folder, in a cache entry (mlmt_bench.warmstart.pretrained_base)
RECORD = "warm_start.json"
ADAPTER_DIR = "adapter"
_REQUIRED = (RECORD, f"{ADAPTER_DIR}/{ADAPTER_TENSORS}", f"{ADAPTER_DIR}/{ADAPTER_SCALES}")


def find(key: str, root: Path = SHIPPED_DIR) -> Path | None:
    """The shipped entry of warm start ``key``, or None (none shipped, or shipped entries switched off)."""
    entry = root / key
    return entry if shipped_bases.enabled() and (entry / shipped_bases.MANIFEST).is_file() else None


def install(key: str, tmp: Path, materialize: Callable[[Path], object], root: Path = SHIPPED_DIR) -> bool:
    """Fill the empty directory ``tmp`` with the shipped entry of ``key`` (files verified against
    their sha256), then ``materialize(tmp)``: write ``model/`` from the adapter and check it against
    the record's sha256 (:func:`mlmt_bench.warmstart.pretrained_base.rebuild_model`, then ``load``),
    raising UserError when it differs. False when none is shipped. A merge that does not give the
    recorded weights is one UserError."""
    entry = find(key, root)
    if entry is None:
        return False
    files = shipped_bases.verify(entry, _REQUIRED, "warm start")
    shipped_bases.copy_entry(entry, files, tmp)
    try:
        materialize(tmp)
    except UserError as exc:
        raise UserError(f"shipped warm start {key}: its adapter merged here does not give the weights it was "
                        f"built with ({exc}); set {shipped_bases.SWITCH}=0 to build it here") from None
    return True


def ship(cache_entry: Path, root: Path = SHIPPED_DIR) -> Path:
    """Copy a built warm start's record, gate (where measured) and adapter to ``root/<key>/`` with
    its manifest; returns that directory."""
    key = json.loads((cache_entry / RECORD).read_text())["key"]
    dest = root / key
    if dest.resolve() == cache_entry.resolve():
        raise UserError(f"{cache_entry} is already the shipped entry of warm start {key}; ship from a cache entry")
    if not (cache_entry / ADAPTER_DIR / ADAPTER_TENSORS).is_file():
        raise UserError(f"{cache_entry}: no {ADAPTER_DIR}/{ADAPTER_TENSORS} (built before warm starts kept their "
                        "adapter); build it again to ship it")
    if dest.exists():
        shutil.rmtree(dest)
    paths = [cache_entry / RECORD, *(cache_entry / ADAPTER_DIR).iterdir()]
    if (cache_entry / GATE_FILE).is_file():
        paths.append(cache_entry / GATE_FILE)
    shipped_bases.write_manifest(dest, paths, cache_entry)
    return dest


if __name__ == "__main__":
    print(ship(Path(sys.argv[1])))

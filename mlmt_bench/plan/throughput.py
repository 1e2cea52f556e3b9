"""Devices and the measured throughput table behind ``mlmt-bench plan``'s time estimates.

The table (``mlmt_bench/data/throughput.yaml``) has the devices (``--device`` keys, their memory)
and rows of measured generated / trained tokens per second for one model on one device; a model
of another size is estimated from the row of the nearest size on that device, scaled by
parameter count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from mlmt_bench.errors import UserError
from mlmt_bench.plan.work import Work

if TYPE_CHECKING:
    from mlmt_bench.spec import RunSpec


GB = 1e9
TABLE = Path(__file__).resolve().parents[1] / "data" / "throughput.yaml"


@dataclass
@dataclass
class Device:
    kind: str
    memory: float | None  # bytes
    description: str
    gpu: bool


def load_table(path: Path = TABLE) -> dict[str, Any]:
    from mlmt_bench.io.bounded_input import load_yaml, read_text

    data = load_yaml(read_text(path), str(path))
    if not isinstance(data, dict) or "devices" not in data or "rows" not in data:
        raise UserError(f"{path}: expected 'devices:' and 'rows:'")
    return data


def resolve_device(name: str, table: dict[str, Any]) -> Device:
    """``auto`` (this machine's first CUDA GPU, else its CPU), or a device key of the table."""
    devices = table["devices"]
    if name == "auto":
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            lowered = props.name.lower().replace(" ", "")
            kind = next((k for k, d in devices.items() if d.get("match") and d["match"] in lowered), "cuda")
            return Device(kind, float(props.total_memory), f"{props.name} (this machine)", True)
        name = "cpu"
    if name not in devices:
        raise UserError(f"--device {name!r}: unknown device (known: auto, {', '.join(devices)})")
    d = devices[name]
    memory = d.get("memory_gb")
    if name == "cpu":
        import psutil

        memory = psutil.virtual_memory().total / GB
    return Device(name, None if memory is None else float(memory) * GB, d.get("description", name), name != "cpu")


def backend_key(spec: RunSpec) -> str:
    """The ``gen`` key of the table that times the spec's backend: the backend class declares it."""
    from mlmt_bench.rollout.backend import backend_class

    return backend_class(spec.backend.name).throughput_key(spec.backend.options)


def throughput(table: dict[str, Any], device: str, params: int, backend: str, cpu_dtype: str = "float32",
               lora: bool = False) -> dict[str, Any] | None:
    """Generated and trained tokens/s for a model of ``params`` on ``device``: the row of the nearest
    model size (log scale), scaled by parameter count (both phases are bound by reading or
    multiplying every weight once per token). Rows measured as the run will run are preferred: the
    same CPU matmul dtype (a row's ``cpu_dtype``, default float32; bfloat16 autocast is ~1.5x) and,
    among those, the same kind of training (a row's ``lora``: a LoRA update skips the base weights'
    gradients). None if the table has no row for the device."""
    rows = [r for r in table["rows"] if r["device"] == device]
    if not rows:
        return None
    same_dtype = [r for r in rows if r.get("cpu_dtype", "float32") == cpu_dtype] or rows
    rows = [r for r in same_dtype if bool(r.get("lora", False)) == lora] or same_dtype
    row = min(rows, key=lambda r: abs(math.log(r["params"] / params)))
    scale = row["params"] / params
    gen_key = backend if backend in row["gen"] else next(k for k in ("vllm", "hf-static", "hf-generate")
                                                          if k in row["gen"])
    note = "" if gen_key == backend else f" (no {backend} figure: {gen_key}'s, so likely slower than {backend} will be)"
    return {"gen": row["gen"][gen_key] * scale, "train": row["train"] * scale,
            "row": row["model"] + (f" ({row['cpu_dtype']} matmuls)" if "cpu_dtype" in row else "")
            + (" (LoRA)" if row.get("lora") else ""),
            "row_params": row["params"], "scale": scale, "backend": gen_key + note, "source": row["source"]}


def time_estimate(table, device, policies, step: Work, one_eval: Work, steps: int, n_eval: int, backend: str,
                  cpu_dtype: str = "float32", final_extra: Work | None = None):
    """Seconds per step, per evaluation and in all, from the throughput table (:func:`throughput`);
    ``cpu_dtype`` is what the run's CPU matmuls run in (:func:`mlmt_bench.runner.cpu_dtype`);
    ``final_extra``: what the last evaluation adds to ``one_eval`` (``eval_s`` counts it)."""
    found = {r: throughput(table, device.kind, p.shape.params, backend,
                           cpu_dtype if device.kind == "cpu" else "float32", p.spec.lora is not None)
             for r, p in policies.items()}
    if any(v is None for v in found.values()):
        measured = sorted({r["device"] for r in table["rows"]})
        return {"available": False,
                "why": f"not estimated: no throughput has been measured on {device.kind} (measured on: "
                       f"{', '.join(measured) or 'none'}); perf/plan_throughput.py run on that device prints the row "
                       f"to add to mlmt_bench/data/{TABLE.name}"}
    rates = cast("dict[str, dict[str, Any]]", found)  # none is None (above)

    def seconds(w: Work) -> float:
        s = 0.0
        for r, v in w.generated.items():
            s += v / rates[r]["gen"]
        for r, v in w.read.items():  # what the update reads: a shared prompt once (train.share_prompts)
            s += v / rates[r]["train"]
        for r, v in w.forward.items():
            s += v / (3 * rates[r]["train"])  # a forward is about a third of forward + backward
        return s

    per_step = seconds(step)
    per_eval = seconds(one_eval)
    eval_s = per_eval * n_eval + (seconds(final_extra) if final_extra is not None else 0.0)
    return {"available": True, "per_step_s": per_step, "train_s": per_step * steps, "per_eval_s": per_eval,
            "eval_s": eval_s, "total_s": per_step * steps + eval_s,
            "basis": {r: {k: v[k] for k in ("row", "row_params", "scale", "backend", "gen", "train", "source")}
                      for r, v in rates.items()}}

"""What the CPU pin (``mlmt_bench.machine.reproducible.PIN``) costs: SFT step time under each candidate setting.

A benchmark, not a test. The workload is the shared base's: ``--steps`` optimiser steps of
:func:`mlmt_bench.warmstart.sft.sft` (batch ``--batch``, one torch thread) on a fresh
``build_tiny_model(--preset)`` with the ``synthetic-arith`` curriculum of the default
:class:`~mlmt_bench.warmstart.shared_base.BaseConfig` (seed 0), after ``--warmup`` untimed steps.
``ATEN_CPU_CAPABILITY`` and ``MKL_CBWR`` are read when torch loads, so every measurement is a
fresh process (``--worker``) with the candidate's environment; the candidates run interleaved,
round-robin over ``--rounds`` rounds with the order rotated each round, so that the machine's
load hits all of them alike. Reported per candidate: the median wall and process-CPU seconds per
step, their ratio to ``unpinned`` (nothing set), the dispatch level and MKL branch the libraries
report, and the sha256 of the trained weights (equal in every round of a candidate; which
candidates agree shows what each variable changes on this machine).

Usage (from the repository root)::

    .venv/bin/python perf/cpu_pin_cost.py --out perf/results/cpu_pin_cost.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: name -> environment (the pinned variables not named are unset).
CANDIDATES: dict[str, dict[str, str]] = {
    "unpinned": {},
    "pin: avx2 + COMPATIBLE": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE"},
    "avx2 + MKL AVX2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"},
    "default + COMPATIBLE": {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE"},
}


def worker(args: argparse.Namespace) -> dict[str, Any]:
    """One measurement in this process (its environment is the candidate's)."""
    import random

    import torch

    from mlmt_bench.benchmarks.synthetic_curriculum import KINDS, Curriculum
    from mlmt_bench.machine.reproducible import record, tensors_sha256
    from mlmt_bench.models.tiny import build_tiny_model
    from mlmt_bench.models.tokenizer import build_char_tokenizer
    from mlmt_bench.warmstart.sft import sft
    from mlmt_bench.warmstart.shared_base import BaseConfig, synthetic_benchmark

    torch.set_num_threads(1)
    cfg = BaseConfig(seed=0)
    tok = build_char_tokenizer()
    data = Curriculum(cfg, synthetic_benchmark(cfg.benchmark, cfg.benchmark_options), tok, 0)
    model = build_tiny_model(args.preset, tok, seed=0)
    stamps: list[tuple[float, float]] = []
    total = args.warmup + args.steps
    summary = sft(model, lambda rng, step: data.example(KINDS[step % len(KINDS)], rng), steps=total,
                  batch=args.batch, lr=2e-3, warmup_frac=0.05, rng=random.Random(0), pad_id=tok.pad_token_id,
                  on_step=lambda step, loss: stamps.append((time.perf_counter(), time.process_time())))
    (w0, c0), (w1, c1) = stamps[args.warmup - 1], stamps[-1]
    env = record()
    return {"wall_s_per_step": (w1 - w0) / args.steps, "cpu_s_per_step": (c1 - c0) / args.steps,
            "tokens": summary["tokens"], "sha256": tensors_sha256(model.state_dict()),
            "cpu_capability": env["cpu_capability"], "mkl_cbwr_branch": env.get("mkl_cbwr_branch")}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="tiny-0.5m")
    ap.add_argument("--steps", type=int, default=50, help="timed SFT steps per measurement")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps before them")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default=None, help="comma-separated candidate names (default: all)")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        out = worker(args)
        sys.stdout.write(json.dumps(out) + "\n")
        return out

    from mlmt_bench.machine.reproducible import PIN, cpu_model

    names = args.only.split(",") if args.only else list(CANDIDATES)
    base_env = {k: v for k, v in os.environ.items() if k not in PIN}
    cmd = [sys.executable, __file__, "--worker", "--preset", args.preset, "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--batch", str(args.batch)]
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for r in range(args.rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            proc = subprocess.run(cmd, env={**base_env, **CANDIDATES[name]}, capture_output=True, text=True,
                                  check=True, cwd=ROOT)
            res = json.loads(proc.stdout.strip().splitlines()[-1])
            runs[name].append(res)
            sys.stderr.write(f"round {r + 1}/{args.rounds} {name:24s} {res['wall_s_per_step']:.4f} s/step wall, "
                             f"{res['cpu_s_per_step']:.4f} CPU  {res['cpu_capability']}/{res['mkl_cbwr_branch']}  "
                             f"{res['sha256'][:16]}\n")
    ref_wall = statistics.median(x["wall_s_per_step"] for x in runs[names[0]])
    ref_cpu = statistics.median(x["cpu_s_per_step"] for x in runs[names[0]])
    results = []
    for name in names:
        xs = runs[name]
        wall = statistics.median(x["wall_s_per_step"] for x in xs)
        cpu = statistics.median(x["cpu_s_per_step"] for x in xs)
        hashes = sorted({x["sha256"] for x in xs})
        results.append({"candidate": name, "env": CANDIDATES[name], "cpu_capability": xs[0]["cpu_capability"],
                        "mkl_cbwr_branch": xs[0]["mkl_cbwr_branch"], "median_wall_s_per_step": round(wall, 5),
                        "median_cpu_s_per_step": round(cpu, 5), f"wall_ratio_to_{names[0]}": round(wall / ref_wall, 3),
                        f"cpu_ratio_to_{names[0]}": round(cpu / ref_cpu, 3),
                        "wall_s_per_step": [round(x["wall_s_per_step"], 5) for x in xs],
                        "cpu_s_per_step": [round(x["cpu_s_per_step"], 5) for x in xs],
                        "sha256": hashes[0] if len(hashes) == 1 else hashes,
                        "same_weights_as": [n for n in names if n != name and runs[n][0]["sha256"] == xs[0]["sha256"]]})
    import torch

    out = {"args": {k: v for k, v in vars(args).items() if k != "worker"}, "cpu": cpu_model(),
           "cores": os.cpu_count(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
           "load_average_before": [round(x, 2) for x in load_before],
           "load_average_after": [round(x, 2) for x in os.getloadavg()],
           "seconds": round(time.perf_counter() - t0, 1), "results": results}
    print(json.dumps(results, indent=1))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()

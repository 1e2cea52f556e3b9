"""What an environment setting costs a whole run: ``mlmt-bench run SPEC`` under named variants.

A benchmark, not a test. Each variant is ``NAME:VAR=VALUE,VAR=VALUE`` (``--set`` overrides of the
spec may follow after ``|``: ``before:MLMT_BENCH_CPU_PIN=1|train.cpu_dtype=float32``). The variants
run interleaved, ``--rounds`` times with the order rotated each round, each a fresh
``mlmt-bench run`` into a temporary output directory; reported per variant: median wall seconds,
median CPU seconds of the run's process tree (user + system, from ``os.wait4``), peak RSS, the
ratios to the first variant, and the load average around each run. Process CPU time is the
steadier measure on a shared machine.

Usage (from the repository root)::

    .venv/bin/python perf/run_env_cost.py registry/runs/smollm2-grpo.yaml \\
        'before:MLMT_BENCH_CPU_PIN=1|train.cpu_dtype=float32' 'after:' --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def parse_variant(text: str) -> tuple[str, dict[str, str], list[str]]:
    """``NAME:VAR=V,VAR=V|FIELD=V|FIELD=V`` -> (name, environment additions, --set overrides)."""
    name, _, rest = text.partition(":")
    env_part, *overrides = rest.split("|")
    env = dict(kv.split("=", 1) for kv in env_part.split(",") if kv.strip())
    return name, env, [o for o in overrides if o.strip()]


def one_run(spec: str, env: dict[str, str], overrides: list[str]) -> dict[str, Any]:
    out = tempfile.mkdtemp(prefix="run_env_cost_")
    cmd = [str(ROOT / ".venv" / "bin" / "mlmt-bench"), "-q", "run", spec, "--set", f"output_dir={out}"]
    for o in overrides:
        cmd += ["--set", o]
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"run failed: {' '.join(cmd)}\n{err[-2000:]}")
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_mb": usage.ru_maxrss / 1024,
            "load_before": load, "load_after": os.getloadavg()[0]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("spec")
    p.add_argument("variants", nargs="+", help="NAME:VAR=VALUE,...|FIELD=VALUE|... (the first is the reference)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", default=None, help="JSON results (default: print only)")
    args = p.parse_args(argv)
    variants = [parse_variant(v) for v in args.variants]
    results: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in variants}
    for r in range(args.rounds):
        order = variants[r % len(variants):] + variants[:r % len(variants)]
        for name, env, overrides in order:
            res = one_run(args.spec, env, overrides)
            results[name].append(res)
            print(f"round {r + 1} {name}: {res['wall_s']:.1f} s wall, {res['cpu_s']:.1f} CPU s, "
                  f"{res['peak_rss_mb']:.0f} MB, load {res['load_before']:.1f} -> {res['load_after']:.1f}",
                  flush=True)
    ref = variants[0][0]
    med = {n: {k: statistics.median(x[k] for x in rs) for k in ("wall_s", "cpu_s", "peak_rss_mb")}
           for n, rs in results.items()}
    for n, m in med.items():
        print(f"{n}: median {m['wall_s']:.1f} s wall ({m['wall_s'] / med[ref]['wall_s']:.2f}x {ref}), "
              f"{m['cpu_s']:.1f} CPU s ({m['cpu_s'] / med[ref]['cpu_s']:.2f}x), peak RSS {m['peak_rss_mb']:.0f} MB")
    if args.out:
        Path(args.out).write_text(json.dumps({"spec": args.spec, "variants": args.variants, "rounds": args.rounds,
                                              "date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(),
                                              "median": med, "runs": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

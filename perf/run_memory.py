"""Resident memory of an experiment's runs in one process: kept vs freed static KV caches and heap.

A benchmark, not a test. The SmolLM2 pilot runs its arms one after another in one process; its mlmt seed 0
was killed by the OOM killer at 20.8 GB. This runs a small version of an experiment spec (one seed, a token
budget of a few steps, a short evaluation; ``--set`` overrides) twice, each in its own process:

- ``kept``: what the code did before: ``backend.options.keep_cache: true`` (every model's static decoder keeps
  up to four KV caches between calls) and :func:`mlmt_bench.machine.memory.release_freed_heap` a no-op (freed
  heap stays resident until an allocation fits it);
- ``freed``: the defaults: caches freed after each call on the CPU, free heap pages returned at the end of every
  phase and after each run.

Both arms compute the same thing (same ids and outcomes: tested in ``tests/test_static_decode.py``). It prints,
per arm and run, the logged ``mem/peak_mb/<phase>`` (peak RSS within each phase, MiB), the RSS after each run
and before the next, the wall time, and the ratios freed / kept; and writes a JSON file. The runs of the two
arms are sequential: nothing else should run beside (a run of the pilot alone peaks at ~12 GB).

Usage (from the repository root; ``make smollm2`` first)::

    .venv/bin/python perf/run_memory.py --spec registry/runs/smollm2-pilot.yaml
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SMALL = ["seeds=[0]", "train.token_budget=2500", "eval.limit=16"]


def _child(spec: str, arm: str, overrides: list[str], out_dir: str, result: str) -> None:
    """One arm: the experiment in this process, RSS read around every run."""
    from mlmt_bench import experiment, runner, spec as specs
    from mlmt_bench.machine import memory

    if arm == "kept":
        memory.release_freed_heap = lambda: True  # the heap stays as the runs leave it
        overrides = [*overrides, "backend.options.keep_cache=true"]
    runs: list[dict[str, Any]] = []
    inner = runner.run

    def run(spec: Any, *a: Any, **k: Any) -> Any:
        entry = {"run": spec.name, "rss_before_mb": round(memory.rss_mb(), 1)}
        t0 = time.perf_counter()
        out = inner(spec, *a, **k)
        entry.update(wall_s=round(time.perf_counter() - t0, 1), rss_after_mb=round(memory.rss_mb(), 1))
        peaks: dict[str, float] = {}
        for line in (Path(out["run_dir"]) / "metrics.jsonl").read_text().splitlines():
            for key, value in json.loads(line).items():
                if key.startswith("mem/peak_mb/"):
                    peaks[key] = max(peaks.get(key, 0.0), value)
        entry["peaks_mb"] = peaks
        runs.append(entry)
        return out

    runner.run = run
    exp, arms = specs.load_any(spec, [*SMALL, *overrides, f"output_dir={out_dir}"])
    experiment.run_experiment(exp, arms, progress=False)
    Path(result).write_text(json.dumps({"arm": arm, "runs": runs, "rss_end_mb": round(memory.rss_mb(), 1)}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", default="registry/runs/smollm2-pilot.yaml")
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="extra KEY.PATH=VALUE")
    ap.add_argument("--out", default="perf/results/run_memory.json")
    ap.add_argument("--child", nargs=3, metavar=("ARM", "OUT_DIR", "RESULT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args.spec, args.child[0], args.overrides, args.child[1], args.child[2])
        return
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"run_memory-{os.getpid()}"
    arms: dict[str, Any] = {}
    for arm in ("kept", "freed"):
        result = work / f"{arm}.json"
        cmd = [sys.executable, __file__, "--spec", args.spec, *sum((["--set", o] for o in args.overrides), []),
               "--child", arm, str(work / arm), str(result)]
        subprocess.run(cmd, check=True, cwd=ROOT)
        arms[arm] = json.loads(result.read_text())
    ratios = []
    for kept, freed in zip(arms["kept"]["runs"], arms["freed"]["runs"]):
        row = {"run": kept["run"], "rss_before_mb": (kept["rss_before_mb"], freed["rss_before_mb"]),
               "wall_s": (kept["wall_s"], freed["wall_s"])}
        for key in sorted(set(kept["peaks_mb"]) & set(freed["peaks_mb"])):
            row[key] = (kept["peaks_mb"][key], freed["peaks_mb"][key], round(freed["peaks_mb"][key]
                                                                             / kept["peaks_mb"][key], 2))
        ratios.append(row)
        print(json.dumps(row))
    record = {"spec": args.spec, "overrides": [*SMALL, *args.overrides], "machine": platform.processor() or
              platform.machine(), "cpus": os.cpu_count(), "arms": arms, "kept_vs_freed": ratios}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

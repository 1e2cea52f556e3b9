"""What building the shared base on idle cores buys: one thread against the governed count
(:class:`mlmt_bench.warmstart.build_threads.ThreadGovernor`, 1 or 2 threads as idle cores allow)
and a fixed 2 threads, on an idle machine, beside ``--hogs`` busy processes, and in a cgroup
with a CPU quota of ``--quota`` CPUs (as ``docker run --cpus=1`` gives; needs root and a writable
cgroup filesystem), where the governor also runs as it did before it read the quota.

A benchmark, not a test. The workload is the shared base's own build (``shared_base._build``:
the default :class:`~mlmt_bench.warmstart.shared_base.BaseConfig`, seed 0, ``--steps`` SFT
steps, no check), in this process under the CPU pin. For each load (``--hogs`` 0 and N: N
processes spinning on a busy loop), the three ways run one after another. Reported: SFT wall
seconds, the ratio to one thread at the same load, the steps run on each thread count, and the
weights' sha256 (equal for all: the thread count is a speed choice only).

Usage (from the repository root)::

    .venv/bin/python perf/base_build_threads.py --steps 150 --hogs 2 --quota 1 \
        --out perf/results/base_build_threads.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import platform
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _spin() -> None:
    while True:
        pass


@contextlib.contextmanager
def _in_cpu_quota(cpus: float) -> Iterator[None]:
    """Run this process (all its threads) inside a new cgroup allowed ``cpus`` CPUs of time
    (cgroup v1's cpu and cpuacct hierarchies, or v2's), then move it back and remove the group."""
    v1 = Path("/sys/fs/cgroup/cpu")
    period = 100_000
    if (v1 / "cpu.cfs_quota_us").exists():
        dirs = [v1 / "mlmt-perf"] + ([Path("/sys/fs/cgroup/cpuacct/mlmt-perf")]
                                      if Path("/sys/fs/cgroup/cpuacct/cpuacct.usage").exists() else [])
        for d in dirs:
            d.mkdir(exist_ok=True)
        (dirs[0] / "cpu.cfs_period_us").write_text(str(period))
        (dirs[0] / "cpu.cfs_quota_us").write_text(str(int(cpus * period)))
    else:
        dirs = [Path("/sys/fs/cgroup/mlmt-perf")]
        dirs[0].mkdir(exist_ok=True)
        (dirs[0] / "cpu.max").write_text(f"{int(cpus * period)} {period}")
    try:
        for d in dirs:
            (d / "cgroup.procs").write_text(str(os.getpid()))
        yield
    finally:
        for d in dirs:
            (d.parent / "cgroup.procs").write_text(str(os.getpid()))
            d.rmdir()


def _build(steps: int, how: str) -> dict[str, Any]:
    from mlmt_bench.machine.cpus import CpuGroup, usable_cpus
    from mlmt_bench.warmstart import shared_base as sb
    from mlmt_bench.warmstart.build_threads import IdleCores, ThreadGovernor

    cfg = sb.BaseConfig(seed=0, steps=steps)
    bench = sb.synthetic_benchmark(cfg.benchmark, cfg.benchmark_options)
    fixed = {"1 thread": 0.0, "2 threads": 99.0}
    if how in fixed:  # on every usable CPU, the quota aside: "2 threads" means 2 in a 1-CPU quota too
        governor = ThreadGovernor(cfg.threads, cfg.batch, idle=lambda: fixed[how], every_s=1e9,
                                  cores=len(usable_cpus()))
    elif how == "governed, quota unread":  # what the governor did before it read the cgroup
        governor = ThreadGovernor(cfg.threads, cfg.batch, idle=IdleCores(group=CpuGroup(None)),
                                  cores=len(usable_cpus()))
    else:
        governor = ThreadGovernor(cfg.threads, cfg.batch)
    with tempfile.TemporaryDirectory() as out:
        report = sb._build(cfg, bench, Path(out), progress=False, governor=governor)
    return {"sft_s": report["sft"]["seconds"], "cpu_s": report["sft"]["cpu_seconds"],
            "steps_on": report["build_threads"]["steps"], "sha256": report["sha256"]}


def main() -> None:
    from mlmt_bench.machine import reproducible

    reproducible.apply()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--hogs", type=int, default=2, help="busy processes of the loaded case")
    ap.add_argument("--quota", type=float, default=0.0, help="CPUs of the quota case (0: no such case)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    results: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "cpu": reproducible.cpu_model() or platform.machine(),
                               "cores": len(os.sched_getaffinity(0)), "steps": args.steps, "loads": {}}
    cases = [(f"{hogs} busy processes", hogs, None) for hogs in sorted({0, args.hogs})]
    cases += [(f"quota of {args.quota:g} CPU", 0, args.quota)] if args.quota else []
    for name, hogs, quota in cases:
        ways = ("1 thread", "governed", "2 threads") if quota is None else \
            ("1 thread", "governed", "governed, quota unread", "2 threads")
        procs = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(hogs)]
        for p in procs:
            p.start()
        try:
            time.sleep(1.0 if hogs else 0.0)
            with _in_cpu_quota(quota) if quota else contextlib.nullcontext():
                rows = {how: _build(args.steps, how) for how in ways}
        finally:
            for p in procs:
                p.terminate()
        for row in rows.values():
            row["vs_1_thread"] = round(row["sft_s"] / rows["1 thread"]["sft_s"], 3)
        results["loads"][name] = rows
        for how, row in rows.items():
            print(f"{name}: {how:22s} {row['sft_s']:7.1f} s  x{row['vs_1_thread']:.2f}  steps on {row['steps_on']}"
                  f"  sha {row['sha256'][:16]}", flush=True)
    shas = {row["sha256"] for rows in results["loads"].values() for row in rows.values()}
    results["same_weights"] = len(shas) == 1
    print("same weights everywhere:", results["same_weights"])
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()

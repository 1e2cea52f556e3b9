"""The shared base builds on as many idle cores as give the same weights
(mlmt_bench/warmstart/build_threads.py): the choice by hand, and the equivalence itself under the
CPU pin, with the thread count switching between steps as a loaded machine makes it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from mlmt_bench.machine.cpus import CpuGroup
from mlmt_bench.warmstart.build_threads import (
    EQUIVALENT,
    EQUIVALENT_BATCHES,
    IdleCores,
    ThreadGovernor,
    allowed_threads,
    pick_threads,
)
from support import TINY

REPO = Path(__file__).resolve().parents[1]


def test_only_the_measured_pair_and_batch_size_are_allowed_more_cores():
    assert EQUIVALENT == (1, 2) and EQUIVALENT_BATCHES == (16,)
    assert allowed_threads(1, 16, 2) == (1, 2) and allowed_threads(2, 16, 16) == (1, 2)
    assert allowed_threads(1, 16, 1) == (1,) and allowed_threads(2, 16, 0) == (1,)
    assert allowed_threads(3, 16, 16) == (3,)  # outside the pair: exactly the keyed count
    assert allowed_threads(1, 12, 16) == (1,)  # 2 threads change the weights at 12 a step
    assert allowed_threads(1, 16, 2, pinned=False) == (1,)  # measured under the CPU pin only


def test_the_largest_allowed_count_that_fits_the_idle_cores_is_picked():
    allowed = (1, 2)
    assert pick_threads(2.0, allowed) == 2
    assert pick_threads(1.8, allowed) == 2  # within the slack of 0.25 core
    assert pick_threads(1.7, allowed) == 1
    assert pick_threads(0.0, allowed) == 1  # a full machine: the smallest, never none
    assert pick_threads(3.9, (1, 2, 4)) == 4 and pick_threads(3.7, (1, 2, 4)) == 2
    assert pick_threads(0.0, (3,)) == 3


def test_idle_cores_are_the_cpus_minus_what_other_processes_used():
    clock, busy, own = iter([0.0, 10.0, 20.0]), iter([0.0, 12.0, 20.0]), iter([0.0, 10.0, 14.0])
    idle = IdleCores(cpus=[0, 1], busy=lambda: next(busy), own=lambda: next(own), clock=lambda: next(clock),
                     group=CpuGroup(None))
    # 10 s: the CPUs were busy 12 s, 10 of them this process's: others used 0.2 core of 2
    assert abs(idle() - 1.8) < 1e-9
    # the next 10 s: busy 8 s, 4 of them ours: others used 0.4 core
    assert abs(idle() - 1.6) < 1e-9


class _Group(CpuGroup):
    """A cgroup whose CPU seconds so far come from ``used`` (one value a call)."""

    def __init__(self, quota: float | None, used) -> None:
        super().__init__(quota)
        object.__setattr__(self, "_used", used)

    def used_seconds(self) -> float | None:
        return next(self._used)


def test_in_a_cgroup_with_a_quota_idle_cores_are_what_the_quota_left():
    """A container with ``--cpus=1.5`` on an 8-core host: the host's idle cores do not count,
    the quota minus what the container's other processes used does."""
    clock, busy, own = iter([0.0, 10.0, 20.0]), iter([0.0, 10.0, 30.0]), iter([0.0, 10.0, 14.0])
    idle = IdleCores(cpus=list(range(8)), busy=lambda: next(busy), own=lambda: next(own),
                     clock=lambda: next(clock), group=_Group(1.5, iter([0.0, 10.0, 25.0])))
    # 10 s: only this process ran (10 s of host time, 10 of the cgroup's): all 1.5 CPUs free
    assert abs(idle() - 1.5) < 1e-9
    # the next 10 s: the cgroup used 15 s, 4 of them ours: others took 1.1 of its 1.5 CPUs (on
    # the host, 8 - 1.6 cores were idle)
    assert abs(idle() - 0.4) < 1e-9
    # the cgroup's CPU time unreadable: the quota caps the host's idle cores
    ticks = iter([0.0, 10.0])
    capped = IdleCores(cpus=list(range(8)), busy=lambda: 0.0, own=lambda: 0.0, clock=lambda: next(ticks),
                       group=_Group(1.5, iter([None, None])))
    assert capped() == 1.5
    on_two = IdleCores(cpus=[0, 1], busy=lambda: 0.0, own=lambda: 0.0, clock=lambda: 0.0, group=CpuGroup(4.0))
    assert on_two() == 2.0  # no wall time yet: the smaller of the CPUs and the quota


def test_the_governor_re_picks_every_interval_and_counts_the_steps_on_each(monkeypatch):
    from mlmt_bench.machine import reproducible

    for k, v in reproducible.PIN.items():
        monkeypatch.setenv(k, v)
    now = [0.0]
    free = iter([2.0, 0.5, 2.0])
    set_calls: list[int] = []
    gov = ThreadGovernor(1, 16, idle=lambda: next(free), cores=2, every_s=5.0, clock=lambda: now[0],
                         set_threads=set_calls.append)
    assert gov.start() == 2
    for t in range(12):  # one step a second: re-picks after steps at 5 s and 10 s
        now[0] = t + 1.0
        gov.step()
    assert set_calls == [2, 1, 2]
    assert gov.record() == {"allowed": [1, 2], "steps": {"1": 5, "2": 7}}
    single = ThreadGovernor(3, 16, idle=lambda: 99.0, cores=8, set_threads=set_calls.append)
    assert single.start() == 3 and single.allowed == (3,)


def test_the_build_line_says_which_thread_counts_it_ran_on():
    from mlmt_bench.warmstart.shared_base import _on_threads

    assert _on_threads({"build_threads": {"steps": {"2": 2400}}}) == " on 2 threads"
    assert _on_threads({"build_threads": {"steps": {"1": 5, "2": 7}}}) == " on 1-2 threads"
    assert _on_threads({"build_threads": {"steps": {"1": 8}}}) == " on 1 thread"
    assert _on_threads({}) == ""  # a base built before the count was recorded


def test_a_build_on_two_threads_leaves_the_callers_thread_count_as_it_was(monkeypatch, tmp_path):
    """A run that builds its missing base goes on with its own train.threads (which its results
    depend on), however many threads the build and its check ran on."""
    import torch

    from mlmt_bench.machine import reproducible
    from mlmt_bench.warmstart import build_threads, shared_base

    for k, v in reproducible.PIN.items():
        monkeypatch.setenv(k, v)
    two_idle = lambda keyed, batch: build_threads.ThreadGovernor(keyed, batch, idle=lambda: 2.0, cores=2)  # noqa: E731
    monkeypatch.setattr(shared_base, "ThreadGovernor", two_idle)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        base = shared_base.ensure_base(shared_base.BaseConfig(**{**TINY, "batch": 16, "steps": 3}),
                                       cache_dir=tmp_path, progress=False)
        assert base.report["build_threads"]["steps"] == {"2": 3}  # it did build on two
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


_SCRIPT = """
import itertools, json, sys, tempfile
from mlmt_bench.machine import reproducible
reproducible.apply()  # the equivalence was measured under the pin, as every build runs
from pathlib import Path
import torch
from mlmt_bench.warmstart import shared_base as sb
from mlmt_bench.warmstart.build_threads import ThreadGovernor

out = {}
for preset in ("tiny-0.5m", "tiny-1m"):
    cfg = sb.BaseConfig(**{**json.loads(sys.argv[1]), "preset": preset, "steps": 9, "batch": 16})
    bench = sb.synthetic_benchmark(cfg.benchmark, cfg.benchmark_options)
    one = ThreadGovernor(1, 16, idle=lambda: 0.0, cores=2)  # a full machine: one thread throughout
    cycle = itertools.cycle([2.0, 2.0, 0.0])  # idle cores as a changing load would leave them
    moving = ThreadGovernor(1, 16, idle=lambda: next(cycle), cores=2, every_s=0.0)
    built = {}
    for name, gov in (("one", one), ("moving", moving)):
        d = Path(tempfile.mkdtemp())
        report = sb._build(cfg, bench, d, progress=False, governor=gov)
        built[name] = (d, report)
    checks = {}
    for threads in (1, 2):
        torch.set_num_threads(threads)
        c = sb.check_base(sb.Base(*built["one"]), bench, 6, temperature=1.0)
        c.pop("seconds")
        checks[threads] = c
    out[preset] = {"sha": {k: r["sha256"] for k, (_, r) in built.items()},
                   "threads": {k: r["build_threads"] for k, (_, r) in built.items()},
                   "checks_equal": checks[1] == checks[2]}
print(json.dumps(out))
"""


def test_one_and_two_threads_build_and_check_the_same_base(tmp_path):
    """Under the CPU pin: a build whose thread count moves between 2 and 1 as the idle cores do
    has the weights of a one-thread build, and the base's check (greedy and sampled) is the same
    at 1 and 2 threads, for the presets the committed specs use."""
    cfg = {k: v for k, v in TINY.items() if k not in ("steps", "batch")}
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, json.dumps(cfg)], capture_output=True, text=True,
                          cwd=REPO, timeout=600, env={**_clean_env(), "MLMT_BENCH_CACHE": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    for preset, r in result.items():
        assert r["sha"]["one"] == r["sha"]["moving"], preset
        assert r["threads"]["one"]["steps"] == {"1": 9}
        assert r["threads"]["moving"]["steps"] == {"1": 3, "2": 6}, r["threads"]
        assert r["checks_equal"], preset


def _clean_env() -> dict[str, str]:
    from mlmt_bench.machine import reproducible

    return {k: v for k, v in os.environ.items() if k not in {*reproducible.PIN, reproducible.SWITCH}}

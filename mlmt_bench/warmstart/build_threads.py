"""How many torch CPU threads a shared-base build runs on: two when a second core is idle, where
two threads are measured to give the weights of one.

A base's weights follow the float summation order of one thread count (``BaseConfig.threads``, in
its key). Whether another count gives the same bits depends on the tensor shapes (torch's CPU
kernels split work between threads differently by size). Measured with torch 2.13.0's CPU wheel
under the CPU pin (:mod:`mlmt_bench.machine.reproducible`) on a 2-core AMD EPYC, at the default 16
conversations a step: a whole seed-0 ``tiny-0.5m`` base (2,400 steps) built on 2 threads has the
sha256 and the check of the committed 1-thread one, and so do 300-step builds of seeds 1-3 and of
``tiny-1m``; but at 1 to 7 or 12 conversations a step 2 threads change the weights within 9
steps, and 3, 4 or 8 threads change them at some batch sizes. So only the measured pair is used:
a build keyed on 1 or 2 threads with a batch of 16 may run on 1 or 2 threads and switch between
steps (:func:`allowed_threads`); any other build runs on exactly its keyed count.
``tests/test_base_threads.py`` keeps the pair true (it fails if a library upgrade breaks it).

The count is re-chosen every few seconds from the cores other processes left idle since the last
look (:class:`IdleCores`): 2 threads on an idle 2-core machine about halve a build's time, and it
goes back to 1 when another process wants the core, because torch's OpenMP threads spin while
they wait for one (measured in ``perf/base_build_threads.py``). In a cgroup with a CPU quota (a
container's ``--cpus``) the quota, not the host's idle cores, bounds the count
(:mod:`mlmt_bench.machine.cpus`): 2 threads in a 1-CPU quota are slower than one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from mlmt_bench.machine import reproducible
from mlmt_bench.machine.cpus import CpuGroup, cpu_budget, usable_cpus

#: Thread counts measured to build bit-identical bases (see the module docstring) ...
EQUIVALENT: tuple[int, ...] = (1, 2)
#: ... at these batch sizes (conversations per SFT step).
EQUIVALENT_BATCHES: tuple[int, ...] = (16,)
#: Idle-core measurement noise tolerated when fitting a thread count (cores).
SLACK = 0.25


def allowed_threads(keyed: int, batch: int, cores: int, pinned: bool = True) -> tuple[int, ...]:
    """Thread counts a build keyed on ``keyed`` threads with ``batch`` conversations a step may
    run on, with ``cores`` cores: the equivalent counts up to ``cores`` (at least one thread), or
    ``keyed`` alone outside the measured pair and batch sizes, and without the CPU pin (``pinned``
    false), under which nothing was measured."""
    if keyed not in EQUIVALENT or batch not in EQUIVALENT_BATCHES or not pinned:
        return (keyed,)
    return tuple(t for t in EQUIVALENT if t <= max(1, cores))


def pick_threads(free_cores: float, allowed: tuple[int, ...]) -> int:
    """The largest of ``allowed`` that fits in ``free_cores`` (idle cores, give or take
    :data:`SLACK`); the smallest when none fits."""
    fits = [t for t in allowed if t <= free_cores + SLACK]
    return max(fits) if fits else min(allowed)


class IdleCores:
    """Cores of this process's CPUs that other processes left idle since the last call
    (system CPU time on those CPUs minus this process's own, over the wall time between calls),
    no more than what its cgroup's CPU quota left (the quota minus the cgroup's other processes'
    CPU time: in a container the host's cores are not what the process may use).

    ``busy``: seconds the CPUs were busy so far; ``own``: this process's CPU seconds so far;
    ``group``: the cgroup (:class:`mlmt_bench.machine.cpus.CpuGroup`, its quota and CPU time so far);
    ``clock``: wall seconds (all injectable for tests)."""

    def __init__(self, cpus: list[int] | None = None, busy: Callable[[], float] | None = None,
                 own: Callable[[], float] | None = None, clock: Callable[[], float] = time.monotonic,
                 group: CpuGroup | None = None) -> None:
        self.cpus = cpus if cpus is not None else usable_cpus()
        self.group = group if group is not None else CpuGroup.find()
        self._busy = busy or self._system_busy
        self._own = own or _own_cpu_seconds
        self._clock = clock
        self._last = self._sample()

    def _system_busy(self) -> float:
        import psutil

        per_cpu = psutil.cpu_times(percpu=True)
        chosen = [per_cpu[i] for i in self.cpus if i < len(per_cpu)] or per_cpu
        return sum(sum(t) - t.idle - getattr(t, "iowait", 0.0) for t in chosen)

    def _sample(self) -> tuple[float, float, float, float | None]:
        return self._clock(), self._busy(), self._own(), self.group.used_seconds()

    def __call__(self) -> float:
        (t0, busy0, own0, group0), now = self._last, self._sample()
        self._last = now
        t1, busy1, own1, group1 = now
        wall, own = t1 - t0, own1 - own0
        quota = self.group.quota
        if wall <= 0:
            return float(len(self.cpus)) if quota is None else min(len(self.cpus), quota)
        free = len(self.cpus) - max(0.0, busy1 - busy0 - own) / wall
        if quota is not None:  # the quota's share the cgroup's other processes took
            others = group1 - group0 - own if group0 is not None and group1 is not None else 0.0
            free = min(free, quota - max(0.0, others) / wall)
        return max(0.0, free)


def _own_cpu_seconds() -> float:
    import psutil

    t = psutil.Process().cpu_times()
    return float(t.user + t.system)


class ThreadGovernor:
    """Sets torch's thread count while a base builds: :meth:`start` picks the first count, then
    :meth:`step` (after every SFT step) re-picks it once ``every_s`` seconds have passed.
    ``used`` counts the steps run on each thread count (recorded in ``base.json``)."""

    def __init__(self, keyed: int, batch: int, *, idle: Callable[[], float] | None = None,
                 cores: int | None = None, every_s: float = 5.0, clock: Callable[[], float] = time.monotonic,
                 set_threads: Callable[[int], None] | None = None) -> None:
        self.allowed = allowed_threads(keyed, batch, cores if cores is not None else cpu_budget(),
                                       pinned=reproducible.in_environment())
        self._idle = idle
        self._every = every_s
        self._clock = clock
        self._set = set_threads or _torch_set_threads
        self.threads = min(self.allowed)
        self.used: dict[int, int] = {}
        self._since = clock()

    def _free(self) -> float:
        if self._idle is None:  # the first look: a short sample of what the others use now
            self._idle = IdleCores()
            time.sleep(0.2)
        return self._idle()

    def start(self) -> int:
        """The first thread count, set in torch (without a look when only one is allowed)."""
        self.threads = pick_threads(self._free(), self.allowed) if len(self.allowed) > 1 else self.allowed[0]
        self._set(self.threads)
        self._since = self._clock()
        return self.threads

    def step(self) -> None:
        """Count the step just run; re-pick the thread count when it is time."""
        self.used[self.threads] = self.used.get(self.threads, 0) + 1
        now = self._clock()
        if len(self.allowed) > 1 and now - self._since >= self._every:
            threads = pick_threads(self._free(), self.allowed)
            if threads != self.threads:
                self._set(threads)
                self.threads = threads
            self._since = now

    def record(self) -> dict[str, Any]:
        """What ``base.json`` keeps: the thread counts allowed and the steps run on each."""
        return {"allowed": list(self.allowed), "steps": {str(t): n for t, n in sorted(self.used.items())}}


def _torch_set_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)

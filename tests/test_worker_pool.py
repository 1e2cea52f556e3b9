"""WorkerPool: deadlines counted in the worker's CPU time, capped in wall time."""

from __future__ import annotations

import sys
import time

import pytest

from mlmt_bench.verifiers.timeout import CallTimeout, WorkerPool, WorkerRaised

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc for CPU time")


@pytest.fixture
def pool() -> WorkerPool:
    p = WorkerPool(max_workers=1, memory_limit_mb=None)
    yield p
    p.close()


def test_returns_the_value_and_reports_remote_errors(pool: WorkerPool) -> None:
    assert pool.call(pow, (3, 4), 5.0) == 81
    with pytest.raises(WorkerRaised, match="ZeroDivisionError"):
        pool.call(divmod, (1, 0), 5.0)
    assert pool.call(pow, (2, 10), 5.0) == 1024  # the worker survived the error


def test_a_runaway_computation_is_killed_and_replaced(pool: WorkerPool) -> None:
    pool.call(pow, (2, 2), 5.0)  # start the worker outside the measured call
    start = time.monotonic()
    with pytest.raises(CallTimeout):
        pool.call(sum, (range(10**12),), 0.5)  # minutes of CPU in C, constant memory
    assert time.monotonic() - start < 0.5 * pool.max_wall_factor + 5
    assert pool.timeouts == 1
    assert pool.call(pow, (2, 5), 5.0) == 32


@linux_only
def test_a_call_that_waits_without_cpu_gets_up_to_the_wall_cap(pool: WorkerPool) -> None:
    # time.sleep uses no CPU, like a worker starved by a loaded machine: 1.0 s of wall time
    # exceeds the 0.5 s deadline but stays under its 4x wall cap, so the answer counts.
    assert pool.call(time.sleep, (1.0,), 0.5) is None
    assert pool.timeouts == 0
    start = time.monotonic()
    with pytest.raises(CallTimeout):
        pool.call(time.sleep, (60,), 0.5)
    took = time.monotonic() - start
    assert 0.5 * pool.max_wall_factor - 0.1 <= took < 30, took


@linux_only
def test_cpu_seconds_grows_with_work(pool: WorkerPool) -> None:
    pool.call(pow, (2, 2), 5.0)
    worker = pool._idle[0]
    before = worker.cpu_seconds()
    pool.call(sum, (range(3 * 10**7),), 30.0)
    after = worker.cpu_seconds()
    assert before is not None and after is not None and after > before

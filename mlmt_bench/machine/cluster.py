"""Ray as the executor of experiments and sweeps (``run EXPERIMENT --ray ADDRESS``, ``sweep SPEC
--ray ADDRESS``): each run, trial or shared-base build is a Ray task, scheduled, placed and retried
by Ray.

:class:`RayExecutor` is what ``concurrent.futures`` calls an executor: ``submit(fn, *args)``
returns a :class:`concurrent.futures.Future` (Ray's ``ObjectRef.future()``), so the loop that keeps
``--workers`` processes busy drives a cluster unchanged. Each task asks for ``num_cpus`` CPUs
(the run's ``train.threads``) and ``num_gpus`` GPUs; a task whose worker process or node dies is
run again by Ray, up to ``max_retries`` times (the task functions are written to be run again:
a run continues its own run directory, see :func:`mlmt_bench.experiment._run_job`). Exceptions
raised by the task itself are not retried: they are the run's failure, raised by ``result()``.

Every node must see the same paths: the experiment's output directory, the shared-base cache
(``MLMT_BENCH_CACHE``) and, for a sweep, its Optuna storage (PostgreSQL, or SQLite on shared
storage for a few workers). Tasks get the CPU pin's environment (:mod:`mlmt_bench.machine.reproducible`)
through Ray's ``runtime_env``, set before the worker imports torch.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from mlmt_bench.errors import UserError

EXTRA = "pip install 'mlmt-bench[ray]'"


class RayExecutor:
    """Submit functions as Ray tasks on the cluster at ``address`` (``auto``, ``host:port``,
    ``ray://host:10001``); a context manager that disconnects at the end."""

    def __init__(self, address: str, *, num_cpus: float = 1.0, num_gpus: float = 0.0, max_retries: int = 3) -> None:
        try:
            import ray
        except ImportError:
            raise UserError(f"--ray needs the ray package, which is not installed ({EXTRA})") from None
        from mlmt_bench.machine import reproducible

        self._ray = ray
        self.num_cpus, self.num_gpus, self.max_retries = num_cpus, num_gpus, max_retries
        env = reproducible.child_env()  # as this process: pinned, switched off, or not needed
        try:
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False,
                     runtime_env={"env_vars": env})
        except Exception as exc:  # noqa: BLE001 - Ray's ConnectionError, ValueError, ...: one line
            text = " ".join(str(exc).split())[:300]
            raise UserError(f"--ray {address}: cannot connect to a Ray cluster ({type(exc).__name__}: "
                            f"{text})") from None
        self._tasks: dict[Callable[..., Any], Any] = {}

    def slots(self) -> int:
        """How many tasks the cluster runs at once: its CPUs (GPUs, if tasks take them) per task."""
        have = self._ray.cluster_resources()
        n = int(have.get("CPU", 1) // max(self.num_cpus, 1e-9))
        if self.num_gpus:
            n = min(n, int(have.get("GPU", 0) // self.num_gpus))
        return max(1, n)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        task = self._tasks.get(fn)
        if task is None:
            task = self._tasks[fn] = self._ray.remote(num_cpus=self.num_cpus, num_gpus=self.num_gpus,
                                                      max_retries=self.max_retries, retry_exceptions=False)(fn)
        out: Future[Any] = Future()

        def settle(ray_future: Future[Any]) -> None:  # Ray's RayTaskError carries the task's own exception
            try:
                out.set_result(ray_future.result())
            except BaseException as exc:  # noqa: BLE001
                cause = getattr(exc, "cause", None)
                out.set_exception(cause if isinstance(cause, BaseException) else exc)

        task.remote(*args).future().add_done_callback(settle)  # Ray's ObjectRef as a concurrent.futures.Future
        return out

    def __enter__(self) -> RayExecutor:
        # Ray's driver threads print the cluster's messages (a worker that died ...) on stdout, which
        # is the command's result (--json): they go to stderr while the executor is open
        self._stdout, sys.stdout = sys.stdout, sys.stderr
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._ray.shutdown()
        finally:
            sys.stdout = self._stdout

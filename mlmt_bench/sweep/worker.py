"""One worker process of ``mlmt-bench sweep --workers N`` (started by
:func:`mlmt_bench.sweep.workers.supervise` as ``python -m mlmt_bench.sweep.worker ARGS``): it runs
:func:`mlmt_bench.sweep.work` on the stored study and sends its events to the parent as JSON lines
on its stdout. Kept apart from the parent's module so that neither imports the other's side
(the parent never imports :mod:`mlmt_bench.sweep`'s trial machinery through here).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from mlmt_bench.errors import UserError
from mlmt_bench.io.signals import interrupt
from mlmt_bench.sweep.workers import WorkerArgs


def run_worker(args: WorkerArgs, worker: int, emit: Callable[[dict[str, Any]], None],
               keep_going: Callable[[], bool]) -> str | None:
    """Worker ``worker``'s share of the study: :func:`mlmt_bench.sweep.study.work_stored`."""
    from mlmt_bench.sweep.study import work_stored

    return work_stored(args, worker, emit, keep_going)


def main(argv: list[str] | None = None) -> int:
    """Entry point of a worker process; ``argv[0]``: JSON ``{"args": WorkerArgs, "worker": K}``."""
    raw = json.loads((sys.argv[1:] if argv is None else argv)[0])
    args, worker = WorkerArgs(**raw["args"]), int(raw["worker"])
    # Events keep the pipe the parent reads; anything else printed on stdout goes to the log.
    events = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    signal.signal(signal.SIGTERM, interrupt)
    parent = os.getppid()
    gone = threading.Event()  # the parent stopped reading: finish the trial, start no other

    def emit(event: dict[str, Any]) -> None:
        if gone.is_set():
            return
        try:
            events.write(json.dumps(event, default=str) + "\n")
        except (OSError, ValueError):
            gone.set()

    try:
        stopped = run_worker(args, worker, emit, lambda: not gone.is_set() and os.getppid() == parent)
    except UserError as exc:
        emit({"event": "error", "message": str(exc)})
        return 2
    except KeyboardInterrupt:
        return 130
    emit({"event": "exit", "stopped": stopped})
    return 1 if stopped else 0


if __name__ == "__main__":
    sys.exit(main())

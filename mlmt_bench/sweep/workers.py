"""``mlmt-bench sweep --workers N``: N worker processes on this machine sharing one study.

The parent (:func:`supervise`, this module) starts each worker as ``python -m
mlmt_bench.sweep.worker ARGS`` in a session of its own. A worker (:mod:`mlmt_bench.sweep.worker`)
loads the sweep and its study and runs
:func:`mlmt_bench.sweep.work`; its events (see "Running" in :mod:`mlmt_bench.sweep`) go to the
parent as JSON lines on its stdout, anything else it prints to ``<sweep dir>/logs/<study>-w<K>.log``,
and it ends with an ``exit`` event (or ``error``, for bad input).

- A worker that finishes (the study has its trials) exits 0; the parent waits for the others.
- A worker whose trials failed ``MAX_CONSECUTIVE_FAILURES`` times in a row exits 1 with the
  reason; a trial that hit a :class:`UserError` makes its worker exit 2. Either way the parent
  stops the other workers (SIGTERM: their running trials are recorded as failed and their run
  directories as interrupted) and returns the reason, or raises the error.
- A worker that dies (killed, crashed) leaves its trial running in the storage; once the trial's
  heartbeat is stale another worker fails it and runs its parameters again
  (:class:`mlmt_bench.sweep.RetryDeadTrial`). The parent starts a replacement worker unless
  ``MAX_CONSECUTIVE_FAILURES`` workers have died since a trial last finished; the study goes on
  with the workers left, and the sweep stops only when none is.
- Interrupting the parent (Ctrl-C, SIGTERM) stops the workers as above.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, cast

from mlmt_bench.errors import UserError
from mlmt_bench.io.signals import sigterm_as_interrupt

STOP_WAIT_S = 60  # how long stopped workers get to record their trials before they are killed


@dataclass
class WorkerArgs:
    """What every worker of one ``mlmt-bench sweep`` command is given."""

    sweep: str  # the sweep file
    overrides: list[str]  # --set, applied to its run spec
    study: str
    storage: str  # URL
    target: int  # complete + pruned trials the study should end with
    seed: int | None
    heartbeat_s: int


GRACE_FACTOR = 3  # a trial is declared dead (failed, retried once) after this many heartbeat intervals without one
MAX_CONSECUTIVE_FAILURES = 3


# ----------------------------------------------------------------------------------------------
# The parent


@dataclass
class _Worker:
    index: int
    proc: subprocess.Popen
    log: Path
    pending: bytes = b""  # the start of a line not yet complete
    trial: int | None = None  # the trial it is running
    final: dict[str, Any] = field(default_factory=dict)  # its exit or error event

    def feed(self, chunk: bytes) -> Iterator[dict[str, Any]]:
        *lines, self.pending = (self.pending + chunk).split(b"\n")
        for line in lines:
            with contextlib.suppress(ValueError):
                yield json.loads(line)


def _how_it_ended(rc: int) -> str:
    if rc < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-rc).name}"
        return f"was killed by signal {-rc}"
    return f"exited with code {rc}"


def supervise(args: WorkerArgs, n: int, display: Any, log_dir: Path) -> str | None:
    """Run ``n`` workers until the study has its trials; returns None, or why the sweep stopped.

    ``display``: a :class:`mlmt_bench.sweep.display.SweepDisplay` (events, warnings).
    Raises :class:`UserError` when a worker met bad input.
    """
    from mlmt_bench.tracking import utc_now

    log_dir.mkdir(parents=True, exist_ok=True)
    sel = selectors.DefaultSelector()
    started = 0

    def start() -> _Worker:
        nonlocal started
        log = log_dir / f"{args.study}-w{started}.log"
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"--- {utc_now()} worker {started} of study {args.study}\n")
            f.flush()
            proc = subprocess.Popen(
                [sys.executable, "-m", "mlmt_bench.sweep.worker",
                 json.dumps({"args": asdict(args), "worker": started})],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=f, start_new_session=True)
        w = _Worker(started, proc, log)
        started += 1
        assert proc.stdout is not None  # stdout=PIPE
        sel.register(proc.stdout, selectors.EVENT_READ, w)
        return w

    deaths = 0  # workers dead since a trial last finished
    finished = False  # a worker saw the study done
    outcome: dict[str, Any] = {}  # "error" or "stopped" of the worker that ends the sweep
    try:
        with sigterm_as_interrupt():  # SIGTERM to the parent stops the workers like Ctrl-C
            for _ in range(n):
                start()
            while sel.get_map() and not outcome:
                for key, _ in sel.select(timeout=1.0):
                    w: _Worker = key.data
                    chunk = os.read(key.fd, 65536)
                    if chunk:
                        for event in w.feed(chunk):
                            kind = event.get("event")
                            if kind in ("exit", "error"):
                                w.final = event
                                continue
                            if kind == "start":
                                w.trial = event.get("trial")
                            elif kind == "end":
                                w.trial = None
                                if event.get("state") in ("complete", "pruned"):
                                    deaths = 0
                            display.handle(w.index, event)
                        continue
                    sel.unregister(key.fileobj)
                    cast(IO[bytes], key.fileobj).close()  # a worker's stdout, registered in start()
                    rc = w.proc.wait()
                    if w.final.get("event") == "error":
                        outcome["error"] = w.final.get("message", "a worker failed")
                    elif w.final.get("event") == "exit" and rc in (0, 1):
                        if w.final.get("stopped"):
                            outcome["stopped"] = w.final["stopped"]
                        finished = finished or rc == 0
                    else:
                        deaths += 1
                        during = "" if w.trial is None else (
                            f" during trial {w.trial}, which is failed and retried once when it has had no "
                            f"heartbeat for {GRACE_FACTOR * args.heartbeat_s} s")
                        display.warn(f"worker {w.index} (pid {w.proc.pid}) {_how_it_ended(rc)}{during}; log: {w.log}")
                        if finished:
                            continue
                        if deaths < MAX_CONSECUTIVE_FAILURES:
                            new = start()
                            display.warn(f"started worker {new.index} in its place")
                        else:
                            display.warn(f"not replaced: {deaths} workers died since a trial last finished")
    finally:
        _stop([key.data for key in sel.get_map().values()])
        sel.close()
    if "error" in outcome:
        raise UserError(outcome["error"])
    if "stopped" in outcome:
        return outcome["stopped"]
    if not finished:
        return f"every worker process died; see their logs in {log_dir}"
    return None


def _stop(workers: list[_Worker]) -> None:
    """SIGTERM the workers still running (their trials are recorded as failed), then wait for them."""
    for w in workers:
        if w.proc.poll() is None:
            w.proc.terminate()
    for w in workers:
        try:
            w.proc.wait(timeout=STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            w.proc.kill()
            w.proc.wait()
        if w.proc.stdout is not None:
            w.proc.stdout.close()


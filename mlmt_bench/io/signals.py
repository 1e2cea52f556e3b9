"""SIGTERM as Ctrl-C: ``kill``, ``docker stop``, a scheduler's preemption end a run the way Ctrl-C does.

Python's default SIGTERM ends the process at once: no ``finally``, no ``except``, so a run killed that
way keeps ``status: running`` in its manifest and its trackers are never closed. Under
:func:`sigterm_as_interrupt` a SIGTERM raises :class:`KeyboardInterrupt` in the main thread instead,
and every path that handles Ctrl-C (the run marked ``interrupted``, the sweep's trial recorded, the CLI's
exit code 130) handles it too.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any


def interrupt(signum: int, frame: Any) -> None:
    """A signal handler that stops the process like Ctrl-C."""
    raise KeyboardInterrupt


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM raises KeyboardInterrupt (main thread only: elsewhere a no-op);
    the previous handler is restored after it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)

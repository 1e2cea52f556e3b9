"""Run a function under a hard wall-clock deadline, from any thread.

Why a worker process (the design choice)
----------------------------------------
math-verify bounds its sympy work with ``signal.alarm``, which only works in the main
thread of the main interpreter, and even there cannot interrupt a long computation that
runs in C without returning to the interpreter (``sympify("9**9**9**9")`` builds a huge
integer and never checks for signals). Rollout code scores responses from thread pools,
so we switch math-verify's own timeouts off (``parsing_timeout=None``,
``timeout_seconds=None``) and enforce the deadline ourselves:

* :class:`WorkerPool` keeps a few long-lived worker processes (plain ``python -c``
  subprocesses: no ``fork`` of a process that already runs threads, such as one that
  imported torch, and no re-import of the caller's ``__main__``). A call sends the pickled
  ``(function, args)`` down the worker's stdin and waits for the reply with
  ``poll(deadline)``. A worker that misses the deadline is killed and replaced on the next
  call, so a runaway computation cannot keep burning CPU or memory. Workers get an
  address-space limit, so a blow-up ends as a ``MemoryError`` in the worker. A new
  worker's start-up (about 0.5 s to import sympy and math-verify) is not charged to the
  call's deadline.
* The deadline is CPU time, with a wall-clock cap: when ``timeout`` wall seconds pass
  without an answer, the call goes on waiting while the worker has used less than
  ``timeout`` CPU seconds on it, up to ``max_wall_factor`` (4) times ``timeout`` of wall
  time. A runaway computation on an idle machine still ends after about ``timeout``
  seconds, but a check that merely waited for a CPU on a loaded machine (CI, a busy
  rollout) is not misjudged as a timeout. Where a process's CPU time cannot be read (not
  Linux), the deadline is wall time alone.
* Calls from several threads run in parallel, one worker each (up to ``max_workers``).
* Where a worker cannot be started (not a POSIX system, no ``sys.executable``),
  :func:`call_inline` runs the function in the calling process: with ``signal.setitimer``
  when on the main thread (a soft deadline), otherwise without a deadline. This fallback is
  reported in :attr:`WorkerPool.inline_reason`.

The function must be a module-level function of an importable module (it is pickled by
reference), and its arguments and result must be picklable.

Why not ``pebble`` (``ProcessPool.schedule(timeout=...)``): its deadline is wall time, which
misjudges a check that only waited for a CPU on a loaded machine, and its workers come from
``multiprocessing`` (a ``fork`` of a process running torch's threads, or a ``spawn`` that
re-imports the caller's ``__main__``); it would also be one more dependency.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mlmt_bench.machine.cpus import cpu_budget


class CallTimeout(Exception):
    """The call did not finish before its deadline."""


class WorkerCrashed(Exception):
    """The worker process died (segfault, killed for memory) before it answered."""


class WorkerRaised(Exception):
    """The function raised in the worker; the message is ``"ExcType: message"``."""


def _limit_memory(memory_limit_mb: int | None) -> None:
    if not memory_limit_mb:
        return
    try:
        import resource

        limit = int(memory_limit_mb) * 1024 * 1024
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (ImportError, ValueError, OSError):  # not on this platform: run without a limit
        pass


def _worker_main(inp: Any, out: Any, memory_limit_mb: int | None, preload: tuple[str, ...]) -> None:
    """Loop of a worker process: receive (fn, args), reply (ok, value_or_message)."""
    # The parent handles Ctrl-C; a worker interrupted mid-call would only confuse it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _limit_memory(memory_limit_mb)
    import importlib

    for name in preload:
        try:
            importlib.import_module(name)
        except Exception:  # the call itself will report the problem
            pass
    try:
        out.send("ready")
    except (EOFError, OSError):
        return
    while True:
        try:
            msg = inp.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        fn, args = msg
        try:
            reply = (True, fn(*args))
        except BaseException as exc:  # noqa: BLE001 - every failure goes back as text
            reply = (False, f"{type(exc).__name__}: {exc}"[:500])
        try:
            out.send(reply)
        except (EOFError, OSError):
            return
        except Exception as exc:  # unpicklable result
            out.send((False, f"unpicklable result: {type(exc).__name__}: {exc}"[:500]))


class _Worker:
    """A ``python -c`` subprocess speaking pickled messages over its stdin and a private
    copy of its stdout (its fd 1 is pointed at stderr, so prints cannot corrupt replies)."""

    def __init__(self, memory_limit_mb: int | None, preload: tuple[str, ...]) -> None:
        from multiprocessing.connection import Connection

        env = dict(os.environ)
        pkg_root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join([pkg_root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        code = "from mlmt_bench.verifiers.timeout import _worker_entry; _worker_entry()"
        args = [sys.executable, "-c", code, str(memory_limit_mb or 0), *preload]
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._w = Connection(os.dup(self.proc.stdin.fileno()), readable=False)
        self._r = Connection(os.dup(self.proc.stdout.fileno()), writable=False)
        self.proc.stdin.close()
        self.proc.stdout.close()

    def send(self, obj: Any) -> None:
        self._w.send(obj)

    def poll(self, timeout: float | None) -> bool:
        return self._r.poll(timeout)

    def recv(self) -> Any:
        return self._r.recv()

    def wait_ready(self, timeout: float) -> None:
        """Block until the worker has imported its preload modules (startup is not charged
        to the first call's deadline)."""
        try:
            if self._r.poll(timeout) and self._r.recv() == "ready":
                return
        except (EOFError, OSError):
            pass
        code = self.proc.poll()
        self.kill()
        raise WorkerCrashed(f"verifier worker did not start within {timeout:g} s (exit code {code})")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def cpu_seconds(self) -> float | None:
        """User + system CPU time the worker has used so far (Linux ``/proc``), or None."""
        try:
            with open(f"/proc/{self.proc.pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            # fields[0] is the state (field 3 of stat(5)); utime and stime are fields 14, 15
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            return None

    def exitcode(self) -> int | None:
        try:
            return self.proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            return None

    def _close_pipes(self) -> None:
        for conn in (self._w, self._r):
            try:
                conn.close()
            except Exception:
                pass

    def kill(self) -> None:
        try:
            self.proc.kill()
            self.proc.wait(timeout=5)
        except Exception:
            pass
        self._close_pipes()

    def stop(self) -> None:
        try:
            self._w.send(None)
            self.proc.wait(timeout=1)
        except Exception:
            pass
        if self.proc.poll() is None:
            self.kill()
        else:
            self._close_pipes()


def _die_with_parent() -> None:
    """Linux: ask for SIGKILL when the parent dies, so a worker busy with a runaway
    computation does not outlive a killed parent (it exits on EOF otherwise)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG = 1
        if os.getppid() == 1:  # parent already gone
            os._exit(0)
    except Exception:
        pass


def _worker_entry() -> None:
    """Main of a worker subprocess (see :class:`_Worker`)."""
    from multiprocessing.connection import Connection

    _die_with_parent()
    out_fd = os.dup(1)
    os.dup2(2, 1)  # stray prints go to stderr, not into the reply pipe
    sys.stdout = sys.stderr
    memory_limit_mb = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    preload = tuple(sys.argv[2:])
    _worker_main(Connection(0, writable=False), Connection(out_fd, readable=False),
                 memory_limit_mb or None, preload)


class WorkerPool:
    """Up to ``max_workers`` worker processes that run calls with a hard deadline.

    ``call(fn, args, timeout)`` returns ``fn(*args)`` or raises :class:`CallTimeout`,
    :class:`WorkerCrashed` or :class:`WorkerRaised`. ``fn`` must be a module-level function
    (it is pickled by reference) and ``args``/the result must be picklable.
    """

    def __init__(self, max_workers: int | None = None, memory_limit_mb: int | None = 4096,
                 preload: tuple[str, ...] = ()) -> None:
        self.max_workers = max(1, int(max_workers or cpu_budget()))
        self.memory_limit_mb = memory_limit_mb
        self.preload = tuple(preload)
        self.inline_reason: str | None = None
        self._idle: list[_Worker] = []
        self._n = 0  # workers alive (idle + busy)
        self._cond = threading.Condition()
        self._closed = False
        self.timeouts = 0  # workers killed for missing a deadline (for tests and logs)
        self.startup_timeout = 120.0  # seconds a new worker may take to import its modules
        self.max_wall_factor = 4.0  # wall-clock cap of a call, in multiples of its CPU deadline

    # -- worker bookkeeping -------------------------------------------------------------
    def _acquire(self) -> _Worker | None:
        with self._cond:
            while True:
                while self._idle:
                    w = self._idle.pop()
                    if w.alive():
                        return w
                    w.kill()
                    self._n -= 1
                if self._n < self.max_workers:
                    self._n += 1
                    break
                self._cond.wait()
        try:
            if os.name != "posix":
                raise OSError("worker processes need a POSIX system")
            w = _Worker(self.memory_limit_mb, self.preload)
        except Exception as exc:  # no usable interpreter, fork refused (process limit) ...
            with self._cond:
                self._n -= 1
                self.inline_reason = f"{type(exc).__name__}: {exc}"
                self._cond.notify()
            return None
        try:
            w.wait_ready(self.startup_timeout)
        except WorkerCrashed:
            with self._cond:
                self._n -= 1
                self._cond.notify()
            raise
        return w

    def _release(self, w: _Worker, ok: bool) -> None:
        with self._cond:
            if ok and not self._closed:
                self._idle.append(w)
            else:
                self._n -= 1
            self._cond.notify()
        if not ok or self._closed:
            w.kill()

    # -- public -------------------------------------------------------------------------
    def call(self, fn: Callable[..., Any], args: tuple[Any, ...], timeout: float | None) -> Any:
        if self.inline_reason is not None or self._closed:
            return call_inline(fn, args, timeout)
        w = self._acquire()
        if w is None:
            return call_inline(fn, args, timeout)
        ok = False
        try:
            try:
                cpu_at_send, sent_at = w.cpu_seconds(), time.monotonic()
                w.send((fn, args))
                ready = w.poll(timeout)
                if not ready and timeout is not None:
                    ready = self._wait_while_starved(w, timeout, cpu_at_send, sent_at)
            except (OSError, EOFError, BrokenPipeError) as exc:
                raise WorkerCrashed(f"verifier worker pipe failed: {exc}") from exc
            if not ready:
                self.timeouts += 1
                raise CallTimeout(f"no answer within {timeout:g} s")
            try:
                success, value = w.recv()
            except (EOFError, OSError) as exc:
                code = w.exitcode()
                raise WorkerCrashed(f"verifier worker died (exit code {code})") from exc
            ok = True
        finally:
            self._release(w, ok)
        if not success:
            raise WorkerRaised(value)
        return value

    def _wait_while_starved(self, w: _Worker, timeout: float, cpu_at_send: float | None, sent_at: float) -> bool:
        """The wall deadline has passed: keep waiting while the worker has used less than
        ``timeout`` CPU seconds on this call, until ``max_wall_factor * timeout`` wall
        seconds after it was sent. True if the answer arrived."""
        hard_stop = sent_at + self.max_wall_factor * timeout
        while True:
            cpu = w.cpu_seconds()
            now = time.monotonic()
            if cpu is None or cpu_at_send is None or now >= hard_stop:
                return False
            cpu_left = timeout - (cpu - cpu_at_send)
            if cpu_left <= 0:
                return False
            if w.poll(min(cpu_left, hard_stop - now)):
                return True

    def close(self) -> None:
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._n -= len(idle)
        for w in idle:
            w.stop()


def call_inline(fn: Callable[..., Any], args: tuple[Any, ...], timeout: float | None) -> Any:
    """Run ``fn(*args)`` in this process. On the main thread (POSIX) a ``SIGALRM`` timer
    raises :class:`CallTimeout` after ``timeout`` s (soft: it cannot interrupt C code);
    elsewhere the call is unbounded. A timer already armed by someone else (pytest-timeout)
    is restored afterwards with its remaining time."""
    use_alarm = (
        timeout is not None and timeout > 0 and hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
    )
    if not use_alarm:
        try:
            return fn(*args)
        except Exception as exc:
            raise WorkerRaised(f"{type(exc).__name__}: {exc}"[:500]) from exc

    def on_alarm(signum: int, frame: Any) -> None:
        raise CallTimeout(f"no answer within {timeout:g} s")

    assert timeout is not None  # use_alarm
    start = time.monotonic()
    old_handler = signal.signal(signal.SIGALRM, on_alarm)
    old_delay, old_interval = signal.setitimer(signal.ITIMER_REAL, float(timeout))
    try:
        return fn(*args)
    except CallTimeout:
        raise
    except Exception as exc:
        raise WorkerRaised(f"{type(exc).__name__}: {exc}"[:500]) from exc
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        if old_delay > 0:
            remaining = max(old_delay - (time.monotonic() - start), 1e-3)
            signal.setitimer(signal.ITIMER_REAL, remaining, old_interval)


_shared: dict[tuple[Any, ...], WorkerPool] = {}
_shared_lock = threading.Lock()


def shared_pool(max_workers: int | None = None, memory_limit_mb: int | None = 4096,
                preload: tuple[str, ...] = ()) -> WorkerPool:
    """A process-wide pool per configuration, so verifier instances share their workers."""
    key = (max_workers, memory_limit_mb, tuple(preload))
    with _shared_lock:
        pool = _shared.get(key)
        if pool is None or pool._closed:
            pool = _shared[key] = WorkerPool(max_workers, memory_limit_mb, preload)
        return pool


@atexit.register
def _close_shared() -> None:
    for pool in list(_shared.values()):
        pool.close()

"""The test evaluator E: evaluates the tests against the candidate C, asking C only for values.

:func:`evaluator_main` runs in E, forked by the judge J before C and isolated like C under a
uid of its own; it reads the tests and C's pid from J, prepares each test (:mod:`.rewrite`),
evaluates it in its own interpreter through :class:`Judge` (E's end of the channels to C:
requests out, results, C's output and its monitor's exit report in, all under the run's
deadline) and writes its report to J. Standard library only (see the package docstring).
"""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import struct
import time

from . import wire
from .jail import (
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWUTS,
    PR_SET_DUMPABLE,
    PR_SET_PDEATHSIG,
    build_jail,
    close_fds_but,
    drop_privileges,
    join_cgroups,
    prctl,
    set_rlimits,
    unshare,
)
from .rewrite import judge_setup, prepare_test, top_level_defs
from .wire import (
    DETAIL_CHARS,
    MAX_FRAME,
    MAX_ITEMS,
    MAX_STRUCTURE,
    decode_value,
    encode_value,
    read_frame,
    structure_count,
    write_frame,
)

TYPE_CHECKING = False  # for the type checker only: the judge imports no typing at run time
if TYPE_CHECKING:
    from typing import Any


def signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def exit_description(status: int) -> str:
    """``killed by SIGNAME`` or ``exited with code N``, from a wait status."""
    if os.WIFSIGNALED(status):
        return f"killed by {signal_name(os.WTERMSIG(status))}"
    return f"exited with code {os.WEXITSTATUS(status)}"


class RemoteError(Exception):
    def __init__(self, etype: str, message: str) -> None:
        super().__init__(message)
        self.etype = etype


class ProgramGone(Exception):
    """C is dead, timed out, or broke the protocol: no more answers."""


class Judge:
    def __init__(self, cfg: dict, pid: int, resp_r: int, out_r: int, err_r: int, req_w: int) -> None:
        self.cfg = cfg
        self.pid = pid
        self.req_w = req_w
        self.deadline = time.monotonic() + float(cfg["timeout_s"])
        self.output_cap = int(cfg["output_bytes"])
        self.out_bytes = 0
        self.tails = {out_r: bytearray(), err_r: bytearray()}
        self.out_r, self.err_r, self.resp_r = out_r, err_r, resp_r
        self.buf = bytearray()
        self.frames: list = []
        self.violation: str | None = None
        self.status: str | None = None  # set when C is gone: timeout / died / output_limit / protocol
        self.exit_desc = ""
        self.exit_signal = 0
        self.reaped = False
        self.next_id = 0
        self.poll = select.poll()
        for fd in (resp_r, out_r, err_r):
            os.set_blocking(fd, False)
            self.poll.register(fd, select.POLLIN)
        try:
            self.pidfd: int | None = os.pidfd_open(pid)
            self.poll.register(self.pidfd, select.POLLIN)
        except (AttributeError, OSError):
            self.pidfd = None
        self.open_fds = {resp_r, out_r, err_r}

    # -- low level
    def _drain(self, fd: int) -> None:
        while True:
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if not chunk:
                self.poll.unregister(fd)
                self.open_fds.discard(fd)
                return
            if fd == self.resp_r:
                self.buf += chunk
                if len(self.buf) > MAX_FRAME + 4:
                    self._parse_frames()
                    if len(self.buf) > MAX_FRAME + 4:
                        self._gone("protocol", "result channel flooded")
                        return
            else:
                self.out_bytes += len(chunk)
                tail = self.tails[fd]
                tail += chunk
                del tail[:-2000]
                if self.out_bytes > self.output_cap:
                    self.violation = self.violation or f"output limit exceeded ({self.output_cap} bytes)"
                    self._gone("output_limit", "output limit exceeded")
                    return
        # not reached

    def _parse_frames(self) -> None:
        while len(self.buf) >= 4:
            (n,) = struct.unpack(">I", self.buf[:4])
            if n > MAX_FRAME:
                self.violation = self.violation or "result larger than the limit"
                self._gone("protocol", "oversized frame")
                self.buf.clear()
                return
            if len(self.buf) < 4 + n:
                return
            with memoryview(self.buf) as view, view[4:4 + n] as part:
                raw = bytes(part)
            del self.buf[:4 + n]
            if structure_count(raw) > MAX_STRUCTURE:  # not parsed: the pending request fails
                self.frames.append({"t": "result", "id": self.next_id, "ok": False, "etype": "ResultTooLarge",
                                    "error": f"result too large to decode (more than {MAX_ITEMS} items)"})
                continue
            try:
                frame = json.loads(raw)
            except (ValueError, RecursionError, MemoryError):
                frame = {"t": "garbage"}
            if not isinstance(frame, dict):
                frame = {"t": "garbage"}
            if frame.get("t") == "violation":
                self.violation = self.violation or str(frame.get("what"))[:DETAIL_CHARS]
                continue
            if frame.get("t") == "exit":
                # from the monitor, after the candidate ended (the last one wins: a forged one
                # written earlier by the candidate is overwritten)
                sig, code = frame.get("signal"), frame.get("code")
                if type(sig) is int and sig > 0:
                    self.exit_signal = sig
                    self.exit_desc = f"killed by {signal_name(sig)}"
                elif type(code) is int:
                    self.exit_signal = 0
                    self.exit_desc = f"exited with code {code}"
                continue
            self.frames.append(frame)

    def _child_exited(self, block: bool = False) -> bool:
        """Has the monitor process (J's child) ended? Reaps it."""
        if self.reaped:
            return True
        try:
            pid, status = os.waitpid(self.pid, 0 if block else os.WNOHANG)
        except ChildProcessError:
            self.reaped = True
            return True
        if pid == 0:
            return False
        self.reaped = True
        if not self.exit_desc:  # no report from the monitor: it was killed (by J, on a limit)
            self.exit_desc = exit_description(status)
        return True

    def _drain_all(self) -> None:
        """Pick up what is left in the pipes (non-blocking), e.g. the monitor's exit frame."""
        for fd in list(self.open_fds):
            try:
                self._drain(fd)
            except Exception:  # noqa: BLE001
                pass
        try:
            self._parse_frames()
        except Exception:  # noqa: BLE001
            pass

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):  # E, after its uid drop: J kills C once E reports
            pass

    def _gone(self, status: str, why: str) -> None:
        if self.status is None:
            self.status = status
        self.kill()

    def next_frame(self):
        """Next frame from C (blocking until the deadline); raises ProgramGone."""
        while True:
            if self.frames:
                return self.frames.pop(0)
            if self.status is not None:
                raise ProgramGone(self.status)
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                self._gone("timeout", "timeout")
                raise ProgramGone("timeout")
            events = self.poll.poll(min(remaining, 0.5) * 1000)
            for fd, _ev in events:
                if fd == self.pidfd:
                    continue
                self._drain(fd)
            self._parse_frames()
            if self.frames:
                continue
            if (self.pidfd is not None and any(fd == self.pidfd for fd, _ in events)) or \
                    (self.pidfd is None and not events and self._child_exited()):
                # C is gone: pick up whatever it wrote before dying
                for fd in list(self.open_fds):
                    self._drain(fd)
                self._parse_frames()
                if self.frames:
                    continue
                self._child_exited()
                if self.status is None:
                    self.status = "died"
                raise ProgramGone(self.status)
            if self.resp_r not in self.open_fds and not self.frames and self.status is None:
                # the channel was closed (e.g. C closed it); treat as death
                self._gone("died", "channel closed")

    def send(self, obj) -> None:
        try:
            write_frame(self.req_w, obj)
        except OSError:
            self._gone("died", "request channel closed")
            raise ProgramGone(self.status) from None

    def remote(self, src: str, local_values: dict):
        enc = {k: encode_value(v) for k, v in local_values.items()}
        return self._request({"t": "eval", "src": src, "locals": enc})

    def call(self, handle: int, args: tuple, kwargs: dict):
        enc_args = [encode_value(a) for a in args]
        enc_kwargs = {str(k): encode_value(v) for k, v in kwargs.items()}
        return self._request({"t": "call", "h": handle, "args": enc_args, "kwargs": enc_kwargs})

    def _request(self, msg: dict):
        if self.status is not None:
            raise ProgramGone(self.status)
        self.next_id += 1
        rid = self.next_id
        msg["id"] = rid
        self.send(msg)
        while True:
            frame = self.next_frame()
            if frame.get("t") != "result" or frame.get("id") != rid:
                continue  # stale or forged frames are ignored
            if frame.get("ok") is True:
                try:
                    return decode_value(frame.get("v"))
                except (ValueError, TypeError, RecursionError, OverflowError, MemoryError) as exc:
                    raise RemoteError("BadResult",
                                      f"unusable result: {type(exc).__name__}: {exc}"[:DETAIL_CHARS]) from exc
            raise RemoteError(str(frame.get("etype"))[:60], str(frame.get("error"))[:DETAIL_CHARS])


def evaluator_main(cfg: dict, fds: dict) -> None:
    """The test evaluator E, forked by J before C: isolated like C (the run's cgroups, a network
    namespace, a jail of its own, rlimits, no_new_privs and a private uid ``cfg["eval_uid"]``),
    then it reads the tests and C's pid from J, evaluates the tests against C (the :class:`Judge`)
    and writes its report to J. The tests may be as untrusted as the program (a ``verify`` input
    line brings its own): here they can harm neither the host nor J. Never returns."""
    try:
        null = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):  # J's stdin (the tests' channel from the host), stdout and stderr
            os.dup2(null, fd)
        close_fds_but({0, 1, 2, *fds.values()})
        mechanisms = []
        if cfg.get("cgroup_dirs"):
            join_cgroups(cfg["cgroup_dirs"])
            mechanisms.append("evaluator_cgroup")
        flags = (CLONE_NEWNET if cfg.get("netns") else 0) | \
            (CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS if cfg.get("jail") else 0)
        if flags:
            unshare(flags)
        if cfg.get("netns"):
            mechanisms.append("evaluator_netns")
        uid = cfg.get("eval_uid")
        if cfg.get("jail"):
            build_jail({**cfg, "pidns": False}, uid)  # no /proc: E is in the host's PID namespace
            mechanisms.append("evaluator_jail")
        else:
            os.chdir("/")
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        set_rlimits([
            (resource.RLIMIT_CPU, int(float(cfg["timeout_s"]) * 2 + 10)),
            (resource.RLIMIT_AS, (int(cfg["memory_mb"]) + 256) << 20),
            (resource.RLIMIT_FSIZE, int(cfg["fsize_mb"]) << 20),
            (resource.RLIMIT_NOFILE, int(cfg["nofile"])),
            (resource.RLIMIT_CORE, 0),
            (resource.RLIMIT_NPROC, int(cfg["nproc"] if uid is not None else cfg["nproc_abs"])),
        ])
        if drop_privileges(uid):
            mechanisms.append("evaluator_uid_drop")
        prctl(PR_SET_DUMPABLE, 0)
        os.umask(0o077)
        msg = read_frame(fds["tests_r"], limit=1 << 30)
        os.close(fds["tests_r"])
        tests, pid = list(msg["tests"]), int(msg["pid"])
    except BaseException as exc:  # noqa: BLE001
        try:
            write_frame(fds["report_w"], {"setup_error": f"test evaluator: {type(exc).__name__}: {exc}"[:500]})
        finally:
            os._exit(70)
    os.write(fds["report_w"], b"R")  # J's deadline starts now
    report: dict[str, Any] = {"status": "starting", "passed": [False] * len(tests), "details": [""] * len(tests),
                              "mechanisms": [], "load_error": None, "load_etype": None}
    judge = Judge(cfg, pid, fds["resp_r"], fds["out_r"], fds["err_r"], fds["req_w"])
    try:
        _judge_run(judge, cfg, tests, report)
    except ProgramGone:
        pass
    except BaseException as exc:  # noqa: BLE001 - report rather than die silently
        report["status"] = "internal"
        report["load_error"] = f"judge error: {type(exc).__name__}: {exc}"[:500]
    try:
        judge._drain_all()  # e.g. the monitor's exit frame
        report["mechanisms"] += mechanisms
        write_frame(fds["report_w"], {
            "report": report, "gone": judge.status, "violation": judge.violation, "exit": judge.exit_desc,
            "exit_signal": judge.exit_signal, "stdout": judge.tails[fds["out_r"]].decode("utf-8", "replace"),
            "stderr": judge.tails[fds["err_r"]].decode("utf-8", "replace")})
    finally:
        os._exit(0)


def _judge_run(judge: Judge, cfg: dict, tests: list, report: dict) -> None:
    first = judge.next_frame()
    if first.get("t") == "setup_error":
        report["status"] = "sandbox_error"
        report["load_error"] = str(first.get("error"))[:500]
        raise ProgramGone("sandbox_error")
    if first.get("t") != "ready":
        report["status"] = "sandbox_error"
        report["load_error"] = "candidate process did not start"
        raise ProgramGone("sandbox_error")
    report["mechanisms"] = [str(m) for m in first.get("mechanisms", [])]
    report["status"] = "loading"
    # prepare the tests while C loads the program
    ns, setup_bound = judge_setup(cfg.get("setup") or "")
    program_defs = top_level_defs(cfg["program"])
    table: list[str] = []
    codes = []
    for i, test in enumerate(tests):
        try:
            codes.append(prepare_test(test, ns, setup_bound, program_defs, table))
        except BaseException as exc:  # noqa: BLE001
            codes.append(None)
            report["details"][i] = f"test cannot be parsed: {type(exc).__name__}: {exc}"[:DETAIL_CHARS]

    def remote(idx, local_values):
        return judge.remote(table[idx], local_values)

    ns["__mlmt_remote__"] = remote
    wire.use_judge(judge)
    frame = judge.next_frame()
    if frame.get("t") == "load_error":
        report["status"] = "load_error"
        report["load_etype"] = str(frame.get("etype"))[:60]
        report["load_error"] = str(frame.get("error"))[:DETAIL_CHARS]
        raise ProgramGone("load_error")
    if frame.get("t") != "loaded":
        report["status"] = "protocol"
        report["load_error"] = "unexpected message from the program"
        raise ProgramGone("protocol")
    report["status"] = "loaded"
    for i, code in enumerate(codes):
        if code is None:
            continue
        try:
            exec(code, ns)  # noqa: S102 - trusted test code; candidate values are plain data
            report["passed"][i] = True
        except AssertionError as exc:
            report["details"][i] = ("AssertionError" + (f": {exc}" if str(exc) else ""))[:DETAIL_CHARS]
        except RemoteError as exc:
            report["details"][i] = str(exc)[:DETAIL_CHARS]
            if exc.etype == "MemoryError":
                judge.violation = judge.violation or "memory limit exceeded"
        except ProgramGone as exc:
            report["details"][i] = f"program stopped: {exc}"
            for j in range(i + 1, len(codes)):
                report["details"][j] = report["details"][j] or f"program stopped: {exc}"
            raise
        except BaseException as exc:  # noqa: BLE001
            report["details"][i] = f"{type(exc).__name__}: {exc}"[:DETAIL_CHARS]
    report["status"] = "ok"
    try:
        judge.send({"t": "exit"})
    except ProgramGone:
        pass


"""The judge process J: supervises one run and writes its verdict for the host.

:func:`judge_main` is the judge's entry point (the archive's ``__main__``, see the package
docstring): with ``--probe`` it prints which isolation mechanisms work (:mod:`.probe`);
otherwise it reads the run's config from stdin, makes the run's cgroups, forks the evaluator E
(:mod:`.evaluator`) and the candidate C (:mod:`.candidate`), reads the tests from stdin only
then and hands them to E, waits for E's report (killing E :data:`EVAL_GRACE_S` after E's own
deadline), checks that report as data (:func:`_checked_report`), kills what is left and writes
the verdict on its stdout. Standard library only.
"""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import struct
import sys
import time

from .candidate import PREIMPORT, candidate_main
from .evaluator import evaluator_main, exit_description, signal_name
from .jail import (
    CLONE_NEWPID,
    PR_SET_CHILD_SUBREAPER,
    PR_SET_DUMPABLE,
    make_cgroups,
    oom_kills,
    prctl,
    remove_cgroups,
    unshare,
)
from .probe import probe
from .wire import DETAIL_CHARS, read_frame, structure_count, write_all, write_frame

TYPE_CHECKING = False  # for the type checker only: the judge imports no typing at run time
if TYPE_CHECKING:
    from typing import Any

EVAL_GRACE_S = 2.0  # J kills E this long after E's own deadline (E stuck in a C-level computation)

_REPORT_STATUSES = frozenset({"starting", "loading", "loaded", "ok", "load_error", "sandbox_error", "protocol",
                              "internal", "timeout", "died", "output_limit"})


def judge_main() -> None:
    os.environ.clear()
    try:
        prctl(PR_SET_DUMPABLE, 0)  # C (same uid in the fallback mode) cannot ptrace J or read /proc/J/fd
    except OSError:
        pass
    _close_own_script()
    if len(sys.argv) > 1 and sys.argv[1] == "--probe":
        print(json.dumps(probe()), flush=True)
        return
    try:
        prctl(PR_SET_CHILD_SUBREAPER, 1)
    except OSError:
        pass
    report_fd = os.dup(1)
    null = os.open("/dev/null", os.O_RDWR)
    os.dup2(null, 1)  # nothing J imports or runs may write into the report stream
    t0 = time.monotonic()
    cfg = read_frame(0, limit=1 << 30)
    epid, pid, tests_w, report_r = _fork_evaluator_and_candidate(cfg)
    # the tests arrive only now, after the fork: C never had them in its memory
    part2 = read_frame(0, limit=1 << 30)
    os.close(0)
    tests = list(part2["tests"])
    try:
        write_frame(tests_w, {"tests": tests, "pid": pid})
    except OSError:
        pass  # E died in its setup: its report says why
    os.close(tests_w)
    try:
        cpu = int(float(cfg["timeout_s"]) * 2 + 10)
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    except (ValueError, OSError):
        pass
    timeout_s = float(cfg["timeout_s"])
    msg, ready, timed_out = _read_evaluator(report_r, time.monotonic() + timeout_s + 5.0, timeout_s, len(tests))
    os.close(report_r)
    e_status = _reap(epid)
    c_status = _reap(pid)
    report = _verdict(_checked_report(msg, len(tests)), part2["nonce"], msg is not None, ready, timed_out,
                      e_status, c_status)
    report["judge_s"] = round(time.monotonic() - t0, 4)
    _end_run(cfg, report)
    write_all(report_fd, (json.dumps(report) + "\n").encode())


def _close_own_script() -> None:
    """Close the descriptor this script was read from, if it was passed as one (``/dev/fd/N``)."""
    if sys.argv[0].startswith("/dev/fd/"):
        try:
            os.close(int(sys.argv[0][len("/dev/fd/"):]))
        except (ValueError, OSError):
            pass


def _fork_evaluator_and_candidate(cfg: dict) -> tuple[int, int, int, int]:
    """Make the run's channels and cgroups (``cfg["cgroup_dirs"]``), fork E, then C (in a new PID
    namespace when ``cfg["pidns"]``). Returns (E's pid, C's pid, the write end of E's tests
    channel, the read end of E's report channel); J keeps no other end."""
    req_r, req_w = os.pipe()
    resp_r, resp_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    tests_r, tests_w = os.pipe()
    report_r, report_w = os.pipe()
    parent_mech = []
    cg_dirs = []
    if cfg.get("cgroup"):
        cg_dirs = make_cgroups(f"mlmt-{cfg['token']}", int(cfg["total_memory_mb"]) << 20, int(cfg["nproc"]) + 8)
    cfg["cgroup_dirs"] = cg_dirs
    if not cfg.get("jail"):
        _preimport()
    # E first, in J's own PID namespace: it must outlive C's (which ends with C's monitor)
    epid = os.fork()
    if epid == 0:
        try:
            evaluator_main(cfg, {"tests_r": tests_r, "report_w": report_w, "req_w": req_w, "resp_r": resp_r,
                                 "out_r": out_r, "err_r": err_r})
        finally:
            os._exit(71)
    os.close(tests_r)
    os.close(report_w)
    if cfg.get("pidns"):
        unshare(CLONE_NEWPID)
        parent_mech.append("pidns")
    cfg["parent_mechanisms"] = parent_mech
    pid = os.fork()
    if pid == 0:
        try:
            candidate_main(cfg, req_r, resp_w, out_w, err_w)
        finally:
            os._exit(71)
    for fd in (req_r, resp_w, out_w, err_w, req_w, resp_r, out_r, err_r):
        os.close(fd)
    return epid, pid, tests_w, report_r


def _preimport() -> None:
    """Import :data:`~.candidate.PREIMPORT` (C and E inherit them; see there)."""
    for mod in PREIMPORT:
        try:
            __import__(mod)
        except Exception:  # noqa: BLE001
            pass


def _verdict(got: dict, nonce: str, reported: bool, ready: bool, timed_out: bool, e_status: int | None,
             c_status: int | None) -> dict:
    """The verdict for the host from E's checked report ``got`` (see :func:`_checked_report`;
    ``reported``: whether E sent a usable one), how E started and ended (``ready``, ``timed_out``,
    its wait status ``e_status``) and C's wait status ``c_status``."""
    report = {"nonce": nonce, **{k: got[k] for k in ("status", "passed", "details", "mechanisms",
                                                     "load_error", "load_etype")}}
    # no report from the monitor: it was killed (by J, on a limit)
    exit_desc = got["exit"] or (exit_description(c_status) if c_status is not None else "")
    gone = got["gone"]
    if not reported:
        gone = _no_report(report, ready, timed_out, e_status)
    elif got["setup_error"]:
        report["status"] = "starting"
        report["load_error"] = got["setup_error"]
    if gone is not None and report["status"] in ("loading", "loaded"):
        report["status"] = gone
    elif report["status"] == "starting":
        report["status"] = "sandbox_error"
        report["load_error"] = report["load_error"] or (
            f"sandboxed process failed to start ({gone or 'no reply'}; {exit_desc})")
    _explain_not_run(report, exit_desc)
    report["violation"] = got["violation"]
    report["exit"] = exit_desc
    report["exit_signal"] = got["exit_signal"]
    report["stdout"] = got["stdout"]
    report["stderr"] = got["stderr"]
    return report


def _explain_not_run(report: dict, exit_desc: str) -> None:
    """Give each failed test without a detail one: not run, and why (the run's status, how C ended)."""
    for i, ok in enumerate(report["passed"]):
        if not ok and not report["details"][i]:
            report["details"][i] = f"not run ({report['status']}{'; ' + exit_desc if exit_desc else ''})"


def _no_report(report: dict, ready: bool, timed_out: bool, e_status: int | None) -> str | None:
    """E sent nothing usable: timed out by J, or died (a limit, the memory cgroup). Sets the
    report's status and error; returns how C's run ended (None: it never started)."""
    killed = f" ({signal_name(os.WTERMSIG(e_status))})" if e_status is not None and os.WIFSIGNALED(e_status) else ""
    report["status"] = "starting" if not ready else "loaded"
    report["load_error"] = "the test evaluator " + ("timed out" if timed_out else "ended without a report" + killed)
    return "timeout" if timed_out and ready else "died" if ready else None


def _end_run(cfg: dict, report: dict) -> None:
    """Kill what is left of the run, note a memory cgroup's OOM kill in ``report`` and remove the
    run's cgroups."""
    if not cfg.get("pidns"):
        uids: set[Any] = {cfg.get("uid"), cfg.get("eval_uid")} - {None}
        for uid in uids:
            _reap_uid(int(uid))
    _kill_descendants()  # orphans of E (outside C's PID namespace) and, without one, of C
    cg_dirs = cfg["cgroup_dirs"]
    if cg_dirs:
        if oom_kills(cg_dirs) and not report["violation"]:
            report["violation"] = "memory limit exceeded (the run's memory cgroup)"
        remove_cgroups(cg_dirs)


def _kill_descendants() -> None:
    """J is a child subreaper: every orphan of the run is re-parented to J. Kill and reap them
    until none is left (double forks and setsid included; needed without a PID namespace)."""
    me = os.getpid()
    for _ in range(200):
        kids = []
        try:
            names = os.listdir("/proc")
        except OSError:
            return
        for name in names:
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat", "rb") as fh:
                    stat = fh.read()
                ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid == me:
                kids.append(int(name))
        if not kids:
            return
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                time.sleep(0.002)


def _read_evaluator(fd: int, start_by: float, timeout_s: float, n_tests: int):
    """(E's report: a dict, or None if it sent none usable; whether E got ready; whether J timed
    it out): waits for E's ready byte until ``start_by``, then ``timeout_s`` + :data:`EVAL_GRACE_S`
    for the report. Nothing E sends is trusted (see :func:`_checked_report`): it is read up to the size an
    honest report of ``n_tests`` can have, and parsed only if its structure is that small too."""
    limit = (128 << 10) + n_tests * (DETAIL_CHARS * 6 + 16)
    structure_limit = n_tests * (DETAIL_CHARS + 4) + 8192
    buf = bytearray()
    ready, timed_out = False, False
    deadline = start_by
    poll = select.poll()
    poll.register(fd, select.POLLIN)
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            timed_out = True
            break
        if not poll.poll(remaining * 1000):
            continue
        try:
            chunk = os.read(fd, 1 << 16)
        except OSError:
            chunk = b""
        if not chunk:
            break
        buf += chunk
        if not ready and buf[:1] == b"R":
            ready = True
            del buf[:1]
            deadline = time.monotonic() + timeout_s + EVAL_GRACE_S
        if len(buf) > limit + 4:
            break
    if timed_out or len(buf) < 4:
        return None, ready, timed_out
    (n,) = struct.unpack(">I", bytes(buf[:4]))
    raw = bytes(buf[4:4 + n])
    if n > limit or len(raw) != n or structure_count(raw) > structure_limit:
        return None, ready, False
    try:
        msg = json.loads(raw)
    except (ValueError, RecursionError, MemoryError):
        return None, ready, False
    return (msg if isinstance(msg, dict) else None), ready, False


def _text(value, limit: int) -> str | None:
    return None if value is None else str(value)[:limit] if isinstance(value, (str, int, float)) else "?"


def _checked_report(msg: dict | None, n_tests: int) -> dict:
    """J's fields from E's report, each checked for type and length (E runs the tests, which may
    be untrusted: what it says is data)."""
    msg = msg if isinstance(msg, dict) else {}
    rep = msg.get("report")
    rep = rep if isinstance(rep, dict) else {}
    passed = rep.get("passed")
    details = rep.get("details")
    status = rep.get("status")
    gone = msg.get("gone")
    mechanisms = rep.get("mechanisms")
    sig = msg.get("exit_signal")
    return {
        "status": status if status in _REPORT_STATUSES else "protocol",
        "passed": [p is True for p in passed] if isinstance(passed, list) and len(passed) == n_tests
        else [False] * n_tests,
        "details": [str(d)[:DETAIL_CHARS] if isinstance(d, str) else "" for d in details]
        if isinstance(details, list) and len(details) == n_tests else [""] * n_tests,
        "mechanisms": [str(m)[:60] for m in mechanisms[:40]] if isinstance(mechanisms, list) else [],
        "load_error": _text(rep.get("load_error"), 500), "load_etype": _text(rep.get("load_etype"), 60),
        "gone": gone if gone in _REPORT_STATUSES else None,
        "violation": _text(msg.get("violation"), DETAIL_CHARS), "exit": _text(msg.get("exit"), 200) or "",
        "exit_signal": sig if type(sig) is int and 0 <= sig < 128 else 0,
        "stdout": _text(msg.get("stdout"), 4000) or "", "stderr": _text(msg.get("stderr"), 4000) or "",
        "setup_error": _text(msg.get("setup_error"), 500),
    }


def _reap(pid: int) -> int | None:
    """Wait for J's child ``pid`` (killed first); its wait status, or None if already reaped."""
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
    while True:
        try:
            return os.waitpid(pid, 0)[1]
        except ChildProcessError:
            return None
        except InterruptedError:
            continue


def _reap_uid(uid: int) -> None:
    """Without a PID namespace: kill every process of the run's uid (kill(-1) as that uid)."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            for _ in range(3):
                try:
                    os.kill(-1, signal.SIGKILL)
                except ProcessLookupError:
                    break
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


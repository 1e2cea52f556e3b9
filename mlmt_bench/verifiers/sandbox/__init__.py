"""Run an untrusted program against trusted tests in an isolated, resource-limited process.

Public API: :class:`Limits`, :class:`RunResult`, :func:`run_tests`, :func:`capabilities`.

Each :func:`run_tests` call starts a throwaway *judge* process (the package ``judge/``, a new
session, run with ``python -I -S -B`` and a scrubbed environment; the package is passed as a
zip archive in a memfd and the interpreter by its real path, so the command line shows no host
path). The judge forks the *candidate* process, which isolates itself and runs the program, and the *evaluator*,
isolated the same way under a uid of its own, which evaluates the tests and asks the candidate
only for the values of candidate-dependent sub-expressions: results cannot be forged from
inside the candidate, and tests that came with the input (untrusted too) never run as root on
the host (see the module docstring of :mod:`mlmt_bench.verifiers.sandbox.judge`).

Isolation used, depending on what :func:`capabilities` finds (all of it when running as root
on Linux with namespaces allowed, as on this project's machines):

==================  ===========================================================================
``uid_drop``        a random unprivileged uid/gid per run (>= 10^9, no passwd entry), no
                    supplementary groups, ``no_new_privs``: cannot signal or ptrace the host,
                    RLIMIT_NPROC is enforced (it is not for root), set-uid binaries do nothing.
``pidns``           the candidate is PID 1 of a new PID namespace: when it ends, the kernel
                    kills every process it started (double fork, setsid, nohup included).
``netns``           new network namespace with only a down loopback: no connect, no bind.
``cgroup``          per-run cgroup-v1 memory and pids groups: total memory (RSS + tmpfs) and task
                    count of the whole run, however many processes it forks.
``jail``            new mount/IPC/UTS namespaces; chroot into a private tmpfs that shows only
                    what the interpreter needs to start and import its standard library
                    (``judge.jail.jail_plan``, worked out by the probe), read-only: the
                    interpreter binary, its dynamic loader and /etc/ld.so.cache (the only file
                    of /etc), the shared libraries it and the stdlib's extension modules map
                    (libpython, libc, libm, libssl, libcrypto, libffi, libz, libbz2, liblzma,
                    libsqlite3, libuuid, libcrypt ...) with their soname symlinks, the C.UTF-8
                    locale and gconv cache, and the stdlib directory with lib-dynload, its
                    site-packages covered by an empty directory; plus /dev/{null,zero,full,
                    random,urandom}, a fresh /proc, and the writable /sandbox (the cwd), /tmp,
                    /var/tmp, /dev/shm, which vanish with the namespace. No /usr/bin (no shell),
                    no site-packages, no project, datasets or home directories.
                    ``tests/test_sandbox.py::test_what_the_jail_shows`` lists it.
always              new session + process-group SIGKILL, RLIMIT_CPU/AS/FSIZE/NOFILE/NPROC/CORE,
                    wall-clock deadline, stdout+stderr cap (the judge reads at most
                    ``output_bytes`` then kills), stdin = /dev/null, scrubbed environment,
                    Python audit hook refusing non-AF_UNIX sockets (reported as a violation).
==================  ===========================================================================

Without root (``uid_drop`` etc. unavailable) the fallback is weaker: the candidate runs as the
host's user (it could signal same-user processes), leftover processes are found by an
environment marker, the working directory is a host temp dir, and the network block is the
Python-level audit hook only. ``capabilities()`` says which mode is active.

Weakening the sandbox on purpose (to debug, or to test the fallback paths) is an explicit
argument only: ``capabilities(disable=("jail", "netns"))`` passed as ``run_tests(caps=...)``,
or the code verifier's ``sandbox_disable`` option, which a run takes from its spec
(``benchmark.verifier_options.sandbox_disable``), prints at start and records in its manifest.
The environment alone cannot do it: ``MLMT_SANDBOX_DISABLE``, which once did, is refused.

Why written here rather than taken from a tool: nsjail, bubblewrap and firejail are system
binaries that pip cannot install (none is on the development machine), and Docker needs a daemon
and an image per call; this uses the kernel's own mechanisms from Python, takes whichever of them
the machine allows, and says which (``capabilities``).
"""

from __future__ import annotations

import functools
import importlib.util
import io
import json
import logging
import marshal
import os
import secrets
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlmt_bench.errors import UserError
from mlmt_bench.io.bounded_input import short_repr

log = logging.getLogger(__name__)

JUDGE_PACKAGE = Path(__file__).with_name("judge")  # what the judge process runs (see _judge_archive)
MECHANISMS = ("uid_drop", "pidns", "netns", "jail", "cgroup")
# Once read to turn mechanisms off; now refused when set (anyone who can set a variable for a
# worker could silently switch isolation off): see check_environment.
DISABLE_ENV = "MLMT_SANDBOX_DISABLE"
_WORLD_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
_JUDGE_ARCHIVE_PACKAGE = "_sandbox_judge"  # judge/'s name in the archive (a name no program imports)
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)


@dataclass(frozen=True)
class Limits:
    """Per-run limits. ``timeout_s`` covers loading the program and running all its tests."""

    timeout_s: float = 10.0
    memory_mb: int = 512  # RLIMIT_AS of each candidate process
    nproc: int = 32  # processes + threads of the run (RLIMIT_NPROC of its private uid)
    fsize_mb: int = 16  # largest file it may write (RLIMIT_FSIZE); its tmpfs is 4x this, >= 64 MB
    output_bytes: int = 1 << 20  # stdout + stderr it may print before being killed
    nofile: int = 256
    total_memory_mb: int | None = None  # memory cgroup of the whole run; None: 2 * memory_mb + 128


@dataclass
class RunResult:
    """What happened to one program.

    status: ok (all tests evaluated) | load_error (exception while running the program or the
            setup) | timeout | died (exited / killed by a signal before the tests finished) |
            output_limit | protocol (garbage on the result channel) | sandbox_error (the
            sandbox itself failed: not the candidate's fault).
    """

    status: str
    passed: list[bool]
    details: list[str]
    error: str | None = None
    error_type: str | None = None
    violation: str | None = None
    exit: str = ""
    exit_signal: int = 0
    mechanisms: list[str] = field(default_factory=list)
    stdout: str = ""
    stderr: str = ""
    wall_s: float = 0.0
    uid: int | None = None  # the run's private uid (None without uid_drop)
    token: str = ""  # value of MLMT_SANDBOX in the run's environment

    @property
    def n_passed(self) -> int:
        return sum(self.passed)


_caps: dict[str, Any] | None = None
_caps_lock = threading.Lock()
_uid_lock = threading.Lock()
_uids_in_use: set[int] = set()


def _python() -> str:
    return sys.executable or "python3"


# The judge archive's entry point: every judge module is imported by the first import, before
# judge_main closes the archive's descriptor; the archive then leaves sys.path, which is as a
# plain script's would be under -I (the candidate and the evaluator inherit it).
_JUDGE_MAIN = f"""import sys
from {_JUDGE_ARCHIVE_PACKAGE}.supervisor import judge_main
sys.path[:] = [p for p in sys.path if p != sys.argv[0]]
judge_main()
"""


@functools.cache
def _judge_archive() -> bytes:
    """The judge as a zip archive Python can run (built once per process): the modules of
    ``judge/`` (standard library only, importing one another relatively) as the package
    ``_sandbox_judge``, and a ``__main__.py`` that runs :func:`judge.supervisor.judge_main`.

    The modules go in compiled (``.pyc``, for this interpreter, which is the one that runs the
    judge: :func:`_judge_command`), with no source beside them: zipimport compiles a source
    module twice (once to name its file), which made each judge start ~40 ms slower than the
    single script it replaces."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr(zipfile.ZipInfo("__main__.py", _ZIP_DATE), _JUDGE_MAIN)
        for path in sorted(JUDGE_PACKAGE.glob("*.py")):
            name = f"{_JUDGE_ARCHIVE_PACKAGE}/{path.stem}.pyc"
            archive.writestr(zipfile.ZipInfo(name, _ZIP_DATE), _bytecode(path.read_bytes(), name[:-1]))
    return buf.getvalue()


def _bytecode(source: bytes, filename: str) -> bytes:
    """``source`` compiled as a ``.pyc`` file: unchecked hash-based (there is no source to check
    it against), not optimised (the judge runs without -O), without this module's ``__future__``
    flags."""
    code = compile(source, filename, "exec", dont_inherit=True, optimize=0)
    flags = 0b01  # hash-based, unchecked (PEP 552)
    return (importlib.util.MAGIC_NUMBER + flags.to_bytes(4, "little") + importlib.util.source_hash(source)
            + marshal.dumps(code))


def _judge_command(*args: str) -> tuple[list[str], tuple[int, ...]]:
    """argv of the judge and the file descriptors it inherits. The interpreter is named by its
    real path (the one the jail shows; not a virtualenv's link) and the judge is read from a
    memfd (``/dev/fd/N``: the archive of :func:`_judge_archive`), so that no host path
    (virtualenv, package) is in the command line a sandboxed process can read
    (``/proc/self/cmdline``). The caller closes the descriptors."""
    python = os.path.realpath(_python())
    try:
        fd = os.memfd_create("mlmt-judge", 0)
    except (AttributeError, OSError):  # no memfd: an unlinked temporary file
        fd, path = tempfile.mkstemp(prefix="mlmt-judge-")
        os.unlink(path)
    try:
        data = _judge_archive()
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return [python, "-I", "-S", "-B", f"/dev/fd/{fd}", *args], (fd,)


def _close_all(fds: Sequence[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def check_environment() -> None:
    """UserError if ``MLMT_SANDBOX_DISABLE`` is set: the environment must not weaken the sandbox."""
    if os.environ.get(DISABLE_ENV, "").strip():
        raise UserError(f"{DISABLE_ENV} is set, but the environment alone cannot weaken the code sandbox: unset "
                        "it; to run weakened on purpose, give the code verifier the option sandbox_disable (in a "
                        "spec: benchmark.verifier_options.sandbox_disable: [jail, netns])")


def check_disable(disable: Sequence[str]) -> tuple[str, ...]:
    """``disable`` as a tuple of mechanism names; UserError on a name that is not one."""
    if isinstance(disable, str):
        names: tuple[Any, ...] = (disable,)
    elif isinstance(disable, (list, tuple, set, frozenset)):
        names = tuple(disable)
    else:
        raise UserError(f"sandbox_disable: expected a list of mechanism names, got {short_repr(disable)}")
    unknown = [n for n in names if n not in MECHANISMS]
    if unknown:
        raise UserError(f"sandbox_disable: unknown mechanism(s) {short_repr(unknown)} "
                        f"(known: {', '.join(MECHANISMS)})")
    return tuple(dict.fromkeys(names))


def capabilities(refresh: bool = False, disable: Sequence[str] = ()) -> dict[str, Any]:
    """Which isolation mechanisms work here (probed once per process, in a child; cached),
    less those named in ``disable`` (an explicit choice; see the module docstring).

    Keys: root, uid_drop, pidns, netns, jail, cgroup (bools), errors (why a mechanism is off),
    disabled (the names turned off by ``disable``). UserError if ``MLMT_SANDBOX_DISABLE`` is set.
    """
    check_environment()
    disabled = check_disable(disable)
    global _caps
    with _caps_lock:
        if _caps is None or refresh:
            try:
                argv, fds = _judge_command("--probe")
                try:
                    out = subprocess.run(argv, capture_output=True, timeout=60, env=_base_env(""), cwd="/",
                                         start_new_session=True, pass_fds=fds)
                finally:
                    _close_all(fds)
                caps = json.loads(out.stdout.decode().strip().splitlines()[-1])
            except Exception as exc:  # noqa: BLE001 - no probe: fall back to the weakest mode
                caps = {"root": False, "errors": {"probe": repr(exc)}}
            for m in MECHANISMS:
                caps[m] = bool(caps.get(m))
            if not caps["uid_drop"]:
                # a jail or namespaces without a uid drop would still run the candidate as root
                for m in ("jail", "pidns"):
                    caps[m] = False
            _caps = caps
        caps = dict(_caps)
    for m in disabled:
        caps[m] = False
    caps["disabled"] = list(disabled)
    if not caps["uid_drop"]:
        caps["jail"] = caps["pidns"] = False
    return caps


def _base_env(token: str) -> dict[str, str]:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
    if token:
        env["MLMT_SANDBOX"] = token
    return env


def _alloc_uid() -> int:
    with _uid_lock:
        while True:
            uid = 1_000_000_000 + secrets.randbelow(1_000_000_000)
            if uid not in _uids_in_use:
                _uids_in_use.add(uid)
                return uid


def _free_uid(uid: int) -> None:
    with _uid_lock:
        _uids_in_use.discard(uid)


def _count_tasks_of(uid: int) -> int:
    n = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as fh:
                text = fh.read()
        except OSError:
            continue
        real_uid = threads = None
        for line in text.splitlines():
            if line.startswith("Uid:"):
                real_uid = int(line.split()[1])
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
        if real_uid == uid:
            n += threads or 1
    return n


def _frame(obj: Any) -> bytes:
    data = json.dumps(obj).encode()
    return struct.pack(">I", len(data)) + data


def run_tests(program: str, tests: Sequence[str], setup: str = "", limits: Limits | None = None,
              *, caps: dict[str, Any] | None = None) -> RunResult:
    """Run ``program``, then ``setup``, then evaluate each test (a statement, usually an assert).

    Never raises on anything the program does; returns a :class:`RunResult`.
    """
    limits = limits or Limits()
    caps = caps if caps is not None else capabilities()
    t0 = time.monotonic()
    token = secrets.token_hex(16)
    nonce = secrets.token_hex(16)
    uid = _alloc_uid() if caps["uid_drop"] else None
    eval_uid = _alloc_uid() if caps["uid_drop"] else None  # the test evaluator's (see sandbox.judge)
    workdir = None
    if not caps["jail"]:
        workdir = tempfile.mkdtemp(prefix="mlmt-sbx-")
        os.chmod(workdir, 0o700)
        if uid is not None:
            os.chown(workdir, uid, uid)
    if uid is not None:
        nproc_abs = limits.nproc
    else:  # RLIMIT_NPROC counts all tasks of the (shared) user
        nproc_abs = _count_tasks_of(os.getuid()) + limits.nproc
    cfg = {
        "program": program, "setup": setup or "", "timeout_s": float(limits.timeout_s),
        "cpu_s": int(limits.timeout_s) + 2, "memory_mb": int(limits.memory_mb),
        "fsize_mb": int(limits.fsize_mb), "nofile": int(limits.nofile), "nproc_abs": int(nproc_abs),
        "output_bytes": int(limits.output_bytes), "uid": uid, "eval_uid": eval_uid, "token": token,
        "workdir": workdir,
        "pidns": bool(caps["pidns"]), "netns": bool(caps["netns"]), "jail": bool(caps["jail"]),
        "cgroup": bool(caps["cgroup"]), "nproc": int(limits.nproc),
        "total_memory_mb": int(limits.total_memory_mb or 2 * limits.memory_mb + 128),
        "python": os.path.realpath(_python()),
        "jail_plan": (caps.get("jail_plan") or capabilities().get("jail_plan")) if caps["jail"] else None,
    }
    payload = _frame(cfg) + _frame({"tests": list(tests), "nonce": nonce})
    proc = None
    out = b""
    err = b""
    hard_timeout = float(limits.timeout_s) + 10.0
    try:
        argv, fds = _judge_command()
        try:
            proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True, close_fds=True, pass_fds=fds, cwd="/", env=_base_env(token))
        finally:
            _close_all(fds)
        try:
            out, err = proc.communicate(payload, timeout=hard_timeout)
        except subprocess.TimeoutExpired:
            _killpg(proc.pid)
            out, err = proc.communicate()
    except OSError as exc:
        return _error_result(tests, f"cannot start the sandbox: {exc}", t0)
    finally:
        if proc is not None:
            _killpg(proc.pid)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        _cleanup(caps, uid, token, workdir, eval_uid)
        for u in (uid, eval_uid):
            if u is not None:
                _free_uid(u)
    wall = time.monotonic() - t0
    report = None
    for line in reversed(out.decode("utf-8", "replace").splitlines()):
        try:
            report = json.loads(line)
            break
        except ValueError:
            continue
    if not isinstance(report, dict) or report.get("nonce") != nonce:
        res = _error_result(tests, "sandbox judge failed: " + err.decode("utf-8", "replace")[-500:], t0)
        if wall >= hard_timeout:
            res.status, res.error = "timeout", "timeout (the judge did not answer)"
        res.uid, res.token = uid, token
        return res
    return RunResult(
        status=str(report["status"]), passed=[bool(p) for p in report["passed"]],
        details=[str(d) for d in report["details"]], error=report.get("load_error"),
        error_type=report.get("load_etype"), violation=report.get("violation"),
        exit=str(report.get("exit") or ""), exit_signal=int(report.get("exit_signal") or 0),
        mechanisms=list(report.get("mechanisms") or []), stdout=report.get("stdout", ""),
        stderr=report.get("stderr", ""), wall_s=wall, uid=uid, token=token)


def _error_result(tests: Sequence[str], msg: str, t0: float) -> RunResult:
    return RunResult(status="sandbox_error", passed=[False] * len(tests), details=[""] * len(tests),
                     error=msg, wall_s=time.monotonic() - t0)


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _cleanup(caps: dict[str, Any], uid: int | None, token: str, workdir: str | None,
             eval_uid: int | None = None) -> None:
    """Kill whatever the run left behind and remove its files (belt and braces: with a PID
    namespace and a jail the kernel has already done both for the candidate; the judge has
    killed the test evaluator's processes)."""
    try:
        if not caps["pidns"]:
            _kill_leftovers(uid, token)
        if eval_uid is not None:  # the evaluator is in no PID namespace of its own
            _kill_leftovers(eval_uid, token)
    except Exception as exc:  # noqa: BLE001
        log.warning("sandbox cleanup (processes) failed: %s", exc)
    if caps.get("cgroup"):  # normally removed by the judge; not if the judge itself was killed
        from mlmt_bench.verifiers.sandbox.judge.jail import cgroup_base, remove_cgroups

        dirs = [f"{b}/mlmt-{token}" for b in (cgroup_base("memory"), cgroup_base("pids")) if b]
        dirs = [d for d in dirs if os.path.isdir(d)]
        if dirs:
            remove_cgroups(dirs, wait_s=1.0)
    if workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    owners = {u for u in (uid, eval_uid) if u is not None}
    if owners and not caps["jail"]:
        for d in _WORLD_WRITABLE:
            try:
                entries = list(os.scandir(d))
            except OSError:
                continue
            for e in entries:
                try:
                    st = e.stat(follow_symlinks=False)
                    if st.st_uid not in owners:
                        continue
                    if stat.S_ISDIR(st.st_mode):
                        shutil.rmtree(e.path, ignore_errors=True)
                    else:
                        os.unlink(e.path)
                except OSError:
                    pass


def _kill_leftovers(uid: int | None, token: str) -> None:
    import psutil

    marker = f"MLMT_SANDBOX={token}".encode()
    me = os.getpid()
    for _round in range(20):
        found = []
        for p in psutil.process_iter(["uids"]):
            if p.pid == me:
                continue
            try:
                uids = p.info["uids"]
                if uid is not None:
                    if uids is not None and uid in (uids.real, uids.effective, uids.saved):
                        found.append(p)
                elif uids is not None and uids.real == os.getuid():
                    with open(f"/proc/{p.pid}/environ", "rb") as fh:
                        if marker in fh.read().split(b"\0"):
                            found.append(p)
            except (OSError, psutil.Error):
                continue
        if not found:
            return
        for p in found:
            try:
                p.kill()
            except psutil.Error:
                pass
        time.sleep(0.01)

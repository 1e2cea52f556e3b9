"""The candidate process C: isolates itself, runs the untrusted program, answers E's requests.

:func:`candidate_main` runs in C, forked by the judge J: it joins the run's cgroups, enters its
namespaces and jail, then splits in two, a root monitor (the init of C's PID namespace, which
reaps and reports how the candidate ended) and the candidate proper, which drops to the run's
uid under rlimits and an audit hook refusing sockets, runs setup + program, and then evaluates
the sub-expressions the evaluator E sends (:func:`_serve`), answering with values encoded as
plain data (:mod:`.wire`). Standard library only (see the package docstring).
"""

from __future__ import annotations

import builtins
import os
import resource
import signal
import sys

from .jail import (
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWUTS,
    PR_SET_PDEATHSIG,
    build_jail,
    close_fds_but,
    drop_privileges,
    join_cgroups,
    prctl,
    set_rlimits,
    unshare,
)
from .wire import (
    _HANDLES,
    DETAIL_CHARS,
    MAX_FRAME,
    EncodeError,
    decode_value,
    encode_value,
    pack,
    read_frame,
    write_all,
    write_frame,
)

# modules imported into C before the uid drop when there is no jail (the uid then cannot read
# a Python installed under /root); harmless otherwise
PREIMPORT = (
    "re", "math", "cmath", "collections", "collections.abc", "heapq", "itertools", "functools",
    "operator", "bisect", "string", "copy", "array", "datetime", "fractions", "decimal",
    "random", "statistics", "typing", "dataclasses", "enum", "numbers", "textwrap", "unicodedata",
    "calendar", "time", "struct", "hashlib", "binascii", "base64", "json", "traceback",
    "linecache", "tokenize", "io", "copyreg", "weakref", "contextlib", "abc", "types", "queue",
    "threading", "subprocess", "shutil", "tempfile", "glob", "fnmatch", "pathlib", "socket",
    "locale", "pprint", "inspect", "ast",
)


def _short(exc: BaseException) -> tuple[str, str]:
    """(its type's name, ``Type: message`` cut to DETAIL_CHARS, with the last solution.py line)."""
    try:
        etype = type(exc).__name__
        msg = str(exc)
    except BaseException:  # noqa: BLE001 - a hostile __str__
        etype, msg = "Exception", "<unprintable>"
    line = ""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "solution.py":
            line = f" (solution.py line {tb.tb_lineno})"
        tb = tb.tb_next
    return etype, f"{etype}: {msg}"[:DETAIL_CHARS] + line


def candidate_main(cfg: dict, req_r: int, resp_w: int, out_w: int, err_w: int) -> None:
    """Runs in the forked child. Never returns."""
    try:
        uid = cfg.get("uid")
        # fds: 0 <- /dev/null, 1/2 <- J's capture pipes, keep the two channel ends, close the rest
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        close_fds_but({0, 1, 2, req_r, resp_w})
        mechanisms = list(cfg.get("parent_mechanisms") or ())
        if cfg.get("cgroup_dirs"):
            join_cgroups(cfg["cgroup_dirs"])
            mechanisms += [f"cgroup_{d.split('/')[4]}" for d in cfg["cgroup_dirs"]]
        flags = 0
        if cfg.get("netns"):
            flags |= CLONE_NEWNET
        if cfg.get("jail"):
            flags |= CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS
        if flags:
            unshare(flags)
            if flags & CLONE_NEWNET:
                mechanisms.append("netns")
            if flags & CLONE_NEWIPC:
                mechanisms.append("ipcns")
        if cfg.get("jail"):
            build_jail(cfg, uid)
            mechanisms.append("mntns_chroot_jail")
        else:
            os.chdir(cfg["workdir"])
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        # C splits in two: this process stays root, runs no candidate code, and is only a monitor
        # (the init of the PID namespace: it reaps orphans and reports how the candidate ended);
        # the child becomes the candidate. The candidate then is not PID 1, so the kernel's
        # SIGXFSZ / SIGXCPU and its own signals act on it normally.
        cand = os.fork()
        if cand != 0:
            _monitor(cand, req_r, resp_w)
        set_rlimits([
            (resource.RLIMIT_CPU, int(cfg["cpu_s"])),
            (resource.RLIMIT_AS, int(cfg["memory_mb"]) << 20),
            (resource.RLIMIT_FSIZE, int(cfg["fsize_mb"]) << 20),
            (resource.RLIMIT_NOFILE, int(cfg["nofile"])),
            (resource.RLIMIT_CORE, 0),
            (resource.RLIMIT_NPROC, int(cfg["nproc_abs"])),
        ])
        mechanisms.append("rlimits")
        if drop_privileges(uid):
            mechanisms.append("uid_drop")
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # Python ignores it; here it ends the run
        os.umask(0o077)
        home = os.getcwd()
        os.environ.clear()
        os.environ.update({
            "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": "/tmp" if cfg.get("jail") else home,
            "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1",
            "PYTHONSAFEPATH": "1", "MLMT_SANDBOX": cfg["token"],
        })
        sys.dont_write_bytecode = True
        if cfg.get("python"):
            sys.executable = cfg["python"]
        sys.argv = ["solution.py"]
        if cfg.get("jail"):
            with open("solution.py", "w") as fh:
                fh.write(cfg["program"])
        _install_audit_hook(resp_w)
        mechanisms.append("audit_hook_no_sockets")
        write_frame(resp_w, {"t": "ready", "mechanisms": mechanisms})
    except BaseException as exc:  # noqa: BLE001
        try:
            write_frame(resp_w, {"t": "setup_error", "error": f"{type(exc).__name__}: {exc}"[:500]})
        finally:
            os._exit(70)
    _serve(cfg, req_r, resp_w)
    os._exit(0)


def _monitor(cand: int, req_r: int, resp_w: int) -> None:
    """The root half of C: reap every child until the candidate ends, report how, exit."""
    try:
        os.close(req_r)
        for fd in (0, 1, 2):
            os.close(fd)
        status = None
        while status is None:
            try:
                pid, st = os.waitpid(-1, 0)
            except ChildProcessError:
                break
            except InterruptedError:
                continue
            if pid == cand:
                status = st
        frame = {"t": "exit", "signal": 0, "code": -1}
        if status is not None:
            if os.WIFSIGNALED(status):
                frame["signal"] = os.WTERMSIG(status)
            else:
                frame["code"] = os.WEXITSTATUS(status)
        write_frame(resp_w, frame)
    finally:
        os._exit(0)


def _install_audit_hook(resp_w: int) -> None:
    import socket as _socket

    allowed_families = {getattr(_socket, "AF_UNIX", 1)}
    _write = write_frame
    _perm = PermissionError

    def hook(event, args):
        if not event.startswith("socket."):
            return
        if event == "socket.__new__":
            try:
                family = int(args[1])
            except Exception:  # noqa: BLE001
                family = -1
            if family in allowed_families:
                return
        elif event not in ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg",
                           "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr",
                           "socket.gethostbyname_ex", "socket.getnameinfo"):
            return
        try:
            _write(resp_w, {"t": "violation", "what": f"network access ({event})"})
        except BaseException:  # noqa: BLE001
            pass
        raise _perm("network access is disabled in the sandbox")

    sys.addaudithook(hook)


def _serve(cfg: dict, req_r: int, resp_w: int) -> None:
    g = {"__name__": "__solution__", "__builtins__": builtins, "__file__": "solution.py"}
    # the harness below uses builtins; a program that monkeypatches them would only break its own
    # answers, but restoring them before each answer keeps the verdict precise ("wrong")
    saved_builtins = dict(builtins.__dict__)
    bdict = builtins.__dict__

    def restore():
        try:
            bdict.update(saved_builtins)
        except BaseException:  # noqa: BLE001
            pass

    try:
        exec(compile(cfg["program"], "solution.py", "exec"), g)  # noqa: S102
        if cfg.get("setup"):
            exec(compile(cfg["setup"], "setup.py", "exec"), g)  # noqa: S102
    except BaseException as exc:  # noqa: BLE001 - SystemExit too: the program may not leave early
        restore()
        etype, msg = _short(exc)
        _flush()
        write_frame(resp_w, {"t": "load_error", "etype": etype, "error": msg})
        os._exit(1)
    restore()
    _flush()
    write_frame(resp_w, {"t": "loaded"})
    while True:
        try:
            os.set_blocking(req_r, True)
            msg = read_frame(req_r)
            if msg.get("t") not in ("eval", "call"):
                os._exit(0)
        except BaseException:  # noqa: BLE001
            os._exit(0)
        rid = None
        try:
            rid = msg.get("id")
            if msg["t"] == "call":
                fn = _HANDLES[msg["h"]]
                args = [decode_value(a) for a in msg["args"]]
                kwargs = {k: decode_value(v) for k, v in msg["kwargs"].items()}
                value = fn(*args, **kwargs)
            else:
                code = compile(msg["src"], "<test>", "eval")
                env = g
                if msg.get("locals"):
                    env = dict(g)
                    for k, v in msg["locals"].items():
                        env[k] = decode_value(v)
                value = eval(code, env)  # noqa: S307
            restore()
            data = pack({"t": "result", "id": rid, "ok": True, "v": encode_value(value)})
            if len(data) > MAX_FRAME:
                raise EncodeError("result too large")
        except BaseException as exc:  # noqa: BLE001
            restore()
            etype, emsg = _short(exc)
            try:
                data = pack({"t": "result", "id": rid, "ok": False, "etype": etype, "error": emsg})
            except BaseException:  # noqa: BLE001 - the program broke json: still answer
                body = b'{"t":"result","id":%d,"ok":false,"etype":"?","error":"?"}' % (
                    rid if type(rid) is int and 0 <= rid < 10 ** 9 else 0)
                data = len(body).to_bytes(4, "big") + body
        _flush()
        try:
            write_all(resp_w, data)
        except BaseException:  # noqa: BLE001
            os._exit(0)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001
            pass

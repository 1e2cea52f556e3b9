"""Which isolation mechanisms work on this machine: the judge's ``--probe`` mode.

:func:`probe` tries each mechanism of :mod:`.jail` in a throwaway child process and says which
worked (the host caches the answer: ``sandbox.capabilities``); for the jail it also works out
what the jail must show (``jail_plan``) and checks that the interpreter starts in it.
Standard library only (see the package docstring).
"""

from __future__ import annotations

import json
import os
import sys

from .jail import (
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWPID,
    CLONE_NEWUTS,
    PR_SET_NO_NEW_PRIVS,
    build_jail,
    jail_plan,
    make_cgroups,
    prctl,
    remove_cgroups,
    unshare,
)
from .wire import write_all

TYPE_CHECKING = False  # for the type checker only: the judge imports no typing at run time
if TYPE_CHECKING:
    from typing import Any


def _probe_in_child(fn) -> tuple[bool, Any]:
    """Run ``fn()`` in a forked child: (True, its JSON-able result) or (False, why it failed)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            data = b"ok" + json.dumps(fn()).encode()
        except BaseException as exc:  # noqa: BLE001
            data = f"{type(exc).__name__}: {exc}".encode()[:300]
        try:
            write_all(w, data)
        finally:
            os._exit(0)
    os.close(w)
    chunks = []
    while True:
        chunk = os.read(r, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(r)
    os.waitpid(pid, 0)
    data = b"".join(chunks)
    if data.startswith(b"ok"):
        return True, json.loads(data[2:])
    return False, data.decode(errors="replace") or "the probe process died"


def probe() -> dict:
    res: dict[str, Any] = {"root": os.geteuid() == 0, "errors": {}}

    def uid_drop():
        os.setgroups([])
        os.setresgid(2_000_000_001, 2_000_000_001, 2_000_000_001)
        os.setresuid(2_000_000_001, 2_000_000_001, 2_000_000_001)
        prctl(PR_SET_NO_NEW_PRIVS, 1)

    def netns():
        unshare(CLONE_NEWNET)
        import socket
        s = socket.socket()
        try:
            s.settimeout(0.5)
            try:
                s.connect(("1.1.1.1", 53))
            except OSError:
                return
            raise OSError("network still reachable")
        finally:
            s.close()

    def pidns():
        unshare(CLONE_NEWPID)
        pid = os.fork()
        if pid == 0:
            os._exit(0 if os.getpid() == 1 else 1)
        _, status = os.waitpid(pid, 0)
        if status != 0:
            raise OSError("not pid 1 in the new namespace")

    def cgroup():
        dirs = make_cgroups(f"mlmt-probe-{os.getpid()}", 64 << 20, 16)
        try:
            if len(dirs) != 2:
                raise OSError(f"cgroup v1 memory+pids not available ({dirs})")
        finally:
            remove_cgroups(dirs)

    plan: dict = {}

    def jail():
        ok, found = _probe_in_child(jail_plan)
        if not ok:
            raise OSError(f"cannot work out what the jail needs: {found}")
        plan.update(found)
        exe = os.path.realpath(sys.executable)
        unshare(CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS)
        build_jail({"fsize_mb": 1, "pidns": False, "jail_plan": plan}, None)
        import subprocess  # the interpreter must start in the jail and import its stdlib

        done = subprocess.run([exe, "-I", "-S", "-B", "-c",
                               "import colorsys, decimal, hashlib, json, sqlite3, zlib"],
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
        if done.returncode != 0:
            raise OSError(f"the interpreter does not start in the jail: {done.stderr.decode(errors='replace')[-200:]}")
        return plan

    for name, fn in (("uid_drop", uid_drop), ("netns", netns), ("pidns", pidns), ("jail", jail), ("cgroup", cgroup)):
        if not res["root"]:
            res[name] = False
            res["errors"][name] = "not root"
            continue
        ok, found = _probe_in_child(fn)
        res[name] = ok
        if not ok:
            res["errors"][name] = found
        elif name == "jail":
            res["jail_plan"] = found
    return res

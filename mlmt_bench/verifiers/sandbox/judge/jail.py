"""Isolation steps the judge applies to its candidate C and evaluator E: namespaces, cgroups,
the chroot jail, rlimits and the uid drop.

* the system calls the standard library lacks (``unshare``, ``mount``, ``prctl``, by ctypes);
* per-run cgroup-v1 memory and pids groups (:func:`make_cgroups` ... :func:`remove_cgroups`; the
  host also uses the last one to clean up after a judge that was killed);
* the jail: :func:`jail_plan` (what of the host it shows, worked out once by the probe) and
  :func:`build_jail` (a chroot onto a private tmpfs holding read-only binds of that plan);
* :func:`set_rlimits`, :func:`drop_privileges`, :func:`close_fds_but`.

Standard library only (see the package docstring).
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import struct
import sys
import time

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38

# ---------------------------------------------------------------------------------------------
# system calls

_libc = None


def _c():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                                ctypes.c_char_p]
        _libc.unshare.argtypes = [ctypes.c_int]
        _libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                                ctypes.c_ulong]
    return _libc


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def unshare(flags: int) -> None:
    _check(_c().unshare(flags), f"unshare({flags:#x})")


def mount(src: str | None, dst: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    _check(_c().mount(enc(src), enc(dst), enc(fstype), flags, enc(data)), f"mount {dst}")


def prctl(option: int, arg: int) -> None:
    _check(_c().prctl(option, arg, 0, 0, 0), f"prctl({option})")


# ---------------------------------------------------------------------------------------------
# cgroups


def cgroup_base(controller: str) -> str | None:
    """The cgroup-v1 directory of this process for ``controller`` (None if not v1-mounted)."""
    try:
        with open("/proc/self/cgroup") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3 and controller in parts[1].split(","):
            base = f"/sys/fs/cgroup/{controller}{parts[2].rstrip('/')}"
            return base if os.path.isdir(base) else None
    return None


def make_cgroups(name: str, memory_bytes: int, pids: int) -> list[str]:
    """Per-run cgroup-v1 memory and pids groups (total memory / task count of the whole run,
    whatever the number of processes). Returns the directories made (maybe none)."""
    made = []
    for controller, knob, value in (("memory", "memory.limit_in_bytes", memory_bytes), ("pids", "pids.max", pids)):
        base = cgroup_base(controller)
        if base is None:
            continue
        path = f"{base}/{name}"
        try:
            os.mkdir(path, 0o700)
        except OSError:
            continue
        try:
            with open(f"{path}/{knob}", "w") as fh:
                fh.write(str(int(value)))
            if controller == "memory":
                try:  # no swap either
                    with open(f"{path}/memory.memsw.limit_in_bytes", "w") as fh:
                        fh.write(str(int(value)))
                except OSError:
                    pass
            made.append(path)
        except OSError:
            try:
                os.rmdir(path)
            except OSError:
                pass
    return made


def join_cgroups(dirs) -> None:
    for d in dirs:
        with open(f"{d}/cgroup.procs", "w") as fh:
            fh.write("0")


def oom_kills(dirs) -> int:
    for d in dirs:
        try:
            with open(f"{d}/memory.oom_control") as fh:
                for line in fh:
                    if line.startswith("oom_kill "):
                        return int(line.split()[1])
        except (OSError, ValueError):
            continue
    return 0


def remove_cgroups(dirs, wait_s: float = 2.0) -> None:
    deadline = time.monotonic() + wait_s
    for d in dirs:
        while True:
            try:
                os.rmdir(d)
                break
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() > deadline:  # tasks still exiting: kill them, then give up
                    try:
                        with open(f"{d}/cgroup.procs") as fh:
                            for pid in fh.read().split():
                                try:
                                    os.kill(int(pid), signal.SIGKILL)
                                except OSError:
                                    pass
                    except OSError:
                        pass
                    if time.monotonic() > deadline + 1.0:
                        break
                time.sleep(0.005)


# ---------------------------------------------------------------------------------------------
# the jail

# Extension modules of the standard library that jail_plan does not import, so that the jail
# does not carry their libraries: GUI, terminal and NIS (which pulls in Kerberos) modules.
_PLAN_SKIP = frozenset({"_tkinter", "readline", "_curses", "_curses_panel", "nis"})


def jail_plan() -> dict:
    """What of the host the jail shows: what this interpreter needs to start and to import its
    standard library, found by asking it. Run it in a throwaway process (it imports modules):

    * the interpreter binary (its real path), the ELF interpreter it names (PT_INTERP, the
      dynamic loader) and the loader's cache ``/etc/ld.so.cache`` (sonames -> library paths;
      the only file of /etc);
    * the standard library: the directory of ``os.py`` and the ``lib-dynload`` directory of its
      extension modules (and a zipped stdlib on ``sys.path``, if any), with any
      ``site-packages`` / ``dist-packages`` inside them covered by an empty directory;
    * every file mapped into this process once all of the standard library's extension modules
      but ``_PLAN_SKIP`` are imported: libpython, libc, libm, libssl, libffi, libz ..., the
      C.UTF-8 locale and glibc's gconv cache; with the symlinks that name each library in its
      directory (its soname);
    * every symlink met on the way (``/lib -> usr/lib`` ...), recreated as the same symlink.

    Returns ``{"binds": [absolute paths, files or directories], "links": [[path, target]],
    "masks": [directories]}``; :func:`build_jail` builds the jail from it.
    """
    stdlib, dynload = _stdlib_dirs()
    _import_extension_modules(dynload)
    mapped = _mapped_files(stdlib)
    exe = os.path.realpath(sys.executable)
    entries = [exe, *sorted(mapped)]
    interp = _elf_interpreter(exe)
    if interp:
        entries.append(interp)
    if os.path.isfile("/etc/ld.so.cache"):
        entries.append("/etc/ld.so.cache")
    entries += _soname_links(mapped)
    links = _root_library_links()
    binds = set(stdlib) | {_resolve_recording_links(path, links) for path in entries}
    masks = [os.path.join(d, sub) for d in stdlib for sub in ("site-packages", "dist-packages")
             if os.path.isdir(os.path.join(d, sub))]  # (a pyenv or /usr/local Python installs packages there)
    return {"binds": sorted(binds), "links": sorted([k, v] for k, v in links.items()), "masks": masks}


def _stdlib_dirs() -> tuple[list[str], list[str]]:
    """(the standard library's directories, none inside another: that of ``os.py``, the
    ``lib-dynload`` ones and any zipped stdlib on ``sys.path``; the ``lib-dynload`` ones), real
    paths."""
    dynload = [os.path.realpath(p) for p in sys.path if os.path.basename(p) == "lib-dynload" and os.path.isdir(p)]
    zipped = [os.path.realpath(p) for p in sys.path if p.endswith(".zip") and os.path.isfile(p)]
    stdlib: list[str] = []
    for d in [os.path.realpath(os.path.dirname(os.__file__)), *dynload, *zipped]:
        if not any(_inside(d, other) for other in stdlib):
            stdlib = [other for other in stdlib if not _inside(other, d)] + [d]
    return stdlib, dynload


def _import_extension_modules(dynload: list[str]) -> None:
    """Import every extension module in the ``dynload`` directories but ``_PLAN_SKIP`` (so that
    the libraries they need are mapped); one that fails to import is not needed."""
    import importlib

    for d in dynload:
        for name in sorted(os.listdir(d)):
            module, _, suffix = name.partition(".")
            if suffix.endswith("so") and module not in _PLAN_SKIP:
                try:
                    importlib.import_module(module)
                except Exception:  # noqa: BLE001 - a module whose library is missing: not needed
                    pass


def _mapped_files(stdlib: list[str]) -> set[str]:
    """The files mapped into this process (``/proc/self/maps``) outside the ``stdlib`` directories."""
    mapped = set()
    with open("/proc/self/maps") as fh:
        for line in fh:
            fields = line.split(None, 5)
            path = fields[5].strip() if len(fields) == 6 else ""
            if path.startswith("/") and os.path.isfile(path) and not any(_inside(path, d) for d in stdlib):
                mapped.add(path)
    return mapped


def _soname_links(mapped: set[str]) -> list[str]:
    """The symlinks, in the directories of the ``mapped`` files, that point to one of them (sonames)."""
    found = []
    for d in sorted({os.path.dirname(m) for m in mapped}):
        for name in sorted(os.listdir(d)):
            full = os.path.join(d, name)
            if os.path.islink(full) and os.path.realpath(full) in mapped:
                found.append(full)
    return found


def _root_library_links() -> dict[str, str]:
    """The symlinks ``/lib*`` of the root directory (``/lib -> usr/lib``, ``/lib64`` ...: where
    loaders look): path -> target as stored."""
    return {"/" + top: os.readlink("/" + top) for top in sorted(os.listdir("/"))
            if top.startswith("lib") and os.path.islink("/" + top)}


def _inside(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _resolve_recording_links(path: str, links: dict) -> str:
    """``path`` with its symlinks resolved one component at a time; each symlink met goes into
    ``links`` (its path -> its target as stored), so that the jail can hold the same chain."""
    parts = [p for p in path.split("/") if p]
    current, hops = "/", 0
    while parts:
        step = os.path.join(current, parts.pop(0))
        if not os.path.islink(step):
            current = step
            continue
        hops += 1
        if hops > 40:
            raise OSError(f"too many levels of symbolic links in {path}")
        links[step] = os.readlink(step)
        # current has no symlink in it, so ".." in the target can be resolved as text
        parts = [p for p in os.path.normpath(os.path.join(current, links[step])).split("/") if p] + parts
        current = "/"
    return current


def _elf_interpreter(path: str) -> str | None:
    """The PT_INTERP path (the dynamic loader) of an ELF executable; None if it has none."""
    with open(path, "rb") as fh:
        head = fh.read(64)
        if head[:4] != b"\x7fELF":
            return None
        e = "<" if head[5] == 1 else ">"
        wide = head[4] == 2  # ELFCLASS64
        (phoff,) = struct.unpack_from(e + ("Q" if wide else "I"), head, 32 if wide else 28)
        phentsize, phnum = struct.unpack_from(e + "HH", head, 54 if wide else 42)
        for i in range(phnum):
            fh.seek(phoff + i * phentsize)
            ph = fh.read(phentsize)
            if struct.unpack_from(e + "I", ph, 0)[0] != 3:  # PT_INTERP
                continue
            offset, size = (struct.unpack_from(e + "Q", ph, 8)[0], struct.unpack_from(e + "Q", ph, 32)[0]) if wide \
                else (struct.unpack_from(e + "I", ph, 4)[0], struct.unpack_from(e + "I", ph, 16)[0])
            fh.seek(offset)
            return fh.read(size).rstrip(b"\0").decode()
    return None


def build_jail(cfg: dict, uid: int | None) -> None:
    """In a fresh mount namespace: a tmpfs at /tmp becomes the root of a chroot jail holding
    read-only binds of ``cfg["jail_plan"]`` (see :func:`jail_plan`), a minimal /dev, a fresh
    /proc (with a PID namespace) and the writable /sandbox, /tmp, /var/tmp, /dev/shm."""
    plan = cfg["jail_plan"]
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    jail = "/tmp"
    size_kb = max(65536, 4 * int(cfg["fsize_mb"]) * 1024)
    mount("tmpfs", jail, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size_kb}k,nr_inodes=16384,mode=755")

    def bind(src: str, ro: bool = True, rec: bool = True) -> None:
        dst = jail + src
        if os.path.isdir(src):
            os.makedirs(dst, mode=0o755, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(dst), mode=0o755, exist_ok=True)
            with open(dst, "w"):
                pass
        mount(src, dst, None, MS_BIND | (MS_REC if rec else 0))
        if ro:
            mount(None, dst, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID)

    for path in plan["binds"]:  # real paths: no component is a symlink
        if os.path.exists(path):
            bind(path)
    for link, target in plan["links"]:  # their parents are real directories too
        if not os.path.lexists(jail + link):
            os.makedirs(os.path.dirname(jail + link), mode=0o755, exist_ok=True)
            os.symlink(target, jail + link)
    for d in plan["masks"]:
        mount("tmpfs", jail + d, "tmpfs", MS_NOSUID | MS_NODEV | MS_RDONLY, "size=4k,nr_inodes=16,mode=555")
    # minimal /dev
    os.makedirs(jail + "/dev", mode=0o755, exist_ok=True)
    for node in ("null", "zero", "full", "random", "urandom"):
        if os.path.exists("/dev/" + node):
            bind("/dev/" + node, ro=False, rec=False)
    for i, name in enumerate(("stdin", "stdout", "stderr")):
        os.symlink(f"/proc/self/fd/{i}", f"{jail}/dev/{name}")
    os.symlink("/proc/self/fd", jail + "/dev/fd")
    os.makedirs(jail + "/proc", mode=0o555)
    if cfg.get("pidns"):
        mount("proc", jail + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for d in ("/tmp", "/dev/shm", "/var/tmp"):
        os.makedirs(jail + d, exist_ok=True)
        os.chmod(jail + d, 0o1777)
    os.makedirs(jail + "/sandbox", mode=0o700)
    if uid is not None:
        os.chown(jail + "/sandbox", uid, uid)
    os.chroot(jail)
    os.chdir("/sandbox")


# ---------------------------------------------------------------------------------------------
# limits, privileges, descriptors


def set_rlimits(limits) -> None:
    """``(resource, value)`` pairs as soft and hard limits (CPU: hard one second above), never above
    an existing hard limit."""
    for res, val in limits:
        _soft, hard = resource.getrlimit(res)
        if hard != resource.RLIM_INFINITY:
            val = min(val, hard)
        if res == resource.RLIMIT_CPU:
            resource.setrlimit(res, (val, min(val + 1, hard) if hard != resource.RLIM_INFINITY else val + 1))
        else:
            resource.setrlimit(res, (val, val))


def drop_privileges(uid: int | None) -> bool:
    """no_new_privs, then (``uid`` given) no groups and ``uid`` as real, effective and saved
    uid and gid; the parent-death signal set again (a uid change clears it). Whether it dropped."""
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        if os.getuid() != uid or os.geteuid() != uid:
            raise OSError("uid drop failed")
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    return uid is not None


def close_fds_but(keep) -> None:
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass

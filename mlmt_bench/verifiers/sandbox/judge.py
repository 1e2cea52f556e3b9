"""Sandbox runner: the trusted "judge" process and the untrusted candidate process.

This file is executed as a script (``python -I -S -B judge.py``) by
:mod:`mlmt_bench.verifiers.sandbox`; it uses the standard library only and imports nothing from
``mlmt_bench``. The host imports it only for :func:`encode_value` / :func:`decode_value` and the
constants.

Process layout (one run = one program and its tests)::

    host (pytest / trainer thread)
      └─ judge  J   this script; new session; root; reads its config from stdin; runs no test
           ├─ evaluator E   fork of J; isolated like C, with a uid of its own; evaluates the tests
           └─ candidate C   fork of J; isolated; runs setup + program; answers E's eval requests

J only supervises: it makes the run's cgroups, forks E and C, hands the tests to E, waits for
E's report (killing E ``EVAL_GRACE_S`` after E's own deadline, whatever E is doing), kills what
is left and writes the verdict for the host. J never parses a value from C, and what E reports
is checked as data: the tests may come with the input (a ``verify`` line, a dataset) and be as
untrusted as the program, so they run in E, never as root on the host. E is in the run's memory
and pids cgroups, a network namespace and a jail of its own (without /proc), under rlimits,
no_new_privs and a private uid; it is not in C's PID namespace (it must outlive C's init), so
J, a child subreaper, kills E's leftovers itself.

Why candidates cannot fake a pass
---------------------------------
The expected values never enter C. E parses every test (``assert f(3) == 5``) and evaluates it
itself; only the sub-expressions that involve the candidate's names (``f(3)``) are sent to C as
source text over a pipe, and C answers with a *value*, encoded as plain data (ints, strings,
lists, dicts ...). E decodes it into fresh builtin objects (a frame of at most ``MAX_FRAME``
bytes and ``MAX_STRUCTURE`` JSON separators, counted before it is parsed; no dict or set whose
keys were forged to share one hash value) and does the comparison, the ``assert`` and any
helper calls (``math.isclose``, ``set`` ...) with its own, untouched interpreter. (Below, "J"
is the trusted side that evaluates the tests: E, forked from J.) So:

* overriding ``__eq__`` / ``__bool__`` on a returned object is useless: the object never leaves C,
  only its plain-data encoding does (custom objects cannot be encoded and fail the test);
* monkeypatching ``assert``/builtins/``print``/``AssertionError`` only changes C, not J;
* ``sys.exit(0)``, ``os._exit(0)``, signals, crashes before or during the tests just mean that
  the requests are never answered: those tests fail;
* the tests are never in C's memory, on its filesystem, command line or environment: J reads
  them from its stdin *after* forking C, and C closes that stdin before running anything;
  frame inspection (``sys._getframe(1)``) only sees the request, not the expected value;
* anything C writes on the result pipe is treated as untrusted data (a forged "answer" is just a
  value, and C does not know the expected one). Verdicts travel only from J to the host, on J's
  stdout, tagged with a nonce that the host sends after C and E have been forked.

Isolation of C (each step is used when the host's probe found it working; see ``probe``):
own uid/gid (a random unprivileged uid per run, so RLIMIT_NPROC is enforced and kill(-1) as
that uid reaches only this run), no_new_privs, new PID namespace (C is its init: when it dies
the kernel kills every descendant, including double-forked / setsid daemons), new network
namespace (no interfaces but a down loopback), new mount/IPC/UTS namespaces with a chroot jail
on a private tmpfs (read-only binds of only what the interpreter needs to start and import its
standard library, see ``jail_plan``; a minimal /dev, a fresh /proc; writable only /sandbox (the
cwd), /tmp, /var/tmp, /dev/shm inside the tmpfs, which vanish with the namespace), rlimits
(CPU, AS, NPROC, FSIZE, NOFILE, CORE), a scrubbed environment, stdin from /dev/null,
stdout/stderr read by J up to a cap, and a Python audit hook that refuses sockets (and reports
the attempt, so the verdict is ``sandbox_violation``).
"""

from __future__ import annotations

import ast
import builtins
import ctypes
import json
import os
import resource
import select
import signal
import struct
import sys
import time

TYPE_CHECKING = False  # for the type checker only: this script imports no typing at run time
if TYPE_CHECKING:
    from typing import Any

# ---------------------------------------------------------------------------------------------
# constants

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

MAX_FRAME = 16 << 20  # largest result frame E accepts from C
MAX_ITEMS = 1_000_000  # largest number of encoded items in one value
MAX_ITER = 1_000_000  # longest iterator C materialises
# a frame is parsed only if it has at most this many JSON separators and openings (``,`` ``[``
# ``{`` ``:``, counted in C code before anything is built; strings holding them count too): what
# E builds from a frame is then bounded by the count, not by how small its items can be made
MAX_STRUCTURE = 2 * MAX_ITEMS + 64
MAX_SAME_HASH = 64  # distinct keys of one dict / set with one hash value (a collision attack)
DETAIL_CHARS = 300
EVAL_GRACE_S = 2.0  # J kills E this long after E's own deadline (E stuck in a C-level computation)

# stdlib modules J must never import on a test's behalf (side effects on import)
_NO_IMPORT = frozenset({
    "antigravity", "this", "turtle", "turtledemo", "tkinter", "idlelib", "webbrowser", "pydoc",
    "lib2to3", "ensurepip", "venv", "pdb", "code", "site", "sitecustomize", "usercustomize",
})

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
# framing: 4-byte big-endian length + JSON


def pack(obj) -> bytes:
    data = json.dumps(obj, separators=(",", ":")).encode()
    return struct.pack(">I", len(data)) + data


def write_frame(fd: int, obj) -> None:
    data = pack(obj)
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def read_exact(fd: int, n: int) -> bytes:
    """Blocking read of exactly n bytes (b'' on EOF before the first byte)."""
    chunks: list[bytes] = []
    while n > 0:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            if chunks:
                raise EOFError("truncated frame")
            return b""
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int, limit: int = MAX_FRAME):
    head = read_exact(fd, 4)
    if not head:
        raise EOFError("channel closed")
    (n,) = struct.unpack(">I", head)
    if n > limit:
        raise ValueError(f"frame of {n} bytes is over the limit")
    return json.loads(read_exact(fd, n))


# ---------------------------------------------------------------------------------------------
# value encoding: plain data only. Containers are JSON arrays whose first item is a tag; strings,
# floats, small ints, bools and None are JSON scalars.


class EncodeError(TypeError):
    pass


def encode_value(v, _budget=None):
    budget = _budget if _budget is not None else [MAX_ITEMS]
    budget[0] -= 1
    if budget[0] < 0:
        raise EncodeError("result too large")
    if v is None or v is True or v is False:
        return v
    if isinstance(v, bool):
        return bool(v)
    if isinstance(v, int):
        v = int(v)
        return v if -(1 << 53) < v < (1 << 53) else ["I", hex(v)]
    if isinstance(v, float):
        return float(v)
    if isinstance(v, str):
        return str.__str__(v)
    e = lambda x: encode_value(x, budget)  # noqa: E731
    import collections
    import decimal
    import fractions
    if isinstance(v, complex):
        return ["C", float(v.real), float(v.imag)]
    if isinstance(v, bytearray):
        return ["BA", bytes(v).hex()]
    if isinstance(v, bytes):
        return ["B", bytes(v).hex()]
    if isinstance(v, collections.Counter):
        return ["CN"] + [x for k, val in dict.items(v) for x in (e(k), e(val))]
    if isinstance(v, collections.OrderedDict):
        return ["OD"] + [x for k, val in dict.items(v) for x in (e(k), e(val))]
    if isinstance(v, collections.defaultdict):
        return ["DD"] + [x for k, val in dict.items(v) for x in (e(k), e(val))]
    if isinstance(v, dict):
        return ["D"] + [x for k, val in dict.items(v) for x in (e(k), e(val))]
    if isinstance(v, list):
        return ["L"] + [e(x) for x in list.__iter__(v)]
    if isinstance(v, tuple):
        return ["T"] + [e(x) for x in tuple.__iter__(v)]
    if isinstance(v, frozenset):
        return ["F"] + [e(x) for x in frozenset.__iter__(v)]
    if isinstance(v, set):
        return ["S"] + [e(x) for x in set.__iter__(v)]
    if isinstance(v, range):
        return ["R", e(v.start), e(v.stop), e(v.step)]
    if isinstance(v, collections.deque):
        return ["DQ", e(v.maxlen)] + [e(x) for x in v]
    if isinstance(v, decimal.Decimal):
        return ["DEC", str(v)]
    if isinstance(v, fractions.Fraction):
        return ["FR", e(v.numerator), e(v.denominator)]
    import collections.abc
    if isinstance(v, collections.abc.Iterator):
        items = []
        for x in v:
            items.append(e(x))
            if len(items) > MAX_ITER:
                raise EncodeError("iterator too long")
        return ["IT"] + items
    if isinstance(v, (collections.abc.KeysView, collections.abc.ValuesView, collections.abc.ItemsView)):
        return ["L"] + [e(x) for x in v]
    if isinstance(v, Opaque):  # J passing a sandbox object back (e.g. a function) as an argument
        if v.handle is None:
            raise EncodeError("this sandbox object cannot be sent back")
        return ["H", v.handle]
    # anything else (a re.Match, an instance of the program's own class, a function ...) travels
    # as an opaque token carrying only its truth value and, if callable, a handle J can call
    # (HumanEval's `check(candidate)`): `assert f(x)` / `assert not f(x)` still work, and a truth
    # bit is no more than returning True/False. It compares equal to nothing but itself.
    try:
        truth = bool(v)
    except Exception:  # noqa: BLE001
        truth = None
    handle = None
    if callable(v):
        handle = len(_HANDLES) + 1
        _HANDLES[handle] = v
    return ["OBJ", str(type(v).__name__)[:80], truth, handle]


_HANDLES: dict = {}  # C only: callables J holds handles to
_JUDGE = None  # J only: the Judge that Opaque.__call__ goes through


class Opaque:
    """J's stand-in for a sandbox value that is not plain data (see ``encode_value``)."""

    __slots__ = ("type_name", "truth", "handle")

    def __init__(self, type_name: str, truth: bool | None, handle: int | None = None) -> None:
        self.type_name = type_name
        self.truth = truth
        self.handle = handle

    def __call__(self, *args, **kwargs):
        if self.handle is None or _JUDGE is None:
            raise TypeError(f"the {self.type_name} object in the sandbox is not callable")
        return _JUDGE.call(self.handle, args, kwargs)

    def __bool__(self) -> bool:
        if self.truth is None:
            raise TypeError(f"truth value of the {self.type_name} object is unknown")
        return self.truth

    def __repr__(self) -> str:
        return f"<{self.type_name} object in the sandbox>"


class DecodeError(ValueError):
    pass


def decode_value(x):
    """Rebuild a value from untrusted encoded data; yields only builtin / stdlib value types."""
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if not isinstance(x, list) or not x or not isinstance(x[0], str):
        raise DecodeError("malformed value")
    tag, rest = x[0], x[1:]
    d = decode_value
    import collections
    if tag == "L":
        return [d(i) for i in rest]
    if tag == "T":
        return tuple(d(i) for i in rest)
    if tag in ("D", "CN", "OD", "DD"):
        if len(rest) % 2:
            raise DecodeError("malformed dict")
        pairs = [(d(rest[i]), d(rest[i + 1])) for i in range(0, len(rest), 2)]
        _check_hashes([k for k, _ in pairs], rest[0::2])
        if tag == "D":
            return dict(pairs)
        if tag == "CN":
            counts: collections.Counter[Any] = collections.Counter()
            for k, val in pairs:
                counts[k] = val
            return counts
        if tag == "OD":
            return collections.OrderedDict(pairs)
        return collections.defaultdict(None, pairs)
    if tag in ("S", "F"):
        items = [d(i) for i in rest]
        _check_hashes(items, rest)
        return set(items) if tag == "S" else frozenset(items)
    if tag == "IT":
        return iter([d(i) for i in rest])
    if tag == "I" and len(rest) == 1 and isinstance(rest[0], str):
        return int(rest[0], 16)
    if tag == "C" and len(rest) == 2:
        return complex(float(rest[0]), float(rest[1]))
    if tag == "B" and len(rest) == 1 and isinstance(rest[0], str):
        return bytes.fromhex(rest[0])
    if tag == "BA" and len(rest) == 1 and isinstance(rest[0], str):
        return bytearray.fromhex(rest[0])
    if tag == "R" and len(rest) == 3:
        a, b, c = (d(i) for i in rest)
        if not all(type(i) is int for i in (a, b, c)):
            raise DecodeError("malformed range")
        return range(a, b, c)
    if tag == "DQ" and rest:
        maxlen = d(rest[0])
        if maxlen is not None and type(maxlen) is not int:
            raise DecodeError("malformed deque")
        return collections.deque((d(i) for i in rest[1:]), maxlen)
    if tag == "DEC" and len(rest) == 1 and isinstance(rest[0], str):
        import decimal
        return decimal.Decimal(rest[0])
    if tag == "FR" and len(rest) == 2:
        import fractions
        num, den = d(rest[0]), d(rest[1])
        if type(num) is not int or type(den) is not int:
            raise DecodeError("malformed fraction")
        return fractions.Fraction(num, den)
    if tag == "OBJ" and len(rest) == 3 and isinstance(rest[0], str) and rest[1] in (True, False, None) \
            and (rest[2] is None or (type(rest[2]) is int and rest[2] > 0)):
        return Opaque(rest[0][:80], rest[1], rest[2])
    if tag == "H" and len(rest) == 1 and type(rest[0]) is int:
        if rest[0] not in _HANDLES:  # only meaningful in C, for handles it gave out
            raise DecodeError("unknown handle")
        return _HANDLES[rest[0]]
    raise DecodeError(f"unknown value tag {tag[:20]!r}")


def _check_hashes(keys: list, encoded: list) -> None:
    """DecodeError if more than ``MAX_SAME_HASH`` distinct keys share one hash value.

    Integers, fractions, decimals and floats hash to their value modulo 2**61 - 1, so a forged
    result can hold a million distinct keys with one hash, which makes building the dict or set
    quadratic (minutes, in C code that no deadline interrupts). The hashes are counted first (a
    Counter of ints: distinct ints never collide there); only a crowded hash value has its keys
    told apart, by their encoded form as text (str hashes are randomised)."""
    import collections

    try:
        counts = collections.Counter(map(hash, keys))
    except TypeError:
        raise DecodeError("unhashable key") from None
    if not counts or max(counts.values()) <= MAX_SAME_HASH:
        return
    crowded = {h for h, n in counts.items() if n > MAX_SAME_HASH}
    distinct: dict = {}
    for key, enc in zip(keys, encoded):
        h = hash(key)
        if h in crowded:
            seen = distinct.setdefault(h, set())
            seen.add(json.dumps(enc))
            if len(seen) > MAX_SAME_HASH:
                raise DecodeError(f"more than {MAX_SAME_HASH} distinct keys with one hash value")


def structure_count(raw: bytes) -> int:
    """JSON separators and openings in ``raw``, an upper bound on the values json.loads builds."""
    return raw.count(b",") + raw.count(b"[") + raw.count(b"{") + raw.count(b":")


# ---------------------------------------------------------------------------------------------
# the candidate process C


def _short(exc: BaseException) -> tuple[str, str]:
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


def _cgroup_base(controller: str) -> str | None:
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
        base = _cgroup_base(controller)
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
    "masks": [directories]}``; :func:`_build_jail` builds the jail from it.
    """
    import importlib

    dynload = [os.path.realpath(p) for p in sys.path if os.path.basename(p) == "lib-dynload" and os.path.isdir(p)]
    zipped = [os.path.realpath(p) for p in sys.path if p.endswith(".zip") and os.path.isfile(p)]
    stdlib: list[str] = []
    for d in [os.path.realpath(os.path.dirname(os.__file__)), *dynload, *zipped]:
        if not any(_inside(d, other) for other in stdlib):
            stdlib = [other for other in stdlib if not _inside(other, d)] + [d]
    for d in dynload:
        for name in sorted(os.listdir(d)):
            module, _, suffix = name.partition(".")
            if suffix.endswith("so") and module not in _PLAN_SKIP:
                try:
                    importlib.import_module(module)
                except Exception:  # noqa: BLE001 - a module whose library is missing: not needed
                    pass
    mapped = set()
    with open("/proc/self/maps") as fh:
        for line in fh:
            fields = line.split(None, 5)
            path = fields[5].strip() if len(fields) == 6 else ""
            if path.startswith("/") and os.path.isfile(path) and not any(_inside(path, d) for d in stdlib):
                mapped.add(path)
    links: dict[str, str] = {}
    binds = set(stdlib)
    exe = os.path.realpath(sys.executable)
    entries = [exe, *sorted(mapped)]
    interp = _elf_interpreter(exe)
    if interp:
        entries.append(interp)
    if os.path.isfile("/etc/ld.so.cache"):
        entries.append("/etc/ld.so.cache")
    for d in sorted({os.path.dirname(m) for m in mapped}):  # sonames: links to a mapped library
        for name in sorted(os.listdir(d)):
            full = os.path.join(d, name)
            if os.path.islink(full) and os.path.realpath(full) in mapped:
                entries.append(full)
    for top in sorted(os.listdir("/")):  # /lib -> usr/lib, /lib64 ...: where loaders look
        if top.startswith("lib") and os.path.islink("/" + top):
            links["/" + top] = os.readlink("/" + top)
    for path in entries:
        binds.add(_resolve_recording_links(path, links))
    masks = [os.path.join(d, sub) for d in stdlib for sub in ("site-packages", "dist-packages")
             if os.path.isdir(os.path.join(d, sub))]  # (a pyenv or /usr/local Python installs packages there)
    return {"binds": sorted(binds), "links": sorted([k, v] for k, v in links.items()), "masks": masks}


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


def _build_jail(cfg: dict, uid: int | None) -> None:
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


def candidate_main(cfg: dict, req_r: int, resp_w: int, out_w: int, err_w: int) -> None:
    """Runs in the forked child. Never returns."""
    try:
        uid = cfg.get("uid")
        # fds: 0 <- /dev/null, 1/2 <- J's capture pipes, keep the two channel ends, close the rest
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        _close_fds_but({0, 1, 2, req_r, resp_w})
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
            _build_jail(cfg, uid)
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
        _set_rlimits([
            (resource.RLIMIT_CPU, int(cfg["cpu_s"])),
            (resource.RLIMIT_AS, int(cfg["memory_mb"]) << 20),
            (resource.RLIMIT_FSIZE, int(cfg["fsize_mb"]) << 20),
            (resource.RLIMIT_NOFILE, int(cfg["nofile"])),
            (resource.RLIMIT_CORE, 0),
            (resource.RLIMIT_NPROC, int(cfg["nproc_abs"])),
        ])
        mechanisms.append("rlimits")
        if _drop_privileges(uid):
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
            view = memoryview(data)
            while view:
                view = view[os.write(resp_w, view):]
        except BaseException:  # noqa: BLE001
            os._exit(0)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001
            pass


# ---------------------------------------------------------------------------------------------
# the judge process J


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


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
                    self.exit_desc = f"killed by {_signame(sig)}"
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
            if os.WIFSIGNALED(status):
                self.exit_desc = f"killed by {_signame(os.WTERMSIG(status))}"
            else:
                self.exit_desc = f"exited with code {os.WEXITSTATUS(status)}"
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


# -- test rewriting


def _root_name(node):
    while isinstance(node, (ast.Call, ast.Attribute, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _bound_names(tree) -> set[str]:
    """Names a piece of code binds anywhere (assignment targets, loop / comprehension variables,
    lambda and function arguments, imports, except-as, defs)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            out.add(node.id)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                out.add((a.asname or a.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            out.add(node.name)
        elif isinstance(node, ast.MatchAs) and node.name:
            out.add(node.name)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            out.update(node.names)
    return out


def _top_level_defs(program: str) -> set[str]:
    try:
        tree = ast.parse(program)
    except BaseException:  # noqa: BLE001
        return set()
    out = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        out.add(n.id)
    return out


class _Rewriter(ast.NodeTransformer):
    def __init__(self, remote: set[str], local: set[str], table: list) -> None:
        self.remote = remote
        self.local = local
        self.table = table

    def visit(self, node):
        if isinstance(node, (ast.Name, ast.Call, ast.Attribute, ast.Subscript)):
            ctx = getattr(node, "ctx", None)
            if (ctx is None or isinstance(ctx, ast.Load)) and _root_name(node) in self.remote:
                return self._remote(node)
        return self.generic_visit(node)

    def _remote(self, node):
        inner_bound = _bound_names(node)
        free = sorted({n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
                      & self.local - inner_bound)
        self.table.append(ast.unparse(node))
        call = ast.Call(
            func=ast.Name("__mlmt_remote__", ast.Load()),
            args=[ast.Constant(len(self.table) - 1),
                  ast.Dict(keys=[ast.Constant(n) for n in free], values=[ast.Name(n, ast.Load()) for n in free])],
            keywords=[])
        return ast.copy_location(call, node)


def judge_setup(setup: str) -> tuple[dict, set[str]]:
    """J's trusted namespace from the setup, and the names only C has.

    The setup runs in C (after the program: MBPP's ``root = Node(1)`` needs the program's class),
    so what it binds is candidate-controlled there. J itself takes only the setup's stdlib
    imports and its plain-literal assignments (``expected = [1, 2]``, via ``ast.literal_eval``);
    tests then use J's copies. Every other name the setup binds is "C only": a test's use of it
    is evaluated in C, like a call to the program (fine for inputs, not for expected values).
    """
    ns: dict = {"__builtins__": builtins, "__name__": "__judge__"}
    c_only: set[str] = set()
    try:
        tree = ast.parse(setup or "")
    except BaseException:  # noqa: BLE001 - C reports the setup's syntax error
        return ns, c_only
    for node in tree.body:
        bound = _bound_names(node)
        done = False
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if all(m.split(".")[0] in sys.stdlib_module_names and m.split(".")[0] not in _NO_IMPORT
                   for m in mods) and not getattr(node, "level", 0):
                try:
                    exec(compile(ast.Module([node], []), "<setup-imports>", "exec"), ns)  # noqa: S102
                    done = True
                except Exception:  # noqa: BLE001
                    pass
        elif isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets):
            try:
                value = ast.literal_eval(node.value)
                for t in node.targets:
                    assert isinstance(t, ast.Name)  # every target is one (the elif above)
                    ns[t.id] = value
                done = True
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                pass
        if done:
            c_only -= bound
        else:
            c_only |= bound
            for name in bound:
                ns.pop(name, None)
    return ns, c_only


def prepare_test(test: str, ns: dict, setup_bound: set[str], program_defs: set[str], table: list):
    """Rewrite one test so that every candidate-dependent sub-expression becomes a remote call.

    A name is remote when J cannot resolve it: not a builtin, not a stdlib module, not imported
    by the setup, bound by the setup's own statements (e.g. MBPP's ``root = Node(1)``). A test
    whose names are all builtins (MBPP 126 asks for a function called ``sum``) sends the names
    the program defines at top level instead.
    """
    tree = ast.parse(test, "<test>", "exec")
    local = _bound_names(tree)
    loaded = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    for name in loaded - local:
        if name not in ns and name not in setup_bound and name in sys.stdlib_module_names \
                and name not in _NO_IMPORT and not hasattr(builtins, name):
            try:
                ns[name] = __import__(name)
            except Exception:  # noqa: BLE001
                pass

    def trusted(name: str) -> bool:
        return name not in setup_bound and (name in ns or hasattr(builtins, name))

    remote = {n for n in loaded - local if not trusted(n)}
    if not remote:
        remote = (loaded - local) & program_defs
    new = _Rewriter(remote, local, table).visit(tree)
    ast.fix_missing_locations(new)
    return compile(new, "<test>", "exec")


def _set_rlimits(limits) -> None:
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


def _drop_privileges(uid: int | None) -> bool:
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


def _close_fds_but(keep) -> None:
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


_REPORT_STATUSES = frozenset({"starting", "loading", "loaded", "ok", "load_error", "sandbox_error", "protocol",
                              "internal", "timeout", "died", "output_limit"})


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
        _close_fds_but({0, 1, 2, *fds.values()})
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
            _build_jail({**cfg, "pidns": False}, uid)  # no /proc: E is in the host's PID namespace
            mechanisms.append("evaluator_jail")
        else:
            os.chdir("/")
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        _set_rlimits([
            (resource.RLIMIT_CPU, int(float(cfg["timeout_s"]) * 2 + 10)),
            (resource.RLIMIT_AS, (int(cfg["memory_mb"]) + 256) << 20),
            (resource.RLIMIT_FSIZE, int(cfg["fsize_mb"]) << 20),
            (resource.RLIMIT_NOFILE, int(cfg["nofile"])),
            (resource.RLIMIT_CORE, 0),
            (resource.RLIMIT_NPROC, int(cfg["nproc"] if uid is not None else cfg["nproc_abs"])),
        ])
        if _drop_privileges(uid):
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


def judge_main() -> None:
    os.environ.clear()
    try:
        prctl(PR_SET_DUMPABLE, 0)  # C (same uid in the fallback mode) cannot ptrace J or read /proc/J/fd
    except OSError:
        pass
    if sys.argv[0].startswith("/dev/fd/"):  # the script itself, passed as a file descriptor
        try:
            os.close(int(sys.argv[0][len("/dev/fd/"):]))
        except (ValueError, OSError):
            pass
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
        for mod in PREIMPORT:  # C and E inherit them; see PREIMPORT
            try:
                __import__(mod)
            except Exception:  # noqa: BLE001
                pass
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
        import resource as _res
        cpu = int(float(cfg["timeout_s"]) * 2 + 10)
        _res.setrlimit(_res.RLIMIT_CPU, (cpu, cpu + 1))
    except (ValueError, OSError):
        pass
    timeout_s = float(cfg["timeout_s"])
    msg, ready, timed_out = _read_evaluator(report_r, time.monotonic() + timeout_s + 5.0, timeout_s, len(tests))
    os.close(report_r)
    e_status = _reap(epid)
    c_status = _reap(pid)
    got = _checked_report(msg, len(tests))
    report = {"nonce": part2["nonce"], **{k: got[k] for k in ("status", "passed", "details", "mechanisms",
                                                                "load_error", "load_etype")}}
    exit_desc, exit_signal = got["exit"], got["exit_signal"]
    if not exit_desc and c_status is not None:  # no report from the monitor: it was killed (by J, on a limit)
        if os.WIFSIGNALED(c_status):
            exit_desc = f"killed by {_signame(os.WTERMSIG(c_status))}"
        else:
            exit_desc = f"exited with code {os.WEXITSTATUS(c_status)}"
    gone = got["gone"]
    if msg is None:  # E sent nothing usable: timed out by J, or died (a limit, the memory cgroup)
        why = "the test evaluator " + ("timed out" if timed_out else "ended without a report" + (
            f" ({_signame(os.WTERMSIG(e_status))})" if e_status is not None and os.WIFSIGNALED(e_status) else ""))
        report["status"] = "starting" if not ready else "loaded"
        gone = "timeout" if timed_out and ready else "died" if ready else None
        report["load_error"] = why
    elif got["setup_error"]:
        report["status"] = "starting"
        report["load_error"] = got["setup_error"]
    if gone is not None and report["status"] in ("loading", "loaded"):
        report["status"] = gone
    elif report["status"] == "starting":
        report["status"] = "sandbox_error"
        report["load_error"] = report["load_error"] or (
            f"sandboxed process failed to start ({gone or 'no reply'}; {exit_desc})")
    for i, ok in enumerate(report["passed"]):
        if not ok and not report["details"][i]:
            report["details"][i] = f"not run ({report['status']}{'; ' + exit_desc if exit_desc else ''})"
    report["violation"] = got["violation"]
    report["exit"] = exit_desc
    report["exit_signal"] = exit_signal
    report["stdout"] = got["stdout"]
    report["stderr"] = got["stderr"]
    report["judge_s"] = round(time.monotonic() - t0, 4)
    if not cfg.get("pidns"):
        for uid in {cfg.get("uid"), cfg.get("eval_uid")} - {None}:
            _reap_uid(int(uid))
    _kill_descendants()  # orphans of E (outside C's PID namespace) and, without one, of C
    if cg_dirs:
        if oom_kills(cg_dirs) and not report["violation"]:
            report["violation"] = "memory limit exceeded (the run's memory cgroup)"
        remove_cgroups(cg_dirs)
    data = (json.dumps(report) + "\n").encode()
    view = memoryview(data)
    while view:
        view = view[os.write(report_fd, view):]


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
    program_defs = _top_level_defs(cfg["program"])
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
    global _JUDGE
    _JUDGE = judge
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


# ---------------------------------------------------------------------------------------------
# probe: which isolation mechanisms work on this machine


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
            view = memoryview(data)
            while view:
                view = view[os.write(w, view):]
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
        _build_jail({"fsize_mb": 1, "pidns": False, "jail_plan": plan}, None)
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


if __name__ == "__main__":
    judge_main()

"""Run directories: nothing written is ever lost or overwritten.

Layout of ``<output_dir>/<name>-<UTC timestamp>/``::

    spec.resolved.yaml   the validated spec, enough to reproduce the run
    manifest.json        git SHA, package versions, seed, host, start/end time, status
    metrics.jsonl        one JSON object per line, appended and flushed as produced
    samples.jsonl        full episodes (all turns, rewards, verdicts), appended and flushed
    checkpoints/step-N/  written under a temporary name and renamed when complete
    .lock                the pid of the process running the run; flock'ed while it runs

One process per run directory: :meth:`RunDir.lock` takes an advisory ``flock`` on ``.lock``
(the kernel drops it when the process dies, however it dies), so a second ``run --resume`` of
a directory in use is a one-line refusal naming the holder's pid, not a second writer.

A full disk (ENOSPC, EDQUOT) loses nothing already written: a failed atomic write removes its
temporary file, an unfinished checkpoint directory is removed (:meth:`RunDir.discard_checkpoint`),
and the manifest is still marked: when its atomic rewrite finds no space, it is overwritten in
place with its compact JSON, shorter than the indented file, so it fits in the blocks the file
already holds (:func:`_rewrite_in_place`).

Where anything is written (run directories may come from someone else, ARCHITECTURE.md):
every file goes to a regular file or a new path, through a fresh temporary file renamed over
it (:func:`atomic_write_bytes`) or opened without following a symlink (:class:`JsonlWriter`);
a device, FIFO, socket, symlink, anything under /proc or /sys, or a directory where a file is
expected (and the reverse) is a one-line refusal (:func:`check_output_file`,
:func:`check_output_dir`). A run's output root is never a system directory
(:func:`check_output_root`), and no part of a run directory may be a symlink
(:meth:`RunDir.open` checks them all before a resume writes anything).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import functools
import hashlib
import json
import os
import platform
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from mlmt_bench.errors import UserError

LOCK_FILE = ".lock"
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)  # the errors of a full disk or quota

_TRACKED_PACKAGES = ("mlmt-bench", "torch", "transformers", "peft", "accelerate", "tokenizers",
                     "datasets", "optuna", "math-verify", "vllm", "trl")


class MetricsListener(Protocol):
    """What a :class:`RunDir` hands its records to after writing them (:class:`mlmt_bench.trackers.RunTrackers`):
    neither method may raise."""

    def log(self, record: dict[str, Any]) -> None: ...

    def close(self, status: str) -> None: ...


def utc_now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# never written into, nor used as the root of a run's outputs: the kernel's views, and the
# directories of the system itself
_PSEUDO_FS = ("/proc", "/sys")
SYSTEM_DIRS = ("/proc", "/sys", "/dev", "/etc", "/bin", "/sbin", "/usr", "/boot", "/lib", "/lib32", "/lib64",
               "/libx32", "/run", "/var/lib", "/var/log", "/var/cache", "/var/spool", "/snap")
_SYSTEM_ROOTS = ("/", "/var", "/home", "/root", "/opt", "/srv", "/mnt", "/media", "/tmp", "/var/tmp")


def _inside(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory + "/")


def _what(mode: int) -> str:
    return ("a directory" if stat.S_ISDIR(mode) else "a regular file" if stat.S_ISREG(mode)
            else "a character device" if stat.S_ISCHR(mode)
            else "a block device" if stat.S_ISBLK(mode) else "a FIFO" if stat.S_ISFIFO(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "a symbolic link" if stat.S_ISLNK(mode)
            else "not a regular file")


def _real(path: Path, what: str) -> str:
    try:
        return os.path.realpath(os.path.abspath(path))
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte
        raise UserError(f"{_label(what, path)}: unusable path ({getattr(exc, 'strerror', None) or exc})") from None


def _check_pseudo(path: Path, real: str, what: str) -> None:
    """UserError if ``path``, as written or resolved (a symlink to /etc counts as /etc), is under
    /proc or /sys, or in a system directory (``SYSTEM_DIRS``: /etc, /usr, /dev ...): the one guard
    every output path and store goes through (:func:`check_output_file`, :func:`check_output_dir`)."""
    for p in (os.path.normpath(os.path.abspath(path)), real):
        top = next((d for d in _PSEUDO_FS if _inside(p, d)), None)
        if top is not None:
            raise UserError(f"{_label(what, path)}: under {top}, refused (only regular files are written)")
    for p in (os.path.normpath(os.path.abspath(path)), real):
        top = next((d for d in SYSTEM_DIRS if _inside(p, d)), None)
        if top is not None:
            raise UserError(f"{_label(what, path)}: in the system directory {top}, refused; write to a directory "
                            "of your own")


def _shown(path: Path | str) -> str:
    """``path`` as an error may show it: shortened, and not at all when it holds a NUL byte (no
    file system has such a path; its text is whatever a corrupt or hostile file put there)."""
    from mlmt_bench.io.bounded_input import shorten

    text = str(path)
    if "\0" in text:
        return f"(a path of {len(text)} characters with a NUL byte, not shown)"
    return shorten(text, 200)


def _label(what: str, path: Path | str) -> str:
    return f"{what} {_shown(path)}" if what else _shown(path)


def check_output_file(path: Path | str, what: str = "output") -> Path:
    """``path`` as a place to write a file: a regular file (replaced) or a new name in an existing
    directory. Anything else is a one-line UserError: a device, FIFO, socket, symlink, directory,
    a path under /proc or /sys, a parent that is not a directory."""
    path = Path(path)
    real = _real(path, what)
    _check_pseudo(path, real, what)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except (OSError, ValueError) as exc:
        raise UserError(f"{_label(what, path)}: unusable path ({getattr(exc, 'strerror', None) or exc})") from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise UserError(f"{_label(what, path)}: is {_what(st.st_mode)}, refused (only regular files are written)")
    parent = path.parent if str(path.parent) else Path(".")
    try:
        pst = os.stat(parent)
    except (OSError, ValueError):
        raise UserError(f"{_label(what, path)}: directory {_shown(parent)} does not exist") from None
    if not stat.S_ISDIR(pst.st_mode):
        raise UserError(f"{_label(what, path)}: {_shown(parent)} is {_what(pst.st_mode)}, not a directory")
    return path


def check_output_dir(path: Path | str, what: str = "output directory") -> Path:
    """``path`` as a directory to write files into: an existing directory (a symlink to one is
    followed) or a new path whose nearest existing ancestor is a directory; never under /proc
    or /sys. A one-line UserError otherwise."""
    path = Path(path)
    real = _real(path, what)
    _check_pseudo(path, real, what)
    probe = Path(real)
    while True:
        try:
            st = os.stat(probe)
            break
        except (FileNotFoundError, NotADirectoryError):
            probe = probe.parent
        except (OSError, ValueError) as exc:
            raise UserError(f"{_label(what, path)}: unusable path ({getattr(exc, 'strerror', None) or exc})") from None
    if not stat.S_ISDIR(st.st_mode):
        where = "" if str(probe) == real else f"{_shown(probe)} "
        raise UserError(f"{_label(what, path)}: {where}is {_what(st.st_mode)}, not a directory")
    return path


def check_output_root(path: Path | str, what: str = "output_dir") -> Path:
    """:func:`check_output_dir`, and not a system directory: ``/`` or a top-level directory such
    as /home or /tmp itself, nor anything in ``SYSTEM_DIRS`` (/etc, /usr, /dev, /proc ...)."""
    path = Path(path)
    real = _real(path, what)
    if real in _SYSTEM_ROOTS or any(_inside(real, d) for d in SYSTEM_DIRS):
        shown = _label(what, path) + (f" (= {_shown(real)})" if real != str(path) else "")
        raise UserError(f"{shown}: a system directory, refused as the root of run outputs; use a directory of "
                        "your own")
    return check_output_dir(path, what)


def rename_into_place(tmp: Path, final: Path, complete: Callable[[Path], bool]) -> None:
    """Rename the finished temporary folder ``tmp`` to ``final`` (a cache entry is complete or
    absent); when another process got there first (the rename fails and ``complete(final)``),
    keep theirs and remove ``tmp``."""
    try:
        os.rename(tmp, final)
    except OSError:
        if not complete(final):
            raise
        shutil.rmtree(tmp, ignore_errors=True)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one of another user's counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_abandoned_temporaries(directory: Path, pattern: re.Pattern[str]) -> None:
    """Remove the temporary folders in ``directory`` that a killed process left (SIGKILL runs no
    cleanup): only those named as ``pattern`` (a full match, group 1 the pid of the process that
    made it) that are real directories (not links), owned by this uid, whose process is gone. In a
    shared cache such as /tmp another program's ``.tmp-x-123-y`` is not ours to delete."""
    for tmp in directory.glob(".tmp-*"):
        m = pattern.fullmatch(tmp.name)
        if m is None:
            continue
        try:
            st = os.lstat(tmp)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not pid_alive(int(m.group(1))):
            shutil.rmtree(tmp, ignore_errors=True)


def cache_env_dir() -> Path | None:
    """``$MLMT_BENCH_CACHE`` as a place to write caches (shared bases, converted pretrained
    models), checked like a run's output root (:func:`check_output_root`: never ``/``, /tmp
    itself or a system directory, where a cache entry would land beside other programs' files);
    None when it is unset or empty."""
    env = os.environ.get("MLMT_BENCH_CACHE")
    if not env:
        return None
    return check_output_root(Path(env).expanduser(), "MLMT_BENCH_CACHE")


@contextlib.contextmanager
def atomic_open(path: Path | str, what: str = "output") -> Iterator[BinaryIO]:
    """A binary file to fill, renamed over ``path`` when the block ends (removed if it raises):
    a fresh temporary file (``O_EXCL``, a random name) beside it, so readers never see half a
    file and a planted name cannot redirect the write. ``path`` must be a regular file or a new
    name (:func:`check_output_file`, checked before and again before the rename): a device, FIFO
    or symlink there is refused, never replaced."""
    path = check_output_file(path, what)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent if str(path.parent) else ".")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        check_output_file(path, what)
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError) and exc.filename is None and exc.errno is not None:
            # a full disk's write or fsync names no file: the error line names the output
            raise OSError(exc.errno, exc.strerror or os.strerror(exc.errno), str(path)) from exc
        raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through :func:`atomic_open`."""
    with atomic_open(path) as f:
        f.write(data)


def atomic_write_text(path: Path, text: str) -> None:
    """:func:`atomic_write_bytes` of ``text`` in UTF-8; a lone surrogate (from a ``\\ud800`` escape
    in a JSON file read back: a copied run directory) is written as that escape, not an error."""
    atomic_write_bytes(path, text.encode("utf-8", "backslashreplace"))


def fresh_stamped_dir(parent: Path, name: str) -> Path:
    """A new directory ``parent/NAME-YYYYmmddTHHMMSSZ`` (UTC, ``parent`` must exist), with ``-1``,
    ``-2`` … appended when that name is taken: mkdir is atomic, so two runs or experiments started
    in the same second get distinct directories and neither writes into the other's."""
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    for i in range(1000):
        path = parent / (f"{name}-{stamp}" + (f"-{i}" if i else ""))
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise UserError(f"{parent}: could not create a fresh directory for {name} (1000 taken this second)")


@functools.cache
def code_fingerprint() -> str:
    """sha256 over mlmt-bench's own ``*.py`` files (path and bytes), hex: what code a run ran, even from
    a checkout with uncommitted changes (its ``git_sha`` does not say) or an installed wheel (none)."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def git_sha(cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd or Path(__file__).parent,
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


#: the packages whose version can change what a run computes (its sampling, arithmetic or
#: grading): an experiment's runs agree on them (mlmt_bench.experiment.join_versions) and the
#: step-0 memo keys on them (mlmt_bench.io.eval_memo.memo_key)
COMPUTING_PACKAGES = ("torch", "transformers", "peft", "accelerate", "tokenizers", "math-verify", "vllm")


def computing_versions(versions: dict[str, str]) -> dict[str, str]:
    """The :data:`COMPUTING_PACKAGES` of ``versions`` (as :func:`package_versions` gives them) that are installed."""
    return {k: versions[k] for k in COMPUTING_PACKAGES if versions.get(k)}


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in _TRACKED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return versions


class JsonlWriter:
    """Append-only JSON lines; each record is flushed to the OS as soon as it is written."""

    def __init__(self, path: Path) -> None:
        self.path = path
        fd = _open_regular(path, os.O_WRONLY | os.O_APPEND, "cannot append, a symlink is refused")
        os.set_blocking(fd, True)
        self._f = os.fdopen(fd, "a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        self._f.write(json.dumps(record, ensure_ascii=False, default=_json_default) + "\n")
        self._f.flush()

    def close(self) -> None:
        """fsync and close; the file is closed even when that fails (a full disk), then it raises."""
        if not self._f.closed:
            try:
                self._f.flush()
                os.fsync(self._f.fileno())
            finally:
                self._f.close()


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def read_jsonl_lines(path: Path) -> list[tuple[int, Any]]:
    """(line number, record) of a JSONL file this module wrote; a torn last line (a crash
    mid-write) is ignored, any other bad line is a file:line UserError (:mod:`mlmt_bench.io.jsonl`),
    and so is a file past the limits of :func:`~mlmt_bench.io.bounded_input.jsonl_bounds` (a run
    directory may come from someone else: ``report``, ``run --resume``)."""
    from mlmt_bench.io.bounded_input import jsonl_bounds
    from mlmt_bench.io.jsonl import iter_jsonl

    return list(iter_jsonl(path, torn_tail_ok=True, **jsonl_bounds()))


def read_jsonl(path: Path) -> list[Any]:
    """Records of a JSONL file (see :func:`read_jsonl_lines`)."""
    return [rec for _, rec in read_jsonl_lines(path)]


class RunDir:
    """One run's directory. Create with :meth:`create`, reopen for resume with :meth:`open`."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.checkpoints = self.path / "checkpoints"
        self._metrics: JsonlWriter | None = None
        self._samples: JsonlWriter | None = None
        self._eval_problems: JsonlWriter | None = None
        self._lock_fd: int | None = None
        self.trackers: MetricsListener | None = None  # experiment trackers (mlmt_bench/trackers), if any

    LOGS = ("manifest.json", "spec.resolved.yaml", "metrics.jsonl", "samples.jsonl", "eval_problems.jsonl")

    @classmethod
    def create(cls, output_dir: Path | str, name: str, spec_yaml: str, seed: int) -> RunDir:
        output_dir = check_output_root(output_dir)
        try:
            output_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"output_dir {_shown(output_dir)}: cannot create it ({exc.strerror or exc})") from None
        path = fresh_stamped_dir(output_dir, name)
        run = cls(path)
        run.checkpoints.mkdir()
        atomic_write_text(path / "spec.resolved.yaml", spec_yaml)
        run.write_manifest({
            "name": name,
            "status": "running",
            "seed": seed,
            "start_time": utc_now(),
            "end_time": None,
            "git_sha": git_sha(),
            "code": code_fingerprint(),
            "host": socket.gethostname(),
            "platform": platform.platform(),
            "argv": sys.argv,
            "versions": package_versions(),
            "spec_sha256": hashlib.sha256(spec_yaml.encode("utf-8")).hexdigest(),
        })
        return run

    @classmethod
    def open(cls, path: Path | str) -> RunDir:
        """An existing run directory, to resume: it, its logs, ``checkpoints/`` and each of its
        entries must be what they say (no symlink, device or FIFO), and it must not be a system
        directory; otherwise a one-line UserError before anything is read or written."""
        path = Path(path)
        check_output_root(path, "run directory")
        run = cls(path)
        run.check_parts()
        if not (path / "manifest.json").is_file() or not (path / "spec.resolved.yaml").is_file():
            raise UserError(f"{path}: not a run directory (no manifest.json / spec.resolved.yaml)")
        return run

    def check_parts(self) -> None:
        """UserError if the run directory, a log file, ``checkpoints/`` or anything in it is a
        symlink or of the wrong kind (a resume would follow it and write elsewhere)."""
        def check(p: Path, want_dir: bool) -> os.stat_result | None:
            try:
                st = os.lstat(p)
            except FileNotFoundError:
                return None
            except OSError as exc:
                raise UserError(f"{_shown(p)}: unreadable ({exc.strerror or exc})") from None
            ok = stat.S_ISDIR(st.st_mode) if want_dir else stat.S_ISREG(st.st_mode)
            if not ok:
                raise UserError(f"{_shown(p)}: is {_what(st.st_mode)}, refused (every part of a run directory "
                                f"must be a real {'directory' if want_dir else 'file'}, not a link)")
            return st

        if check(self.path, True) is None:
            raise UserError(f"{_shown(self.path)}: no such run directory")
        for name in (*self.LOGS, LOCK_FILE):
            check(self.path / name, False)
        if check(self.checkpoints, True) is None:
            return
        def unreadable(exc: OSError) -> None:  # a directory os.walk cannot list is not skipped unchecked
            raise UserError(f"{_shown(exc.filename or self.checkpoints)}: unreadable ({exc.strerror or exc})")

        seen, top = 0, str(self.checkpoints).count(os.sep)
        for root, dirs, files in os.walk(self.checkpoints, onerror=unreadable, followlinks=False):
            if root.count(os.sep) - top >= 16:  # a checkpoint is 2 levels deep; os.walk recurses in Python
                raise UserError(f"{_shown(self.checkpoints)}: nested more than 16 levels deep, refused")
            for name in dirs + files:  # os.walk lists a symlink to a directory among dirs, never enters it
                seen += 1
                if seen > 100_000:
                    raise UserError(f"{_shown(self.checkpoints)}: more than 100000 entries, refused")
                try:
                    st = os.lstat(os.path.join(root, name))
                except OSError as exc:  # a name too long for the system ...
                    raise UserError(f"{_shown(os.path.join(root, name))}: unreadable ({exc.strerror or exc})") from None
                if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
                    raise UserError(f"{_shown(os.path.join(root, name))}: is {_what(st.st_mode)}, refused (every "
                                    "part of a run directory must be a real file or directory, not a link)")

    # manifest -------------------------------------------------------------------------------
    def manifest(self) -> dict[str, Any]:
        from mlmt_bench.io.bounded_input import read_json

        manifest = read_json(self.path / "manifest.json")  # bounded: a resumed run directory may be anyone's
        if not isinstance(manifest, dict):
            raise UserError(f"{self.path / 'manifest.json'}: expected a JSON object")
        return manifest

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        """Atomically; on a full disk, in place (:func:`_rewrite_in_place`) so a status still lands."""
        path = self.path / "manifest.json"
        try:
            atomic_write_text(path, json.dumps(manifest, indent=2, default=_json_default))
        except OSError as exc:
            if exc.errno not in NO_SPACE or not path.is_file():
                raise
            try:
                _rewrite_in_place(path, json.dumps(manifest, separators=(",", ":"), default=_json_default))
            except OSError:
                raise exc from None

    def update_manifest(self, **fields: Any) -> None:
        m = self.manifest()
        m.update(fields)
        self.write_manifest(m)

    def finish(self, status: str) -> None:
        """Close the logs, record ``status`` and the end time, release the lock. It runs in error
        handlers (a full disk) too, so every log is closed whatever the others do; a log that could
        not be flushed turns "completed" into "failed" and its error is raised after the marking."""
        error = self._close_logs()
        if error is not None and status == "completed":
            status = "failed"
        else:
            error = None  # the run failed already; a log lost in that failure is not news
        if self.trackers is not None:  # never raises: a tracker's failure is a warning line
            self.trackers.close(status)
            self.trackers = None
        try:
            self.update_manifest(status=status, end_time=utc_now())
        finally:
            self.unlock()
        if error is not None:
            raise error

    def check_spec(self) -> str | None:
        """UserError if ``spec.resolved.yaml`` is not the spec the run started with (its sha256
        differs from the manifest's ``spec_sha256``): a resume would continue another experiment
        under the old name. A run from before the hash was recorded returns a warning instead, and
        the caller records the hash from then on. Never shows the file's content."""
        spec = self.path / "spec.resolved.yaml"
        want = self.manifest().get("spec_sha256")
        if want is None:
            return (f"warning: {_shown(self.path)}: manifest.json records no spec_sha256 (a run from an older "
                    "version); resuming with spec.resolved.yaml unchecked, its hash recorded from now on")
        if want != self.spec_sha256():
            raise UserError(f"{_shown(spec)}: changed since the run started (its sha256 is not manifest.json's "
                            "spec_sha256); a resume continues the spec the run began with: restore the file, or "
                            "start a new run with the edited spec")
        return None

    def spec_sha256(self) -> str:
        """sha256 of ``spec.resolved.yaml`` as it is on disk now."""
        h = hashlib.sha256()
        try:
            with open(self.path / "spec.resolved.yaml", "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
        except OSError as exc:
            raise UserError(f"{_shown(self.path / 'spec.resolved.yaml')}: unreadable ({exc.strerror or exc})") from None
        return h.hexdigest()

    # one process per run directory ------------------------------------------------------------
    def lock(self) -> None:
        """Hold ``.lock`` (an exclusive ``flock``, with this process's pid in it) until
        :meth:`finish` / :meth:`unlock` or the process's death; a one-line UserError naming the
        holder's pid if another process holds it. Advisory: every writer of a run (``run`` and
        ``run --resume``) takes it before writing."""
        import fcntl

        fd = _open_lock_file(self.path / LOCK_FILE, "the run directory")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BaseException as exc:
            holder = _holder(fd) if isinstance(exc, BlockingIOError) else None
            os.close(fd)
            if holder is None:
                raise
            raise UserError(f"{_shown(self.path)}: in use by process {holder} (it holds {LOCK_FILE}); one "
                            "process per run directory: wait for it to end or stop it, then resume") from None
        _write_holder(fd)
        self._lock_fd = fd

    def unlock(self) -> None:
        """Release :meth:`lock` (a no-op when not held). The file stays: removing it would let a
        process that opened the old file and one that creates a new one both hold "the" lock."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # append-only logs -----------------------------------------------------------------------
    def log_metrics(self, record: dict[str, Any]) -> None:
        """Append ``record`` to ``metrics.jsonl`` (flushed), then hand it to the trackers."""
        if self._metrics is None:
            self._metrics = JsonlWriter(self.path / "metrics.jsonl")
        self._metrics.write(record)
        if self.trackers is not None:
            self.trackers.log(record)

    def log_sample(self, record: dict[str, Any]) -> None:
        if self._samples is None:
            self._samples = JsonlWriter(self.path / "samples.jsonl")
        self._samples.write(record)

    def log_eval_problems(self, records: list[dict[str, Any]]) -> None:
        if self._eval_problems is None:
            self._eval_problems = JsonlWriter(self.path / "eval_problems.jsonl")
        for r in records:
            self._eval_problems.write(r)

    def metrics(self) -> list[dict[str, Any]]:
        path = self.path / "metrics.jsonl"
        return read_jsonl(path) if path.exists() else []

    def truncate_logs_after(self, step: int) -> None:
        """On resume: drop log lines written after the checkpoint at ``step`` (they will be redone),
        and the per-problem rows and samples of an evaluation of ``step`` whose metrics record was
        never written (the trainer writes that record last; the resumed run evaluates again)."""
        evaluated = False
        for name in ("metrics.jsonl", "samples.jsonl", "eval_problems.jsonl"):  # metrics first: it decides
            path = self.path / name
            if not path.exists():
                continue
            kept = []
            for lineno, r in read_jsonl_lines(path):  # a copied run directory's logs: anything may be there
                at = r.get("step", -1) if isinstance(r, dict) else None
                kind = name != "metrics.jsonl" or isinstance(r, dict) and isinstance(r.get("kind"), str)
                if isinstance(at, bool) or not isinstance(at, (int, float)) or not kind:  # the trainer reads both
                    raise UserError(f"{_shown(path)}:{lineno}: expected a JSON object with a numeric 'step'"
                                    + (" and a 'kind'" if name == "metrics.jsonl" else ""))
                if name == "metrics.jsonl":
                    evaluated = evaluated or (at == step and r["kind"] == "eval")
                if at < step or at == step and (evaluated or name == "metrics.jsonl"):
                    kept.append(r)
            atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in kept))

    def close(self) -> None:
        error = self._close_logs()
        if error is not None:
            raise error

    def _close_logs(self) -> OSError | None:
        """Close every log, even when one fails (a full disk); returns the first error."""
        error = None
        for w in (self._metrics, self._samples, self._eval_problems):
            if w is not None:
                try:
                    w.close()
                except OSError as exc:
                    error = error or exc
        self._metrics = self._samples = self._eval_problems = None
        return error

    # checkpoints ----------------------------------------------------------------------------
    def checkpoint_dir(self, step: int) -> Path:
        return self.checkpoints / f"step-{step:06d}"

    def begin_checkpoint(self, step: int) -> Path:
        """A temporary directory to fill; :meth:`commit_checkpoint` renames it into place.
        ``checkpoints/`` must be a real directory (a symlink would send the checkpoint elsewhere)."""
        if self.checkpoints.is_symlink() or (self.checkpoints.exists() and not self.checkpoints.is_dir()):
            raise UserError(f"{_shown(self.checkpoints)}: not a real directory (a symlink?), refused")
        tmp = self.checkpoints / f".tmp-step-{step:06d}"
        if tmp.is_symlink() or tmp.is_file():
            tmp.unlink()
        elif tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        return tmp

    def commit_checkpoint(self, tmp: Path, step: int) -> Path:
        final = self.checkpoint_dir(step)
        if os.path.lexists(final):
            old = final.with_name(final.name + ".old")
            _remove_entry(old)  # a stray one (left by a crash, or in a copied run directory)
            os.replace(final, old)
            os.replace(tmp, final)
            _remove_entry(old)  # a directory, or whatever a copied run directory had there (a file)
        else:
            os.replace(tmp, final)
        return final

    def discard_checkpoint(self, tmp: Path) -> None:
        """Remove an unfinished checkpoint (its writing failed: a full disk ...)."""
        shutil.rmtree(tmp, ignore_errors=True)

    def prune_checkpoints(self, keep: int | None, step: int) -> None:
        """``train.keep_checkpoints``: after the checkpoint at ``step``, delete all but the newest
        ``keep`` at or before it (None: keep all). Later ones are left: they are what a resume
        from an older checkpoint skipped as corrupt, and training will write over them."""
        if keep is None:
            return
        done = [p for p in self.iter_checkpoints() if _step_of(p) <= step]
        for old in done[:-keep]:
            shutil.rmtree(old)

    def latest_checkpoint(self) -> Path | None:
        done = list(self.iter_checkpoints())
        return done[-1] if done else None

    def iter_checkpoints(self) -> Iterator[Path]:
        """Committed checkpoints, oldest first: ``step-<digits>`` directories, by step (a stray
        ``step-zzz``, a ``.old`` or ``.tmp-`` directory is not a checkpoint)."""
        found = [p for p in self.checkpoints.glob("step-*")
                 if p.name[5:].isdigit() and p.name[5:].isascii() and p.is_dir() and not p.is_symlink()]
        yield from sorted(found, key=_step_of)


def _remove_entry(path: Path) -> None:
    """Remove ``path`` if it exists: a directory with its content, anything else (a file, a link) itself."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def _step_of(checkpoint: Path) -> int:
    return int(checkpoint.name[5:])


def _open_regular(path: Path, flags: int, cannot: str) -> int:
    """``path`` opened with ``flags`` (created if absent, mode 0644): never through a symlink, never
    blocking on a FIFO; a one-line UserError unless it is a regular file (``cannot``: what the
    error of a failed open says, followed by the reason in brackets)."""
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0), 0o644)
    except OSError as exc:
        raise UserError(f"{_shown(path)}: {cannot} ({exc.strerror or exc})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise UserError(f"{_shown(path)}: is {_what(mode)}, refused (only regular files are written)")
    return fd


def _open_lock_file(path: Path, what: str) -> int:
    """``path`` opened for an advisory ``flock`` (:func:`_open_regular`)."""
    return _open_regular(path, os.O_RDWR, f"cannot lock {what}")


def _write_holder(fd: int) -> None:
    with contextlib.suppress(OSError):  # the pid is for the message of whoever waits or is refused
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)


@contextlib.contextmanager
def one_at_a_time(path: Path, what: str, on_wait: Callable[[str], None] | None = None) -> Iterator[None]:
    """Run the block while holding an exclusive ``flock`` on ``path``, waiting for a process that
    holds it (``on_wait(its pid)`` is called once first): what the block makes (a cache entry) is
    made by one process, and the others then find it. The lock dies with its process, so a killed
    holder never blocks anyone. A lock file owned by another user is not waited on (it could hold
    it forever): the block then runs unlocked, as it did before there was a lock."""
    import fcntl

    try:
        foreign = os.lstat(path).st_uid != os.getuid()
    except OSError:
        foreign = False  # absent: created below, this user's
    if foreign:
        yield
        return
    fd = _open_lock_file(path, what)
    try:
        if os.fstat(fd).st_uid == os.getuid():  # created by another user since the lstat: not waited on
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if on_wait is not None:
                    on_wait(_holder(fd))
                fcntl.flock(fd, fcntl.LOCK_EX)
            _write_holder(fd)
        yield
    finally:
        os.close(fd)


def _holder(fd: int) -> str:
    """The pid written in a lock file, or "unknown" (the holder has not written it yet)."""
    raw = os.pread(fd, 32, 0).strip()
    return raw.decode("ascii") if raw.isdigit() else "unknown"


def _rewrite_in_place(path: Path, text: str) -> None:
    """Overwrite ``path``'s bytes and truncate it to ``text``: no new file, and no new block when
    ``text`` is no longer than the file. Not atomic (a crash mid-write tears it), so only for what
    a full disk leaves no other way to write."""
    data = text.encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        done = 0
        while done < len(data):
            done += os.pwrite(fd, data[done:], done)
        os.ftruncate(fd, len(data))
        os.fsync(fd)
    finally:
        os.close(fd)

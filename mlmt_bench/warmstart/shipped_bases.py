"""Shared bases shipped with mlmt-bench: a built base's cache entry (``base.json`` and ``model/``)
copied into the package, so that every machine starts the quickstart from the same weights and
its first run skips the build.

Why not build it everywhere: the CPU pin (:mod:`mlmt_bench.machine.reproducible`) makes a base the same
on machines of one CPU vendor, but not across vendors (measured 2026-12-03: the default seed-0
base built on an Intel Xeon with AMX has other weights than on an AMD EPYC, pinned alike, and
fails the testbed check there: false alarms on gold solutions 11.0% against 1.0%). A copy
shipped here is a base like any other in the cache: its ``base.json`` says where it was built.

Layout: ``mlmt_bench/data/bases/<key>/`` with the entry's files and ``files.json`` (each file's
sha256). :func:`install` copies a shipped entry into the cache only when every file matches (a
copy that does not is refused in one line), under a temporary name renamed into place like a
build. ``MLMT_BENCH_SHIPPED_BASES=0`` ignores shipped copies (every base is built here, e.g. to
see whether this machine reproduces one). :func:`ship` makes a copy from a cache entry.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from mlmt_bench.errors import UserError

#: where shipped entries live (package data)
SHIPPED_DIR = Path(__file__).resolve().parents[1] / "data" / "bases"
#: ``MLMT_BENCH_SHIPPED_BASES=0`` (or false/no/off) ignores shipped entries
SWITCH = "MLMT_BENCH_SHIPPED_BASES"
#: the manifest of a shipped entry: {path relative to the entry: sha256 of the file}
MANIFEST = "files.json"


def enabled() -> bool:
    """Whether shipped bases are used (they are unless ``MLMT_BENCH_SHIPPED_BASES`` switches them off)."""
    return os.environ.get(SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


def find(key: str) -> Path | None:
    """The shipped entry of base ``key``, or None (none shipped, or shipped bases switched off)."""
    entry = SHIPPED_DIR / key
    return entry if enabled() and (entry / MANIFEST).is_file() else None


def _sha256(path: Path) -> str:
    from mlmt_bench.machine.reproducible import file_sha256

    return file_sha256(path)


def verify(entry: Path, required: tuple[str, ...] = ("base.json", "model/model.safetensors"),
           what: str = "base") -> dict[str, str]:
    """The manifest of a shipped ``entry`` after checking every file it lists against its sha256
    (and that it lists the ``required`` files); a missing or changed file is one UserError naming
    it (a partial checkout, a Git LFS pointer, an edit). ``what`` names the entry's kind in errors."""
    try:
        files = json.loads((entry / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"shipped {what} {entry.name}: {MANIFEST} cannot be read ({exc}); reinstall mlmt-bench, "
                        f"or set {SWITCH}=0 to build it here") from None
    if not isinstance(files, dict) or not set(required) <= set(files):
        raise UserError(f"shipped {what} {entry.name}: {MANIFEST} does not list {' and '.join(required)}")
    for rel, sha in files.items():
        path = entry / rel
        if Path(rel).is_absolute() or ".." in Path(rel).parts or not path.is_file() or _sha256(path) != sha:
            raise UserError(f"shipped {what} {entry.name}: {rel} is missing or differs from its sha256 in "
                            f"{MANIFEST}; reinstall mlmt-bench, or set {SWITCH}=0 to build it here")
    return files


def copy_entry(entry: Path, files: dict[str, str], dest: Path) -> None:
    """Copy the ``files`` of a verified shipped ``entry`` under ``dest``."""
    for rel in files:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(entry / rel, dest / rel)


def write_manifest(dest: Path, paths: list[Path], source: Path) -> None:
    """Copy ``paths`` (under ``source``) to ``dest`` keeping their relative paths, and write the
    manifest of their sha256 there."""
    files = {}
    for path in sorted(paths):
        rel = path.relative_to(source).as_posix()
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dest / rel)
        files[rel] = _sha256(dest / rel)
    (dest / MANIFEST).write_text(json.dumps(files, indent=2, sort_keys=True) + "\n")


def install(key: str, cache_dir: Path) -> Path | None:
    """Copy the shipped entry of base ``key`` (verified: :func:`verify`) to ``cache_dir/key`` and
    return that directory; None when none is shipped. Another process that installs or builds
    the same key first wins (its entry is kept)."""
    entry = find(key)
    if entry is None:
        return None
    files = verify(entry)
    final = cache_dir / key
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-{os.getpid()}-", dir=cache_dir))  # as a build's
    try:
        copy_entry(entry, files, tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "base.json").is_file():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def ship(cache_entry: Path, root: Path = SHIPPED_DIR) -> Path:
    """Copy a built base's cache entry (``base.json`` and ``model/``) to ``root/<key>/`` with its
    manifest; returns that directory. For maintainers: ``python -m mlmt_bench.warmstart.shipped_bases ENTRY``."""
    key = json.loads((cache_entry / "base.json").read_text())["key"]
    dest = root / key
    if dest.resolve() == cache_entry.resolve():  # re-shipping an entry onto itself would delete it first
        raise UserError(f"{cache_entry} is already the shipped entry of base {key}; ship from a cache entry")
    if dest.exists():
        shutil.rmtree(dest)
    write_manifest(dest, [cache_entry / "base.json", *(cache_entry / "model").iterdir()], cache_entry)
    return dest


if __name__ == "__main__":
    print(ship(Path(sys.argv[1])))

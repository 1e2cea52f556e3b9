"""Finding and reading benchmark data files.

:func:`load_records` returns a dataset's rows as a list of dicts with the upstream field
names (the same shape whether the rows came from a local file or from the Hugging Face
hub). It looks, in this order, in:

1. the benchmark's ``path`` option: a data file, or a directory holding one;
2. the directory named by ``$MLMT_BENCH_DATA``;
3. the data shipped with the project (:func:`shipped_dirs`): ``<repo>/data`` in a source
   checkout, ``<prefix>/share/mlmt-bench/data`` for a wheel install, and last
   ``<repo>/../shared/data`` (one more place, never needed);
4. the Hugging Face hub, through ``datasets.load_dataset`` with the upstream dataset names
   (skipped when ``HF_HUB_OFFLINE=1`` or ``HF_DATASETS_OFFLINE=1``).

An explicit ``path`` that does not hold the file is an error (it is never silently
replaced by another copy). If nothing is found, the :class:`~mlmt_bench.errors.UserError`
names every place searched, on one line.

Readers accept plain or gzip-compressed files (detected by content) in three formats:
JSON Lines (``.jsonl``), a JSON array of objects (``.json``) and CSV with a header row
(``.csv``; fields may contain newlines), and a CSV member of a (password-protected) zip
archive, read in memory (GPQA as its authors distribute it). A corrupt or truncated file gives a one-line
``UserError`` naming the file and the line. Rows are never echoed in messages (GPQA asks
that its questions not be published).
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import stat
import threading
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlmt_bench.benchmarks.base import Benchmark
from mlmt_bench.errors import UserError
from mlmt_bench.io.jsonl import (
    DECODE_ERRORS as _DECODE_ERRORS,
    decode_error as _decode_error,
    is_gzip as _is_gzip,
    iter_jsonl,
)
from mlmt_bench.types import Problem

ENV_VAR = "MLMT_BENCH_DATA"
OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")

_REPO_ROOT = Path(__file__).resolve().parents[2]


def shipped_dirs() -> list[Path]:
    """Directories searched after ``$MLMT_BENCH_DATA``: the data that comes with the project."""
    import sys

    return [
        _REPO_ROOT / "data",
        Path(sys.prefix) / "share" / "mlmt-bench" / "data",
        (_REPO_ROOT / ".." / "shared" / "data").resolve(),
    ]


@dataclass(frozen=True)
class HubSource:
    """Where the same rows live on the Hugging Face hub.

    ``splits``: the hub splits to concatenate (in this order, then sorted by ``sort_key``
    when given), so that e.g. MBPP's four hub splits become the 974 rows of ``mbpp.jsonl``.
    ``convert``: turns one hub row into the local file's row shape (default: ``dict(row)``).
    """

    path: str
    name: str | None
    splits: tuple[str, ...]
    sort_key: str | None = None
    convert: Callable[[dict[str, Any]], dict[str, Any]] | None = None


@dataclass(frozen=True)
class ZipMember:
    """A CSV inside a zip archive: ``archive`` (file name), ``member`` (path inside), ``password``."""

    archive: str
    member: str
    password: bytes | None = None


@dataclass(frozen=True)
class DataSpec:
    """One dataset: its local file name(s), the columns every row must have, the hub copy."""

    benchmark: str
    filenames: tuple[str, ...]
    required: tuple[str, ...]
    hub: HubSource | None = None
    extra_names: tuple[str, ...] = field(default=())  # other accepted names in a directory
    zip_member: ZipMember | None = None  # the archive is tried after the plain files

    def candidates(self) -> tuple[str, ...]:
        archive = (self.zip_member.archive,) if self.zip_member else ()
        return self.filenames + self.extra_names + archive


# ---------------------------------------------------------------------------------------
# Readers
# ---------------------------------------------------------------------------------------


def _open_text(path: Path) -> io.TextIOBase:
    if _is_gzip(path):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


def _format_of(path: Path) -> str:
    name = path.name.lower()
    if name.endswith(".gz"):
        name = name[:-3]
    for ext, fmt in ((".jsonl", "jsonl"), (".ndjson", "jsonl"), (".json", "json"), (".csv", "csv")):
        if name.endswith(ext):
            return fmt
    raise UserError(f"{path}: unknown data file type (expected .jsonl, .json or .csv, optionally .gz)")


def _check_row(path: Path, line: int, row: Any, required: Sequence[str]) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise UserError(f"{path}:{line}: expected a JSON object per record, got {type(row).__name__}")
    missing = [k for k in required if k not in row]
    if missing:
        raise UserError(f"{path}:{line}: record lacks field(s) {', '.join(missing)}")
    return row


def read_jsonl(path: Path, required: Sequence[str] = ()) -> list[dict[str, Any]]:
    return [_check_row(path, lineno, row, required) for lineno, row in iter_jsonl(path)]


def read_json_array(path: Path, required: Sequence[str] = ()) -> list[dict[str, Any]]:
    try:
        with _open_text(path) as f:
            text = f.read()
    except _DECODE_ERRORS as exc:
        raise _decode_error(path, 1, exc) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}:{exc.lineno}: invalid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(data, list):
        raise UserError(f"{path}:1: expected a JSON array of records, got a JSON {type(data).__name__}")
    # line of each element, for messages: count newlines up to each top-level element
    rows = []
    for i, row in enumerate(data):
        if not isinstance(row, dict) or any(k not in row for k in required):
            line = _array_element_line(text, i)
            _check_row(path, line, row, required)
        rows.append(row)
    return rows


def _array_element_line(text: str, index: int) -> int:
    """1-based line where the ``index``-th element of a top-level JSON array starts."""
    dec = json.JSONDecoder()
    pos = text.index("[") + 1
    for i in range(index + 1):
        while text[pos] in " \t\r\n,":
            pos += 1
        if i == index:
            return text.count("\n", 0, pos) + 1
        _, pos = dec.raw_decode(text, pos)
    return 1


def read_csv(path: Path, required: Sequence[str] = ()) -> list[dict[str, Any]]:
    return _read_csv_stream(path, lambda: _open_text(path), required)


def read_zip_csv(path: Path, member: ZipMember, required: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Rows of a CSV member of a zip archive, decrypted and decompressed in memory only."""
    import zipfile

    origin = Path(f"{path}!{member.member}")
    try:
        with zipfile.ZipFile(path) as archive:
            raw = archive.read(member.member, pwd=member.password)
    except KeyError:
        raise UserError(f"{path}: archive has no member {member.member!r}") from None
    except (zipfile.BadZipFile, RuntimeError, OSError, zlib.error, EOFError) as exc:
        raise UserError(f"{path}: corrupt or unreadable zip archive ({_first_line(exc)})") from None
    return _read_csv_stream(origin, lambda: io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8", newline=""),
                            required)


def _read_csv_stream(path: Path, open_text: Callable[[], Any], required: Sequence[str]) -> list[dict[str, Any]]:
    """CSV rows with a header; ``path`` names the source in messages."""
    rows: list[dict[str, Any]] = []
    line = 1
    try:
        with open_text() as f:
            reader = csv.reader(f)
            try:
                header = next(reader)
            except StopIteration:
                raise UserError(f"{path}:1: empty CSV file (no header row)") from None
            missing = [k for k in required if k not in header]
            if missing:
                raise UserError(f"{path}:1: CSV header lacks column(s) {', '.join(missing)}")
            line = reader.line_num
            for fields in reader:
                start = line + 1
                line = reader.line_num
                if not fields or (len(fields) == 1 and not fields[0].strip()):
                    continue
                if len(fields) != len(header):
                    raise UserError(
                        f"{path}:{start}: CSV record has {len(fields)} field(s), the header has "
                        f"{len(header)} (truncated or corrupt file?)"
                    )
                rows.append(dict(zip(header, fields)))
    except UserError:
        raise
    except csv.Error as exc:
        raise UserError(f"{path}:{line + 1}: corrupt CSV ({exc})") from None
    except _DECODE_ERRORS as exc:
        raise _decode_error(path, line + 1, exc) from None
    return rows


_READERS = {"jsonl": read_jsonl, "json": read_json_array, "csv": read_csv}

_cache: dict[tuple[str, int, int, tuple[str, ...], str], list[dict[str, Any]]] = {}
_cache_lock = threading.Lock()


def read_records(path: Path, required: Sequence[str] = (), member: ZipMember | None = None) -> list[dict[str, Any]]:
    """Rows of a local data file, or of ``member`` when ``path`` is its zip archive (cached per
    path, size, mtime and member; treat as read-only)."""
    path = Path(path)
    try:
        st = path.stat()
    except OSError as exc:
        raise UserError(f"{path}: cannot read data file ({exc.strerror or exc})") from None
    zipped = member if member is not None and path.name == member.archive else None  # read from the archive
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns, tuple(required), zipped.member if zipped else "")
    with _cache_lock:
        if key in _cache:
            return _cache[key]
    rows = read_zip_csv(path, zipped, required) if zipped else _READERS[_format_of(path)](path, required)
    with _cache_lock:
        _cache[key] = rows
    return rows


# ---------------------------------------------------------------------------------------
# Discovery
# ---------------------------------------------------------------------------------------


@dataclass
class Found:
    rows: list[dict[str, Any]]
    origin: str  # a file path, or "hf://<dataset>[/<config>]"


def _find_in_dir(directory: Path, spec: DataSpec) -> Path | None:
    for name in spec.candidates():
        p = directory / name
        if p.is_file():
            return p
    return None


def _offline_var() -> str | None:
    """``"HF_HUB_OFFLINE=1"`` (as set) when an offline variable is on, else None."""
    for var in OFFLINE_VARS:
        value = os.environ.get(var, "").strip()
        if value.lower() in ("1", "true", "yes", "on"):
            return f"{var}={value}"
    return None


def _load_hub(hub: HubSource) -> list[dict[str, Any]]:
    import datasets  # looked up at call time, so tests can monkeypatch datasets.load_dataset

    rows: list[dict[str, Any]] = []
    for split in hub.splits:
        if hub.name is None:
            ds = datasets.load_dataset(hub.path, split=split)
        else:
            ds = datasets.load_dataset(hub.path, hub.name, split=split)
        for row in ds:
            row = dict(row)
            rows.append(hub.convert(row) if hub.convert else row)
    sort_key = hub.sort_key
    if sort_key:
        rows.sort(key=lambda r: r[sort_key])
    return rows


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    msg = text[0] if text else ""
    return f"{type(exc).__name__}: {msg}"[:200] if msg else type(exc).__name__


def data_path_problem(path: str | os.PathLike[str]) -> str | None:
    """What is wrong with ``path`` (``~`` expanded) as a benchmark's data, or None for an existing
    regular file or directory: "does not exist", or what it is instead ("is a character device,
    refused"): a device or FIFO is never opened (reading /dev/zero never ends, a FIFO blocks)."""
    from mlmt_bench.io.bounded_input import kind_of, why_unusable

    try:
        st = os.stat(os.path.expanduser(path))
    except (FileNotFoundError, NotADirectoryError):
        return "does not exist"
    except (OSError, ValueError, RuntimeError) as exc:  # a symlink loop, a NUL byte
        return f"cannot be used ({why_unusable(exc)})"
    if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
        return None
    return f"is {kind_of(st.st_mode)}, refused (expected a data file or a directory)"


def load_records(spec: DataSpec, path: str | os.PathLike[str] | None = None) -> Found:
    """Rows of ``spec`` from the first place that has them (see the module docstring)."""
    want = " or ".join(spec.filenames)
    # 1. explicit path
    if path is not None and str(path) != "":
        p = Path(path).expanduser()
        if p.is_file():
            return Found(read_records(p, spec.required, spec.zip_member), str(p))
        if p.is_dir():
            f = _find_in_dir(p, spec)
            if f is not None:
                return Found(read_records(f, spec.required, spec.zip_member), str(f))
            raise UserError(f"benchmark {spec.benchmark}: {want} not found in path {p}")
        raise UserError(f"benchmark {spec.benchmark}: path {p} {data_path_problem(p) or 'does not exist'}")
    searched: list[str] = []
    # 2. $MLMT_BENCH_DATA
    env = os.environ.get(ENV_VAR, "")
    if env:
        d = Path(env).expanduser()
        f = _find_in_dir(d, spec) if d.is_dir() else None
        if f is not None:
            return Found(read_records(f, spec.required, spec.zip_member), str(f))
        searched.append(f"${ENV_VAR}={d}" + ("" if d.is_dir() else " (not a directory)"))
    else:
        searched.append(f"${ENV_VAR} (not set)")
    # 3. shipped data
    for d in shipped_dirs():
        f = _find_in_dir(d, spec) if d.is_dir() else None
        if f is not None:
            return Found(read_records(f, spec.required, spec.zip_member), str(f))
        searched.append(str(d))
    # 4. Hugging Face hub
    hub = spec.hub
    if hub is None:
        searched.append("Hugging Face hub (no hub copy)")
    else:
        where = hub.path + (f" ({hub.name})" if hub.name else "")
        off = _offline_var()
        if off:
            searched.append(f"Hugging Face hub {where} (skipped: {off})")
        else:
            try:
                rows = _load_hub(hub)
            except UserError:
                raise
            except Exception as exc:  # offline, gated, not installed ...
                searched.append(f"Hugging Face hub {where} ({_first_line(exc)})")
            else:
                missing = [k for k in spec.required if rows and k not in rows[0]]
                if missing:
                    raise UserError(f"benchmark {spec.benchmark}: hub dataset {where} lacks field(s) "
                                    f"{', '.join(missing)}")
                return Found(rows, f"hf://{hub.path}" + (f"/{hub.name}" if hub.name else ""))
    raise UserError(
        f"benchmark {spec.benchmark}: data file {want} not found; searched: {'; '.join(searched)}. "
        f"Pass the benchmark option path=FILE_OR_DIR or set ${ENV_VAR}"
    )


# ---------------------------------------------------------------------------------------
# Deterministic helpers shared by the benchmarks
# ---------------------------------------------------------------------------------------


def stable_hash(*parts: Any) -> int:
    """A 64-bit hash of ``parts`` that is the same in every process (unlike ``hash()``)."""
    import hashlib

    text = "\x1f".join(str(p) for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


SPLITS: tuple[str, ...] = ("train", "validation", "test")


def seeded_split(ids: Iterable[str], seed: int, validation_fraction: float, test_fraction: float,
                 salt: str) -> dict[str, set[str]]:
    """Partition ``ids`` into disjoint ``train`` / ``validation`` / ``test`` sets for a seed.

    With ``u = stable_hash(salt, seed, id) / 2**64`` uniform in [0, 1): ``test`` when
    ``u < test_fraction``, ``validation`` when ``u < test_fraction + validation_fraction``,
    else ``train``. Each id's side depends only on (salt, seed, id), not on the other ids, so
    an item never changes split when a file gains or loses rows, and GPQA diamond/main/extended
    (which share record ids and the salt "gpqa") put a shared question on the same side. The
    shares are therefore close to, not exactly, the fractions.
    """
    out: dict[str, set[str]] = {split: set() for split in SPLITS}
    for i in ids:
        u = stable_hash(salt, seed, i) / 2.0**64
        out["test" if u < test_fraction else "validation" if u < test_fraction + validation_fraction
            else "train"].add(i)
    return out


def check_fractions(benchmark: str, validation_fraction: Any, test_fraction: Any) -> tuple[float, float]:
    """``(validation, test)`` fractions as floats: each in [0, 1), test > 0, and a train share left."""
    values = []
    for name, value in (("validation_fraction", validation_fraction), ("test_fraction", test_fraction)):
        if isinstance(value, bool):
            value = None
        try:
            f = float(value)
        except (TypeError, ValueError):
            raise UserError(f"benchmark {benchmark}: {name} must be a number in [0, 1), got {value!r}") from None
        if not 0.0 <= f < 1.0:
            raise UserError(f"benchmark {benchmark}: {name} must be in [0, 1), got {value!r}")
        values.append(f)
    val, test = values
    if test <= 0.0 or val + test >= 1.0:
        raise UserError(f"benchmark {benchmark}: need test_fraction > 0 and validation_fraction + test_fraction < 1 "
                        f"(the rest is train), got {val:g} + {test:g}")
    return val, test


# ---------------------------------------------------------------------------------------
# Base class of the benchmarks that only have a test set upstream (MATH-500, GSM8K, GPQA)
# ---------------------------------------------------------------------------------------


class HeldOutSplitBenchmark(Benchmark):
    """A benchmark whose upstream release is a single test set.

    Splits (METHOD.md v2: disjoint): a seeded partition of the problems (:func:`seeded_split`)
    into ``train``, ``validation`` (``validation_fraction``, default 0.1) and ``test``
    (``test_fraction``, default 0.5). Problems keep the file's order within every split. Sweeps
    and checks read ``validation``; reports read ``test``.

    Subclasses set ``data_spec``, ``split_salt`` and implement ``make_problem(row, index)``.
    """

    splits = SPLITS
    data_spec: DataSpec
    split_salt: str = ""

    def __init__(self, path: str | None = None, seed: int = 0, validation_fraction: float = 0.1,
                 test_fraction: float = 0.5, **options: Any) -> None:
        super().__init__(path=path, seed=seed, **options)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise UserError(f"benchmark {self.name}: seed must be an integer, got {seed!r}")
        self.validation_fraction, self.test_fraction = check_fractions(self.name, validation_fraction, test_fraction)
        self._problems: list[Problem] | None = None
        self.origin: str | None = None

    def make_problem(self, row: dict[str, Any], index: int, origin: str) -> Problem:
        raise NotImplementedError

    def all_problems(self) -> list[Problem]:
        """Every problem, in file order (loaded once per instance)."""
        if self._problems is None:
            found = load_records(self.data_spec, self.path)
            self.origin = found.origin
            problems = [self.make_problem(row, i, found.origin) for i, row in enumerate(found.rows)]
            ids = [p.id for p in problems]
            if len(set(ids)) != len(ids):
                dup = next(i for i in ids if ids.count(i) > 1)
                raise UserError(f"{found.origin}: duplicate problem id {dup!r}")
            self._problems = problems
        return self._problems

    def load(self, split: str) -> list[Problem]:
        self.check_split(split)
        problems = self.all_problems()
        keep = seeded_split([p.id for p in problems], self.seed, self.validation_fraction, self.test_fraction,
                            self.split_salt or self.name)[split]
        return [p for p in problems if p.id in keep]

"""Reading JSON Lines, the one reader for every JSONL file the project reads: benchmark data,
``verify`` input, and the logs a run writes (metrics, samples, per-problem evaluations).

A file may be gzip-compressed (recognised by its magic bytes). Every problem is a one-line
``file:line`` :class:`~mlmt_bench.errors.UserError`; ``torn_tail_ok`` accepts a last line cut off
mid-write (a run killed while logging), which is dropped.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mlmt_bench.errors import UserError

DECODE_ERRORS = (EOFError, gzip.BadGzipFile, zlib.error, UnicodeDecodeError, OSError)


def is_gzip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def decode_error(path: Path, line: int, exc: BaseException) -> UserError:
    if isinstance(exc, EOFError):
        why = "file is truncated (compressed stream ended early)"
    elif isinstance(exc, UnicodeDecodeError):
        why = "not valid UTF-8"
    else:
        why = f"cannot be read ({type(exc).__name__}: {exc})"
    return UserError(f"{path}:{line}: corrupt data file: {why}".replace("\n", " "))


def iter_jsonl(path: Path | str, *, max_line_bytes: int | None = None, max_depth: int | None = None,
               torn_tail_ok: bool = False, max_total_bytes: int | None = None, max_lines: int | None = None,
               max_nodes: int | None = None) -> Iterator[tuple[int, Any]]:
    """(line number, parsed value) of each non-blank line of a JSON Lines file (plain or gzip).

    A line that is not JSON (or not UTF-8), or a file that cannot be decoded, is a one-line
    file:line UserError, except the last line when ``torn_tail_ok``; so is a line longer than
    ``max_line_bytes`` (newline included; read no further) or nested deeper than ``max_depth``,
    and a file of more than ``max_total_bytes`` (decompressed: a gzip bomb is read no further),
    ``max_lines`` lines (blank ones included) or ``max_nodes`` JSON values and keys in all
    (:func:`~mlmt_bench.bounded_input.json_nodes`); with ``max_total_bytes`` only a regular file
    is opened. :func:`mlmt_bench.bounded_input.jsonl_bounds` gives all of them (None: no limit)."""
    from mlmt_bench.bounded_input import check_json_depth, human_bytes, shorten

    path = Path(path)
    lineno = 0
    limit = -1 if max_line_bytes is None else max_line_bytes + 1
    bounded = max_total_bytes is not None or max_lines is not None or max_nodes is not None
    total = nodes = 0
    if bounded:  # a device or FIFO is refused before it is opened (reading /dev/zero never ends)
        from mlmt_bench.bounded_input import check_regular_file

        check_regular_file(path)
    try:
        with (gzip.open(path, "rb") if is_gzip(path) else open(path, "rb")) as f:
            for lineno, raw in enumerate(iter(lambda: f.readline(limit), b""), 1):
                if max_line_bytes is not None and len(raw) > max_line_bytes:
                    raise UserError(f"{path}:{lineno}: line longer than {human_bytes(max_line_bytes)}")
                if bounded:
                    total += len(raw)
                    _check_total(path, lineno, total, max_total_bytes, max_lines, human_bytes)
                try:
                    value = _parse(raw, path, lineno, shorten)
                except UserError:
                    if torn_tail_ok and not raw.endswith(b"\n") and not f.readline(1):
                        return  # the last line, cut off mid-write
                    raise
                if value is _BLANK:
                    continue
                if max_nodes is not None:
                    from mlmt_bench.bounded_input import json_nodes

                    nodes += json_nodes(value, f"{path}:{lineno}", 1 << 30 if max_depth is None else max_depth)
                    if nodes > max_nodes:
                        raise UserError(f"{path}:{lineno}: more than the limit of {max_nodes:,} JSON values "
                                        "in one file")
                elif max_depth is not None:
                    check_json_depth(value, f"{path}:{lineno}", max_depth)
                yield lineno, value
    except UserError:
        raise
    except DECODE_ERRORS as exc:
        raise decode_error(path, lineno + 1, exc) from None


_BLANK = object()


def _check_total(path: Path, lineno: int, total: int, max_total_bytes: int | None, max_lines: int | None,
                 human_bytes: Any) -> None:
    if max_total_bytes is not None and total > max_total_bytes:
        raise UserError(f"{path}:{lineno}: more than the limit of {human_bytes(max_total_bytes)} of JSON Lines "
                        "(decompressed) in one file")
    if max_lines is not None and lineno > max_lines:
        raise UserError(f"{path}:{lineno}: more than the limit of {max_lines:,} lines in one file")


def _parse(raw: bytes, path: Path, lineno: int, shorten: Any) -> Any:
    try:  # line by line, so an undecodable byte is reported on its own line
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise decode_error(path, lineno, exc) from None
    if not line.strip():
        return _BLANK
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}:{lineno}: invalid JSON ({exc.msg} at column {exc.colno})") from None
    except RecursionError:
        raise UserError(f"{path}:{lineno}: invalid JSON (nested too deeply)") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise UserError(f"{path}:{lineno}: invalid JSON ({shorten(str(exc), 120)})") from None

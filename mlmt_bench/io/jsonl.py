"""Reading JSON Lines, the one reader for every JSONL file the project reads: benchmark data,
``verify`` input, and the logs a run writes (metrics, samples, per-problem evaluations).

A file may be gzip-compressed (recognised by its magic bytes; read by :func:`open_jsonl`, not
Python's gzip module, whose reader skips the NUL padding after a member one byte per Python call:
a member followed by 3 GiB of NUL bytes, a sparse file, held it for hours). Every problem is a one-line
``file:line`` :class:`~mlmt_bench.errors.UserError`; ``torn_tail_ok`` accepts a last line cut off
mid-write (a run killed while logging), which is dropped.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from mlmt_bench.errors import UserError

DECODE_ERRORS = (EOFError, gzip.BadGzipFile, zlib.error, UnicodeDecodeError, OSError)


def is_gzip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


class GzipTooLarge(Exception):
    """More compressed bytes than a gzip file within its decompressed limit can hold."""


class _Gunzip(io.RawIOBase):
    """The decompressed bytes of a gzip file: its members one after another, the NUL padding gzip
    allows between and after them skipped a chunk at a time (in C), CRC and length checked by
    zlib. At most ``cap`` compressed bytes are read (GzipTooLarge past it); a member cut short is
    an EOFError, anything else that is not gzip a zlib.error."""

    CHUNK = 1 << 20

    def __init__(self, f: BinaryIO, cap: int | None) -> None:
        self._f, self._cap, self._consumed = f, cap, 0
        self._d = zlib.decompressobj(31)
        self._tail = b""  # compressed bytes read but not yet decompressed

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self._f.close()
        super().close()

    def _more(self) -> bytes:
        chunk = self._f.read(self.CHUNK)
        self._consumed += len(chunk)
        if self._cap is not None and self._consumed > self._cap:
            raise GzipTooLarge(self._cap)
        return chunk

    def readinto(self, buf: Any) -> int:
        while True:
            if self._d.eof:  # a member ended: skip the padding, then the next member, if any
                rest = self._d.unused_data.lstrip(b"\0")
                while not rest:
                    chunk = self._more()
                    if not chunk:
                        return 0
                    rest = chunk.lstrip(b"\0")
                self._d, self._tail = zlib.decompressobj(31), rest
            if not self._tail:
                self._tail = self._more()
                if not self._tail:
                    raise EOFError("compressed stream ended early")
            out = self._d.decompress(self._tail, len(buf))  # never more than asked: a bomb stays small
            self._tail = self._d.unconsumed_tail
            if out:
                buf[: len(out)] = out
                return len(out)


def open_jsonl(path: Path | str, max_total_bytes: int | None = None, *, follow_links: bool = True) -> BinaryIO:
    """``path`` opened to read its bytes, decompressed when it is gzip (its magic bytes). With
    ``max_total_bytes`` (the decompressed limit), no more compressed bytes are read than a gzip
    of that much can hold (:class:`GzipTooLarge`): padding or garbage past it is never read.
    ``follow_links=False``: opened with ``O_NOFOLLOW`` (a symbolic link raises OSError ELOOP)."""
    if follow_links:
        f = open(path, "rb")
    else:
        f = os.fdopen(os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)), "rb")
    try:
        gz = f.read(2) == b"\x1f\x8b"
        f.seek(0)
    except BaseException:
        f.close()
        raise
    if not gz:
        return f
    cap = None if max_total_bytes is None else max_total_bytes + max_total_bytes // 64 + (1 << 20)
    return io.BufferedReader(_Gunzip(f, cap), buffer_size=1 << 16)


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
    (:func:`~mlmt_bench.io.bounded_input.json_nodes`); with ``max_total_bytes`` only a regular file
    is opened. :func:`mlmt_bench.io.bounded_input.jsonl_bounds` gives all of them (None: no limit)."""
    from mlmt_bench.io.bounded_input import check_json_depth, human_bytes, shorten

    path = Path(path)
    lineno = 0
    limit = -1 if max_line_bytes is None else max_line_bytes + 1
    bounded = max_total_bytes is not None or max_lines is not None or max_nodes is not None
    total = nodes = 0
    if bounded:  # a device or FIFO is refused before it is opened (reading /dev/zero never ends)
        from mlmt_bench.io.bounded_input import check_regular_file

        check_regular_file(path)
    try:
        with open_jsonl(path, max_total_bytes) as f:
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
                    from mlmt_bench.io.bounded_input import json_nodes

                    nodes += json_nodes(value, f"{path}:{lineno}", 1 << 30 if max_depth is None else max_depth)
                    if nodes > max_nodes:
                        raise UserError(f"{path}:{lineno}: more than the limit of {max_nodes:,} JSON values "
                                        "in one file")
                elif max_depth is not None:
                    check_json_depth(value, f"{path}:{lineno}", max_depth)
                yield lineno, value
    except UserError:
        raise
    except GzipTooLarge as exc:
        raise UserError(f"{path}:{lineno + 1}: more than {exc.args[0]:,} bytes of gzip data (a gzip of the limit, "
                        f"{human_bytes(max_total_bytes or 0)} of JSON Lines, is smaller)") from None
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

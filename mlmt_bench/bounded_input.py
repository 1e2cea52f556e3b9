"""Bounded reading of what a user hands in as structured text.

Every spec file (run, experiment and its ``base:``, sweep, each file of an ``extends:`` chain),
every ``--set`` value and every ``mlmt-bench verify`` input line is read through this module,
so that no input, however crafted, can make a command hang, exhaust memory or end in a
traceback: a violation is one :class:`~mlmt_bench.errors.UserError` line (exit code 2), found
in well under a second. The limits, all named here:

=====================  ===================================================================
``MAX_FILE_BYTES``     1 MiB: one YAML file, or one ``--set`` value. Only regular files are
                       opened (a device, FIFO or socket is refused before it is opened).
``MAX_DEPTH``          64 nested mappings / sequences (an alias counts as its expansion).
``MAX_NODES``          50,000 scalars, mappings and sequences in one YAML document, with every
                       alias counted as a full copy of what it refers to (an "alias bomb"
                       stops here); an alias inside the node it names is refused.
``MAX_EXTENDS``        16 files in one ``extends:`` chain.
``MAX_LINE_BYTES``     16 MiB: one JSON line of a ``verify`` input (its nesting: ``MAX_DEPTH``).
``MAX_ECHO_CHARS``     60: user input quoted in an error message is cut to this (:func:`shorten`,
                       :func:`short_repr`).
=====================  ===================================================================

A value read from a file is quoted in an error only if it is plain (:func:`echo`: a number, or a
short name such as ``grop`` or ``Qwen/Qwen2.5-1.5B``); anything else is described ("a string of
37 characters"), never shown: a spec can ``extends:`` any file (``/etc/shadow``), and an error
names the file and the field, not the file's content. YAML syntax errors say where, not what.

Real specs use a few hundred nodes, a depth below 10 and a few KB; the limits leave a wide
margin and bound the worst case (measured in ``tests/test_hostile_input.py``).

YAML is checked in two passes: the event stream of the (C, when available) parser is walked
once to count depth and expanded nodes, and only a document within the limits is built.
"""

from __future__ import annotations

import os
import re
import reprlib
import stat
from pathlib import Path
from typing import Any

import yaml

from mlmt_bench.errors import UserError

MAX_FILE_BYTES = 1 << 20
MAX_DEPTH = 64
MAX_NODES = 50_000
MAX_EXTENDS = 16
MAX_LINE_BYTES = 16 << 20
MAX_ECHO_CHARS = 60

# PyYAML's libyaml binding parses ~50x faster than its pure-Python parser; the resolver and
# constructor (Python in both) are the same, so the result is the same.
_LOADER: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class InvalidYAML(UserError):
    """Text that is not YAML (a syntax error); ``--set`` then takes the text as a string."""


def shorten(text: str, limit: int = MAX_ECHO_CHARS) -> str:
    """``text`` cut to ``limit`` characters (the last one then ``…``)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def short_repr(value: Any, limit: int = MAX_ECHO_CHARS) -> str:
    """``repr(value)`` cut to ``limit`` characters, in bounded time whatever the size of
    ``value`` (reprlib looks at a few items per level and a few levels only)."""
    r = reprlib.Repr()
    r.maxstring = r.maxother = r.maxlong = limit + 8
    r.maxlevel, r.maxdict, r.maxlist, r.maxtuple, r.maxset, r.maxfrozenset, r.maxdeque = 3, 4, 6, 6, 6, 6, 6
    return shorten(r.repr(value), limit)


_PLAIN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+\-/ ]{0,%d}\Z" % (MAX_ECHO_CHARS - 1))
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]{0,%d}\Z" % (MAX_ECHO_CHARS - 1))


def is_plain(value: Any) -> bool:
    """Whether ``value`` may be quoted in an error: a number, bool, None, or a short string of
    letters, digits, ``_ . - + /`` and spaces (a name, a path, a number as text)."""
    if value is None or isinstance(value, (bool, int, float)):
        return not isinstance(value, int) or abs(value) < 10 ** 30
    if isinstance(value, (list, tuple)):  # a short list of such: [1, 2]
        return len(value) <= 6 and all(not isinstance(v, (list, tuple)) and is_plain(v) for v in value) \
            and len(repr(value)) <= MAX_ECHO_CHARS
    return isinstance(value, str) and bool(_PLAIN.match(value))


def is_name(key: Any) -> bool:
    """Whether a mapping key may be shown in an error: a short identifier (every spec field is one)."""
    return isinstance(key, int) and not isinstance(key, bool) or isinstance(key, str) and bool(_NAME.match(key))


def echo(value: Any) -> str:
    """``value`` for an error message: its repr when :func:`is_plain`, else what it is, never its
    content ("a string of 37 characters", "a mapping of 3 keys")."""
    if is_plain(value):
        return repr(value)
    if isinstance(value, str):
        return f"a string of {len(value)} characters (not shown)"
    if isinstance(value, dict):
        return f"a mapping of {len(value)} key{'s' * (len(value) != 1)} (not shown)"
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)} item{'s' * (len(value) != 1)} (not shown)"
    return f"a value of type {type(value).__name__} (not shown)"


def human_bytes(n: int) -> str:
    """``n`` bytes as "16 MiB" when a whole number of MiB, else "1234 bytes"."""
    return f"{n >> 20} MiB" if n >= 1 << 20 and n % (1 << 20) == 0 else f"{n} bytes"


def read_text(path: Path | str, limit: int = MAX_FILE_BYTES) -> str:
    """The UTF-8 text of a regular file of at most ``limit`` bytes; one-line UserError otherwise.

    Devices, FIFOs and sockets are refused from ``stat`` before they are opened (opening a
    FIFO blocks, reading /dev/zero never ends); the file is then opened non-blocking, checked
    again and read up to ``limit + 1`` bytes, so a file swapped or growing meanwhile is caught.
    """
    path = Path(path)
    st = check_regular_file(path)
    if st.st_size > limit:
        raise UserError(f"{path}: {st.st_size} bytes, more than the limit of {human_bytes(limit)}")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        _check_regular(path, os.fstat(fd).st_mode)
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    if size > limit:
        raise UserError(f"{path}: more than the limit of {human_bytes(limit)}")
    try:
        return b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a text file (cannot decode as UTF-8)") from None


def check_regular_file(path: Path | str) -> os.stat_result:
    """``os.stat(path)``; UserError unless it is an existing regular file (checked without opening it)."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        raise UserError(f"{path}: file not found") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        raise UserError(f"{path}: cannot read ({getattr(exc, 'strerror', None) or exc})") from None
    _check_regular(Path(path), st.st_mode)
    return st


def _check_regular(path: Path, mode: int) -> None:
    if stat.S_ISDIR(mode):
        raise UserError(f"{path}: is a directory, expected a file")
    if not stat.S_ISREG(mode):
        raise UserError(f"{path}: not a regular file (a device, FIFO or socket), refused")


# ----------------------------------------------------------------------------------------------
# YAML


def load_yaml(text: str, source: str) -> Any:
    """The YAML document in ``text`` (None when empty), within the limits above.

    ``source`` starts every message (a file name, ``--set KEY``). Raises :class:`InvalidYAML`
    for a syntax error and :class:`UserError` for a limit or a value YAML cannot build
    (``2001-02-30``, an integer of 5,000 digits).
    """
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate: undecodable bytes of a command-line argument
        raise UserError(f"{source}: not valid UTF-8 text") from None
    if size > MAX_FILE_BYTES:
        raise UserError(f"{source}: {size} bytes of YAML, more than the limit of {human_bytes(MAX_FILE_BYTES)}")
    try:
        check_yaml_bounds(text, source)
        return yaml.load(text, Loader=_LOADER)  # noqa: S506 - a safe loader (CSafeLoader / SafeLoader)
    except yaml.YAMLError as exc:
        raise InvalidYAML(f"{source}: invalid YAML: {_yaml_problem(exc)}") from None
    except (ValueError, OverflowError, TypeError) as exc:  # raised by a constructor (int, date ...)
        raise UserError(f"{source}: invalid YAML value: {shorten(str(exc), 120)}") from None


_QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'" + r'|"(?:[^"\\]|\\.)*"')


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """Where and what, without the file's text: a quoted piece of it in PyYAML's message (an
    undefined alias's name, a tag) is dropped, a single quoted character kept."""
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    problem = getattr(exc, "problem", None) or (str(exc).splitlines() or [type(exc).__name__])[0]
    return where + shorten(unquoted(problem), 120)


def unquoted(text: str) -> str:
    """``text`` (an exception's message) without the pieces of input it quotes, but single
    characters: "found undefined alias (not shown)", "unexpected keyword argument (not shown)"."""
    return _QUOTED.sub(lambda m: m.group(0) if len(m.group(0)) <= 6 else "(not shown)", text)


def check_yaml_bounds(text: str, source: str) -> None:
    """Walk the parser's events once: UserError past ``MAX_DEPTH`` or ``MAX_NODES`` (aliases
    expanded) or at an alias inside the node it names. Syntax errors propagate as YAMLError."""
    nodes = 0
    depth = 0  # collections open around the current event
    done: dict[Any, tuple[int, int]] = {}  # anchor -> (expanded nodes, levels of collections)
    stack: list[list[Any]] = []  # per open collection: [anchor, nodes before it, deepest level inside]
    for event in yaml.parse(text, Loader=_LOADER):
        kind = type(event)
        if kind is yaml.ScalarEvent:
            nodes += 1
            if event.anchor is not None:
                done[event.anchor] = (1, 0)
        elif kind is yaml.SequenceStartEvent or kind is yaml.MappingStartEvent:
            nodes += 1
            depth += 1
            if depth > MAX_DEPTH:
                raise _bound_error(source, event, f"nested deeper than {MAX_DEPTH} levels")
            stack.append([event.anchor, nodes - 1, depth])
        elif kind is yaml.SequenceEndEvent or kind is yaml.MappingEndEvent:
            anchor, before, deepest = stack.pop()
            if anchor is not None:
                done[anchor] = (nodes - before, deepest - depth + 1)
            depth -= 1
            if stack:
                stack[-1][2] = max(stack[-1][2], deepest)
        elif kind is yaml.AliasEvent:
            if event.anchor not in done:
                if any(entry[0] == event.anchor for entry in stack):
                    raise _bound_error(source, event, "an alias is inside the node it names")
                continue  # an undefined alias: the loader reports it
            count, levels = done[event.anchor]
            nodes += count
            if depth + levels > MAX_DEPTH:
                raise _bound_error(source, event, f"nested deeper than {MAX_DEPTH} levels (with aliases expanded)")
            if stack:
                stack[-1][2] = max(stack[-1][2], depth + levels)
        if nodes > MAX_NODES:
            raise _bound_error(source, event, f"has more than {MAX_NODES} nodes (aliases counted as copies)")


def _bound_error(source: str, event: Any, what: str) -> UserError:
    mark = getattr(event, "start_mark", None)
    where = f" (line {mark.line + 1})" if mark is not None else ""
    return UserError(f"{source}: YAML {what}{where}")


# ----------------------------------------------------------------------------------------------
# JSON


def check_json_depth(value: Any, where: str, limit: int = MAX_DEPTH) -> None:
    """UserError if ``value`` (parsed JSON) nests lists / objects deeper than ``limit``."""
    stack = [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if level > limit:
            raise UserError(f"{where}: JSON nested deeper than {limit} levels")
        stack.extend((child, level + 1) for child in children if isinstance(child, (dict, list)))

"""Bounded reading of what a user hands in as structured text.

Every spec file (run, experiment and its ``base:``, sweep, each file of an ``extends:`` chain),
every ``--set`` value, every ``mlmt-bench verify`` input line and every file of a run directory
that ``report`` or ``run --resume`` reads (run directories travel: :func:`read_json`,
:func:`jsonl_bounds`) is read through this module, so that no input, however crafted, can
make a command hang, exhaust memory or end in a traceback: a violation is one
:class:`~mlmt_bench.errors.UserError` line (exit code 2), found in well under a second (a run's
logs: in the time it takes to read up to the limits). The limits, all named here:

=====================  ===================================================================
``MAX_FILE_BYTES``     1 MiB: one YAML file, or one ``--set`` value. Only regular files are
                       opened (a device, FIFO or socket is refused before it is opened).
``MAX_DEPTH``          64 nested mappings / sequences (an alias counts as its expansion).
``MAX_NODES``          50,000 scalars, mappings and sequences in one YAML document, with every
                       alias counted as a full copy of what it refers to (an "alias bomb"
                       stops here); an alias inside the node it names is refused.
``MAX_EXTENDS``        16 files in one ``extends:`` chain.
``MAX_LINE_BYTES``     16 MiB: one JSON line of a ``verify`` input or a run's log (its nesting:
                       ``MAX_DEPTH``).
``MAX_JSONL_BYTES``    256 MiB: one JSON Lines file (a ``verify`` input, a run's
                       ``metrics`` / ``samples`` / ``eval_problems`` log), counted after gzip
                       decompression (a gzip bomb stops here).
``MAX_JSONL_LINES``    2,000,000 lines of one such file, blank ones included (a file of
                       newlines is read in about a second, not for minutes).
``MAX_JSONL_NODES``    4,000,000 JSON values and object keys in one such file: each takes ~60
                       bytes once parsed (``[[],[],…]`` ~20 times its size), so what is kept
                       stays below ~250 MB; a real log or input holds well under a million.
``MAX_JSON_BYTES``     4 MiB: one JSON file of a run or experiment directory (``manifest.json``,
                       ``experiment.json``: a run writes a few KB), nested at most ``MAX_DEPTH``.
``MAX_ECHO_CHARS``     60: user input quoted in an error message is cut to this (:func:`shorten`,
                       :func:`short_repr`).
``MAX_SCORED_CHARS``   2 Mi characters: one ``response`` (or inline gold ``answer``) of a
                       ``verify`` input line. Scoring is linear but costs ~1 s per MiB in
                       the worst case (a choice response of ``"A "`` repeated), so a 16 MiB
                       line took 30 s; a real response (``max_new_tokens`` ≤ 131,072) is
                       well under 1 MiB.
=====================  ===================================================================

A value read from a file is quoted in an error only if it is plain (:func:`echo`: a number, or a
short name such as ``grop`` or ``Qwen/Qwen2.5-1.5B``); anything else is described ("a string of
37 characters"), never shown: a spec can ``extends:`` any file (``/etc/shadow``), and an error
names the file and the field, not the file's content. YAML syntax errors say where, not what.
Every message the CLI prints goes through :func:`printable` first: a control character (ESC,
BEL, CR, NUL, any other C0 / C1 one) or a bidi override (U+202E) that a spec, a name or a
``--set`` value slips into a message is shown escaped (``\\x1b``, ``\\u202e``), so no input can
recolour, rewrite or reorder the terminal's text.

A key given twice in one YAML mapping (at any depth; ``<<:`` merge keys excepted, those may be
overridden) is an error naming the key and both lines: PyYAML would silently keep the last one,
so a second ``train:`` mapping would drop the first one's ``token_budget``.

Real specs use a few hundred nodes, a depth below 10 and a few KB; the limits leave a wide
margin and bound the worst case (measured in ``tests/test_hostile_input.py``).

YAML is checked in two passes: the event stream of the (C, when available) parser is walked
once to count depth and expanded nodes, and only a document within the limits is built.

Written here because the parsers bound none of it: PyYAML's ``safe_load`` builds any number of
aliases and any depth (an alias bomb is a structure no walk of it finishes) and keeps a duplicate
key's last value, and ``json`` reads any size it is given and any depth up to a RecursionError.
"""

from __future__ import annotations

import errno
import itertools
import os
import re
import reprlib
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

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
if TYPE_CHECKING:  # the type checker sees SafeLoader: CSafeLoader has the same constructor and resolver
    _LOADER = yaml.SafeLoader
else:
    _LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class InvalidYAML(UserError):
    """Text that is not YAML (a syntax error); ``--set`` then takes the text as a string."""


def shorten(text: str, limit: int = MAX_ECHO_CHARS) -> str:
    """``text`` cut to ``limit`` characters (the last one then ``…``)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def printable(text: str) -> str:
    """``text`` as a message may show it: every character that is not printable escaped as Python
    writes it (``\\x1b``, ``\\u202e``, ``\\udcff``): C0 / C1 controls, DEL, bidi controls and other
    format characters, line / paragraph separators, surrogates; and the password of every URL
    masked (:func:`mask_credentials`). What a message shows the terminal cannot act on, a lone
    surrogate (an undecodable argument) cannot make writing it fail, and no error line or note
    prints a database password."""
    return escape_unprintable(mask_credentials(text))


def escape_unprintable(text: str, keep: str = "") -> str:
    """``text`` with every character that is not printable, except those in ``keep``, written as
    Python writes its escape (``\\x1b``, ``\\u202e``, ``\\udcff``)."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() or ch in keep else _escape(ch) for ch in text)


#: ``scheme://user:password@host``: the user kept, the password (up to the last ``@`` before the
#: host's ``/``, so a password holding ``@`` is masked whole) replaced
_URL_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://[^:/@\s]*):[^/\s]*@")


def mask_credentials(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@host`` URL in it replaced by
    ``***`` (``postgresql+psycopg2://admin:s3cret@db/mlflow`` → ``postgresql+psycopg2://admin:***@db/mlflow``)."""
    return _URL_PASSWORD.sub(r"\1:***@", text) if "://" in text else text


def _escape(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def short_repr(value: Any, limit: int = MAX_ECHO_CHARS) -> str:
    """``repr(value)`` cut to ``limit`` characters, in bounded time whatever the size of
    ``value`` (reprlib looks at a few items per level and a few levels only)."""
    r = reprlib.Repr()
    r.maxstring = r.maxother = r.maxlong = limit + 8
    r.maxlevel, r.maxdict, r.maxlist, r.maxtuple, r.maxset, r.maxfrozenset, r.maxdeque = 3, 4, 6, 6, 6, 6, 6
    return shorten(r.repr(value), limit)


_PLAIN = re.compile(rf"[A-Za-z0-9_][A-Za-z0-9_.+\-/ ]{{0,{MAX_ECHO_CHARS - 1}}}\Z")
_NAME = re.compile(rf"[A-Za-z_][A-Za-z0-9_\-]{{0,{MAX_ECHO_CHARS - 1}}}\Z")


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


def did_you_mean(name: Any, known: Iterable[str], *, n: int = 1) -> str:
    """``"; did you mean 'grpo'?"``: the hint for a ``name`` not among ``known``, naming the (at
    most ``n``) entries closest to it (:func:`difflib.get_close_matches`, similarity ≥ 0.5), or ""
    when none is close. Only a plain name (:func:`is_plain`) gets one: a hint is for a typo, and a
    value that is not shown is not hinted at either. The one did-you-mean of the package."""
    import difflib

    close = difflib.get_close_matches(str(name), list(known), n=n, cutoff=0.5) if is_plain(name) else []
    return f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""


_PATH_LIKE = re.compile(r"[\w./~+\-@=, ]{1,200}\Z")


def echo_path(value: Any) -> str:
    """A path from a file for an error message: itself when it is made of the characters of
    ordinary paths (letters, digits, ``/ . _ - ~ + @ = ,`` and spaces; at most 200), else
    :func:`echo` (described, not shown)."""
    return value if isinstance(value, str) and _PATH_LIKE.match(value) else echo(value)


def human_bytes(n: int) -> str:
    """``n`` bytes as "16 MiB" when a whole number of MiB, else "1234 bytes"."""
    return f"{n >> 20} MiB" if n >= 1 << 20 and n % (1 << 20) == 0 else f"{n} bytes"


def read_text(path: Path | str, limit: int = MAX_FILE_BYTES, *, follow_links: bool = True) -> str:
    """The UTF-8 text of a regular file of at most ``limit`` bytes; one-line UserError otherwise
    (:func:`read_bytes`)."""
    data = read_bytes(path, limit, follow_links=follow_links)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a text file (cannot decode as UTF-8)") from None


def read_bytes(path: Path | str, limit: int = MAX_FILE_BYTES, *, follow_links: bool = True) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes; one-line UserError otherwise.

    Devices, FIFOs and sockets are refused from ``stat`` before they are opened (opening a
    FIFO blocks, reading /dev/zero never ends); the file is then opened non-blocking, checked
    again and read up to ``limit + 1`` bytes, so a file swapped or growing meanwhile is caught.
    ``follow_links=False`` (a file in a directory from elsewhere: a published report, a run
    directory being published): a symbolic link is refused, checked with ``lstat`` and again by
    opening with ``O_NOFOLLOW``, so a link to a private key is never read through.
    """
    path = Path(path)
    st = check_regular_file(path) if follow_links else check_plain_file(path)
    if st.st_size > limit:
        raise UserError(f"{path}: {st.st_size} bytes, more than the limit of {human_bytes(limit)}")
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow_links:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a link swapped in since the lstat
            raise UserError(f"{path}: a symbolic link, refused (links are not followed here)") from None
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
    return b"".join(chunks)


def check_regular_file(path: Path | str) -> os.stat_result:
    """``os.stat(path)``; UserError unless it is an existing regular file (checked without opening it)."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        raise UserError(f"{path}: file not found") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        raise UserError(f"{path}: cannot read ({why_unusable(exc)})") from None
    _check_regular(Path(path), st.st_mode)
    return st


def check_plain_file(path: Path | str) -> os.stat_result:
    """``os.lstat(path)``; UserError unless it is an existing regular file that is not a symbolic
    link (a link in a directory from elsewhere could point anywhere: it is refused, not followed)."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        raise UserError(f"{path}: file not found") from None
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: cannot read ({why_unusable(exc)})") from None
    refuse_link(path, st.st_mode)
    _check_regular(Path(path), st.st_mode)
    return st


def refuse_link(path: Path | str, mode: int | None = None) -> None:
    """A one-line UserError if ``path`` is a symbolic link (``lstat``; ``mode``: its ``st_mode``
    when the caller has it)."""
    if mode is None:
        try:
            mode = os.lstat(path).st_mode
        except (OSError, ValueError):
            return  # absent or unusable: the caller's own check says so
    if stat.S_ISLNK(mode):
        raise UserError(f"{shorten(str(path), 200)}: a symbolic link, refused (links are not followed here)")


def _check_regular(path: Path, mode: int) -> None:
    if stat.S_ISDIR(mode):
        raise UserError(f"{path}: is a directory, expected a file")
    if not stat.S_ISREG(mode):
        raise UserError(f"{path}: not a regular file ({kind_of(mode)}), refused")


def kind_of(mode: int) -> str:
    """What an ``st_mode`` is, for a message: "a directory", "a character device", "a FIFO" ..."""
    return ("a directory" if stat.S_ISDIR(mode) else "a regular file" if stat.S_ISREG(mode)
            else "a character device" if stat.S_ISCHR(mode) else "a block device" if stat.S_ISBLK(mode)
            else "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a symbolic link" if stat.S_ISLNK(mode) else "neither a file nor a directory")


def resolved(path: Path | str) -> Path:
    """``Path(path).resolve()``, or a one-line UserError naming ``path`` where it cannot be
    resolved: a symbolic link loop (a RuntimeError before Python 3.13, an OSError after), a NUL."""
    try:
        return Path(path).resolve()
    except (RuntimeError, OSError, ValueError) as exc:
        raise UserError(f"{shorten(str(path), 200)}: cannot read ({why_unusable(exc)})") from None


def why_unusable(exc: BaseException) -> str:
    """Why a path cannot be used, in a few words: a RuntimeError is ``Path.resolve``'s symlink loop."""
    if isinstance(exc, RuntimeError) or getattr(exc, "errno", None) == errno.ELOOP:
        return "a symbolic link loop"
    return getattr(exc, "strerror", None) or str(exc)


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
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a safe loader (CSafeLoader / SafeLoader)
    except DuplicateKey as exc:
        raise UserError(f"{source}: {exc}") from None
    except yaml.YAMLError as exc:
        raise InvalidYAML(f"{source}: invalid YAML: {_yaml_problem(exc)}") from None
    except (ValueError, OverflowError, TypeError) as exc:  # raised by a constructor (int, date ...)
        raise UserError(f"{source}: invalid YAML value: {shorten(str(exc), 120)}") from None


class DuplicateKey(Exception):
    """A key given twice in one YAML mapping (raised while it is built; :func:`load_yaml` makes it
    a UserError, never InvalidYAML: ``--set`` must not take such a value as a plain string)."""

    def __init__(self, key: Any, first: Any, second: Any) -> None:
        shown = repr(key) if is_name(key) or is_plain(key) else "(not shown)"
        if first.line == second.line:
            where = f"line {first.line + 1}, columns {first.column + 1} and {second.column + 1}"
        else:
            where = f"lines {first.line + 1} and {second.line + 1}"
        super().__init__(f"duplicate key {shown} at {where} (the second would silently replace the first)")


class _UniqueKeyLoader(_LOADER):
    """The safe loader, refusing a key given twice in one mapping (:class:`DuplicateKey`).

    The check runs in ``flatten_mapping``, which the constructor calls on every mapping before
    building it and on every mapping a ``<<:`` merge key pulls in, before it rewrites the node
    (merged pairs then precede the node's own, which may override them): so each mapping is
    checked once, as written, nested ones and aliased ones included."""

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        checked: set[int] | None = getattr(self, "_checked_mappings", None)
        if checked is None:
            checked = set()  # ids of nodes, all alive until the document is built
            self._checked_mappings = checked
        if id(node) not in checked:
            checked.add(id(node))
            _check_unique_keys(self, node)
        super().flatten_mapping(node)


def _check_unique_keys(loader: Any, node: yaml.MappingNode) -> None:
    seen: dict[Any, Any] = {}  # key -> its start mark
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag in (
                "tag:yaml.org,2002:merge", "tag:yaml.org,2002:value"):
            continue  # `<<:` merges (overridable); a non-scalar key: the constructor refuses it (unhashable)
        key = loader.construct_object(key_node)
        try:
            if key in seen:  # equal as built: `a` and `"a"`, `1` and `0x1` (the dict would keep one)
                raise DuplicateKey(key, seen[key], key_node.start_mark)
            seen[key] = key_node.start_mark
        except TypeError:  # unhashable: the constructor reports it
            continue


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
        # `type(event) is C` (exact classes, as before), written out so that the type checker narrows `event`
        if type(event) is yaml.ScalarEvent:
            nodes += 1
            if event.anchor is not None:
                done[event.anchor] = (1, 0)
        elif type(event) is yaml.SequenceStartEvent or type(event) is yaml.MappingStartEvent:
            nodes += 1
            depth += 1
            if depth > MAX_DEPTH:
                raise _bound_error(source, event, f"nested deeper than {MAX_DEPTH} levels")
            stack.append([event.anchor, nodes - 1, depth])
        elif type(event) is yaml.SequenceEndEvent or type(event) is yaml.MappingEndEvent:
            anchor, before, deepest = stack.pop()
            if anchor is not None:
                done[anchor] = (nodes - before, deepest - depth + 1)
            depth -= 1
            if stack:
                stack[-1][2] = max(stack[-1][2], deepest)
        elif type(event) is yaml.AliasEvent:
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
    """UserError if ``value`` (parsed JSON) nests lists / objects deeper than ``limit`` (:func:`json_nodes`)."""
    json_nodes(value, where, limit)


def json_nodes(value: Any, where: str, max_depth: int = MAX_DEPTH) -> int:
    """How many values and object keys ``value`` (parsed JSON) holds, itself included; UserError
    if it nests lists / objects deeper than ``max_depth``.

    Walked one level at a time with the loops in C (``itertools``: no Python step per item, so
    5 million ``[]`` take about a second, not 15 s), holding only the next level's lists and
    objects (8 bytes each, beside the 56+ bytes of each of them): never a stack of every child
    with its level, which doubled the memory of ``[[],[],…]``."""
    count = 1
    lists = [value] if isinstance(value, list) else []
    dicts = [value] if isinstance(value, dict) else []
    depth = 0
    while lists or dicts:
        depth += 1
        if depth > max_depth:
            raise UserError(f"{where}: JSON nested deeper than {max_depth} levels")
        count += sum(map(len, lists)) + 2 * sum(map(len, dicts))
        lists, dicts = (_of_type(_children(lists, dicts), _children(lists, dicts), kind) for kind in (list, dict))
    return count


def _children(lists: list[Any], dicts: list[Any]) -> Iterator[Any]:
    """The items of ``lists`` and the values of ``dicts``, iterated in C."""
    return itertools.chain(itertools.chain.from_iterable(lists), itertools.chain.from_iterable(map(dict.values, dicts)))


def _of_type(items: Iterator[Any], same_items: Iterator[Any], kind: type) -> list[Any]:
    """Those of ``items`` that are a ``kind`` (``same_items``: a second iterator over them), in C."""
    return list(itertools.compress(items, map(isinstance, same_items, itertools.repeat(kind))))


# ----------------------------------------------------------------------------------------------
# Run directories and JSON Lines files (limits: the table above)
#
# A run directory may come from someone else (a published report, a copied experiment), and a
# ``verify`` input is anyone's: ``report``, ``run --resume`` and ``verify`` read them through the
# readers below, never with a bare ``read_text`` / ``json.loads`` / ``yaml.safe_load``.

MAX_JSONL_BYTES = 256 << 20
MAX_JSONL_LINES = 2_000_000
MAX_JSONL_NODES = 4_000_000
MAX_JSON_BYTES = 4 << 20
MAX_SCORED_CHARS = 2 << 20


class JsonlBounds(TypedDict):
    """:func:`jsonl_bounds`: keyword arguments of :func:`mlmt_bench.io.jsonl.iter_jsonl`."""

    max_line_bytes: int
    max_depth: int
    max_total_bytes: int
    max_lines: int
    max_nodes: int


def jsonl_bounds() -> JsonlBounds:
    """The keyword arguments of :func:`mlmt_bench.io.jsonl.iter_jsonl` that bound a JSON Lines file
    read from a run directory or handed to ``verify``: a line of at most ``MAX_LINE_BYTES``
    nested at most ``MAX_DEPTH``; at most ``MAX_JSONL_BYTES`` (decompressed), ``MAX_JSONL_LINES``
    and ``MAX_JSONL_NODES`` in all; only a regular file. Read when called (tests lower them)."""
    return {"max_line_bytes": MAX_LINE_BYTES, "max_depth": MAX_DEPTH, "max_total_bytes": MAX_JSONL_BYTES,
            "max_lines": MAX_JSONL_LINES, "max_nodes": MAX_JSONL_NODES}


def read_json(path: Path | str, limit: int | None = None) -> Any:
    """The JSON document in the regular file ``path`` (``manifest.json``, ``experiment.json``):
    at most ``limit`` bytes (default ``MAX_JSON_BYTES``: ~1.4 million values at most), nested at
    most ``MAX_DEPTH``; one-line UserError otherwise, never quoting the file."""
    import json

    text = read_text(path, MAX_JSON_BYTES if limit is None else limit)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: invalid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    except RecursionError:
        raise UserError(f"{path}: invalid JSON (nested too deeply)") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise UserError(f"{path}: invalid JSON ({shorten(unquoted(str(exc)), 120)})") from None
    json_nodes(value, str(path))  # the depth
    return value


def read_yaml_file(path: Path | str) -> Any:
    """The YAML document in the regular file ``path`` (a run's ``spec.resolved.yaml``) within the
    limits of a spec file (``MAX_FILE_BYTES``, ``MAX_DEPTH``, ``MAX_NODES``: no alias bomb)."""
    return load_yaml(read_text(path), str(path))

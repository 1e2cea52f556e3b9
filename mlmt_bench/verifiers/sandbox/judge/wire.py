"""The wire format between the judge's processes: frames, and values as plain data.

A frame is a 4-byte big-endian length and that many bytes of JSON. A value crosses from the
candidate C to the evaluator E (and an argument from E to C) only as plain data:
:func:`encode_value` turns it into JSON-able data, :func:`decode_value` rebuilds fresh builtin /
stdlib objects from it, refusing what would stall E (see :func:`check_hashes`). Containers are
JSON arrays whose first item is a tag; strings, floats, small ints, bools and None are JSON
scalars. Standard library only (see the package docstring).
"""

from __future__ import annotations

import json
import os
import struct

TYPE_CHECKING = False  # for the type checker only: the judge imports no typing at run time
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

MAX_FRAME = 16 << 20  # largest result frame E accepts from C
MAX_ITEMS = 1_000_000  # largest number of encoded items in one value
MAX_ITER = 1_000_000  # longest iterator C materialises
# a frame is parsed only if it has at most this many JSON separators and openings (``,`` ``[``
# ``{`` ``:``, counted in C code before anything is built; strings holding them count too): what
# E builds from a frame is then bounded by the count, not by how small its items can be made
MAX_STRUCTURE = 2 * MAX_ITEMS + 64
MAX_SAME_HASH = 64  # distinct keys of one dict / set with one hash value (a collision attack)
DETAIL_CHARS = 300  # longest text a verdict carries per test (and per error message)

# ---------------------------------------------------------------------------------------------
# framing: 4-byte big-endian length + JSON


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd`` (blocking; os.write may write less than asked)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def pack(obj) -> bytes:
    data = json.dumps(obj, separators=(",", ":")).encode()
    return struct.pack(">I", len(data)) + data


def write_frame(fd: int, obj) -> None:
    write_all(fd, pack(obj))


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


def structure_count(raw: bytes) -> int:
    """JSON separators and openings in ``raw``, an upper bound on the values json.loads builds."""
    return raw.count(b",") + raw.count(b"[") + raw.count(b"{") + raw.count(b":")


# ---------------------------------------------------------------------------------------------
# encoding (in C, of results; in E, of the values a test passes to C)


class EncodeError(TypeError):
    pass


def _encode_int(v) -> Any:
    v = int(v)
    return v if -(1 << 53) < v < (1 << 53) else ["I", hex(v)]


# (type, encoder) in the order encode_value tries them, for values that are JSON scalars
_SCALARS: tuple[tuple[type, Callable[[Any], Any]], ...] = (
    (bool, bool),
    (int, _encode_int),
    (float, float),
    (str, str.__str__),
)
# the same for containers and the other stdlib value types: :func:`_containers`, built on first
# use (its stdlib imports are not needed until a value that is not a scalar is encoded)
_CONTAINERS: tuple[tuple[Any, Callable[[Any, Callable[[Any], Any]], list]], ...] | None = None


def _items(v, e) -> list:
    """A dict's keys and values, encoded, alternating (its own dict order, whatever its class)."""
    return [x for k, val in dict.items(v) for x in (e(k), e(val))]


def _encode_iterator(v, e) -> list:
    items = []
    for x in v:
        items.append(e(x))
        if len(items) > MAX_ITER:
            raise EncodeError("iterator too long")
    return ["IT", *items]


def _encode_handle(v: Opaque, e) -> list:
    """E passing a sandbox object back to C (e.g. a function, as an argument): its handle."""
    if v.handle is None:
        raise EncodeError("this sandbox object cannot be sent back")
    return ["H", v.handle]


def _containers() -> tuple:
    global _CONTAINERS
    if _CONTAINERS is None:
        import collections
        import collections.abc
        import decimal
        import fractions

        views = (collections.abc.KeysView, collections.abc.ValuesView, collections.abc.ItemsView)
        _CONTAINERS = (
            (complex, lambda v, e: ["C", float(v.real), float(v.imag)]),
            (bytearray, lambda v, e: ["BA", bytes(v).hex()]),
            (bytes, lambda v, e: ["B", bytes(v).hex()]),
            # the dict subclasses before dict
            (collections.Counter, lambda v, e: ["CN", *_items(v, e)]),
            (collections.OrderedDict, lambda v, e: ["OD", *_items(v, e)]),
            (collections.defaultdict, lambda v, e: ["DD", *_items(v, e)]),
            (dict, lambda v, e: ["D", *_items(v, e)]),
            (list, lambda v, e: ["L", *[e(x) for x in list.__iter__(v)]]),
            (tuple, lambda v, e: ["T", *[e(x) for x in tuple.__iter__(v)]]),
            (frozenset, lambda v, e: ["F", *[e(x) for x in frozenset.__iter__(v)]]),
            (set, lambda v, e: ["S", *[e(x) for x in set.__iter__(v)]]),
            (range, lambda v, e: ["R", e(v.start), e(v.stop), e(v.step)]),
            (collections.deque, lambda v, e: ["DQ", e(v.maxlen), *[e(x) for x in v]]),
            (decimal.Decimal, lambda v, e: ["DEC", str(v)]),
            (fractions.Fraction, lambda v, e: ["FR", e(v.numerator), e(v.denominator)]),
            (collections.abc.Iterator, _encode_iterator),
            (views, lambda v, e: ["L", *[e(x) for x in v]]),
            (Opaque, _encode_handle),
        )
    return _CONTAINERS


def encode_value(v, _budget=None):
    """``v`` as plain JSON-able data (at most :data:`MAX_ITEMS` items in all; EncodeError past
    that). Anything that is not a plain value (a re.Match, an instance of the program's own
    class, a function ...) travels as an opaque token: see :func:`_opaque_token`."""
    budget = _budget if _budget is not None else [MAX_ITEMS]
    budget[0] -= 1
    if budget[0] < 0:
        raise EncodeError("result too large")
    if v is None or v is True or v is False:
        return v
    for kind, encode in _SCALARS:
        if isinstance(v, kind):
            return encode(v)
    e = lambda x: encode_value(x, budget)  # noqa: E731
    for kinds, encode_container in _containers():
        if isinstance(v, kinds):
            return encode_container(v, e)
    return _opaque_token(v)


def _opaque_token(v) -> list:
    """A value that is not plain data as a token carrying only its truth value and, if callable, a
    handle E can call (HumanEval's `check(candidate)`): `assert f(x)` / `assert not f(x)` still
    work, and a truth bit is no more than returning True/False. It compares equal to nothing but
    itself."""
    try:
        truth = bool(v)
    except Exception:  # noqa: BLE001
        truth = None
    handle = None
    if callable(v):
        handle = len(_HANDLES) + 1
        _HANDLES[handle] = v
    return ["OBJ", str(type(v).__name__)[:80], truth, handle]


_HANDLES: dict = {}  # C only: callables E holds handles to
_JUDGE = None  # E only: the channel to C (evaluator.Judge) that Opaque.__call__ goes through


def use_judge(judge) -> None:
    """Make ``judge`` (E's channel to C) the one that calls on :class:`Opaque` handles go through."""
    global _JUDGE
    _JUDGE = judge


class Opaque:
    """E's stand-in for a sandbox value that is not plain data (see ``encode_value``)."""

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


# ---------------------------------------------------------------------------------------------
# decoding (in E, of C's results; in C, of E's arguments): untrusted data


class DecodeError(ValueError):
    pass


_UNKNOWN = object()  # a decoder's answer to a tag it knows with a shape it does not


def decode_value(x):
    """Rebuild a value from untrusted encoded data; yields only builtin / stdlib value types."""
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if not isinstance(x, list) or not x or not isinstance(x[0], str):
        raise DecodeError("malformed value")
    tag, rest = x[0], x[1:]
    decoder = _DECODERS.get(tag)
    value = _UNKNOWN if decoder is None else decoder(tag, rest)
    if value is _UNKNOWN:
        raise DecodeError(f"unknown value tag {tag[:20]!r}")
    return value


def _decode_mapping(tag: str, rest: list):
    """A dict, Counter, OrderedDict or defaultdict (no default factory) from alternating keys and
    values."""
    import collections

    if len(rest) % 2:
        raise DecodeError("malformed dict")
    pairs = [(decode_value(rest[i]), decode_value(rest[i + 1])) for i in range(0, len(rest), 2)]
    check_hashes([k for k, _ in pairs], rest[0::2])
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


def _decode_set(tag: str, rest: list):
    items = [decode_value(i) for i in rest]
    check_hashes(items, rest)
    return set(items) if tag == "S" else frozenset(items)


def _decode_text(tag: str, rest: list):
    """A value carried as one string: an int too large for a JSON number (hex), bytes, a bytearray
    (hex) or a Decimal."""
    if len(rest) != 1 or not isinstance(rest[0], str):
        return _UNKNOWN
    if tag == "I":
        return int(rest[0], 16)
    if tag == "B":
        return bytes.fromhex(rest[0])
    if tag == "BA":
        return bytearray.fromhex(rest[0])
    import decimal

    return decimal.Decimal(rest[0])


def _decode_complex(tag: str, rest: list):
    return complex(float(rest[0]), float(rest[1])) if len(rest) == 2 else _UNKNOWN


def _decode_range(tag: str, rest: list):
    if len(rest) != 3:
        return _UNKNOWN
    a, b, c = (decode_value(i) for i in rest)
    if not all(type(i) is int for i in (a, b, c)):
        raise DecodeError("malformed range")
    return range(a, b, c)


def _decode_deque(tag: str, rest: list):
    import collections

    if not rest:
        return _UNKNOWN
    maxlen = decode_value(rest[0])
    if maxlen is not None and type(maxlen) is not int:
        raise DecodeError("malformed deque")
    return collections.deque((decode_value(i) for i in rest[1:]), maxlen)


def _decode_fraction(tag: str, rest: list):
    if len(rest) != 2:
        return _UNKNOWN
    import fractions

    num, den = decode_value(rest[0]), decode_value(rest[1])
    if type(num) is not int or type(den) is not int:
        raise DecodeError("malformed fraction")
    return fractions.Fraction(num, den)


def _decode_opaque(tag: str, rest: list):
    if len(rest) != 3 or not isinstance(rest[0], str) or rest[1] not in (True, False, None):
        return _UNKNOWN
    if rest[2] is not None and not (type(rest[2]) is int and rest[2] > 0):
        return _UNKNOWN
    return Opaque(rest[0][:80], rest[1], rest[2])


def _decode_handle(tag: str, rest: list):
    if len(rest) != 1 or type(rest[0]) is not int:
        return _UNKNOWN
    if rest[0] not in _HANDLES:  # only meaningful in C, for handles it gave out
        raise DecodeError("unknown handle")
    return _HANDLES[rest[0]]


# tag -> decoder(tag, the items after the tag): a value, or _UNKNOWN for a shape it does not know
_DECODERS: dict[str, Callable[[str, list], Any]] = {
    "L": lambda tag, rest: [decode_value(i) for i in rest],
    "T": lambda tag, rest: tuple(decode_value(i) for i in rest),
    "D": _decode_mapping, "CN": _decode_mapping, "OD": _decode_mapping, "DD": _decode_mapping,
    "S": _decode_set, "F": _decode_set,
    "IT": lambda tag, rest: iter([decode_value(i) for i in rest]),
    "I": _decode_text, "B": _decode_text, "BA": _decode_text, "DEC": _decode_text,
    "C": _decode_complex,
    "R": _decode_range,
    "DQ": _decode_deque,
    "FR": _decode_fraction,
    "OBJ": _decode_opaque,
    "H": _decode_handle,
}


def check_hashes(keys: list, encoded: list) -> None:
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

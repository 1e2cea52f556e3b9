"""Fuzzing what ``report``, ``run --resume`` and ``verify`` read from someone else (ARCHITECTURE.md,
"Untrusted data stays data"; the robustness issue's "no traceback, no hang, no memory exhaustion").

A seeded generator starts from valid inputs and breaks them:

- **run directories** (``report`` on two runs, on an experiment directory, in place, ``--raw``,
  ``--at-flops``; ``run --resume`` of a killed real tiny run): truncated files, flipped bytes,
  hostile JSON values in every field (null, lists, huge integers, NaN, control characters, lone
  surrogates, deep nesting), missing files, gzip that is garbage or truncated, huge sparse files,
  duplicate YAML keys, alias bombs and tags in ``spec.resolved.yaml``, checkpoint directories
  mutated (truncated safetensors, a garbage or hostile trainer state, stray names, a file where a
  directory should be), symlinks (to /dev/zero, out of the case's directory, loops), FIFOs and
  sockets (opening a FIFO blocks: the readers must refuse it first; a timer catches a hang);
- **published reports** (``run EXPERIMENT_SPEC --restore REPORT`` of the report directory's two
  runs published with ``report --raw``, every one of which a valid restore copies in, leaving
  nothing to train): the run files mutated as above, manifests with fields of the wrong kinds,
  run directories named with control characters, dots, 255 bytes or a name the experiment
  writes, duplicate and many runs (up to 200), ``runs/`` or a run a link, FIFO or file, the
  REPORT argument a link, a file, ``/dev/zero``. The experiment's policy is the relative path
  ``CKPT`` (absent): a run that restore leaves out is a one-line error, never a training run;
- **verify inputs** (math and choice verifiers mostly, a few code cases since each runs a
  sandbox): malformed JSON lines, wrong types, huge numbers, deep nesting, lines near the 16 MiB
  limit and responses near the 2 Mi-character scoring limit, control characters, gzip, empty and
  binary files;
- **every field** (``test_fuzz_every_field``, deterministic): each field of each file of a run
  directory, of the trainer state and of a verify line set in turn to values of the wrong kinds.

Every case runs the CLI in this process (typer's CliRunner) and must end with exit code 0 or 2,
no traceback, exactly one ``error: `` line on stderr for exit 2, a message that does not echo the
secret planted in the files, within ``WALL_S``; nothing outside the case's directory may change
(the symlinks' targets, the valid templates, the working directory), no planted YAML tag or
pickle may run, and the process's peak RSS during the cases stays under 1 GiB above its RSS when
they start (the suite's earlier tests leave models in the process: the high-water mark is reset).

The cases run in an empty working directory with the hub offline (``HF_HUB_OFFLINE=1``: a mutated
spec may name a hub model). The default suite runs the first ``FAST_CASES`` random cases;
``-m slow`` runs ``MLMT_FUZZ_CASES`` (default 2,000; a fifth of those past the fast ones restore
cases, :func:`family_of`) and the every-field sweep (~580 cases).
``MLMT_FUZZ_KEEP_GOING=1`` runs every case and lists all failures, ``MLMT_FUZZ_ONLY=3,17`` runs
those cases only, ``MLMT_FUZZ_STATS=FILE`` writes the statistics of a run (cases per family,
exit codes, times, the slowest cases, peak RSS) as JSON (the sweep's to ``FILE.sweep``).
The regressions at the end are the bugs the fuzz found, one case each.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import pickle
import random
import re
import resource
import shutil
import signal
import socket
import stat
import struct
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from conftest import minimal_spec
from mlmt_bench.cli import app

WALL_S = 10.0  # per case: a hang detector (cases take ~0.01-2 s), generous for a loaded 2-core machine
ALARM_S = 30  # a case still running after this is interrupted (SIGALRM) and fails as a hang
RSS_LIMIT_MB = 1024
FAST_CASES = 100  # ~30 s here (200: ~65 s on this shared 2-core machine)
FAST_RESTORE = (23, 71)  # the restore cases among the fast ones
RESTORE_EVERY = 5  # past the fast cases: case i is a restore case when i % RESTORE_EVERY == 3
SLOW_CASES = int(os.environ.get("MLMT_FUZZ_CASES", "2000"))
KEEP_GOING = os.environ.get("MLMT_FUZZ_KEEP_GOING") == "1"
ONLY = [int(i) for i in os.environ.get("MLMT_FUZZ_ONLY", "").split(",") if i.strip()]  # reproduce these cases
SECRET = "root:$6$Zq8SECRETHASHx1$aB3dEfGh:19000:0:99999:7:::"
STAMP = "20250101T000000Z"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ---------------------------------------------------------------------------------------------
# hostile values


class Raw:
    """JSON text put verbatim where a value goes (what json.dumps cannot or will not write: an
    integer of 5,000 digits, ``1e400``, 100,000 nested brackets)."""

    def __init__(self, text: str) -> None:
        self.text = text


def dumps(value: Any) -> str:
    """JSON text of ``value``, :class:`Raw` values spliced in verbatim."""
    raws: list[str] = []

    def enc(v: Any) -> Any:
        if isinstance(v, Raw):
            raws.append(v.text)
            return f"@@RAW{len(raws) - 1}@@"
        if isinstance(v, dict):
            return {(k if isinstance(k, str) else str(k)): enc(x) for k, x in v.items()}
        if isinstance(v, list):
            return [enc(x) for x in v]
        return v

    text = json.dumps(enc(value))
    for i, raw in enumerate(raws):
        text = text.replace(f'"@@RAW{i}@@"', raw, 1)
    return text


def deep_json(rng: random.Random) -> Raw:
    n = rng.choice([10, 63, 64, 65, 200, 5000, 100_000])
    return Raw("[" * n + "]" * n if rng.random() < 0.6 else '{"a":' * n + "1" + "}" * n)


CONTROL = "\x00\x07\x08\x1b[31m\x1b]0;owned\x07\r\u0085\u2028\u202e\ufeff"
KEYS = ["kind", "step", "n", "acc@t1", "acc@t2", "flops", "gen_tokens", "gen_tokens_eval", "final", "eval", "turns",
        "arms", "report", "status", "seed", "name", "arm", "spec_sha256", "resumed_from", "problem_id", "t1", "t2",
        "t2_null", "t2_base_critic", "text", "verdict", "reward", "problem", "response", "answer", "tests", "setup",
        "metadata", "options", "id", "benchmark", "prompt", "baseline", "title", "at_flops", "raw", "run_dir",
        "path", "base_critic/acc@t2", "value/explained_variance", "__tensor__", "__tuple__", "__dict__",
        "__ndarray__", "", " ", "\x00", "\ud800", SECRET]


def hostile_value(rng: random.Random, depth: int = 0) -> Any:
    r = rng.random()
    if depth < 2 and r < 0.08:
        return [hostile_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if depth < 2 and r < 0.16:
        return {rng.choice(KEYS): hostile_value(rng, depth + 1) for _ in range(rng.randrange(4))}
    if r < 0.22:
        return deep_json(rng)
    return rng.choice([
        None, True, False, 0, -1, 1, 2, 3, 0.5, -0.0, 3.7, -2.5, 10 ** 30, -(10 ** 19), 2 ** 63, 2 ** 64 + 1,
        10 ** 400, Raw("1" + "0" * 5000), Raw("-" + "9" * 4301), Raw("1e400"), Raw("-1e400"), Raw("NaN"),
        Raw("Infinity"), Raw("-Infinity"), 1e308, 5e-324, 1e-320,
        "", " ", "x", "eval", "final", "train", "completed", "running", "grpo", "mlmt", "test/000000", "step-000001",
        CONTROL, "\ud800", "\udfff tail", "a\x00b", SECRET, "A" * 10_000, "B" * rng.choice([100, 300_000]),
        "../../../etc/passwd", "/dev/zero", "/proc/self/mem", "\\boxed{", "\\boxed{" * 2000, "{}{0}%s%n",
        "<script>alert(1)</script>", "]]>\"'&<", "1e400", "nan", "-inf", "0x10", "٣", "¹",
        [], {}, [1, 2, 3], [None], ["x"] * 1000, [[]] * 5000, {"a": 1}, {"kind": "eval"}, {"__tensor__": "t0"},
    ])


def walk(doc: Any, limit: int = 6) -> list[tuple[Any, Any]]:
    """(container, key) of every value in ``doc`` (nested up to ``limit`` levels, 2,000 at most)."""
    out: list[tuple[Any, Any]] = []
    todo = [(doc, 0)]
    while todo and len(out) < 2000:
        node, depth = todo.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for k, v in list(items)[:200]:
            out.append((node, k))
            if depth < limit and isinstance(v, (dict, list)):
                todo.append((v, depth + 1))
    return out


def mutate_doc(rng: random.Random, doc: Any) -> Any:
    """``doc`` (parsed JSON / YAML) with one field set to a hostile value, removed or added, or
    replaced whole."""
    spots = walk(doc)
    op = rng.random()
    if not spots or op < 0.05:
        return hostile_value(rng)
    parent, key = rng.choice(spots)
    if op < 0.7:
        parent[key] = hostile_value(rng)
    elif op < 0.85:
        del parent[key]
    else:
        dicts = [c for c, _ in spots if isinstance(c, dict)] or ([doc] if isinstance(doc, dict) else [])
        if dicts:
            rng.choice(dicts)[rng.choice(KEYS)] = hostile_value(rng)
        else:
            parent[key] = hostile_value(rng)
    return doc


# ---------------------------------------------------------------------------------------------
# file-level mutations


def _bytes(p: Path) -> bytes:
    """The content of a regular file (not through a link; b"" for a huge sparse one)."""
    if p.is_symlink() or not p.is_file() or p.stat().st_size > 64 << 20:
        return b""
    return p.read_bytes()


def _write(p: Path, data: bytes) -> None:
    """Write ``data`` as the regular file ``p``, replacing a link, FIFO or directory there first
    (never writing through one: a FIFO would block, a link would change what it points at)."""
    if p.is_symlink() or (os.path.lexists(p) and not p.is_file()):
        _replace(p)
    p.write_bytes(data)


def _replace(p: Path) -> None:
    """Remove whatever ``p`` is (file, link, FIFO, directory) so that something else can go there."""
    if p.is_symlink() or (p.exists() and not p.is_dir()):
        p.unlink()
    elif p.is_dir():
        shutil.rmtree(p)


def garbage(rng: random.Random, n: int) -> bytes:
    return bytes(rng.randrange(256) for _ in range(n))


def op_truncate(rng, p: Path, env) -> str:
    data = _bytes(p)
    _write(p, data[: rng.randrange(len(data) + 1)] if data else b"")
    return "truncate"


def op_flip(rng, p: Path, env) -> str:
    data = bytearray(_bytes(p))
    for _ in range(rng.randint(1, 8)):
        if data:
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    _write(p, bytes(data))
    return "flip-bits"


def op_insert(rng, p: Path, env) -> str:
    data = _bytes(p)
    at = rng.randrange(len(data) + 1)
    bit = rng.choice([garbage(rng, rng.randint(1, 40)), CONTROL.encode(), b"\xff\xfe\xc3(", b"\x00" * 100,
                      b"\n\n\n", b"\r\n", b"\xef\xbb\xbf", "\u202e".encode(), b'"\\ud800"', b"}{][,:"])
    _write(p, data[:at] + bit + data[at:])
    return "insert-bytes"


def op_delete(rng, p: Path, env) -> str:
    _replace(p)
    return "delete"


def op_empty(rng, p: Path, env) -> str:
    _replace(p)
    p.write_bytes(rng.choice([b"", b"\n", b" \n\t\n", b"\x00", b"\xef\xbb\xbf"]))
    return "empty"


def op_binary(rng, p: Path, env) -> str:
    _replace(p)
    p.write_bytes(rng.choice([garbage(rng, rng.randint(1, 4096)), b"\x7fELF\x02\x01\x01" + bytes(200),
                              b"PK\x03\x04" + garbage(rng, 64), pickle.dumps({"a": 1})]))
    return "binary"


def op_secret(rng, p: Path, env) -> str:
    """The content of a file nobody should see (its error must name the file, not show it)."""
    _replace(p)
    p.write_text(rng.choice([f"{SECRET}\ndaemon:*:19000:0:99999:7:::\n", f'"{SECRET}"\n', f"{SECRET}: 1\n",
                             f'{{"kind": "eval", "step": "{SECRET}"}}\n', f"[{SECRET}]\n", f"{{{SECRET}}}\n"]))
    return "secret-content"


def op_sparse(rng, p: Path, env) -> str:
    """Huge but sparse: the valid content (or nothing), then GiBs of NUL bytes."""
    size = rng.choice([(1 << 20) + 1, (4 << 20) + 1, (16 << 20) + 7, (256 << 20) + 1, 2 << 30, 3 << 30])
    if p.is_symlink() or not p.is_file():
        _replace(p)
        p.write_bytes(b"")
    with open(p, "r+b") as f:
        f.truncate(size)
    return f"sparse-{size}"


def op_many_lines(rng, p: Path, env) -> str:
    data = _bytes(p)
    line = data.splitlines(keepends=True)[0] if data.strip() else b"{}\n"
    n = rng.choice([1000, 20_000, 2_000_001]) if line.strip() else 2_000_001
    _write(p, data + (b"\n" * n if n > 100_000 else line * n))
    return f"many-lines-{n}"


def op_symlink(rng, p: Path, env) -> str:
    _replace(p)
    target = rng.choice(["/dev/zero", "/dev/null", "/dev/urandom", "/proc/self/mem", "/etc/passwd",
                         str(env.outside / "secret.txt"), str(env.outside / "valid" / p.name), str(env.outside),
                         str(env.outside / "dir"), str(p), str(p.parent / "missing"), "self-loop-b"])
    if target == "self-loop-b":  # a loop of two links
        (p.parent / f"{p.name}.loop").symlink_to(p)
        target = str(p.parent / f"{p.name}.loop")
    p.symlink_to(target)
    return f"symlink->{target.replace(str(env.outside), 'OUTSIDE').replace(str(p.parent), 'HERE')}"


def op_chain(rng, p: Path, env) -> str:
    _replace(p)
    links = [p] + [p.parent / f".chain{i}" for i in range(rng.choice([5, 45]))]
    for a, b in zip(links, links[1:]):
        a.symlink_to(b)
    links[-1].write_bytes(b"{}\n")
    return f"symlink-chain-{len(links) - 1}"


def op_fifo(rng, p: Path, env) -> str:
    _replace(p)
    os.mkfifo(p)
    return "fifo"


def op_socket(rng, p: Path, env) -> str:
    _replace(p)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    cwd = os.getcwd()
    try:
        os.chdir(p.parent)  # a short relative name: AF_UNIX paths are short
        s.bind(p.name)
    finally:
        os.chdir(cwd)
        s.close()
    return "socket"


def op_dir(rng, p: Path, env) -> str:
    _replace(p)
    (p / "inner").mkdir(parents=True)
    (p / "inner" / "x.json").write_text("{}")
    return "directory-instead-of-file"


def _gz_source(p: Path) -> tuple[Path, bytes]:
    data = _bytes(p)
    gz = p if p.name.endswith(".gz") else p.with_name(p.name + ".gz")
    if p.is_file() and not p.name.endswith(".gz"):
        p.unlink()
    return gz, (gzip.decompress(data) if data[:2] == b"\x1f\x8b" and gz == p and _gunzips(data) else data)


def _gunzips(data: bytes) -> bool:
    try:
        gzip.decompress(data)
        return True
    except Exception:  # noqa: BLE001 - BadGzipFile, EOFError, zlib.error ...
        return False


def op_gzip(rng, p: Path, env) -> str:
    """The log as ``<name>.gz``: valid, truncated, flipped, garbage after the magic, trailing
    garbage, a small bomb, or beside the plain file."""
    kind = rng.choice(["valid", "truncated", "flipped", "magic-garbage", "trailing", "bomb", "both", "of-garbage",
                       "empty-member"])
    if kind == "both":
        data = _bytes(p)
        _write(p.with_name(p.name + ".gz"), gzip.compress(garbage(rng, 100)))
        _write(p, data)
        return "gzip-both"
    gz, data = _gz_source(p)
    packed = gzip.compress(data)
    if kind == "truncated":
        packed = packed[: rng.randrange(2, max(3, len(packed)))]
    elif kind == "flipped":
        b = bytearray(packed)
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(10, len(b)) if len(b) > 10 else 0] ^= 0xFF
        packed = bytes(b)
    elif kind == "magic-garbage":
        packed = b"\x1f\x8b" + garbage(rng, rng.randint(0, 200))
    elif kind == "trailing":
        packed += garbage(rng, rng.randint(1, 50))
    elif kind == "bomb":  # blank 1 MiB lines: 64 MiB, or past the 256 MiB limit
        packed += gzip.compress(b" " * ((1 << 20) - 1) + b"\n", compresslevel=9) * rng.choice([64, 300])
    elif kind == "of-garbage":
        packed = gzip.compress(garbage(rng, 300))
    elif kind == "empty-member":
        packed = gzip.compress(b"") + packed
    _write(gz, packed)
    return f"gzip-{kind}"


FILE_OPS: list[tuple[float, Callable]] = [
    (3, op_truncate), (3, op_flip), (2, op_insert), (2, op_delete), (1, op_empty), (1, op_binary), (1, op_secret),
    (0.5, op_sparse), (0.3, op_many_lines), (1.5, op_symlink), (0.3, op_chain), (1, op_fifo), (0.3, op_socket),
    (0.7, op_dir),
]


def pick(rng: random.Random, weighted: list[tuple[float, Any]]) -> Any:
    return rng.choices([x for _, x in weighted], weights=[w for w, _ in weighted])[0]


# ---------------------------------------------------------------------------------------------
# structured mutations: JSON, JSON Lines, YAML


def op_json_field(rng, p: Path, env) -> str:
    """One to three fields of a JSON file set to hostile values (removed, added, the root replaced)."""
    try:
        doc = json.loads(_bytes(p))
    except (ValueError, RecursionError):
        doc = {}
    for _ in range(rng.randint(1, 3)):
        doc = mutate_doc(rng, doc)
    _write(p, dumps(doc).encode("utf-8", "surrogatepass"))
    return "json-field"


def _records(p: Path) -> list[Any]:
    out = []
    data = _bytes(p)
    if data[:2] == b"\x1f\x8b" and _gunzips(data):
        data = gzip.decompress(data)
    for line in data.splitlines():
        with contextlib.suppress(ValueError, RecursionError):
            out.append(json.loads(line))
    return out


def op_jsonl(rng, p: Path, env) -> str:
    """A JSON Lines log with hostile records: a field changed in some of them, a record that is
    not an object, lines dropped, repeated, shuffled, torn, blank; CRLF; a BOM; a line near the
    16 MiB limit."""
    recs = _records(p) or [{}]
    kind = rng.choice(["field"] * 6 + ["nonobject", "drop", "repeat", "shuffle", "torn", "blank", "crlf", "bom",
                                       "long"])
    if kind == "field":
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(recs))
            recs[i] = mutate_doc(rng, recs[i])
    elif kind == "nonobject":
        recs.insert(rng.randrange(len(recs) + 1), hostile_value(rng))
    elif kind == "drop":
        del recs[rng.randrange(len(recs))]
    elif kind == "repeat":
        recs += [rng.choice(recs)] * rng.randint(1, 50)
    elif kind == "shuffle":
        rng.shuffle(recs)
    elif kind == "long":  # a string value near the 16 MiB line limit (just under or just over)
        rec = recs[-1] if isinstance(recs[-1], dict) else {}
        rec = {**rec, "pad": ""}
        room = (16 << 20) - len(dumps(rec).encode()) - 1
        rec["pad"] = "x" * (room + rng.choice([0, 1, -1000]))
        recs[-1] = rec
    lines = [dumps(r) for r in recs]
    text = "".join(line + "\n" for line in lines)
    if kind == "torn":
        text = text[: len(text) - rng.randint(2, max(2, len(lines[-1]) // 2))]
    elif kind == "blank":
        text = "\n \n\t\n" + text.replace("\n", "\n\n", rng.randint(1, 3))
    elif kind == "crlf":
        text = text.replace("\n", "\r\n")
    elif kind == "bom":
        text = "\ufeff" + text
    data = text.encode("utf-8", "surrogatepass")
    _write(p, gzip.compress(data) if p.name.endswith(".gz") and rng.random() < 0.8 else data)
    return f"jsonl-{kind}"


def alias_bomb(levels: int = 9) -> str:
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def op_yaml(rng, p: Path, env) -> str:
    """spec.resolved.yaml with a hostile value at a field, a duplicate key, an alias bomb, a
    python tag, deep nesting, several documents, tabs, invalid YAML."""
    text = _bytes(p).decode("utf-8", "replace")
    kind = rng.choice(["field"] * 5 + ["duplicate", "bomb", "tag", "deep", "documents", "tab", "invalid", "anchors",
                                       "merge", "date"])
    if kind == "field":
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError:
            doc = {}
        for _ in range(rng.randint(1, 3)):
            doc = mutate_doc(rng, doc)
        try:
            text = yaml.dump(_yamlable(doc), Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), allow_unicode=True)
        except Exception:  # noqa: BLE001 - what the dumper cannot write (a lone surrogate ...)
            text += "x: 1\n"
    elif kind == "duplicate":
        key = rng.choice(["name", "seed", "benchmark", "algorithm", "train", "policies"])
        text += f"{key}: {rng.choice(['x', '{}', '[]', '1', 'null'])}\n"
    elif kind == "bomb":
        text = alias_bomb(rng.choice([5, 9])) + text.replace("benchmark:\n", "benchmark:\n  options: {x: *a4}\n", 1)
    elif kind == "tag":
        marker = env.case_dir / "PWNED"
        text += rng.choice([f'x: !!python/object/apply:os.system ["touch {marker}"]\n',
                            "x: !!python/name:os.system\n", "x: !custom 1\n", "x: !!binary AAAA\n",
                            f'benchmark: !!python/object/new:subprocess.Popen [["touch", "{marker}"]]\n'])
    elif kind == "deep":
        n = rng.choice([63, 64, 65, 1000, 100_000])
        text += "x: " + "[" * n + "]" * n + "\n"
    elif kind == "documents":
        text += "---\n" + text
    elif kind == "tab":
        text = text.replace("  ", "\t", rng.randint(1, 5))
    elif kind == "invalid":
        at = rng.randrange(len(text) + 1)
        text = text[:at] + rng.choice(["{", "]", ": :", "&", "*undefined", "'", '"', "%", "@", "`", "\x00"]) + text[at:]
    elif kind == "anchors":
        text += "a: &x [1]\nb: *x\nc: *undefined\n"
    elif kind == "merge":
        text += "m1: &m {a: 1}\nm2:\n  <<: *m\n  <<: *m\n"
    elif kind == "date":
        text += f"seed: {rng.choice(['2001-02-30', '0x' + 'f' * 2000, '1' * 5000, '.nan', '.inf', '0o777'])}\n"
    _write(p, text.encode("utf-8", "surrogatepass"))
    return f"yaml-{kind}"


def _yamlable(doc: Any) -> Any:
    if isinstance(doc, Raw):
        try:
            return json.loads(doc.text) if len(doc.text) < 4000 else doc.text[:50]
        except (ValueError, RecursionError):
            return doc.text[:50]
    if isinstance(doc, dict):
        return {(k if isinstance(k, (str, int)) else str(k)): _yamlable(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_yamlable(v) for v in doc]
    return doc


# ---------------------------------------------------------------------------------------------
# checkpoint mutations (resume)


def _safetensors_parts(p: Path) -> tuple[dict[str, Any], bytes] | None:
    data = _bytes(p)
    if len(data) < 8:
        return None
    (n,) = struct.unpack("<Q", data[:8])
    try:
        return json.loads(data[8:8 + n]), data[8 + n:]
    except (ValueError, RecursionError):
        return None


def _write_safetensors(p: Path, header: dict[str, Any], body: bytes) -> None:
    h = dumps(header).encode("utf-8", "surrogatepass")
    h += b" " * (-len(h) % 8)
    _write(p, struct.pack("<Q", len(h)) + h + body)


def op_state_meta(rng, p: Path, env) -> str:
    """The trainer state's JSON (safetensors metadata) with hostile values in its fields."""
    parts = _safetensors_parts(p)
    if parts is None:
        return op_flip(rng, p, env)
    header, body = parts
    meta = header.get("__metadata__", {})
    try:
        state = json.loads(meta.get("mlmt_state", "{}"))
    except (ValueError, RecursionError):
        state = {}
    for _ in range(rng.randint(1, 3)):
        state = mutate_doc(rng, state)
    meta["mlmt_state"] = dumps(state)
    header["__metadata__"] = meta
    _write_safetensors(p, header, body)
    return "state-json"


def op_safetensors_header(rng, p: Path, env) -> str:
    """A safetensors header with hostile dtypes, shapes, offsets, a huge header length."""
    parts = _safetensors_parts(p)
    if parts is None:
        return op_truncate(rng, p, env)
    header, body = parts
    if rng.random() < 0.2:
        _write(p, struct.pack("<Q", rng.choice([2 ** 63, 2 ** 40, len(body) + 100, 0])) + _bytes(p)[8:])
        return "safetensors-length"
    for _ in range(rng.randint(1, 3)):
        header = mutate_doc(rng, header)
    if isinstance(header, dict) and rng.random() < 0.5:
        name = rng.choice([k for k in header if k != "__metadata__"] or ["t0"])
        header[name] = {"dtype": rng.choice(["F32", "BF16", "I64", "BOOL", "U8", "F8_E4M3", "XX"]),
                        "shape": rng.choice([[], [0], [10 ** 9, 10 ** 9], [-1], [2 ** 62, 4]]),
                        "data_offsets": rng.choice([[0, 4], [0, 2 ** 62], [8, 4], [0, len(body)]])}
    _write_safetensors(p, header if isinstance(header, dict) else {}, body)
    return "safetensors-header"


def op_pickle(rng, p: Path, env) -> str:
    """A legacy trainer_state.pt that runs a command when unpickled (instead of the safetensors file)."""
    marker = env.case_dir / "PWNED"
    p.unlink(missing_ok=True)
    with open(p.with_name("trainer_state.pt"), "wb") as f:
        pickle.dump({"counters": _Payload(str(marker))}, f, protocol=rng.choice([2, pickle.HIGHEST_PROTOCOL]))
    return "pickle-payload"


class _Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def op_stray(rng, p: Path, env) -> str:
    """Stray entries in checkpoints/: names that look like checkpoints, a file where a
    checkpoint directory goes, empty newer checkpoints, many of them, deep nesting."""
    ck = p  # the checkpoints directory
    kind = rng.choice(["names", "file-step", "empty-newer", "many", "deep", "copy-newer"])
    if kind == "names":
        for name in rng.sample(["step-zzz", "step-", "step-000001.old", ".tmp-step-000002", "step-٣", "step-+3",
                                "step-1e5", "step--1", "step-000000000000000000000000000007", "step-0x10", "x",
                                ".hidden", "step-000009 ", "STEP-000009"], rng.randint(1, 4)):
            (ck / name).mkdir(exist_ok=True)
            if rng.random() < 0.5:
                (ck / name / "trainer_state.safetensors").write_bytes(garbage(rng, 64))
    elif kind == "file-step":
        (ck / "step-000005").write_bytes(garbage(rng, 16))
    elif kind == "empty-newer":
        (ck / "step-000007").mkdir()
    elif kind == "many":
        for i in range(2, rng.choice([50, 2000])):
            (ck / f"step-{i:06d}").mkdir()
    elif kind == "deep":
        d = ck / "step-000003"
        d.mkdir()
        fd = os.open(d, os.O_RDONLY)
        try:  # deeper than PATH_MAX and than Python's recursion limit, made relative to a descriptor
            name = "d" * rng.choice([1, 8])
            for _ in range(rng.choice([100, 1200])):
                os.mkdir(name, dir_fd=fd)
                nfd = os.open(name, os.O_RDONLY, dir_fd=fd)
                os.close(fd)
                fd = nfd
        finally:
            os.close(fd)
    elif kind == "copy-newer":  # a copy of the intact checkpoint under a newer step, then corrupted
        src = next(ck.glob("step-000001"), None)
        if src is not None and src.is_dir() and not src.is_symlink():
            dst = ck / "step-000002"
            shutil.copytree(src, dst, symlinks=True)
            target = rng.choice(list(dst.rglob("*")) or [dst])
            if target.is_file():
                pick(rng, FILE_OPS + [(3, op_state_meta)])(rng, target, env)
    return f"stray-{kind}"


# ---------------------------------------------------------------------------------------------
# the environment of the cases


@dataclass
class Env:
    root: Path
    outside: Path  # what symlinks point at: must not change
    report_base: Path  # an experiment directory with two runs (synthetic, valid)
    resume_base: Path  # a killed real tiny run (status running, one checkpoint)
    protected: list[Path]  # snapshotted around every case
    cwd: Path
    case_dir: Path = Path()
    published: Path = Path()  # report_base published with ``report --raw``: what ``run --restore`` reads


def snapshot(path: Path) -> dict[str, tuple]:
    """Every entry under ``path`` (not following links): its kind, size, and content hash (small
    files) or mtime (large ones)."""
    out: dict[str, tuple] = {}
    if not os.path.lexists(path):
        return out
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            full = os.path.join(root, name)
            st = os.lstat(full)
            key = os.path.relpath(full, path)
            if stat.S_ISREG(st.st_mode) and st.st_size <= 1 << 16:
                with open(full, "rb") as f:
                    out[key] = ("f", st.st_size, hashlib.sha256(f.read()).hexdigest())
            elif stat.S_ISLNK(st.st_mode):
                out[key] = ("l", os.readlink(full))
            else:
                out[key] = (stat.S_IFMT(st.st_mode), st.st_size, st.st_mtime_ns)
    return out


def write_run(d: Path, name: str, arm: str, good: int, out_root: Path, gz: bool = False) -> Path:
    """A run directory as `mlmt-bench run` writes it, by hand: two evaluations of four problems
    (``good`` of them right at the end), a training record, the final record, episodes."""
    d.mkdir(parents=True)
    spec = minimal_spec(name=name, output_dir=str(out_root))
    spec_text = yaml.safe_dump(spec)
    (d / "spec.resolved.yaml").write_text(spec_text)
    (d / "manifest.json").write_text(json.dumps({
        "name": name, "arm": arm, "experiment": "fz", "status": "completed", "seed": 0,
        "start_time": "2025-01-01T00:00:00Z",
        "end_time": "2025-01-01T00:01:00Z", "spec_sha256": hashlib.sha256(spec_text.encode()).hexdigest(),
        "roles": {"solver": "trained", "critic": "absent", "feedback": "none"}}, indent=2))
    recs = []
    for step in (0, 1):
        recs.append({"kind": "eval", "step": step, "gen_tokens": 100 * step, "trained_tokens": 50 * step,
                     "flops": 1e6 * step, "wall_s": 0.1 + step, "n": 4, "acc@t1": good * step / 4,
                     "acc@t2": good * step / 4, "gen_tokens_eval": 8, "mem/peak_mb/eval": 400.0})
    recs.insert(1, {"kind": "train", "step": 1, "gen_tokens": 100, "trained_tokens": 50, "flops": 1e6, "wall_s": 0.5,
                    "reward_mean": 0.5, "reward_std": 0.1, "updated": ["solver"], "value/explained_variance": 0.3})
    recs.append({**recs[-1], "kind": "final"})
    rows = [{"step": s, "gen_tokens": 100 * s, "problem_id": f"test/{i:06d}", "t1": bool(s and i < good),
             "t2": bool(s and i < good), "t2_null": None} for s in (0, 1) for i in range(4)]
    samples = [{"step": s, "problem_id": f"test/{i:06d}", "turns": [
        {"kind": "attempt", "policy": "solver", "text": f"so the answer is {i}", "reward": float(s and i < good),
         "verdict": "ok" if s and i < good else "wrong", "tokens": 6, "finish_reason": "stop"}]}
        for s in (0, 1) for i in range(4)]
    for fname, lines in (("metrics.jsonl", recs), ("eval_problems.jsonl", rows), ("samples.jsonl", samples)):
        text = "".join(json.dumps(r) + "\n" for r in lines)
        if gz and fname != "metrics.jsonl":
            (d / f"{fname}.gz").write_bytes(gzip.compress(text.encode(), mtime=0))
        else:
            (d / fname).write_text(text)
    return d


@pytest.fixture(scope="module")
def env(tmp_path_factory, tiny_ckpt) -> Env:
    root = tmp_path_factory.mktemp("untrusted-fuzz")
    outside = root / "outside"
    (outside / "dir").mkdir(parents=True)
    (outside / "dir" / "keep.txt").write_text("keep\n")
    (outside / "secret.txt").write_text(f"{SECRET}\n")
    exp = root / "templates" / f"fz-{STAMP}"
    write_run(exp / f"grpo-{STAMP}", "grpo", "grpo", 1, exp)
    write_run(exp / f"mlmt-{STAMP}", "mlmt", "mlmt", 3, exp, gz=True)
    (exp / "experiment.json").write_text(json.dumps({
        "name": "fz", "seeds": [0], "arms": {"grpo": [f"grpo-{STAMP}"], "mlmt": [f"mlmt-{STAMP}"]}}, indent=2))
    resume = _killed_run(root / "real", tiny_ckpt)
    # valid copies of every file, for the symlinks that point out of a case's directory
    (outside / "valid").mkdir()
    for src in [*(exp / f"grpo-{STAMP}").iterdir(), exp / "experiment.json", *resume.iterdir()]:
        if src.is_file():
            shutil.copy(src, outside / "valid" / src.name)
    shutil.copytree(resume / "checkpoints", outside / "checkpoints")
    cwd = root / "cwd"
    cwd.mkdir()
    published = root / "published" / "report"
    e = Env(root, outside, exp, resume, [outside, exp.parent, resume, Path(tiny_ckpt), published.parent], cwd,
            published=published)
    res = CliRunner().invoke(app, ["-q", "report", str(exp), "--raw", "--out", str(published)])
    assert res.exit_code == 0, (res.stderr[-2000:], res.exception)
    # the valid inputs pass (and the imports, the worker pools, the first model load are paid here)
    with _in_case(e, "warm-report") as d:
        res = CliRunner().invoke(app, ["report", str(copy_report(e, d)), "--out", str(d / "out")])
        assert res.exit_code == 0, (res.stderr[-2000:], res.exception)
    with _in_case(e, "warm-resume") as d:
        res = CliRunner().invoke(app, ["-q", "run", "--resume", str(copy_resume(e, d))])
        assert res.exit_code == 0, (res.stderr[-2000:], res.exception)
    with _in_case(e, "warm-restore") as d:  # every run is restored: nothing is left to train
        res = CliRunner().invoke(app, ["run", str(restore_spec(d)), "--restore", str(copy_published(e, d))])
        assert res.exit_code == 0, (res.stderr[-2000:], res.exception)
        assert "restored 2 finished run(s) of fz" in res.stderr and "] grpo seed" not in res.stderr, res.stderr
        (exp_dir,) = (d / "runs").iterdir()
        assert sorted(p.name for p in exp_dir.iterdir() if p.is_dir()) == sorted(p.name for p in runs_of(e))
    with _in_case(e, "warm-verify") as d:
        for verifier, lines in VALID_LINES.items():
            inp = d / f"{verifier}.jsonl"
            inp.write_text("".join(json.dumps(line) + "\n" for line in lines))
            res = CliRunner().invoke(app, ["verify", verifier, str(inp), "--out", str(d / f"{verifier}.out")])
            assert res.exit_code == 0, (verifier, res.stderr[-2000:], res.exception)
    return e


def _killed_run(root: Path, ckpt: Path) -> Path:
    """A real one-step tiny run with a checkpoint after its step, marked as a kill leaves it."""
    from mlmt_bench import runner
    from mlmt_bench.spec import load_run_spec

    root.mkdir()
    spec = minimal_spec(name="fz", output_dir=str(root / "runs"))
    spec["policies"]["solver"]["path"] = str(ckpt)
    spec["benchmark"] = {"name": "synthetic-arith", "eval_limit": 2}
    spec["backend"] = {"max_new_tokens": 4}
    spec["train"] = {"steps": 1, "problems_per_step": 2, "threads": 1, "checkpoint_every": 1}
    spec["eval"] = {"every": 0, "feedback_metrics": False, "samples": 2}
    (root / "spec.yaml").write_text(yaml.safe_dump(spec))
    run = Path(runner.run(load_run_spec(root / "spec.yaml"), progress=False)["run_dir"])
    (run / ".lock").unlink(missing_ok=True)
    m = json.loads((run / "manifest.json").read_text())
    m.update(status="running", end_time=None)
    (run / "manifest.json").write_text(json.dumps(m, indent=2))
    return run


@contextlib.contextmanager
def _in_case(e: Env, name: str):
    d = e.root / "cases" / name
    d.mkdir(parents=True)
    e.case_dir = d
    try:
        yield d
    finally:
        try:
            shutil.rmtree(d, ignore_errors=True)
        except RecursionError:  # a tree deeper than rmtree goes
            pass
        if os.path.lexists(d):
            subprocess.run(["rm", "-rf", "--", str(d)], check=True)


def copy_report(e: Env, d: Path) -> Path:
    dst = d / e.report_base.name
    shutil.copytree(e.report_base, dst, symlinks=True)
    return dst


def copy_resume(e: Env, d: Path) -> Path:
    dst = d / e.resume_base.name
    shutil.copytree(e.resume_base, dst, symlinks=True)
    return dst


# ---------------------------------------------------------------------------------------------
# case generators: each returns the CLI arguments and a description of what it did


def _mutate_files(rng: random.Random, e: Env, targets: list[Path], structured: Callable[[Path], Callable | None],
                  n: int) -> list[str]:
    done = []
    for _ in range(n):
        p = rng.choice(targets)
        op = structured(p) if rng.random() < 0.55 else None
        if op is None:
            op = pick(rng, FILE_OPS + ([(1.5, op_gzip)] if ".jsonl" in p.name else []))
        done.append(f"{p.name}:{op(rng, p, e)}")
    return done


def _structured_for(p: Path) -> Callable | None:
    if p.name.endswith(".jsonl") or p.name.endswith(".jsonl.gz"):
        return op_jsonl
    if p.name.endswith(".json"):
        return op_json_field
    if p.name.endswith(".yaml"):
        return op_yaml
    return None


def report_case(rng: random.Random, e: Env, d: Path) -> tuple[list[str], list[str]]:
    exp = copy_report(e, d)
    runs = sorted(p for p in exp.iterdir() if p.is_dir())
    files = [exp / "experiment.json"] + [p for r in runs for p in sorted(r.iterdir())]
    form = rng.choice(["runs", "runs", "experiment", "experiment", "in-place", "raw", "at-flops", "arm"])
    what = [f"form={form}"]
    if form in ("in-place", "raw") and rng.random() < 0.4:  # planted where the report writes
        name = rng.choice(["comparison.md", "index.html", "acc_vs_tokens.png", "runs"])
        what.append(f"planted-{name}:{pick(rng, [(2, op_symlink), (1, op_fifo), (1, op_dir)])(rng, exp / name, e)}")
    what += _mutate_files(rng, e, files, _structured_for, rng.choice([1, 1, 1, 2, 3]))
    if rng.random() < 0.05:  # a run directory itself replaced
        r = rng.choice(runs)
        what.append(f"{r.name}:{pick(rng, [(2, op_symlink), (1, op_fifo), (1, op_delete), (1, op_empty)])(rng, r, e)}")
    out = d / "out"
    if form == "runs":
        args = ["report", *map(str, runs), "--out", str(out)]
    elif form == "experiment":
        args = ["report", str(exp), "--out", str(out)]
    elif form == "in-place":
        args = ["report", str(exp)]
    elif form == "raw":
        args = ["report", str(exp), "--raw"] + (["--out", str(out)] if rng.random() < 0.7 else [])
    elif form == "at-flops":
        args = ["report", str(exp), "--out", str(out), "--at-flops", rng.choice(["0", "5e5", "1e6", "1e300"])]
    else:
        args = ["report", str(runs[0]), "--arm", f"other={runs[1]}", "--out", str(out), "--baseline", "other"]
    if rng.random() < 0.15:
        args = [rng.choice(["-q", "--json"]), *args]
    return args, what


def resume_case(rng: random.Random, e: Env, d: Path) -> tuple[list[str], list[str]]:
    run = copy_resume(e, d)
    ck = run / "checkpoints" / "step-000001"
    logs = [run / n for n in ("manifest.json", "spec.resolved.yaml", "metrics.jsonl", "samples.jsonl",
                              "eval_problems.jsonl", ".lock")]
    ckpt_files = sorted(p for p in ck.rglob("*") if p.is_file())
    what: list[str] = []
    kind = rng.choice(["logs", "logs", "spec", "manifest", "checkpoint", "checkpoint", "state", "stray", "parts"])
    if kind == "logs":
        what += _mutate_files(rng, e, logs, _structured_for, rng.randint(1, 2))
    elif kind == "spec":  # the spec edited, and (mostly) its hash in the manifest updated to match
        what += _mutate_files(rng, e, [run / "spec.resolved.yaml"], _structured_for, 1)
        spec = run / "spec.resolved.yaml"
        if rng.random() < 0.7 and _bytes(spec):
            m = json.loads((run / "manifest.json").read_text())
            m["spec_sha256"] = hashlib.sha256(_bytes(spec)).hexdigest()
            (run / "manifest.json").write_text(json.dumps(m))
            what.append("rehashed")
    elif kind == "manifest":
        what.append(f"manifest.json:{op_json_field(rng, run / 'manifest.json', e)}")
    elif kind == "checkpoint":
        what += _mutate_files(rng, e, ckpt_files, _structured_for, rng.randint(1, 2))
    elif kind == "state":
        op = rng.choice([op_state_meta, op_state_meta, op_safetensors_header, op_pickle])
        target = ck / "trainer_state.safetensors" if op is not op_safetensors_header or rng.random() < 0.5 \
            else ck / "solver" / "model.safetensors"
        what.append(f"{target.name}:{op(rng, target, e)}")
    elif kind == "stray":
        what.append(op_stray(rng, run / "checkpoints", e))
    else:  # a directory where a file goes, the reverse, links to outside
        target = rng.choice([run / "checkpoints", ck, ck / "solver", ck / "solver" / "model.safetensors", run])
        op = rng.choice([op_empty, op_symlink, op_fifo, op_dir, op_delete, op_symlink])
        if target == run and op is op_symlink:
            link = d / "link-to-run"
            link.symlink_to(run)
            return ["run", "--resume", str(link)], ["run-is-a-symlink"]
        what.append(f"{target.name}:{op(rng, target, e)}")
    return ["-q", "run", "--resume", str(run)], what


# the published-report side: ``run EXPERIMENT_SPEC --restore REPORT`` of a report someone else
# published with ``report --raw`` (mlmt_bench.report.publish.restore_runs)

#: names a run directory of a published report may carry (it becomes a directory name here)
RUN_NAMES = ["run\x1b[2J\x1b]0;owned\x07", "run\nnext line", "run\r", "run\x85c1", "\u202erun", "run\ttab", "..run",
             "run..", "a..b", ".restoring-x", ".hidden", "-rf", "*", "a b", "run\u2028", "r" * 255, "r" * 244,
             "experiment.json", "comparison.md", "index.html", "acc_vs_tokens.png", "\ufeffrun", "٣", "CON"]
#: hostile manifest values where the experiment reads a restored run's fields
MANIFEST_FIELDS: dict[str, list[Any]] = {
    "arm": ["grpo", "mlmt", "nope", None, ["grpo"], {"grpo": 1}, 0, "", CONTROL],
    "seed": [0, 1, -1, None, "0", [0], {}, 0.0, 2.5, True, 10 ** 30],
    "base": [None, "x", [], {}, {"key": None}, {"key": "k"}, {"key": [1]},
             {"key": "k", "sha256": 5, "environment": "x"}, 1],
    "experiment": ["fz", ["fz"], None], "status": ["completed", "running", ["completed"]]}


def restore_spec(d: Path) -> Path:
    """The experiment whose runs the published report holds (``fz``: arms grpo and mlmt, seed 0),
    writing into ``d``. Its policy path is the relative ``CKPT`` the template runs were written
    with (none exists in the cases' empty working directory): a run that restore left out cannot
    train; loading its model is a one-line error at once."""
    spec = {"name": "fz", "base": minimal_spec(), "seeds": [0], "budget": "none", "output_dir": str(d / "runs"),
            "arms": {"grpo": {}, "mlmt": {}}}
    path = d / "exp.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def runs_of(e: Env) -> list[Path]:
    return sorted((e.published / "runs").iterdir())


def copy_published(e: Env, d: Path) -> Path:
    dst = d / "published"
    shutil.copytree(e.published, dst, symlinks=True)
    return dst


def restore_case(rng: random.Random, e: Env, d: Path) -> tuple[list[str], list[str]]:
    pub = copy_published(e, d)
    runs = sorted(p for p in (pub / "runs").iterdir())
    files = [p for r in runs for p in sorted(r.iterdir())]
    kind = rng.choice(["files"] * 5 + ["manifest"] * 3 + ["name", "name", "duplicate", "many", "runs-dir",
                                                          "stray", "report", "argument"])
    what = [f"kind={kind}"]
    if kind == "files":  # links to /dev/zero, outside, loops; FIFOs; sparse; gzip garbage; hostile records
        what += _mutate_files(rng, e, files, _structured_for, rng.choice([1, 1, 2, 3]))
    elif kind == "manifest":
        m = rng.choice(runs) / "manifest.json"
        doc = json.loads(m.read_text())
        if rng.random() < 0.6:
            for key in rng.sample(sorted(MANIFEST_FIELDS), rng.randint(1, 2)):
                doc[key] = rng.choice(MANIFEST_FIELDS[key])
                what.append(f"manifest.{key}")
        else:
            doc = mutate_doc(rng, doc)
            what.append("manifest:json-field")
        m.write_bytes(dumps(doc).encode("utf-8", "surrogatepass"))
    elif kind == "name":  # control characters, '..', very long names, names the experiment writes
        r = rng.choice(runs)
        name = rng.choice(RUN_NAMES + [b"run\xff\xfe"])
        os.rename(os.fsencode(r), os.fsencode(r.parent) + b"/" + (name if isinstance(name, bytes) else
                                                                  os.fsencode(name)))
        what.append(f"renamed-to-{name!r:.40}")
    elif kind == "duplicate":  # the same arm x seed twice, under another name
        r = rng.choice(runs)
        shutil.copytree(r, r.with_name(r.name + rng.choice(["-copy", "x", "-s0"])), symlinks=True)
        what.append("duplicate-run")
    elif kind == "many":
        n = rng.choice([20, 60, 200])
        for i in range(n):
            shutil.copytree(runs[i % len(runs)], pub / "runs" / f"copy-{i:04d}", copy_function=os.link)
        what.append(f"many-runs-{n}")
    elif kind == "runs-dir":
        op = pick(rng, [(2, op_symlink), (1, op_fifo), (1, op_empty), (1, op_delete)])
        what.append(f"runs:{op(rng, pub / 'runs', e)}")
    elif kind == "stray":  # entries of runs/ that are no run directory, or a run that is a link
        target = pub / "runs" / rng.choice(["zz-stray", runs[0].name])
        op = pick(rng, [(3, op_symlink), (1, op_fifo), (1, op_socket), (1, op_empty), (1, op_dir), (0.5, op_chain)])
        what.append(f"runs/{target.name == runs[0].name and 'run' or 'stray'}:{op(rng, target, e)}")
    elif kind == "report":  # what restore checks first: experiment.json
        what += _mutate_files(rng, e, [pub / "experiment.json"], _structured_for, 1)
    args = ["run", str(restore_spec(d)), "--restore", str(pub)]
    if kind == "argument":  # REPORT itself: a link, a file, a special file, the same report twice
        choice = rng.choice(["link-outside", "link", "file", "dev-zero", "twice", "missing"])
        arg = {"link-outside": str(e.outside), "dev-zero": "/dev/zero", "file": str(pub / "experiment.json"),
               "missing": str(d / "missing")}.get(choice)
        if choice == "link":
            (d / "link").symlink_to(pub)
            arg = str(d / "link")
        args = args[:-1] + [arg or str(pub)] + (["--restore", str(pub)] if choice == "twice" else [])
        what.append(f"argument-{choice}")
    return ["-q", *args], what  # without -q it says what it restored and what it runs on stderr


PROBLEM = {"id": "p1", "benchmark": "fz", "prompt": "6*7?", "answer": "42"}
VALID_LINES: dict[str, list[dict[str, Any]]] = {
    "math": [{"problem": PROBLEM, "response": "so it is \\boxed{42}"},
             {"problem": {"id": "p2", "answer": "-3"}, "response": "The answer is -3."},
             {"problem": {"id": "p3", "answer": "7"}, "response": "#### 8"}],
    "choice": [{"problem": {"id": "c1", "answer": "B", "metadata": {"options": ["w", "x", "y", "z"]}},
                "response": "Answer: B"},
               {"problem": {"id": "c2", "answer": "(C)"}, "response": "I choose **C**"}],
    "code": [{"problem": {"id": "k1", "tests": ["assert f(2) == 2"]},
              "response": "```python\ndef f(x):\n    return x\n```"}],
}
RARE_LINES = {  # slower valid lines, mixed in now and then: a benchmark lookup, a math-verify check
    "math": [{"benchmark": "synthetic-arith", "id": "test/000000", "response": "12"},
             {"problem": {"id": "p4", "answer": "\\frac{1}{2}"}, "response": "so 0.5"}],
    "choice": [{"benchmark": "gpqa-diamond", "id": "nope", "response": "A"}],
    "code": [],
}


def verify_case(rng: random.Random, e: Env, d: Path, verifier: str) -> tuple[list[str], list[str]]:
    valid = VALID_LINES[verifier]
    lines: list[Any] = [dict(x) for x in rng.sample(valid, k=rng.randint(1, len(valid)))]
    lines = json.loads(json.dumps(lines))
    if RARE_LINES[verifier] and rng.random() < 0.08:
        lines.append(json.loads(json.dumps(rng.choice(RARE_LINES[verifier]))))
    inp = d / "in.jsonl"
    kind = rng.choice(["field"] * 8 + ["bytes"] * 3 + ["file"] * 3 + ["gzip", "lines", "long"])
    what = [f"kind={kind}"]
    if kind == "field":
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(lines))
            lines[i] = mutate_doc(rng, lines[i])
        inp.write_text("".join(dumps(x) + "\n" for x in lines), encoding="utf-8", errors="surrogatepass")
    else:
        inp.write_text("".join(json.dumps(x) + "\n" for x in lines))
        if kind == "bytes":
            what.append(pick(rng, [(3, op_truncate), (3, op_flip), (3, op_insert), (1, op_secret)])(rng, inp, e))
        elif kind == "file":
            what.append(pick(rng, [(1, op_delete), (2, op_empty), (2, op_binary), (1, op_sparse), (2, op_symlink),
                                   (1, op_fifo), (0.5, op_socket), (1, op_dir), (0.3, op_chain)])(rng, inp, e))
        elif kind == "gzip":
            what.append(op_gzip(rng, inp, e))
            inp = inp.with_name("in.jsonl.gz") if inp.with_name("in.jsonl.gz").exists() else inp
        elif kind == "lines":
            what.append(op_jsonl(rng, inp, e))
        else:  # near the limits: a response of about MAX_SCORED_CHARS, or a line of about 16 MiB
            line = lines[0] if isinstance(lines[0], dict) else {"problem": PROBLEM}
            if rng.random() < 0.5:
                unit = rng.choice(["\\boxed{", "9", "A ", "x", "the answer is "])
                n = (2 << 20) + rng.choice([0, 1, -100])
                line = {**line, "response": (unit * (n // len(unit) + 1))[:n]}
                what.append(f"response-of-{n}")
            else:
                line = {**line, "pad": ""}
                room = (16 << 20) - len(dumps(line).encode()) - 1
                line["pad"] = "x" * (room + rng.choice([0, 1, -100]))
                what.append("line-near-16MiB")
            inp.write_text(dumps(line) + "\n")
    if verifier == "code":
        lines = [x for x in lines if isinstance(x, dict)]
    args = ["verify", verifier if rng.random() > 0.02 else rng.choice(["nope", "MATH", ""]), str(inp),
            "--out", str(d / rng.choice(["out.jsonl", "in.jsonl", "out.jsonl"]))]
    if rng.random() < 0.1:
        args += ["--workers", rng.choice(["1", "2"])]
    if rng.random() < 0.1:
        args = [rng.choice(["-q", "--json"]), *args]
    return args, what


def family_of(i: int) -> str:
    """The family of case ``i``: every 50th is a code case; of the rest, 45% report, 10% resume,
    25% math, 20% choice (any prefix of the cases has about these shares); among the cases past
    the fast ones, every RESTORE_EVERY-th of these is a restore case instead (the fast cases hold
    FAST_RESTORE of them, about the time of the cases they replace)."""
    if i % 50 == 49:
        return "verify-code"
    if i in FAST_RESTORE or (i >= FAST_CASES and i % RESTORE_EVERY == 3):
        return "restore"
    return (["report"] * 9 + ["resume"] * 2 + ["verify-math"] * 5 + ["verify-choice"] * 4)[i % 20]


def make_case(i: int, e: Env, d: Path) -> tuple[str, list[str], list[str]]:
    rng = random.Random(f"untrusted-fuzz-{i}")
    fam = family_of(i)
    if fam == "report":
        args, what = report_case(rng, e, d)
    elif fam == "resume":
        args, what = resume_case(rng, e, d)
    elif fam == "restore":
        args, what = restore_case(rng, e, d)
    else:
        args, what = verify_case(rng, e, d, fam.split("-")[1])
    return fam, args, what


# ---------------------------------------------------------------------------------------------
# running a case


class Hang(Exception):
    """A case ran past ALARM_S (raised in the main thread by SIGALRM)."""


@contextlib.contextmanager
def deadline(seconds: float):
    def on_alarm(signum, frame):
        raise Hang(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _status_mb(field: str) -> float:
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"{field}:\s+(\d+) kB", text).group(1)) / 1024


def reset_peak_rss() -> float:
    """Reset this process's RSS high-water mark (Linux: ``5`` into ``/proc/self/clear_refs``) and
    return its RSS now, in MiB. Without the reset (another system) the mark is the process's
    lifetime peak and the starting RSS 0: a stricter check, never a looser one."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return _status_mb("VmRSS")
    except OSError:
        return 0.0


def rss_mb() -> float:
    """The RSS high-water mark in MiB, since the last :func:`reset_peak_rss` where it worked."""
    try:
        return _status_mb("VmHWM")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def require(ok: Any, why: str) -> None:
    """``assert`` with only ``why`` as its message (no introspection of a 16 MiB result)."""
    if not ok:
        raise AssertionError(why)


def where(exc: BaseException) -> str:
    """The innermost frames of ``exc``'s traceback: where the bug is."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)[-3:]
    return " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(frames))


def check_result(res: Any, wall: float, case_dir: Path) -> None:
    """The contract of every case (see the module docstring)."""
    require(not isinstance(res.exception, Hang), f"hang: {res.exception}")
    exc = res.exception
    require(exc is None or isinstance(exc, SystemExit),
            f"exception {type(exc).__name__}: {str(exc)[:300]!r} at {where(exc) if exc else ''}")
    require(res.exit_code in (0, 2), f"exit code {res.exit_code}: {res.stderr[-500:]!r}")
    require("Traceback (most recent call last)" not in res.output, f"a traceback: {res.output[-1500:]!r}")
    if res.exit_code == 2:
        require(res.stderr.startswith("error: ") and res.stderr.count("\n") == 1,
                f"not one error line: {res.stderr[-800:]!r}")
    else:
        require(not any(line.startswith("error") for line in res.stderr.splitlines()), res.stderr[-800:])
    require("SECRET" not in res.stderr, f"a file's content echoed: {res.stderr[-800:]!r}")
    require(not (case_dir / "PWNED").exists(), "a planted tag or pickle ran")
    require(wall < WALL_S, f"took {wall:.1f} s (limit {WALL_S} s)")


def random_cases(e: Env, n: int) -> list[tuple[int, Callable[[Path], tuple[str, list[str], list[str]]]]]:
    return [(i, lambda d, i=i: make_case(i, e, d)) for i in range(n)]


def run_cases(e: Env, cases: list[tuple[int, Callable[[Path], tuple[str, list[str], list[str]]]]],
              stats_name: str = "") -> dict[str, Any]:
    """Run the cases (number, maker: case directory -> family, CLI arguments, what it did);
    returns statistics. Stops at the first failure unless KEEP_GOING."""
    before = {str(p): snapshot(p) for p in e.protected}
    fams: Counter = Counter()
    fam_s: Counter = Counter()
    codes: Counter = Counter()
    ops: Counter = Counter()
    slowest: list[tuple[float, int, str]] = []  # (seconds, case, what it did)
    failures: list[str] = []
    start_rss = reset_peak_rss()
    t_all = time.perf_counter()
    for i, maker in [c for c in cases if c[0] in ONLY] if ONLY else cases:
        with _in_case(e, f"c{i:05d}") as d:
            fam, args, what = maker(d)
            t0 = time.perf_counter()
            with deadline(ALARM_S):
                try:
                    res = CliRunner().invoke(app, args)
                except Hang as exc:  # raised outside the command (CliRunner's own code)
                    res = type("R", (), {"exception": exc, "exit_code": -1, "output": "", "stderr": ""})()
            wall = time.perf_counter() - t0
            fams[fam] += 1
            fam_s[fam] += wall
            codes[f"{fam}:{res.exit_code}"] += 1
            ops.update(w.split(":", 1)[-1].split("->")[0] for w in what)
            slowest = sorted(slowest + [(wall, i, f"{fam}: {'; '.join(what)[:120]}")], reverse=True)[:10]
            label = f"case {i} ({fam}; {'; '.join(what)}; args {[a.replace(str(d), 'CASE') for a in args]})"
            try:
                check_result(res, wall, d)
                for p in e.protected:
                    require(snapshot(p) == before[str(p)], f"{p} changed")
                require(not os.listdir(e.cwd), f"wrote into the working directory: {os.listdir(e.cwd)}")
            except AssertionError as exc:
                failures.append(f"{label}: {exc}")
                if not KEEP_GOING:
                    break
    stats = {"cases": sum(fams.values()), "per_family": dict(sorted(fams.items())),
             "family_s": {k: round(v, 1) for k, v in sorted(fam_s.items())},
             "exit_codes": dict(sorted(codes.items())), "wall_s": round(time.perf_counter() - t_all, 1),
             "max_case_s": round(slowest[0][0], 2) if slowest else 0.0,
             "slowest": [(round(w, 2), i, f) for w, i, f in slowest], "peak_rss_mb": round(rss_mb(), 1),
             "start_rss_mb": round(start_rss, 1),
             "children_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1),
             "mutations": dict(ops.most_common()), "failures": failures}
    if os.environ.get("MLMT_FUZZ_STATS"):
        Path(os.environ["MLMT_FUZZ_STATS"] + stats_name).write_text(json.dumps(stats, indent=2))
    assert not failures, f"{len(failures)} failing case(s):\n" + "\n".join(f[:3000] for f in failures[:30])
    grew = stats["peak_rss_mb"] - stats["start_rss_mb"]
    assert grew < RSS_LIMIT_MB, f"peak RSS {stats['peak_rss_mb']} MB, {grew:.0f} MB above the start"
    return stats


def offline(monkeypatch, cwd: Path) -> None:
    """The cases run in an empty working directory and never reach for the hub: a mutated spec
    may name a model such as ``eval``, a hub name (by design); offline, loading it is a one-line
    error at once, not 30 s of retries on a machine without a network."""
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


def test_fuzz_untrusted_inputs_fast(env, monkeypatch):
    offline(monkeypatch, env.cwd)
    stats = run_cases(env, random_cases(env, FAST_CASES))
    assert set(stats["per_family"]) == {"report", "resume", "verify-math", "verify-choice", "verify-code", "restore"}


@pytest.mark.slow
def test_fuzz_untrusted_inputs_full(env, monkeypatch):
    offline(monkeypatch, env.cwd)
    stats = run_cases(env, random_cases(env, SLOW_CASES))
    assert stats["cases"] >= min(SLOW_CASES, 2000) or ONLY


@pytest.mark.slow
def test_fuzz_every_field(env, monkeypatch):
    """Each field of each file (and of a verify line) set to values of every wrong kind in turn."""
    offline(monkeypatch, env.cwd)
    stats = run_cases(env, sweep_cases(env), ".sweep")
    assert stats["cases"] >= 500 or ONLY


# ---------------------------------------------------------------------------------------------
# the sweep: every field of every file, each set to values of the wrong kinds (deterministic)

SWEEP_VALUES = [None, True, [SECRET], {}, -1, 2.5, Raw("1" + "0" * 400), Raw("NaN"), CONTROL + SECRET, "\ud800",
                Raw("[" * 70 + "]" * 70), "x" * 5000]


def field_paths(doc: Any, prefix: tuple = (), limit: int = 4) -> list[tuple]:
    """Every path (keys and list indices) to a value in ``doc``, up to ``limit`` levels (lists:
    their first two items)."""
    out: list[tuple] = []
    items = doc.items() if isinstance(doc, dict) else list(enumerate(doc))[:2] if isinstance(doc, list) else []
    for k, v in items:
        out.append(prefix + (k,))
        if len(prefix) + 1 < limit:
            out += field_paths(v, prefix + (k,), limit)
    return out


def set_at(doc: Any, path: tuple, value: Any) -> Any:
    node = doc
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return doc


def _sweep_file(p: Path, line: int | None, path: tuple, value: Any) -> None:
    """Set ``path`` of ``p`` (of its ``line``-th record for JSON Lines, gzip kept) to ``value``."""
    raw = p.read_bytes()
    packed = raw[:2] == b"\x1f\x8b"
    text = (gzip.decompress(raw) if packed else raw).decode()
    if p.name.endswith(".yaml"):
        out = yaml.safe_dump(_yamlable(set_at(yaml.safe_load(text), path, value)), allow_unicode=True)
    elif line is None:
        out = dumps(set_at(json.loads(text), path, value))
    else:
        recs = [json.loads(x) for x in text.splitlines()]
        recs[line] = set_at(recs[line], path, value)
        out = "".join(dumps(r) + "\n" for r in recs)
    data = out.encode("utf-8", "surrogatepass")
    p.write_bytes(gzip.compress(data) if packed else data)


def _rotate(j: int, k: int) -> list[Any]:
    """``k`` of SWEEP_VALUES for the ``j``-th path: over all paths every value is used."""
    return [SWEEP_VALUES[(j * k + t) % len(SWEEP_VALUES)] for t in range(k)]


def _targets(base: Path, names: list[str], limit: int = 4) -> list[tuple[str, int | None, tuple]]:
    """(file, record, path) of every field of ``names`` (JSON Lines: the first record of each kind)."""
    out = []
    for name in names:
        p = base / name
        raw = p.read_bytes()
        text = (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).decode()
        if name.endswith(".yaml"):
            out += [(name, None, path) for path in field_paths(yaml.safe_load(text), limit=limit)]
        elif ".jsonl" in name:
            kinds: set = set()
            for i, rec in enumerate(json.loads(x) for x in text.splitlines()):
                if rec.get("kind") not in kinds:
                    kinds.add(rec.get("kind"))
                    out += [(name, i, path) for path in field_paths(rec, limit=limit)]
        else:
            out += [(name, None, path) for path in field_paths(json.loads(text), limit=limit)]
    return out


def sweep_cases(e: Env) -> list[tuple[int, Callable]]:
    cases: list[tuple[int, Callable]] = []
    n = 100_000  # numbered apart from the random cases

    def add(maker: Callable) -> None:
        nonlocal n
        cases.append((n, maker))
        n += 1

    run = f"grpo-{STAMP}"
    names = [f"{run}/{x}" for x in ("manifest.json", "spec.resolved.yaml", "metrics.jsonl", "eval_problems.jsonl",
                                     "samples.jsonl")] + [f"mlmt-{STAMP}/eval_problems.jsonl.gz", "experiment.json"]
    for j, (name, line, path) in enumerate(_targets(e.report_base, names)):
        for value in _rotate(j, 3):
            def report(d, name=name, line=line, path=path, value=value):
                exp = copy_report(e, d)
                _sweep_file(exp / name, line, path, value)
                return "report", ["report", str(exp), "--out", str(d / "out")], [f"{name}:{line}:{path}"]
            add(report)
    # a resume costs ~1 s: the fields at the top two levels, one value each (rotating), more for what it reads
    for j, (name, line, path) in enumerate(_targets(e.resume_base, ["manifest.json", "metrics.jsonl",
                                                                     "spec.resolved.yaml"], limit=2)):
        if name == "metrics.jsonl" and path[-1] not in ("step", "kind"):
            continue  # a resume reads nothing else of a log (the report sweep covers every field)
        read = path[0] in ("status", "spec_sha256", "resumed_from", "step", "train", "policies", "algorithm")
        for value in _rotate(j, 3 if read else 1):
            def resume(d, name=name, line=line, path=path, value=value):
                run_dir = copy_resume(e, d)
                _sweep_file(run_dir / name, line, path, value)
                if name.endswith(".yaml"):  # as an attacker would: the manifest's hash updated to match
                    m = json.loads((run_dir / "manifest.json").read_text())
                    m["spec_sha256"] = hashlib.sha256((run_dir / name).read_bytes()).hexdigest()
                    (run_dir / "manifest.json").write_text(json.dumps(m))
                return "resume", ["-q", "run", "--resume", str(run_dir)], [f"{name}:{line}:{path}"]
            add(resume)
    state = e.resume_base / "checkpoints" / "step-000001" / "trainer_state.safetensors"
    header, _ = _safetensors_parts(state)
    paths = [p for p in field_paths(json.loads(header["__metadata__"]["mlmt_state"]), limit=4)
             if p[0] != "optimizers" or len(p) <= 3]
    for j, path in enumerate(paths[:80]):
        for value in _rotate(j, 3):
            def resume_state(d, path=path, value=value):
                run_dir = copy_resume(e, d)
                _set_state(run_dir / "checkpoints" / "step-000001", lambda st: set_at(st, path, value))
                return "resume", ["-q", "run", "--resume", str(run_dir)], [f"state:{path}"]
            add(resume_state)
    for verifier in ("math", "choice"):
        lines = VALID_LINES[verifier][:1] + RARE_LINES[verifier][:1]
        for j, (line_no, path) in enumerate((k, p) for k, line in enumerate(lines) for p in field_paths(line)):
            for value in _rotate(j, 4):
                def verify(d, verifier=verifier, line_no=line_no, path=path, value=value, lines=lines):
                    doc = json.loads(json.dumps(lines[line_no]))
                    inp = d / "in.jsonl"
                    inp.write_bytes((dumps(set_at(doc, path, value)) + "\n").encode("utf-8", "surrogatepass"))
                    return (f"verify-{verifier}", ["verify", verifier, str(inp), "--out", str(d / "out.jsonl")],
                            [f"line:{path}"])
                add(verify)
    return cases


# ---------------------------------------------------------------------------------------------
# regressions: what the fuzz found, one case each (before the fix: a traceback, or a 30 s line)


def _run_copy(env: Env, tmp_path: Path) -> Path:
    run = tmp_path / env.resume_base.name
    shutil.copytree(env.resume_base, run, symlinks=True)
    return run


def _set_state(step_dir: Path, edit: Callable[[dict], None]) -> None:
    path = step_dir / "trainer_state.safetensors"
    header, body = _safetensors_parts(path)
    state = json.loads(header["__metadata__"]["mlmt_state"])
    edit(state)
    header["__metadata__"]["mlmt_state"] = dumps(state)
    _write_safetensors(path, header, body)


def test_verify_keeps_a_lone_surrogate_escape_of_the_input(tmp_path):
    """A ``"\\ud800"`` escape is valid JSON but no UTF-8 text: writing the output line raised
    UnicodeEncodeError (a traceback); the line is now written with its escapes."""
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text('{"problem": {"id": "\\ud800", "answer": "42"}, "response": "\\udfff \\\\boxed{42}"}\n')
    res = CliRunner().invoke(app, ["verify", "math", str(inp), "--out", str(out)])
    assert res.exit_code == 0, (res.stderr, res.exception)
    (line,) = out.read_bytes().decode("utf-8").splitlines()
    back = json.loads(line)
    assert back["problem"]["id"] == "\ud800" and back["response"].startswith("\udfff")
    assert back["verdict"]["kind"] == "ok"


@pytest.mark.parametrize("what,n", [("response", 2 << 20), ("problem.answer", 2 << 20)])
def test_verify_refuses_a_response_or_answer_past_the_scored_limit(tmp_path, what, n):
    """A 16 MiB response of ``"A "`` took 30 s to score (choice), ``\\boxed{`` 17 s (math): a
    response or gold answer is scored up to MAX_SCORED_CHARS characters, refused beyond."""
    from support import one_line_error

    inp = tmp_path / "in.jsonl"
    for size, ok in ((n, True), (n + 1, False)):
        line = {"problem": {"id": "c", "answer": "B"}, "response": "Answer: B"}
        if what == "response":
            line["response"] = ("A " * size)[:size]
        else:
            line["problem"]["answer"] = "B" * size
        inp.write_text(json.dumps(line) + "\n")
        args = ["verify", "choice", str(inp), "--out", str(tmp_path / "out.jsonl")]
        if ok:
            t0 = time.perf_counter()
            assert CliRunner().invoke(app, args).exit_code == 0
            assert time.perf_counter() - t0 < WALL_S
        else:
            one_line_error(args, f"in.jsonl:1: '{what}' has {n + 1:,} characters, more than the limit of {n:,}")


@pytest.mark.parametrize("step", [SECRET, 10 ** 30, -1, 2.5, float("nan"), [1]])
def test_report_names_a_step_that_is_not_a_step_count(env, tmp_path, step):
    """``int(rec["step"])`` in the figures raised ValueError (echoing the value) for a string
    step, OverflowError in numpy for 10**30: the reader now refuses it, naming file, line, field."""
    from support import one_line_error

    exp = copy_report(env, tmp_path)
    metrics = exp / f"grpo-{STAMP}" / "metrics.jsonl"
    recs = [json.loads(x) for x in metrics.read_text().splitlines()]
    recs[0]["step"] = step
    metrics.write_text("".join(json.dumps(r) + "\n" for r in recs))
    err = one_line_error(["report", str(exp), "--out", str(tmp_path / "out")],
                         f"{metrics}:1: 'step' must be a whole number of steps")
    assert "SECRET" not in err


def test_report_treats_an_integer_too_large_for_a_float_as_no_number(env, tmp_path):
    """``math.isfinite(10**400)`` raises OverflowError: ``is_num`` said so with a traceback."""
    from mlmt_bench.report.runs import is_num

    assert not is_num(10 ** 400) and not is_num(True) and is_num(10 ** 300) and not is_num(float("inf"))
    exp = copy_report(env, tmp_path)
    metrics = exp / f"mlmt-{STAMP}" / "metrics.jsonl"
    metrics.write_text(metrics.read_text().replace('"acc@t2": 0.75', '"acc@t2": 1' + "0" * 400))
    res = CliRunner().invoke(app, ["report", str(exp), "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, (res.stderr, res.exception)


@pytest.mark.parametrize("edit,fragment", [
    (lambda s: s["rng"].__setitem__("python", [3, [1, 2], None]), "rng.python is not a python RNG state"),
    (lambda s: s["rng"].__setitem__("numpy", {"__tuple__": ["MT19937", [1], 0, 0, 0.0]}), "rng.numpy"),
    (lambda s: s["rng"].__setitem__("torch", "x"), "rng.torch"),
])
def test_resume_checks_the_rng_states_before_loading_anything(env, tmp_path, edit, fragment):
    """A malformed RNG state passed check_state and failed in ``random.setstate`` (TypeError, a
    traceback) after the weights and optimisers were loaded; now the checkpoint is not intact."""
    from support import one_line_error

    run = _run_copy(env, tmp_path)
    _set_state(run / "checkpoints" / "step-000001", edit)
    before = (run / "metrics.jsonl").read_bytes()
    one_line_error(["run", "--resume", str(run)], "no intact checkpoint", fragment)
    assert (run / "metrics.jsonl").read_bytes() == before


@pytest.mark.parametrize("line,fragment", [
    ('{"kind": "eval", "step": "3"}', "metrics.jsonl:5: expected a JSON object with a numeric 'step'"),
    ('{"kind": "eval", "step": null}', "metrics.jsonl:5: expected a JSON object with a numeric 'step'"),
    ('[1, 2]', "metrics.jsonl:5: expected a JSON object with a numeric 'step'"),
    ('{"step": 0}', "metrics.jsonl:5: expected a JSON object with a numeric 'step' and a 'kind'"),  # KeyError
])
def test_resume_names_a_log_record_it_cannot_order_by_step(env, tmp_path, line, fragment):
    """Dropping the log lines after the checkpoint compared ``"3" <= 1`` (TypeError) or called
    ``.get`` on a list (AttributeError); a metrics record without a kind reached the trainer's
    ``r["kind"]`` at the end of the run (KeyError)."""
    from support import one_line_error

    run = _run_copy(env, tmp_path)
    with open(run / "metrics.jsonl", "a") as f:
        f.write(line + "\n")
    one_line_error(["-q", "run", "--resume", str(run)], fragment)


def test_resume_keeps_a_lone_surrogate_escape_in_a_log(env, tmp_path):
    run = _run_copy(env, tmp_path)
    with open(run / "samples.jsonl", "a") as f:
        f.write('{"step": 0, "problem_id": "\\ud800", "turns": []}\n')
    res = CliRunner().invoke(app, ["-q", "run", "--resume", str(run)])
    assert res.exit_code == 0, (res.stderr[-1500:], res.exception)
    assert '"problem_id": "\\ud800"' in (run / "samples.jsonl").read_text()


@pytest.mark.parametrize("stray", ["file-as-step", "old-dir", "old-file"])
def test_a_checkpoint_is_committed_over_whatever_is_in_its_place(env, tmp_path, stray):
    """``checkpoints/step-000001`` a regular file (not a checkpoint: the run starts over) made the
    commit's ``shutil.rmtree`` of the replaced entry raise NotADirectoryError; a stray
    ``step-000001.old`` made ``os.replace`` fail (ENOTEMPTY / ENOTDIR)."""
    run = _run_copy(env, tmp_path)
    step = run / "checkpoints" / "step-000001"
    shutil.rmtree(step)
    step.write_bytes(b"not a checkpoint")
    if stray == "old-dir":
        (step.with_name("step-000001.old") / "x").mkdir(parents=True)
    elif stray == "old-file":
        step.with_name("step-000001.old").write_bytes(b"x")
    res = CliRunner().invoke(app, ["-q", "run", "--resume", str(run)])
    assert res.exit_code == 0, (res.stderr[-1500:], res.exception)
    assert step.is_dir() and (step / "trainer_state.safetensors").is_file()
    assert not os.path.lexists(step.with_name("step-000001.old"))


def test_report_does_not_show_a_protocol_value_from_a_run_spec(env, tmp_path):
    from support import one_line_error

    exp = copy_report(env, tmp_path)
    spec = exp / f"grpo-{STAMP}" / "spec.resolved.yaml"
    d = yaml.safe_load(spec.read_text())
    d["benchmark"]["name"] = SECRET
    spec.write_text(yaml.safe_dump(d))
    err = one_line_error(["report", str(exp), "--out", str(tmp_path / "out")], "differ in their protocol",
                         'benchmark.name: "synthetic-arith" vs a string of 51 characters (not shown)')
    assert "SECRET" not in err


def test_report_writes_a_lone_surrogate_of_a_log_as_its_escape(env, tmp_path):
    """A problem id ``"\\ud800"`` reached comparison.md, whose UTF-8 encoding raised (a traceback)."""
    exp = copy_report(env, tmp_path)
    rows = exp / f"grpo-{STAMP}" / "eval_problems.jsonl"
    rows.write_text(rows.read_text().replace('"test/000000"', '"\\ud800"'))
    res = CliRunner().invoke(app, ["report", str(exp), "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, (res.stderr[-1500:], res.exception)
    (tmp_path / "out" / "comparison.md").read_bytes().decode("utf-8")


@pytest.mark.parametrize("entry,fragment", [
    (SECRET, "run directory a string of 51 characters (not shown) not found"),
    ("x" * 5000, "run directory a string of 5000 characters (not shown) not found"),  # ENAMETOOLONG: a traceback
    ("a\x00b", "not found"),
    ({"run_dir": [SECRET]}, "cannot read a run directory from a mapping of 1 key (not shown)"),
])
def test_report_names_an_unusable_run_directory_of_an_experiment_without_showing_it(env, tmp_path, entry, fragment):
    from support import one_line_error

    exp = copy_report(env, tmp_path)
    record = json.loads((exp / "experiment.json").read_text())
    record["arms"]["mlmt"] = [entry]
    (exp / "experiment.json").write_text(json.dumps(record))
    err = one_line_error(["report", str(exp), "--out", str(tmp_path / "out")], "experiment.json: arms.mlmt: ",
                         fragment)
    assert "SECRET" not in err


def test_resume_does_not_show_a_benchmark_path_that_is_no_path(env, tmp_path):
    from support import one_line_error

    run = _run_copy(env, tmp_path)
    spec = run / "spec.resolved.yaml"
    d = yaml.safe_load(spec.read_text())
    d["benchmark"]["path"] = "\x00" + SECRET
    spec.write_text(yaml.safe_dump(d))
    m = json.loads((run / "manifest.json").read_text())
    m["spec_sha256"] = hashlib.sha256(spec.read_bytes()).hexdigest()
    (run / "manifest.json").write_text(json.dumps(m))
    err = one_line_error(["run", "--resume", str(run)], "benchmark.path: a string of 52 characters (not shown) "
                                                        "cannot be used")
    assert "SECRET" not in err


@pytest.mark.parametrize("counter,value", [("step", {}), ("step", -1), ("step", 2.5), ("wall_s", {}), ("flops", None),
                                           ("gen_tokens", "1")])
def test_resume_checks_the_counters_before_loading_anything(env, tmp_path, counter, value):
    """A step of ``{}`` reached ``"<=" `` when the logs were cut (TypeError), a wall_s of ``{}`` the
    trainer's clock (TypeError): counters must be finite numbers, the step a whole number."""
    from support import one_line_error

    run = _run_copy(env, tmp_path)
    _set_state(run / "checkpoints" / "step-000001", lambda s: s["counters"].__setitem__(counter, value))
    one_line_error(["run", "--resume", str(run)], "no intact checkpoint",
                   f"counters: {counter} must be finite numbers")


def test_verify_names_an_input_that_is_a_symlink_loop(tmp_path):
    """``Path.resolve`` raised RuntimeError on a loop (comparing the input with the output)."""
    from support import one_line_error

    (tmp_path / "in.jsonl").symlink_to(tmp_path / "in.jsonl")
    one_line_error(["verify", "choice", str(tmp_path / "in.jsonl"), "--out", str(tmp_path / "out.jsonl")],
                   "in.jsonl: cannot read (a symbolic link loop)")


def _restore_args(env: Env, tmp_path: Path) -> tuple[Path, list[str]]:
    pub = copy_published(env, tmp_path)
    return pub, ["-q", "run", str(restore_spec(tmp_path)), "--restore", str(pub)]


@pytest.mark.parametrize("packed", [b"\x1f\x8b\x08\x00" + bytes(range(40)), "flipped"], ids=["garbage", "flipped"])
def test_restore_names_a_published_log_that_is_no_gzip(env, tmp_path, packed):
    """A published ``metrics.jsonl.gz`` of garbage after the magic, or with flipped bytes, raised
    zlib.error from restore's read (a traceback); now one line, and nothing is restored."""
    from support import one_line_error

    pub, args = _restore_args(env, tmp_path)
    log = sorted((pub / "runs").iterdir())[-1] / "metrics.jsonl.gz"
    if packed == "flipped":
        data = bytearray(log.read_bytes())
        data[len(data) // 2] ^= 0xFF
        packed = bytes(data)
    log.write_bytes(packed)
    one_line_error(args, "metrics.jsonl.gz: cannot read as gzip")
    (exp_dir,) = (tmp_path / "runs").iterdir()
    assert not [p for p in exp_dir.iterdir() if p.is_dir()]


@pytest.mark.parametrize("field,value,fragment", [
    ("base", "x", "'base' must be a mapping"),  # AttributeError in join_base
    ("base", {"sha256": "ab"}, "'base' must be a mapping"),  # KeyError
    ("arm", ["grpo"], "'arm' must be a string"),  # TypeError: unhashable
    ("seed", [0], "'seed' a whole number"),  # before: "--resume DIR: ... different spec", with no --resume given
])
def test_restore_refuses_a_run_whose_arm_seed_or_base_has_the_wrong_kind(env, tmp_path, field, value, fragment):
    """The experiment keys a finished run by its manifest's arm and seed and admits its base:
    a published manifest's values of the wrong kind ended in a traceback (AttributeError,
    KeyError, TypeError) after the runs were restored; now restore refuses them first, in one
    line, and writes nothing."""
    from support import one_line_error

    pub, args = _restore_args(env, tmp_path)
    manifest = sorted((pub / "runs").iterdir())[-1] / "manifest.json"
    doc = json.loads(manifest.read_text())
    doc[field] = value
    manifest.write_text(json.dumps(doc))
    one_line_error(args, "manifest.json: ", fragment, "nothing restored")
    (exp_dir,) = (tmp_path / "runs").iterdir()
    assert not [p for p in exp_dir.iterdir() if p.is_dir()]


@pytest.mark.parametrize("n", [245, 255])
def test_restore_refuses_a_run_name_too_long_for_its_temporary_name(env, tmp_path, n):
    """A published run named with 245-255 bytes (a valid file name) is restored first as
    ``.restoring-<name>``, past the 255-byte limit: OSError ENAMETOOLONG, a traceback (exit 1)."""
    from support import one_line_error

    pub, args = _restore_args(env, tmp_path)
    run = sorted((pub / "runs").iterdir())[0]
    run.rename(run.with_name("r" * n))
    one_line_error(args, f"a run named with {n} bytes, refused (at most 244); nothing restored")
    (exp_dir,) = (tmp_path / "runs").iterdir()
    assert not list(exp_dir.glob("*/"))

"""A report published with its raw data (METHOD.md v3: anyone can recompute every number), which
``mlmt-bench report DIR`` re-renders byte for byte.

``mlmt-bench report EXP_DIR --out DIR --raw`` copies what the report is computed from into DIR and
renders the report from those copies:

    DIR/experiment.json         the experiment's record with its arms listing ``runs/<run>``
                                (relative to DIR) and ``report``: the options it was rendered with
                                (title, baseline, at_flops), which a re-render reuses
    DIR/runs/<run>/manifest.json, spec.resolved.yaml        as the run wrote them
    DIR/runs/<run>/metrics.jsonl.gz, eval_problems.jsonl.gz the run's logs (every evaluation's
                                per-problem outcomes), gzip of the bytes the run wrote
    DIR/runs/<run>/samples.jsonl.gz   only the logged episodes the report reads (the example
                                episodes where arms disagree: :func:`episodes.episodes_used`; the
                                problem browser's, one run's per arm and problem:
                                :func:`problem_set.episodes_shown`); absent when it reads none
    DIR/eval-memo/<key>.json.gz the step-0 evaluations the runs read from or stored in this
                                machine's memo (:mod:`mlmt_bench.io.eval_memo`), gzip of the
                                entries; ``run --restore`` puts them back, so a session elsewhere
                                with the same CPU, code and weights reads them instead of
                                evaluating again. The report never reads them.
    DIR/comparison.md, acc_vs_tokens.png, index.html, problems.html

No checkpoints and no other samples. ``mlmt-bench report DIR`` (no ``--out``: in place) reads the
copies with the recorded options and writes the same comparison.md and index.html, wherever DIR
is: nothing rendered depends on its location or on the time (acc_vs_tokens.png carries no
version or date either). The bytes of the PNG, which index.html embeds, depend on matplotlib's
version (and its FreeType): re-render with the versions in the runs' manifests for identical files.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path
from typing import Any

from mlmt_bench.errors import UserError
from mlmt_bench.io import eval_memo
from mlmt_bench.io.jsonl import DECODE_ERRORS, GzipTooLarge, open_jsonl
from mlmt_bench.report.episodes import episodes_used
from mlmt_bench.report.problem_set import episodes_shown
from mlmt_bench.report.runs import log_file
from mlmt_bench.tracking import atomic_write_bytes, atomic_write_text

#: copied as they are
AS_IS = ("manifest.json", "spec.resolved.yaml")
#: copied whole, gzip-compressed (``<name>.gz``)
LOGS = ("metrics.jsonl", "eval_problems.jsonl")
SAMPLES = "samples.jsonl"
RUNS = "runs"
MEMO = "eval-memo"
#: a committed report should stay below this (issue 18): ``mlmt-bench report`` warns above it
SIZE_LIMIT_BYTES = 25 * 10**6
#: ``run --restore`` writes at most this many bytes in all (decompressed logs, manifests, specs):
#: a report of a few MB whose logs each pass the per-file bound could otherwise fill a disk. The
#: v3 headline's 110 runs decompress to 36 MB.
MAX_RESTORE_BYTES = 256 << 20
#: a file name's limit on Linux and macOS file systems (bytes); a run is restored as ``.restoring-<run>`` first
MAX_NAME_BYTES = 255
_RESTORING = ".restoring-"


def _gzip(data: bytes) -> bytes:
    """gzip without a file name or time stamp: the same bytes give the same file."""
    return data if data[:2] == b"\x1f\x8b" else gzip.compress(data, compresslevel=9, mtime=0)


def _read(path: Path, limit: int | None = None) -> bytes:
    """The bytes of a run's log (or a memo entry), decompressed; the report has read a log within
    the limits of :func:`~mlmt_bench.io.bounded_input.jsonl_bounds` already, and a file that grew
    past ``limit`` (default ``MAX_JSONL_BYTES``) since, or a gzip bomb, is a one-line error, read
    no further. A symbolic link is refused, never followed."""
    from mlmt_bench.io import bounded_input

    bounded_input.check_plain_file(path)
    limit = bounded_input.MAX_JSONL_BYTES if limit is None else limit
    try:
        f = open_jsonl(path, limit, follow_links=False)  # not gzip.open: it skips NUL padding one byte per call
    except OSError as exc:
        bounded_input.refuse_link(path)  # swapped for a link since the check
        raise UserError(f"{path}: cannot read ({exc.strerror or exc})") from None
    with f:
        try:
            data = f.read(limit + 1)
        except GzipTooLarge:
            data = None  # more compressed bytes than a gzip of the limit holds: past it
        except DECODE_ERRORS as exc:  # a published log is data from elsewhere: garbage is one line
            raise UserError(f"{path}: cannot read as gzip ({type(exc).__name__}: {exc})") from None
    if data is None or len(data) > limit:
        raise UserError(f"{path}: more than the limit of {bounded_input.human_bytes(limit)} of JSON "
                        "(decompressed) in one file")
    return data


def _kept_samples(path: Path, step: int | None, pids: set[str]) -> bytes:
    """The lines of a samples log at ``step`` whose problem is in ``pids`` (the last line of each,
    as the report reads them), as they were written."""
    kept: dict[str, bytes] = {}
    for line in _read(path).splitlines(keepends=True):
        try:
            rec = json.loads(line)
        except ValueError:  # a torn last line, which the report ignores too
            continue
        if (isinstance(rec, dict) and isinstance(rec.get("turns"), list) and rec.get("step") == step
                and str(rec.get("problem_id")) in pids):
            kept.pop(str(rec.get("problem_id")), None)
            kept[str(rec.get("problem_id"))] = line if line.endswith(b"\n") else line + b"\n"
    return b"".join(kept.values())


def _check_sources(src_of: dict[str, Path]) -> None:
    """Refuse, in one line and before anything is read or written, a run directory or a file that
    :func:`_copy_run` would read which is a symbolic link (its target, e.g. a private key, would be
    published), or a file there that is not a regular one."""
    from mlmt_bench.io import bounded_input

    for src in src_of.values():
        bounded_input.refuse_link(src)
        names = [*AS_IS, *(f for n in (*LOGS, SAMPLES) for f in (n, f"{n}.gz"))]
        for name in names:
            if os.path.lexists(src / name):
                bounded_input.check_plain_file(src / name)


def _copy_run(src: Path, dest: Path, used: tuple[int | None, set[str]] | None) -> None:
    from mlmt_bench.io import bounded_input

    dest.mkdir(parents=True, exist_ok=True)
    for name in AS_IS:
        if os.path.lexists(src / name):
            atomic_write_bytes(dest / name, bounded_input.read_bytes(src / name, follow_links=False))
    for name in (*LOGS, SAMPLES):
        (dest / name).unlink(missing_ok=True)  # a plain log would shadow its .gz (runs.log_file)
        packed = dest / f"{name}.gz"
        source = log_file(src, name)
        if name == SAMPLES:
            data = _kept_samples(source, *used) if used is not None and source.is_file() else b""
            if data:
                atomic_write_bytes(packed, _gzip(data))
            else:
                packed.unlink(missing_ok=True)
        elif os.path.lexists(source):
            limit = bounded_input.MAX_JSONL_BYTES
            atomic_write_bytes(packed, _gzip(bounded_input.read_bytes(source, limit, follow_links=False)))


def check_publish_target(out_dir: Path) -> None:
    """One-line refusal of a directory ``report --raw`` could never publish into (``run --publish``
    asks before its first run): not a directory (or a new path), or one that holds an experiment's
    own ``experiment.json``."""
    from mlmt_bench.tracking import check_output_dir

    check_output_dir(out_dir, "--publish")
    _check_report_dir(out_dir)


def _check_report_dir(out_dir: Path) -> None:
    exp = out_dir / "experiment.json"
    if exp.is_file():
        try:
            report = json.loads(exp.read_text(encoding="utf-8")).get("report")
        except (OSError, ValueError, AttributeError):
            report = None
        if not (isinstance(report, dict) and report.get("raw")):
            raise UserError(f"{out_dir}: holds an experiment's own experiment.json; publish into a new directory "
                            "(or into a report published with --raw)")


def _check_target(out_dir: Path, names: set[str]) -> None:
    _check_report_dir(out_dir)
    stale = sorted(p.name for p in (out_dir / RUNS).iterdir() if p.name not in names) \
        if (out_dir / RUNS).is_dir() else []
    if stale:
        raise UserError(f"{out_dir / RUNS}: holds runs this report does not use ({', '.join(stale[:3])}"
                        f"{' ...' if len(stale) > 3 else ''}); remove them or publish into a new directory")


def publish_runs(grouped: dict[str, list[Path]], out_dir: Path, *, record: dict[str, Any], title: str,
                 baseline: str | None, at_flops: float | None) -> dict[str, list[Path]]:
    """Copy the raw data of ``grouped`` (arm -> run directories) into ``out_dir`` as the module says
    and write its experiment.json; returns the arms with the copies' directories.

    record: the source experiment's experiment.json ({} when the runs came from elsewhere); kept
    but for its arms and its ``comparison`` (the source's file paths). title, baseline, at_flops:
    the options of the report, recorded for a re-render.
    """
    from mlmt_bench.report.runs import load_run, with_base_critic_arms

    out_dir = Path(out_dir)
    src_of: dict[str, Path] = {}
    for dirs in grouped.values():
        for d in dirs:
            name = Path(os.path.abspath(d)).name
            if name in src_of and os.path.abspath(src_of[name]) != os.path.abspath(d):
                raise UserError(f"two runs named {name} ({src_of[name]} and {d}); a report holds each run once "
                                f"as {RUNS}/<run name>")
            src_of[name] = Path(d)
    _check_sources(src_of)
    _check_target(out_dir, set(src_of))
    loaded = with_base_critic_arms({arm: [load_run(p, at_flops=at_flops) for p in dirs]
                                    for arm, dirs in grouped.items()})
    used: dict[str, tuple[int | None, set[str]]] = {}
    for path, (step, pids) in [*episodes_used(loaded).items(), *episodes_shown(loaded).items()]:
        used.setdefault(os.path.abspath(path), (step, set()))[1].update(pids)  # one final step per run
    for name, src in src_of.items():
        dest = out_dir / RUNS / name
        if os.path.abspath(src) != os.path.abspath(dest):  # not already this report's copy
            _copy_run(src, dest, used.get(os.path.abspath(src)))
    _publish_memo([r.manifest for rows in loaded.values() for r in rows], out_dir)
    out = {arm: [out_dir / RUNS / Path(os.path.abspath(d)).name for d in dirs] for arm, dirs in grouped.items()}
    exp = {k: v for k, v in record.items() if k not in ("arms", "comparison", "report")}
    exp.setdefault("name", title)
    # an arm of the experiment with no finished run yet stays listed, empty, in its place: a re-render says so
    order = dict.fromkeys([*(record.get("arms") or {}), *out])
    exp["arms"] = {arm: [f"{RUNS}/{p.name}" for p in out.get(arm, [])] for arm in order}
    exp["report"] = {"title": title, "baseline": baseline, "at_flops": at_flops, "raw": True}
    atomic_write_text(out_dir / "experiment.json", json.dumps(exp, indent=2) + "\n")
    return out


def _memo_keys(manifest: Any) -> list[str]:
    """The memo keys a run's manifest names (``eval_memo``: read, ``eval_memo_stored``: stored)."""
    keys = []
    for field in ("eval_memo", "eval_memo_stored"):
        named = manifest.get(field) if isinstance(manifest, dict) else None
        if isinstance(named, dict):
            keys += [k for k in named.values() if isinstance(k, str) and eval_memo.KEY.fullmatch(k)]
    return keys


def _publish_memo(manifests: list[dict[str, Any]], out_dir: Path) -> None:
    """The memo entries the runs' ``manifests`` name which this machine's memo holds, into
    ``out_dir/eval-memo/<key>.json.gz``; an entry published already is kept (the same key is the
    same evaluation)."""
    from mlmt_bench.io import bounded_input

    for manifest in manifests:
        for key in _memo_keys(manifest):
            dest, entry = out_dir / MEMO / f"{key}.json.gz", eval_memo.entry_path(key)
            if entry is None or not entry.is_file() or dest.is_file():
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(dest, _gzip(bounded_input.read_bytes(entry, eval_memo.MAX_ENTRY_BYTES,
                                                                     follow_links=False)))


def restore_memo(report_dir: Path) -> int:
    """The step-0 evaluations ``report_dir`` published (``eval-memo/<key>.json.gz``) into this
    machine's memo; an entry the memo holds already is kept. Returns how many were written (0
    with the memo off). Data from elsewhere: every entry is read and checked (a plain file named
    ``<key>.json.gz``, gzip of a JSON object with a ``samples`` list, within
    ``eval_memo.MAX_ENTRY_BYTES``, and ``MAX_RESTORE_BYTES`` in all) before any is written; one
    that is not is a one-line error."""
    from mlmt_bench.io import bounded_input

    memo_dir = Path(report_dir) / MEMO
    if eval_memo.default_dir() is None or not os.path.lexists(memo_dir):
        return 0
    bounded_input.refuse_link(memo_dir)
    if not memo_dir.is_dir():
        raise UserError(f"--restore {report_dir}: {MEMO} is not a directory; nothing restored")
    planned: list[tuple[Path, bytes]] = []
    total = 0
    for src in sorted(memo_dir.iterdir()):
        key = src.name.removesuffix(".json.gz")
        if not (src.name.endswith(".json.gz") and eval_memo.KEY.fullmatch(key)):
            raise UserError(f"--restore {report_dir}: {MEMO}/{bounded_input.printable(src.name)!r} is not named "
                            "<sha256>.json.gz; nothing restored")
        data = _read(src, eval_memo.MAX_ENTRY_BYTES)
        try:
            entry = json.loads(data)
            bounded_input.json_nodes(entry, str(src))
        except (ValueError, RecursionError):
            entry = None
        if not (isinstance(entry, dict) and isinstance(entry.get("samples"), list)):
            raise UserError(f"--restore {report_dir}: {MEMO}/{src.name} is not a stored evaluation (a JSON object "
                            "with 'samples'); nothing restored")
        dest = eval_memo.entry_path(key)
        if dest is not None and not dest.exists():
            total += len(data)
            if total > MAX_RESTORE_BYTES:
                raise UserError(f"--restore {report_dir}: its {MEMO} holds more than the limit of "
                                f"{bounded_input.human_bytes(MAX_RESTORE_BYTES)} (decompressed) in all; nothing "
                                "restored")
            planned.append((dest, data))
    for dest, data in planned:
        dest.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(dest, data)
    return len(planned)


def size(out_dir: Path) -> dict[str, Any]:
    """Bytes of everything under a published report, against :data:`SIZE_LIMIT_BYTES`."""
    total = sum(p.stat().st_size for p in Path(out_dir).rglob("*") if p.is_file())
    return {"bytes": total, "limit_bytes": SIZE_LIMIT_BYTES, "over_limit": total > SIZE_LIMIT_BYTES}


def check_restorable(report_dir: Path) -> Path:
    """``report_dir/runs`` if ``report_dir`` is a report published with ``--raw``; else a
    one-line :class:`UserError`, raised before an experiment creates anything."""
    report_dir = Path(report_dir)
    runs = report_dir / RUNS
    if not (report_dir / "experiment.json").is_file() or not runs.is_dir():
        raise UserError(f"--restore {report_dir}: not a report published with --raw (no experiment.json and {RUNS}/)")
    return runs


def _check_run_fields(path: Path, manifest: dict[str, Any]) -> None:
    """A one-line UserError unless the fields an experiment keys and admits a finished run by have
    their kinds (``arm`` a string, ``seed`` a whole number, ``base`` absent or a mapping with a
    string ``key``, a string ``sha256`` and a mapping ``environment``): an experiment's own runs
    have them, a published report's are data from elsewhere."""
    base = manifest.get("base")
    seed = manifest.get("seed")
    if not isinstance(manifest.get("arm"), str) or not isinstance(seed, int) or isinstance(seed, bool):
        raise UserError(f"{path}: 'arm' must be a string and 'seed' a whole number; nothing restored")
    if base is not None and not (isinstance(base, dict) and isinstance(base.get("key"), str)
                                 and isinstance(base.get("sha256"), (str, type(None)))
                                 and isinstance(base.get("environment"), (dict, type(None)))):
        raise UserError(f"{path}: 'base' must be a mapping with a string 'key' (and a string 'sha256', a mapping "
                        "'environment'); nothing restored")


def restore_wall_s(report_dir: Path) -> dict[str, Any]:
    """The published experiment record's ``wall_s`` (``{"<arm>/s<seed>": seconds, "total": ...}``;
    {} when it has none), so that an experiment restored on a fresh machine keeps each run's pace
    (:func:`mlmt_bench.experiment.time_to_go`) and republishes it; the caller keeps the entries it
    can use. A record that is not a JSON object is a one-line error."""
    from mlmt_bench.io import bounded_input

    record = bounded_input.read_json(Path(report_dir) / "experiment.json")
    if not isinstance(record, dict):
        raise UserError(f"--restore {report_dir}: experiment.json is not a JSON object; nothing restored")
    walls = record.get("wall_s")
    return walls if isinstance(walls, dict) else {}


def restore_runs(report_dir: Path, exp_dir: Path, experiment: str) -> list[str]:
    """The inverse of :func:`publish_runs` for one experiment: each finished run of
    ``experiment`` published in ``report_dir`` becomes a run directory of ``exp_dir`` again
    (manifest, resolved spec, decompressed logs; no checkpoints), so that ``run EXP --resume``
    keeps it and runs only what is missing. A run already in ``exp_dir`` is left as it is.
    Returns the names of the runs restored.

    The report is data from elsewhere: only plain directories and files are read (a symbolic
    link anywhere in ``runs/`` is a one-line error, never followed), each within the bounds the
    report reads them with, and :data:`MAX_RESTORE_BYTES` in all. Every input is read and checked
    before anything is written, so a refused report leaves ``exp_dir`` as it was. What the
    experiment then checks of a finished run (its resolved spec equals the arm's, its base's hash
    equals the experiment's) applies to these runs as to any other."""
    from mlmt_bench.io import bounded_input

    runs = check_restorable(report_dir)
    bounded_input.refuse_link(runs)
    planned: list[tuple[str, dict[str, bytes]]] = []
    total = 0
    for src in sorted(runs.iterdir()):
        bounded_input.refuse_link(src)
        if not src.name.isprintable() or src.name.startswith("."):  # it becomes a directory name here
            raise UserError(f"--restore {report_dir}: a run named {bounded_input.printable(src.name)!r}, refused "
                            "(control characters or a leading dot); nothing restored")
        if len(os.fsencode(_RESTORING + src.name)) > MAX_NAME_BYTES:  # restored under that name first
            raise UserError(f"--restore {report_dir}: a run named with {len(os.fsencode(src.name))} bytes, refused "
                            f"(at most {MAX_NAME_BYTES - len(_RESTORING)}); nothing restored")
        if not src.is_dir() or not os.path.lexists(src / "manifest.json"):
            continue
        bounded_input.check_plain_file(src / "manifest.json")
        manifest = bounded_input.read_json(src / "manifest.json")
        if not isinstance(manifest, dict) or manifest.get("experiment") != experiment \
                or manifest.get("status") != "completed":
            continue
        if (exp_dir / src.name).exists():
            continue
        _check_run_fields(src / "manifest.json", manifest)
        files: dict[str, bytes] = {}
        for name in (*LOGS, SAMPLES):
            packed = src / f"{name}.gz"
            if os.path.lexists(packed):
                files[name] = _read(packed)
        for name in AS_IS:
            files[name] = bounded_input.read_text(src / name, follow_links=False).encode("utf-8")
        total += sum(len(b) for b in files.values())
        if total > MAX_RESTORE_BYTES:
            raise UserError(f"--restore {report_dir}: its runs hold more than the limit of "
                            f"{bounded_input.human_bytes(MAX_RESTORE_BYTES)} (decompressed) in all; nothing restored")
        planned.append((src.name, files))
    restored = []
    for name, files in planned:
        tmp = exp_dir / f"{_RESTORING}{name}"
        shutil.rmtree(tmp, ignore_errors=True)  # what a killed restore left
        tmp.mkdir()
        for fname in (*LOGS, SAMPLES):
            if fname in files:
                atomic_write_bytes(tmp / fname, files[fname])
        for fname in reversed(AS_IS):  # the manifest last: a directory without one is no run
            atomic_write_bytes(tmp / fname, files[fname])
        tmp.rename(exp_dir / name)  # whole, or not at all: a half-restored run is never taken for a finished one
        restored.append(name)
    return restored

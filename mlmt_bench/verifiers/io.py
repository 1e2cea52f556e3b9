"""``mlmt-bench verify VERIFIER IN.jsonl --out OUT.jsonl``: score saved responses.

Each input line is a JSON object, either

* ``{"problem": {<Problem.to_json()>}, "response": "..."}``, or
* ``{"benchmark": "<name>", "id": "<problem id>", "response": "..."}``: the problem is looked
  up in every split of the benchmark built with its default options.

Each output line is the input object plus ``"verdict": Verdict.to_json()``, in input order.
The output is written to a temporary file next to OUT and renamed over it at the end, so a
failure never leaves a half-written OUT nor clobbers an existing one. OUT must be a regular
file or a new path (:func:`~mlmt_bench.tracking.check_output_file`): a device, FIFO, socket,
symlink, directory or anything under /proc or /sys is refused before anything is scored. Every input line is
validated before any scoring starts; a bad one is a one-line
:class:`~mlmt_bench.errors.UserError` naming ``file:line``, and so is a line longer than
``MAX_LINE_BYTES`` or nested deeper than ``MAX_DEPTH``, a ``response`` (or inline gold
``answer``) longer than ``MAX_SCORED_CHARS`` (scoring one costs ~1 s per MiB), and an input of more than
``MAX_JSONL_BYTES`` (decompressed), ``MAX_JSONL_LINES`` lines or ``MAX_JSONL_NODES`` JSON values
(:func:`mlmt_bench.io.bounded_input.jsonl_bounds`: every line is kept until the output is written,
so the whole input is bounded, not only each line); IN must be a regular file (a device or FIFO
is refused). IN is read by the one JSONL reader (:func:`~mlmt_bench.io.jsonl.iter_jsonl`), so it
may be gzip-compressed (a gzip bomb is read no further than the limit).
"""

from __future__ import annotations

import inspect
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from mlmt_bench.errors import UserError
from mlmt_bench.io.bounded_input import check_regular_file, echo, jsonl_bounds, resolved, shorten, unquoted
from mlmt_bench.io.jsonl import iter_jsonl
from mlmt_bench.tracking import atomic_open, check_output_file
from mlmt_bench.types import VERDICT_KINDS, Problem, Verdict
from mlmt_bench.verifiers.base import Verifier


def _accepts(cls: Any, name: str) -> bool:
    try:
        params = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def build_verifier(name: str, workers: int | None = None, options: dict[str, Any] | None = None) -> Verifier:
    """``registry.verifiers.get(name)(**options)``, adding ``workers`` when the class takes it;
    a constructor's TypeError / ValueError (an option it does not know) is a UserError."""
    from mlmt_bench import registry

    cls = registry.verifiers.get(name)
    kwargs = dict(options or {})
    if workers is not None and _accepts(cls, "workers"):
        kwargs["workers"] = workers
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise UserError(f"verifier {name}: {shorten(str(exc), 200)}") from None


class _ProblemIndex:
    """Problems of registered benchmarks by id (each benchmark loaded at most once)."""

    def __init__(self) -> None:
        self._by_benchmark: dict[str, dict[str, Problem]] = {}

    def get(self, benchmark: str, pid: str, where: str) -> Problem:
        if benchmark not in self._by_benchmark:
            from mlmt_bench import registry

            if benchmark not in registry.benchmarks:
                raise UserError(f"{where}: {registry.benchmarks.unknown_message(benchmark)}")
            bench = registry.benchmarks.get(benchmark)()
            index: dict[str, Problem] = {}
            for split in bench.splits:
                for p in bench.load(split):
                    index.setdefault(p.id, p)
            self._by_benchmark[benchmark] = index
        index = self._by_benchmark[benchmark]
        problem = index.get(pid)
        if problem is None:  # "11" for "mbpp/11", "5" for "gsm8k/5"
            problem = index.get(f"{benchmark}/{pid}")
        if problem is None:
            raise UserError(f"{where}: benchmark {benchmark!r} has no problem with id {echo(pid)}")
        return problem


def read_requests(in_path: Path) -> list[tuple[dict[str, Any], Problem, str]]:
    """(input object, problem, response) per non-blank line; UserError on a bad line."""
    try:
        check_regular_file(in_path)  # a device or FIFO is refused before it is opened
    except UserError as exc:
        raise UserError(f"cannot read input: {exc}") from None
    index = _ProblemIndex()
    out: list[tuple[dict[str, Any], Problem, str]] = []
    for lineno, obj in iter_jsonl(in_path, **jsonl_bounds()):
        where = f"{in_path}:{lineno}"
        if not isinstance(obj, dict):
            raise UserError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        if "verdict" in obj:
            raise UserError(f"{where}: line already has a 'verdict' (is this an output file?)")
        response = obj.get("response")
        if not isinstance(response, str):
            raise UserError(f"{where}: 'response' must be a string")
        _check_scored_size(response, "'response'", where)
        if "problem" in obj:
            pj = obj["problem"]
            if not isinstance(pj, dict) or "id" not in pj:
                raise UserError(f"{where}: 'problem' must be a Problem object with an 'id'")
            try:
                problem = Problem.from_json(pj)
            except (TypeError, ValueError, KeyError) as exc:
                raise UserError(f"{where}: bad 'problem' ({type(exc).__name__}: "
                                f"{shorten(unquoted(str(exc)))})") from None
            _check_scored_size(problem.answer or "", "'problem.answer'", where)
        elif "benchmark" in obj and "id" in obj:
            if not isinstance(obj["benchmark"], str):
                raise UserError(f"{where}: 'benchmark' must be a string")
            problem = index.get(obj["benchmark"], str(obj["id"]), where)
        else:
            raise UserError(f"{where}: needs either 'problem' or both 'benchmark' and 'id'")
        out.append((obj, problem, response))
    return out


def _check_scored_size(text: str, what: str, where: str) -> None:
    """UserError if ``text`` (a response or gold answer to score) is longer than ``MAX_SCORED_CHARS``."""
    from mlmt_bench.io import bounded_input

    limit = bounded_input.MAX_SCORED_CHARS
    if len(text) > limit:
        raise UserError(f"{where}: {what} has {len(text):,} characters, more than the limit of {limit:,}")


def _score_all(verifier: Verifier, problems: list[Problem], responses: list[str], workers: int | None) -> list[Verdict]:
    overrides_batch = type(verifier).score_batch is not Verifier.score_batch
    if overrides_batch or not workers or workers <= 1 or len(problems) <= 1:
        return list(verifier.score_batch(problems, responses))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="verify") as ex:
        return list(ex.map(verifier.score, problems, responses))


def verify_file(verifier_name: str, in_path: Path, out_path: Path, workers: int | None = None) -> dict[str, Any]:
    """Score every line of ``in_path`` with verifier ``verifier_name``; write ``out_path``.

    Returns ``{"n", "correct", "mean_reward", "kinds": {kind: count}}`` (every kind of
    :data:`~mlmt_bench.types.VERDICT_KINDS` listed, zeros included). ``workers`` is passed to
    the verifier when its constructor takes it; otherwise, for a verifier without its own
    ``score_batch``, it is the number of scoring threads.
    """
    in_path, out_path = Path(in_path), Path(out_path)
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise UserError(f"workers must be a positive integer, got {workers!r}")
    check_output_file(out_path, "--out")  # a regular file or a new path: never a device, FIFO or /proc
    if resolved(in_path) == resolved(out_path):  # a symlink loop: one line, not a RuntimeError
        raise UserError(f"{out_path}: output must differ from the input file")
    verifier = build_verifier(verifier_name, workers)
    requests = read_requests(in_path)

    problems = [p for _, p, _ in requests]
    responses = [r for _, _, r in requests]
    verdicts = _score_all(verifier, problems, responses, workers)
    if len(verdicts) != len(requests):
        raise RuntimeError(f"verifier {verifier_name!r} returned {len(verdicts)} verdicts for "
                           f"{len(requests)} responses")

    kinds = {k: 0 for k in VERDICT_KINDS}
    correct = 0
    total = 0.0
    with atomic_open(out_path, "--out") as f:  # checked again before the rename, after the scoring
        for (obj, _, _), v in zip(requests, verdicts):
            record = {**obj, "verdict": v.to_json()}
            try:
                f.write((json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))
            except UnicodeEncodeError:  # a lone surrogate (a "\ud800" escape in the input): kept as an escape
                f.write((json.dumps(record) + "\n").encode("utf-8"))
            kinds[v.kind] = kinds.get(v.kind, 0) + 1
            correct += int(bool(v.correct))
            total += float(v.reward)
    n = len(requests)
    return {
        "n": n,
        "correct": correct,
        "mean_reward": (total / n) if n else 0.0,
        "kinds": kinds,
    }

"""Example episodes for a report: problems on which the arms' final answers disagree, with the
episode (attempt, feedback, refinement) each arm wrote for them in ``samples.jsonl``.

An evaluation logs the episodes of its first ``eval.samples`` problems, and the final evaluation
those of every problem unless ``eval.final_samples`` is off (docs/run-directory.md); a run
written before that option existed may cover none of the disputed problems, and the report says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mlmt_bench.report.runs import RunRecord, log_file
from mlmt_bench.tracking import read_jsonl_lines


@dataclass
class Episode:
    """One arm's episode on a problem: the run's seed, whether its final answer (t2) was right,
    and the turns as samples.jsonl holds them (``kind``, ``policy``, ``text``, ``reward``,
    ``verdict``, ...)."""

    seed: int | None
    correct: bool
    turns: list[dict[str, Any]]


@dataclass
class Disagreement:
    """A problem the arms answered differently at the final evaluation.

    accuracy: per arm, the final t2 correctness averaged over its seeds (0..1).
    episodes: per arm with a logged episode of the problem, one of them (its first seed that has one).
    """

    problem_id: str
    accuracy: dict[str, float]
    episodes: dict[str, Episode] = field(default_factory=dict)


@dataclass
class Examples:
    """``shown``: up to ``limit`` disputed problems whose logged episodes include a right and a
    wrong final answer; ``n_disputed``: problems on which the arms' seed-averaged final t2
    differs; ``n_covered``: how many of those had such episodes."""

    shown: list[Disagreement]
    n_disputed: int
    n_covered: int


def final_sample_records(run: RunRecord) -> tuple[int | None, dict[str, dict[str, Any]]]:
    """(the step, ``{problem id: its samples.jsonl record}``) of the episodes a run logged at its
    final evaluation step (else at its last logged step; the last line per problem wins, as a
    resume may repeat a step); (None, {}) without samples.jsonl (or samples.jsonl.gz)."""
    path = log_file(run.path, "samples.jsonl")
    if not path.is_file():
        return None, {}
    rows = [rec for _, rec in read_jsonl_lines(path) if isinstance(rec, dict) and isinstance(rec.get("turns"), list)]
    steps = [rec["step"] for rec in rows if isinstance(rec.get("step"), int)]
    if not steps:
        return None, {}
    step = run.final_step if run.final_step in steps else max(steps)
    return step, {str(rec.get("problem_id")): rec for rec in rows if rec.get("step") == step}


def _final_samples(run: RunRecord) -> tuple[int | None, dict[str, list[dict[str, Any]]]]:
    """(the step, ``{problem id: turns}``) of the episodes :func:`samples_at_final_step` reads."""
    step, records = final_sample_records(run)
    return step, {pid: rec["turns"] for pid, rec in records.items()}


def samples_at_final_step(run: RunRecord) -> dict[str, list[dict[str, Any]]]:
    """``{problem id: turns}`` of the episodes ``run`` logged at its final evaluation step (the
    last line per problem wins, as a resume may repeat a step); empty without samples.jsonl
    (or samples.jsonl.gz)."""
    return _final_samples(run)[1]


_Pick = tuple[Path, int | None]  # the run directory whose logged episode an arm shows, and its step


def _disputes(loaded: dict[str, list[RunRecord]]
              ) -> tuple[list[Disagreement], dict[str, int], dict[tuple[str, str], _Pick]]:
    """The problems whose seed-averaged final acc@t2 differs between arms, each with the episode
    every arm shows for it; the problems' order of first appearance; and where each of those
    episodes was logged: ``{(problem id, arm): (run directory, step)}``."""
    per_arm: dict[str, dict[str, float]] = {}
    for arm, results in loaded.items():
        sums: dict[str, list[float]] = {}
        for r in results:
            for pid, ok in r.outcomes("t2").items():
                sums.setdefault(pid, []).append(ok)
        per_arm[arm] = {pid: float(np.mean(v)) for pid, v in sums.items()}
    order: dict[str, int] = {}
    for acc in per_arm.values():
        for pid in acc:
            order.setdefault(pid, len(order))
    disputed = []
    for pid in order:
        acc = {arm: a[pid] for arm, a in per_arm.items() if pid in a}
        if len(acc) > 1 and max(acc.values()) > min(acc.values()):
            disputed.append(Disagreement(pid, acc))
    used: dict[tuple[str, str], _Pick] = {}
    if not disputed:
        return disputed, order, used

    samples = {arm: [(r, _final_samples(r)) for r in results] for arm, results in loaded.items()}
    for d in disputed:
        for arm in d.accuracy:
            for r, (step, by_pid) in samples[arm]:
                if d.problem_id in by_pid and d.problem_id in r.problems:
                    d.episodes[arm] = Episode(r.seed, bool(r.problems[d.problem_id]["t2"]), by_pid[d.problem_id])
                    used[d.problem_id, arm] = (r.path, step)
                    break
    return disputed, order, used


def find_disagreements(loaded: dict[str, list[RunRecord]], limit: int = 3) -> Examples:
    """Problems whose final acc@t2 (seed-averaged, per arm) differs between arms, most disputed
    first (the largest gap between arms, then the most arms with an episode, then problem order)."""
    disputed, order, _ = _disputes(loaded)
    if not disputed:
        return Examples([], 0, 0)
    covered = [d for d in disputed if _covered(d)]
    covered.sort(key=lambda d: (-(max(d.accuracy.values()) - min(d.accuracy.values())), -len(d.episodes),
                                order[d.problem_id]))
    return Examples(covered[:limit], len(disputed), len(covered))


def _covered(d: Disagreement) -> bool:
    """The problem's episodes include a right and a wrong final answer."""
    return len({e.correct for e in d.episodes.values()}) == 2


def episodes_used(loaded: dict[str, list[RunRecord]]) -> dict[Path, tuple[int | None, set[str]]]:
    """The logged episodes that decide what :func:`find_disagreements` returns: every arm's episode
    of each disputed problem it covers (they decide the count, the order and what is shown), as
    ``{run directory: (the step of its samples read, problem ids)}``. Samples holding only these
    give the same :class:`Examples` (a problem not covered stays so without its episodes)."""
    disputed, _, picks = _disputes(loaded)
    out: dict[Path, tuple[int | None, set[str]]] = {}
    for d in disputed:
        if _covered(d):
            for arm in d.episodes:
                path, step = picks[d.problem_id, arm]
                out.setdefault(path, (step, set()))[1].add(d.problem_id)
    return out

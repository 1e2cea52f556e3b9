"""Example episodes for a report: problems on which the arms' final answers disagree, with the
episode (attempt, feedback, refinement) each arm wrote for them in ``samples.jsonl``.

An evaluation logs the episodes of its first ``eval.samples`` problems, and the final evaluation
those of every problem unless ``eval.final_samples`` is off (docs/run-directory.md); a run
written before that option existed may cover none of the disputed problems, and the report says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mlmt_bench.report.runs import RunRecord
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


def samples_at_final_step(run: RunRecord) -> dict[str, list[dict[str, Any]]]:
    """``{problem id: turns}`` of the episodes ``run`` logged at its final evaluation step (the
    last line per problem wins, as a resume may repeat a step); empty without samples.jsonl."""
    path = run.path / "samples.jsonl"
    if not path.is_file():
        return {}
    rows = [rec for _, rec in read_jsonl_lines(path) if isinstance(rec, dict) and isinstance(rec.get("turns"), list)]
    steps = [rec["step"] for rec in rows if isinstance(rec.get("step"), int)]
    if not steps:
        return {}
    step = run.final_step if run.final_step in steps else max(steps)
    return {str(rec.get("problem_id")): rec["turns"] for rec in rows if rec.get("step") == step}


def find_disagreements(loaded: dict[str, list[RunRecord]], limit: int = 3) -> Examples:
    """Problems whose final acc@t2 (seed-averaged, per arm) differs between arms, most disputed
    first (the largest gap between arms, then the most arms with an episode, then problem order)."""
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
    if not disputed:
        return Examples([], 0, 0)

    samples = {arm: [(r, samples_at_final_step(r)) for r in results] for arm, results in loaded.items()}
    covered = []
    for d in disputed:
        for arm in d.accuracy:
            for r, by_pid in samples[arm]:
                if d.problem_id in by_pid and d.problem_id in r.problems:
                    d.episodes[arm] = Episode(r.seed, bool(r.problems[d.problem_id]["t2"]), by_pid[d.problem_id])
                    break
        if len({e.correct for e in d.episodes.values()}) == 2:
            covered.append(d)
    covered.sort(key=lambda d: (-(max(d.accuracy.values()) - min(d.accuracy.values())), -len(d.episodes),
                                order[d.problem_id]))
    return Examples(covered[:limit], len(disputed), len(covered))

"""Every problem of the final evaluation with what each arm did on it, for the problem browser
(problems.html, :mod:`mlmt_bench.report.browser_page`).

Per problem: its statement and gold answer, and per arm the final outcome of each of its runs
(attempt t1 and final answer t2, as a transition ``i->c``, ``c->i``, ``i->i`` or ``c->c``; i:
incorrect, c: correct) and one logged episode (attempt, feedback, refinement, with their
verdicts) of its first run that logged one at its final evaluation. A row derived from another
arm's runs (``<arm> + base critic``, ...) has outcomes but no episode: its runs' samples are the
arm's own evaluation, not the derived one.

The statement and gold come from the runs' samples.jsonl (``problem``, ``gold``); runs written
before samples held them get them from their benchmark when it declares its problems
``generated`` (rebuilt from the spec's options, offline); else they are unknown (None).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlmt_bench.errors import UserError
from mlmt_bench.report.episodes import final_sample_records
from mlmt_bench.report.runs import RunRecord, own_arms

#: the transitions, in the order a filter lists them: (key, label)
TRANSITIONS = (("i->c", "i→c (fixed)"), ("c->i", "c→i (broken)"), ("i->i", "i→i (wrong twice)"),
               ("c->c", "c→c (right twice)"))


#: a run directory may be anyone's: a benchmark is not rebuilt from options above this (a crafted
#: ``n_test: 10**9`` would have the report generate a billion problems; 10**5 take seconds)
MAX_REBUILT_OPTION = 100_000


def transition(t1: bool, t2: bool) -> str:
    """``i->c`` and the like: the attempt's and the final answer's correctness."""
    return f"{'c' if t1 else 'i'}->{'c' if t2 else 'i'}"


@dataclass
class ArmOutcome:
    """One arm on one problem: ``runs``: (seed, t1, t2) of each of its runs that evaluated it;
    ``episode``: the turns of one logged episode ([] when none), of the run of seed ``episode_seed``."""

    runs: list[tuple[int | None, bool, bool]] = field(default_factory=list)
    episode: list[dict[str, Any]] = field(default_factory=list)
    episode_seed: int | None = None
    #: where the episode was logged: (run directory, step of its samples), None without one
    episode_from: tuple[Path, int | None] | None = None

    @property
    def transitions(self) -> list[str]:
        return [transition(t1, t2) for _, t1, t2 in self.runs]


@dataclass
class ProblemRow:
    """A problem of the final evaluation: its id, statement and gold answer (None: unknown), and
    per arm (in the comparison's order) what it did."""

    problem_id: str
    text: str | None
    gold: str | None
    arms: dict[str, ArmOutcome]


def problem_rows(loaded: dict[str, list[RunRecord]]) -> list[ProblemRow]:
    """Every problem that some run evaluated at its final evaluation, in the order the runs list
    them (the first run's order, then each new one as it appears)."""
    own = own_arms(loaded)
    order: dict[str, None] = {}
    outcomes: dict[str, dict[str, ArmOutcome]] = {}
    texts: dict[str, tuple[Any, Any]] = {}
    for arm, results in loaded.items():
        for r in results:
            step, samples = final_sample_records(r) if arm in own else (None, {})
            for pid, row in r.problems.items():
                order.setdefault(pid, None)
                out = outcomes.setdefault(pid, {}).setdefault(arm, ArmOutcome())
                out.runs.append((r.seed, bool(row["t1"]), bool(row["t2"])))
                rec = samples.get(pid)
                if rec is None:
                    continue
                if out.episode_from is None:
                    out.episode, out.episode_seed = [t for t in rec["turns"] if isinstance(t, dict)], r.seed
                    out.episode_from = (r.path, step)
                if pid not in texts and rec.get("problem") is not None:
                    texts[pid] = (rec.get("problem"), rec.get("gold"))
    missing = [pid for pid in order if pid not in texts]
    if missing:
        texts.update(_generated(loaded, set(missing)))
    return [ProblemRow(pid, *_text(texts.get(pid)), {a: outcomes[pid][a] for a in loaded if a in outcomes[pid]})
            for pid in order]


def episodes_shown(loaded: dict[str, list[RunRecord]]) -> dict[Path, tuple[int | None, set[str]]]:
    """The logged episodes the problem browser shows, as ``{run directory: (the step of its samples
    read, problem ids)}`` (what a published report keeps: :mod:`mlmt_bench.report.publish`)."""
    out: dict[Path, tuple[int | None, set[str]]] = {}
    for row in problem_rows(loaded):
        for arm in row.arms.values():
            if arm.episode_from is not None:
                out.setdefault(arm.episode_from[0], (arm.episode_from[1], set()))[1].add(row.problem_id)
    return out


def _text(pair: tuple[Any, Any] | None) -> tuple[str | None, str | None]:
    if pair is None:
        return None, None
    return tuple(None if v is None else str(v) for v in pair)  # type: ignore[return-value]


def _generated(loaded: dict[str, list[RunRecord]], wanted: set[str]) -> dict[str, tuple[str, str | None]]:
    """Statements and gold answers of ``wanted`` problems from the runs' benchmarks that declare
    them ``generated`` (each distinct benchmark, split and options loaded once; none with a number
    among its options above ``MAX_REBUILT_OPTION``)."""
    from mlmt_bench import registry

    out: dict[str, tuple[str, str | None]] = {}
    seen: set[str] = set()
    for results in loaded.values():
        for r in results:
            bench = r.spec.get("benchmark")
            if not isinstance(bench, dict) or not isinstance(bench.get("name"), str):
                continue
            key = json.dumps([bench.get(k) for k in ("name", "path", "options", "eval_split")], sort_keys=True,
                             default=str)
            if key in seen or bench["name"] not in registry.benchmarks:
                continue
            seen.add(key)
            cls = registry.benchmarks.get(bench["name"])
            options = bench.get("options")
            options = options if isinstance(options, dict) else {}
            if not cls.generated or any(
                    isinstance(v, (int, float)) and abs(v) > MAX_REBUILT_OPTION for v in options.values()):
                continue
            try:
                problems = cls(path=bench.get("path"), **options).load(str(bench.get("eval_split") or "test"))
            except (UserError, TypeError, ValueError):  # options this version does not know
                continue
            out.update({p.id: (p.prompt, p.answer) for p in problems if p.id in wanted and p.id not in out})
    return out

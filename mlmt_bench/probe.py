"""The feedback perturbation probe (METHOD v4, "Copy-channel controls"; issue 31).

On identical attempts, what does the refinement read: the feedback, or a number in it? The
probe generates each problem's first attempt once (the solver), the critic's own feedback on it
once, then refines the same attempt after each row of feedback
(:data:`~mlmt_bench.benchmarks.perturbations.PROBE_ROWS`: the critic's own, its edits the
benchmark declares with ``Benchmark.feedback_perturbations``, g∅) and scores every refinement::

    problems ──solver──▶ z (acc@t1) ──critic──▶ g ──benchmark──▶ {row: g'} ──(redact)──▶ solver(x, z, g') ──▶ acc@t2

Per row: ``acc@t2`` (share of refinements correct, over the problems the row applies to),
``delta`` (acc@t2 − acc@t1 on those problems), ``copy_rate`` (share of refinements whose final
answer, as the verifier reads it, is one of the values the feedback the refiner saw states:
``Benchmark.stated_values``; None where the benchmark reads none), ``copy_last_rate`` (the same
with the last value it states), ``edited`` (share of the row's
feedbacks that differ from the critic's own) and, with ``redact``, ``redacted_share`` (mean share
of the feedback's characters the benchmark's redaction rule removed). A refine gain that an edit
moves is an answer channel.

``redact``: every row's feedback passes through ``Benchmark.redact_feedback`` before the refiner
sees it (METHOD v4 ``feedback.redact``), so the table says what redaction leaves of the channel.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mlmt_bench.benchmarks.base import Benchmark
from mlmt_bench.benchmarks.perturbations import PROBE_ROWS, states_any
from mlmt_bench.rollout.episodes import Actors, Sampling, _generate, attempt_prompt, critique, refine_prompt
from mlmt_bench.types import Problem

#: What each row gives the refiner (the Markdown table's first column).
ROW_LABELS: dict[str, str] = {
    "own": "the critic's own",
    "values_removed": "own, every supplied value replaced by the attempt's own",
    "last_shifted": "own, only the last stated value + 1",
    "approve_gold": "approve everything, with the gold values",
    "approve_own": "approve everything, with the attempt's own values",
    "oracle": "the oracle's feedback",
    "null": "g∅ (the templates' null feedback)",
}


def probe_feedback(benchmark: Benchmark, actors: Actors, problems: Sequence[Problem], sampling: Sampling, *,
                   redact: bool = False, bar: Any = None, chunk: int = 256,
                   oracle: Callable[[Problem, str], str] | None = None) -> dict[str, Any]:
    """The probe on ``problems`` (see the module docstring). ``actors``: the solver (attempts and
    refinements, at ``sampling.temperature``), the critic (at ``sampling.critic_temperature``),
    the backend, the templates (``null_feedback`` is the ``null`` row) and the verifier. ``bar``:
    a rich-Progress-like object told the generated turns (``add_task`` / ``update``), or None.
    The refinements of every row go to the backend together, ``chunk`` prompts a call. ``oracle``:
    the ``oracle`` row's feedback on an attempt, in the form the critic was taught to write (a
    worked warm start's: ``OracleBenchmark.worked_feedback``, which the refiner then reads
    redacted); default the benchmark's own (:meth:`Benchmark.feedback_perturbations`).

    Returns a JSON-able dict: ``n``, ``redact``, ``acc@t1``, ``rows`` (row -> :func:`row_metrics`'
    ``{"n", "acc@t2", "acc@t1", "delta", "copy_rate", "copy_last_rate", "edited",
    "redacted_share"}``, or ``{"n": 0,
    "applicable": False}`` for a row the benchmark declares for no problem; rates in [0, 1]),
    ``per_problem`` (``problem_id``, ``t1`` and each applicable row's ``t2``), ``gen_tokens``
    and ``seconds`` (wall time).
    """
    if actors.critic is None:
        raise ValueError("the feedback probe needs a critic")
    start = time.perf_counter()
    problems = list(problems)
    n = len(problems)
    solver, tpl = actors.solver, actors.templates
    task = bar.add_task("feedback probe", total=n * (2 + len(PROBE_ROWS))) if bar is not None else None

    def advance(what: str) -> None:
        if bar is not None:
            bar.update(task, advance=n, description=f"feedback probe: {what}")

    a_prompts = [attempt_prompt(solver.tokenizer, tpl, p) for p in problems]
    attempts = _generate(solver, a_prompts, sampling, sampling.max_new_tokens, actors.backend)
    texts = [g.text for g in attempts]
    t1_verdicts = actors.verifier.score_batch(problems, texts)
    t1 = [bool(v.correct) for v in t1_verdicts]
    gen_tokens = sum(len(g.ids) for g in attempts)
    advance("attempts")
    own = critique(actors.critic, actors.backend, tpl, problems, texts, sampling)
    advance("the critic's feedback")

    feedbacks: dict[str, list[str | None]] = {row: [] for row in PROBE_ROWS}
    for p, z, v, g in zip(problems, texts, t1_verdicts, own):
        edits = benchmark.feedback_perturbations(p, z, g, answer=v.extracted)
        if oracle is not None and "oracle" in edits:
            edits["oracle"] = oracle(p, z)
        for row in PROBE_ROWS:
            feedbacks[row].append(g if row == "own" else tpl.null_feedback if row == "null" else edits.get(row))

    jobs: list[tuple[str, int, str]] = []  # (row, problem, the feedback the refiner sees)
    shares: dict[str, list[float]] = {row: [] for row in PROBE_ROWS}
    for row in PROBE_ROWS:
        for i, text in enumerate(feedbacks[row]):
            if text is None:
                continue
            if redact:
                red = benchmark.redact_feedback(problems[i], texts[i], text)
                text = red.text
                shares[row].append(red.share)
            jobs.append((row, i, text))
    prompts = [refine_prompt(solver.tokenizer, tpl, problems[i], a_prompts[i], attempts[i].ids, texts[i], text)
               for _, i, text in jobs]
    if bar is not None:
        bar.update(task, total=2 * n + len(prompts))
    gens = []
    for at in range(0, len(prompts), chunk):  # one batch of refinements for every row (a bar that moves)
        gens += _generate(solver, prompts[at: at + chunk], sampling, sampling.max_new_tokens, actors.backend)
        if bar is not None:
            bar.update(task, advance=len(prompts[at: at + chunk]), description="feedback probe: refinements")
    gen_tokens += sum(len(g.ids) for g in gens)
    verdicts = actors.verifier.score_batch([problems[i] for _, i, _ in jobs], [g.text for g in gens])

    rows: dict[str, dict[str, Any]] = {}
    t2_of: dict[str, list[bool | None]] = {}
    for row in PROBE_ROWS:
        mine = [(i, text, v) for (r, i, text), v in zip(jobs, verdicts) if r == row]
        if not mine:
            rows[row] = {"n": 0, "applicable": False}
            continue
        t2 = [bool(v.correct) for _, _, v in mine]
        stated = [(benchmark.stated_values(text), v.extracted) for _, text, v in mine]
        rows[row] = row_metrics(t2, [t1[i] for i, _, _ in mine],
                                [None if vals is None else states_any(answer, vals) for vals, answer in stated],
                                [None if vals is None else states_any(answer, vals[-1:]) for vals, answer in stated],
                                [feedbacks[row][i] != own[i] for i, _, _ in mine], shares[row] if redact else None)
        column: list[bool | None] = [None] * n
        for (i, _, _), ok in zip(mine, t2):
            column[i] = ok
        t2_of[row] = column
    per_problem = [{"problem_id": p.id, "t1": t1[i], **{row: col[i] for row, col in t2_of.items()}}
                   for i, p in enumerate(problems)]
    return {"n": n, "redact": redact, "acc@t1": _mean(t1), "rows": rows, "per_problem": per_problem,
            "gen_tokens": gen_tokens, "seconds": round(time.perf_counter() - start, 2)}


def row_metrics(t2: Sequence[bool], t1: Sequence[bool], copied: Sequence[bool | None],
                copied_last: Sequence[bool | None], edited: Sequence[bool],
                shares: Sequence[float] | None) -> dict[str, Any]:
    """One row of the table from its problems' outcomes (all sequences aligned, one entry per
    problem the row applies to): ``acc@t2`` = mean(t2), ``acc@t1`` = mean(t1), ``delta`` their
    difference, ``copy_rate`` = mean(copied), ``copy_last_rate`` = mean(copied_last) (each None if
    any entry is None: the benchmark reads no values), ``edited`` = mean(edited),
    ``redacted_share`` = mean(shares) (None without redaction). Rates in [0, 1]. Pure."""
    acc2, acc1 = _mean(t2), _mean(t1)
    return {"n": len(t2), "acc@t2": acc2, "acc@t1": acc1, "delta": acc2 - acc1, "copy_rate": _rate(copied),
            "copy_last_rate": _rate(copied_last), "edited": _mean(edited),
            "redacted_share": None if shares is None else _mean(shares)}


def _rate(flags: Sequence[bool | None]) -> float | None:
    return None if any(f is None for f in flags) else _mean([bool(f) for f in flags])


def _mean(xs: Sequence[float] | Sequence[bool]) -> float:
    return sum(float(x) for x in xs) / len(xs) if xs else 0.0


def table_rows(result: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The probe's table: header and one row of cells per feedback row (percentages; ``N/A``
    for a row that does not apply, ``–`` for a rate the benchmark cannot read)."""
    redact = bool(result.get("redact"))
    header = ["feedback given to the refiner", "n", "acc@t2", "Δ vs acc@t1", "copy_rate", "copy_last", "edited"]
    header += ["redacted"] if redact else []
    out = []
    for row in PROBE_ROWS:
        r = result["rows"].get(row) or {"n": 0, "applicable": False}
        label = f"{row}: {ROW_LABELS[row]}"
        if r.get("applicable") is False:
            out.append([label, "0"] + ["N/A"] * (len(header) - 2))
            continue
        cells = [label, str(r["n"]), _pct(r["acc@t2"]), f"{100 * r['delta']:+.1f}", _pct(r["copy_rate"]),
                 _pct(r["copy_last_rate"]), _pct(r["edited"])]
        out.append(cells + ([_pct(r["redacted_share"])] if redact else []))
    return header, out


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def markdown(result: dict[str, Any], title: str = "Feedback perturbation probe") -> str:
    """The probe as a Markdown section: what was run, then the table."""
    header, rows = table_rows(result)
    what = [f"{result['n']} problems" + (f" ({result['split']} split)" if result.get("split") else ""),
            f"acc@t1 {_pct(result['acc@t1'])}", "feedback redacted" if result.get("redact") else "feedback as written"]
    if result.get("command"):
        what.append(f"`{result['command']}`")
    lines = [f"# {title}", "", "; ".join(what) + ".", "",
             "Identical attempts; only the feedback the refiner sees differs between rows. `copy_rate`: share of "
             "refinements whose final answer is a value stated in that feedback (`copy_last`: its last stated "
             "value). `edited`: share of feedbacks the row changed." + (" `redacted`: share of the feedback's "
             "characters the redaction rule removed." if result.get("redact") else ""), "",
             "| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_probe(result: dict[str, Any], out: Path) -> list[Path]:
    """``probe.json`` (the whole result) and ``probe.md`` (:func:`markdown`) in ``out``; returns their paths."""
    from mlmt_bench.tracking import atomic_write_text

    out.mkdir(parents=True, exist_ok=True)
    files = [out / "probe.json", out / "probe.md"]
    atomic_write_text(files[0], json.dumps(result, indent=2) + "\n")
    atomic_write_text(files[1], markdown(result))
    return files

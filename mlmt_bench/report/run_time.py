"""How long a run took, read from its ``metrics.jsonl``: the run-time figures a report shows beside
the training cost (wall time per run, of it in evaluations, seconds per training step, generated
and trained tokens per second).

Every ``train`` and ``eval`` record carries ``wall_s``: seconds since the run's training began,
counted on across resumes (a resumed run starts from its checkpoint's count and its log is cut back
to that step, so work lost to a crash is not counted, nor is loading the models). A record's
duration is its ``wall_s`` minus that of the record logged before it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlmt_bench.report.numbers import is_num

#: the keys :func:`run_time` returns
RUN_TIME_KEYS = ("eval_s", "train_step_s", "train_gen_tok_per_s", "train_tok_per_s")


def run_time(records: Sequence[dict[str, Any]], last_step: int | None = None) -> dict[str, float]:
    """Run-time figures of a run's ``train`` and ``eval`` records (in the order they were logged),
    those after ``last_step`` left out (None: all). Keys, each only where the records allow it:

    - ``eval_s``: seconds spent in evaluations (each eval record's duration; the first record's
      duration is its ``wall_s``);
    - ``train_step_s``: mean duration of a training step (a train record's duration: rollout,
      reward, update and logging; an evaluation is its own record);
    - ``train_gen_tok_per_s``: generated tokens per second of training rollout, Σ Δgen_tokens /
      Σ (Δgen_tokens / gen_tok_per_s) over the steps (each step's ``gen_tok_per_s`` is its generated
      tokens over its rollout's seconds);
    - ``train_tok_per_s``: trained tokens per second of update, Σ Δtrained_tokens / Σ
      (Δtrained_tokens / train_tok_per_s) over the steps that trained.

    A record without a numeric ``wall_s`` has no duration and the next one's is counted from the record
    before it (runs from before it was logged give no durations); a duration below 0 (a log not cut
    back on resume) is skipped."""
    prev_wall = 0.0
    prev_gen = prev_trained = 0.0
    eval_s: list[float] = []
    step_s: list[float] = []
    gen = rollout_s = trained = update_s = 0.0
    for rec in records:
        kind, step, wall = rec.get("kind"), rec.get("step"), rec.get("wall_s")
        if kind not in ("train", "eval") or (last_step is not None and is_num(step) and step > last_step):
            continue
        took = None
        if is_num(wall):
            took, prev_wall = float(wall) - prev_wall, float(wall)
        if kind == "eval":
            if took is not None and took >= 0:
                eval_s.append(took)
            continue
        if took is not None and took >= 0:
            step_s.append(took)
        d_gen = _delta(rec.get("gen_tokens"), prev_gen)
        d_trained = _delta(rec.get("trained_tokens"), prev_trained)
        prev_gen = float(rec["gen_tokens"]) if is_num(rec.get("gen_tokens")) else prev_gen
        prev_trained = float(rec["trained_tokens"]) if is_num(rec.get("trained_tokens")) else prev_trained
        if d_gen and _positive(rec.get("gen_tok_per_s")):
            gen, rollout_s = gen + d_gen, rollout_s + d_gen / float(rec["gen_tok_per_s"])
        if d_trained and _positive(rec.get("train_tok_per_s")):
            trained, update_s = trained + d_trained, update_s + d_trained / float(rec["train_tok_per_s"])
    out: dict[str, float] = {}
    if eval_s:
        out["eval_s"] = sum(eval_s)
    if step_s:
        out["train_step_s"] = sum(step_s) / len(step_s)
    if rollout_s > 0:
        out["train_gen_tok_per_s"] = gen / rollout_s
    if update_s > 0:
        out["train_tok_per_s"] = trained / update_s
    return out


def _delta(value: Any, prev: float) -> float:
    """How much a cumulative counter grew since ``prev`` (0 when it is missing or went back)."""
    return max(float(value) - prev, 0.0) if is_num(value) else 0.0


def _positive(value: Any) -> bool:
    return is_num(value) and value > 0

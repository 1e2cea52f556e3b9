"""The warm start's conversations for a pretrained chat model, rendered exactly as a run renders them.

Every role of every arm starts from one checkpoint (METHOD v4); when the pretrained model lacks a
skill a role needs (SmolLM2-135M writes no verdict line and is hurt by any feedback, issue 33),
that checkpoint is the pretrained model after one supervised warm start on the union of the
skills: solve (x -> gold solution), critique (x, z -> the oracle's answer-free feedback, ending
with the verdict line), refine (x, z, g -> the gold solution, its flagged step worked out with
``refine: worked``, or z again when g approves it) and resolve (x, z, g∅ -> the gold solution).
The oracle (:class:`OracleBenchmark`) writes every target, so the data never depends on which arm
runs.

An example's prompt ids come from the same functions the rollout builds its contexts with
(:func:`mlmt_bench.rollout.episodes.attempt_prompt`, ``feedback_prompt``, ``refine_prompt``:
the chat template, token-in/token-out), so the warm start trains the very contexts RL will show;
its target is the text's ids and the end-of-turn token, the only positions with loss weight.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from mlmt_bench.benchmarks.base import OracleBenchmark, verdict_line
from mlmt_bench.types import Problem, PromptTemplates

Kind = Literal["solve", "critique", "refine", "resolve"]
KINDS: tuple[Kind, ...] = ("solve", "critique", "refine", "resolve")
Source = Literal["own", "gold", "slip"]
SOURCES: tuple[Source, ...] = ("own", "gold", "slip")

#: token ids and ``[start, end)`` spans of trained positions with loss weights (``warmstart/sft.py``)
Example = tuple[list[int], list[tuple[int, int, float]]]


@dataclass(frozen=True)
class Conversation:
    """One warm-start conversation: the problem, the attempt ``z`` it is about (its ``source``;
    empty for ``solve``), the feedback ``g`` (``refine``: the oracle's, ``resolve``: g∅) and the
    ``target`` the model learns to write."""

    kind: Kind
    problem: Problem
    attempt: str
    source: Source | None
    feedback: str
    target: str


def attempt_for(bench: OracleBenchmark, problem: Problem, source: Source, own: Sequence[str],
                rng: random.Random) -> str:
    """An attempt at ``problem``: one of the model's ``own`` sampled attempts (drawn uniformly), the
    gold solution, or the gold solution with one slip (:meth:`OracleBenchmark.inject_errors`). A
    problem with no own attempt takes a slip."""
    if source == "own" and own:
        return own[rng.randrange(len(own))]
    gold = bench.solution(problem)
    return gold if source == "gold" else bench.inject_errors(gold, rng)


def conversation(bench: OracleBenchmark, templates: PromptTemplates, kind: Kind, problem: Problem,
                 source: Source, own: Sequence[str], rng: random.Random, *, worked: bool = False,
                 worked_refine: bool = False) -> Conversation:
    """The ``kind`` conversation about ``problem`` with an attempt from ``source`` (unused by solve).
    ``worked``: the critique target is the oracle's feedback with its working
    (:meth:`OracleBenchmark.worked_feedback`), and the refiner reads it redacted, as a run with
    ``feedback.redact`` shows it. ``worked_refine``: after feedback that flags an error, the
    refine target works the flagged step out (:meth:`OracleBenchmark.worked_refinement`) instead
    of writing the gold solution bare: redacted, the feedback no longer holds the right value, so
    a refiner that only rewrites the solution repeats its own arithmetic."""
    gold = bench.solution(problem)
    if kind == "solve":
        return Conversation(kind, problem, "", None, "", gold)
    z = attempt_for(bench, problem, source, own, rng)
    if kind == "resolve":
        return Conversation(kind, problem, z, source, templates.null_feedback, gold)
    written = bench.worked_feedback(problem, z) if worked else bench.oracle_feedback(problem, z)
    if kind == "critique":
        return Conversation(kind, problem, z, source, "", written)
    g = bench.redact_feedback(problem, z, written).text if worked else written
    fixed = bench.worked_refinement(problem, z) if worked_refine else gold
    return Conversation(kind, problem, z, source, g, z if verdict_line(g) else fixed)


def token_example(tokenizer: Any, templates: PromptTemplates, c: Conversation) -> Example:
    """``c`` as token ids: the context the rollout would build for its turn, then the target's ids
    and the end-of-turn token, trained with weight 1 (every other position 0)."""
    from mlmt_bench.rollout.episodes import attempt_prompt, feedback_prompt, refine_prompt

    if c.kind == "critique":
        prompt = feedback_prompt(tokenizer, templates, c.problem, c.attempt)
    else:
        prompt = attempt_prompt(tokenizer, templates, c.problem)
        if c.kind in ("refine", "resolve"):
            z_ids = encode(tokenizer, c.attempt)
            prompt = refine_prompt(tokenizer, templates, c.problem, prompt, z_ids, c.attempt, c.feedback)
    target = encode(tokenizer, c.target) + [tokenizer.eos_token_id]
    return prompt + target, [(len(prompt), len(prompt) + len(target), 1.0)]


def encode(tokenizer: Any, text: str) -> list[int]:
    """``text``'s ids with nothing added (what a generated turn with that text holds)."""
    return list(tokenizer.encode(text, add_special_tokens=False))


def draw(weights: dict[str, float], rng: random.Random) -> str:
    """A key of ``weights`` drawn in proportion to its weight (positive total)."""
    keys = [k for k, w in weights.items() if w > 0]
    return rng.choices(keys, weights=[weights[k] for k in keys])[0]

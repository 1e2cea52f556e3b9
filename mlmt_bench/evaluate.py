"""Held-out evaluation with the protocol and metrics of METHOD.md.

One episode per problem (greedy by default): attempt z, feedback g, refinement ŷ. Refine-all
accuracy is the headline (``acc@t2``); oracle-gated accuracy is reported separately. With
feedback metrics on, every attempt is also refined with g∅, paired with the real feedback on
the same (x, z): that gives ``feedback_effect`` and ``feedback_sensitivity``. With a model
critic, the critic diagnostics of METHOD v3 (:mod:`mlmt_bench.metrics.critic`) judge its
feedback on the current solver's attempts against the verifier (and the oracle, when the
benchmark has one).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mlmt_bench.algorithms.update import TrainItem
from mlmt_bench.metrics import feedback as fbm
from mlmt_bench.metrics.critic import DIAGNOSTICS, critic_diagnostics
from mlmt_bench.metrics.turns import oracle_gated_accuracy, turn_metrics
from mlmt_bench.models.forward import sequence_logprob_sums
from mlmt_bench.rollout.episodes import Actors, Program, Rollout, Sampling, refine_prompt, rollout
from mlmt_bench.types import Problem


@dataclass
class EvalResult:
    metrics: dict[str, Any]
    per_problem: list[dict[str, Any]]
    samples: list[dict[str, Any]] = field(default_factory=list)


def evaluate(program: Program, actors: Actors, problems: Sequence[Problem], sampling: Sampling, *,
             feedback_metrics: bool = True, n_samples: int = 8,
             protocols: Sequence[str] = ("refine_all", "oracle_gated"),
             micro_batch_tokens: int | None = None) -> EvalResult:
    ro = rollout(program, actors, problems, sampling)
    attempts = ro.of_kind("attempt")
    t1 = [bool(ro.turns[i].scored_verdict.correct) for i in attempts]
    m: dict[str, Any] = {"n": len(problems)}
    if program.feedback == "none":
        t2 = list(t1)
        m.update({"acc@t1": sum(t1) / len(t1), "acc@t2": sum(t1) / len(t1)})
    else:
        refines = ro.of_kind("refine")
        t2 = [bool(ro.turns[i].scored_verdict.correct) for i in refines]
        m.update(turn_metrics(t1, t2))
        if "oracle_gated" in protocols:
            m["acc_oracle_gated"] = oracle_gated_accuracy(t1, t2)
    t2_null: Sequence[bool | None] = [None] * len(problems)
    if program.feedback in ("critic", "oracle") and feedback_metrics:
        t2_null = _feedback_metrics(ro, actors, sampling, m, micro_batch_tokens)
    elif program.feedback == "null":  # the refinement *is* the one after g∅ (self_correct, null_feedback)
        t2_null = list(t2)
        m["acc@t2_null"] = m["acc@t2"]
    if program.feedback == "critic" and actors.verdict is not None:
        m.update(diagnose_critic(ro, actors))
    m["gen_tokens_eval"] = sum(len(t.ids) for t in ro.turns)
    per_problem = [{"problem_id": p.id, "t1": a, "t2": b, "t2_null": c}
                   for p, a, b, c in zip(problems, t1, t2, t2_null)]
    return EvalResult(m, per_problem, _samples(ro, n_samples))


def diagnose_critic(ro: Rollout, actors: Actors) -> dict[str, Any]:
    """The critic diagnostics of a rollout's feedbacks on their attempts (``exact_correction_rate``
    only where the benchmark has an oracle critic)."""
    assert actors.verdict is not None
    feedbacks = ro.of_kind("feedback")
    attempts = [ro.parent_of(f) for f in feedbacks]
    says = [actors.verdict(ro.turns[f].text) for f in feedbacks]
    correct = [bool(a.verdict.correct) if a.verdict else False for a in attempts]
    exact = None
    if actors.oracle is not None:
        exact = [ro.turns[f].text.strip() == actors.oracle(ro.problems[a.problem], a.text).strip()
                 for f, a in zip(feedbacks, attempts)]
    d = critic_diagnostics(says, correct, exact)
    return {k: d[k] for k in DIAGNOSTICS if d[k] is not None}


def _feedback_metrics(ro: Rollout, actors: Actors, sampling: Sampling,
                      m: dict[str, Any], micro_batch_tokens: int | None) -> list[bool]:
    solver, tpl = actors.solver, actors.templates
    feedbacks, refines = ro.of_kind("feedback"), ro.of_kind("refine")
    null_prompts, with_g = [], []
    for fi in feedbacks:
        a = ro.parent_of(fi)
        prob = ro.problems[a.problem]
        null_prompts.append(refine_prompt(solver.tokenizer, tpl, prob, a.prompt_ids, a.ids, a.text, tpl.null_feedback))
    gens = actors.backend.generate(solver.model, solver.tokenizer, null_prompts, max_new_tokens=sampling.max_new_tokens,
                                   temperature=sampling.temperature, top_p=sampling.top_p, stop=sampling.stop)
    probs = [ro.problems[ro.turns[fi].problem] for fi in feedbacks]
    verdicts = actors.verifier.score_batch(probs, [g.text for g in gens])
    t2_null = [bool(v.correct) for v in verdicts]
    t2 = [bool(ro.turns[i].scored_verdict.correct) for i in refines]
    m["acc@t2_null"] = sum(t2_null) / len(t2_null)
    m["feedback_effect"] = fbm.feedback_effect(t2, t2_null)

    # how much the solver listens: log π_L(ŷ | x, z, g) − log π_L(ŷ | x, z, g∅), per token of ŷ
    pairs = [(ro.turns[ri], null_prompt) for ri, null_prompt in zip(refines, null_prompts) if ro.turns[ri].ids]
    for r, null_prompt in pairs:
        with_g += [TrainItem(r.prompt_ids, r.ids, 0.0), TrainItem(null_prompt, r.ids, 0.0)]
    sums = sequence_logprob_sums(solver.model, with_g, solver.tokenizer.pad_token_id, micro_batch_tokens)
    lp_g, lp_null, n_tok = sums[0::2], sums[1::2], [len(r.ids) for r, _ in pairs]
    if n_tok:
        m["feedback_sensitivity"] = fbm.feedback_sensitivity(lp_g, lp_null, n_tok)
    golds = [ro.problems[ro.turns[fi].problem].answer for fi in feedbacks]
    m["leakage_rate"] = fbm.leakage_rate([ro.turns[fi].text for fi in feedbacks], golds, actors.verifier.leaks)
    fb_tokens = [len(ro.turns[fi].ids) for fi in feedbacks]
    m.update(fbm.feedback_length_stats(fb_tokens, [sum(len(t.ids) for t in ro.turns)]))
    return t2_null


def _samples(ro: Rollout, n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for ai in ro.of_kind("attempt")[:n]:
        chain: list[dict[str, Any]] = []
        node: int | None = ai
        while node is not None:
            t = ro.turns[node]
            chain.append({"kind": t.kind, "policy": t.policy, "text": t.text, "reward": t.reward,
                          "verdict": t.verdict.kind if t.verdict else None, "tokens": len(t.ids),
                          "finish_reason": t.finish_reason})
            node = t.children[0] if t.children else None
        out.append({"problem_id": ro.problems[ro.turns[ai].problem].id, "turns": chain})
    return out

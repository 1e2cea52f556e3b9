"""Held-out evaluation with the protocol and metrics of METHOD.md.

One episode per problem (greedy by default): attempt z, feedback g, refinement ŷ. Refine-all
accuracy is the headline (``acc@t2``); oracle-gated accuracy is reported separately. With
feedback metrics on, every attempt is also refined with g∅, paired with the real feedback on
the same (x, z): that gives ``feedback_effect`` and ``feedback_sensitivity``. With a model
critic, the critic diagnostics of METHOD v3 (:mod:`mlmt_bench.metrics.critic`) judge its
feedback on the current solver's attempts against the verifier (and the oracle, when the
benchmark has one). METHOD v4's copy-channel metrics: ``feedback/redacted_share`` under
``feedback.redact``, ``copy_rate`` (refinements whose answer the shown feedback states) and, with
a model critic, the critic scored as a second solver (``acc_critic_as_solver``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mlmt_bench.algorithms.update import TrainItem
from mlmt_bench.benchmarks.perturbations import states_any
from mlmt_bench.metrics import feedback as fbm
from mlmt_bench.metrics.completions import clipped_ratios
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
    # role -> prompt / generated tokens of the protocol's turns (not the diagnostic g∅ pass): test-time cost
    prompt_tokens: dict[str, int] = field(default_factory=dict)
    gen_tokens: dict[str, int] = field(default_factory=dict)
    # the episodes themselves, for a second protocol on the same attempts (refine_again); kept in
    # memory only (the step-0 memo stores the fields above), so None for a result read from it
    rollout: Rollout | None = field(default=None, repr=False, compare=False, metadata={"memo": False})


def evaluate(program: Program, actors: Actors, problems: Sequence[Problem], sampling: Sampling, *,
             feedback_metrics: bool = True, n_samples: int = 8,
             protocols: Sequence[str] = ("refine_all", "oracle_gated"),
             micro_batch_tokens: int | None = None, episodes: Rollout | None = None,
             null_outcomes: Sequence[bool] | None = None, keep_attempts: bool = False) -> EvalResult:
    """``program`` on ``problems``, scored. ``episodes``: its rollout, already generated (e.g. by
    :func:`refine_again`); default: generated here. ``null_outcomes``: whether each attempt's
    refinement after g∅ is correct, when already known for these very attempts (g∅ is never
    redacted, so a second protocol on them has the same): not generated again.
    ``keep_attempts``: a later pass will refine these attempts (``rollout``'s)."""
    ro = episodes if episodes is not None else rollout(program, actors, problems, sampling,
                                                       keep_attempts=keep_attempts)
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
        t2_null = _feedback_metrics(ro, actors, sampling, m, micro_batch_tokens, null_outcomes)
    elif program.feedback == "null":  # the refinement *is* the one after g∅ (self_correct, null_feedback)
        t2_null = list(t2)
        m["acc@t2_null"] = m["acc@t2"]
    if program.feedback == "critic" and actors.verdict is not None:
        m.update(diagnose_critic(ro, actors))
    solver_rows: list[bool | None] = []
    if program.feedback in ("critic", "oracle"):
        m.update(redaction_metrics(ro))
        m.update(copy_metrics(ro, actors))
        if program.feedback == "critic" and actors.stated_answer is not None:
            solver_rows = critic_as_solver(ro, actors, m)
    m["gen_tokens_eval"] = sum(len(t.ids) for t in ro.turns)
    m.update(generated_clipped(ro))
    per_problem = [{"problem_id": p.id, "t1": a, "t2": b, "t2_null": c}
                   for p, a, b, c in zip(problems, t1, t2, t2_null)]
    if len(solver_rows) == len(per_problem):  # the critic's stated answer, scored: the "critic as second solver"
        for row, solved in zip(per_problem, solver_rows):
            row["t2_critic_solver"] = bool(solved)  # no stated answer: not solved
    return EvalResult(m, per_problem, _samples(ro, n_samples), dict(ro.prompt_tokens), dict(ro.gen_tokens), ro)


def redaction_metrics(ro: Rollout) -> dict[str, float]:
    """``feedback/redacted_share`` (METHOD v4): the mean share of each feedback's characters that
    ``feedback.redact`` removed before the refiner saw it; {} when no feedback was redacted."""
    shares = [t.redaction.share for t in ro.turns if t.kind == "feedback" and t.redaction is not None]
    share = fbm.redacted_share(shares)
    return {} if share is None else {"feedback/redacted_share": share}


def copy_metrics(ro: Rollout, actors: Actors) -> dict[str, float]:
    """``copy_rate`` (METHOD v4): the share of refinements whose final answer (the verifier's
    extracted answer) is one of the values the feedback the refiner saw states
    (``Benchmark.stated_values`` of the shown, possibly redacted, text); {} where the benchmark
    reads no values (``stated_values`` None)."""
    if actors.stated_values is None:
        return {}
    copied: list[bool | None] = []
    for ri in ro.of_kind("refine"):
        values = actors.stated_values(ro.parent_of(ri).refiner_text)
        copied.append(None if values is None else states_any(ro.turns[ri].scored_verdict.extracted, values))
    rate = fbm.copy_rate(copied)
    return {} if rate is None else {"copy_rate": rate}


def critic_as_solver(ro: Rollout, actors: Actors, m: dict[str, Any]) -> list[bool | None]:
    """The critic as a second solver (METHOD v4): the final answer each feedback states
    (``Benchmark.stated_answer`` of what the critic wrote, not of the redacted text), scored by
    the verifier with no refinement. Adds ``acc_critic_as_solver``, ``critic_states_answer_rate``
    and ``critic_as_solver_tokens`` (its test-time tokens per problem: the attempt's and the
    feedback's generated tokens) to ``m``; returns per feedback True / False, or None where the
    feedback states no answer (counted as not solved)."""
    assert actors.stated_answer is not None
    feedbacks = ro.of_kind("feedback")
    if not feedbacks:
        return []
    stated = [actors.stated_answer(ro.turns[f].text) for f in feedbacks]
    said = [i for i, s in enumerate(stated) if s is not None]
    verdicts = actors.verifier.score_batch([ro.problems[ro.turns[feedbacks[i]].problem] for i in said],
                                           [str(stated[i]) for i in said])
    solved: list[bool | None] = [None] * len(feedbacks)
    for i, v in zip(said, verdicts):
        solved[i] = bool(v.correct)
    m.update(fbm.critic_as_solver(solved))
    m["critic_as_solver_tokens"] = sum(len(ro.turns[f].ids) + len(ro.parent_of(f).ids) for f in feedbacks) / len(
        feedbacks)
    return solved


def generated_clipped(ro: Rollout) -> dict[str, float]:
    """``completions/clipped_ratio`` of the turns a model generated in ``ro``, overall and per turn
    kind (:func:`~mlmt_bench.metrics.completions.clipped_ratios`; rule-written feedback is none)."""
    return clipped_ratios((t.kind, t.finish_reason) for t in ro.turns if t.policy in ("solver", "critic"))


def diagnose_critic(ro: Rollout, actors: Actors) -> dict[str, Any]:
    """The critic diagnostics of a rollout's feedbacks on their attempts (``exact_correction_rate``
    only where the benchmark has an oracle critic), ``critic/verdict_unparsed`` (the share of
    feedbacks whose verdict the benchmark cannot read) and, with the benchmark's labelled keyword
    fallback on (``verdict_fallback: keywords``), ``critic/verdict_keywords`` (the share it read)."""
    assert actors.verdict is not None
    feedbacks = ro.of_kind("feedback")
    attempts = [ro.parent_of(f) for f in feedbacks]
    texts = [ro.turns[f].text for f in feedbacks]
    says = [actors.verdict(t) for t in texts]
    correct = [bool(a.verdict.correct) if a.verdict else False for a in attempts]
    exact = None
    if actors.oracle is not None:
        exact = [ro.turns[f].text.strip() == actors.oracle(ro.problems[a.problem], a.text).strip()
                 for f, a in zip(feedbacks, attempts)]
    d = critic_diagnostics(says, correct, exact)
    out: dict[str, Any] = {k: d[k] for k in DIAGNOSTICS if d[k] is not None}
    if feedbacks:  # the share of verdicts the benchmark could not read (strictly, unless its fallback is on)
        out["critic/verdict_unparsed"] = d["verdict_unparsed"]
    if actors.verdict_by_keywords is not None and feedbacks:  # the labelled fallback: how much it read
        out["critic/verdict_keywords"] = sum(map(actors.verdict_by_keywords, texts)) / len(feedbacks)
    return out


def _feedback_metrics(ro: Rollout, actors: Actors, sampling: Sampling, m: dict[str, Any],
                      micro_batch_tokens: int | None, null_outcomes: Sequence[bool] | None = None) -> list[bool]:
    solver, tpl = actors.solver, actors.templates
    feedbacks, refines = ro.of_kind("feedback"), ro.of_kind("refine")
    null_prompts, with_g = [], []
    for fi in feedbacks:
        a = ro.parent_of(fi)
        prob = ro.problems[a.problem]
        null_prompts.append(refine_prompt(solver.tokenizer, tpl, prob, a.prompt_ids, a.ids, a.text, tpl.null_feedback))
    if null_outcomes is not None:
        if len(null_outcomes) != len(feedbacks):
            raise ValueError(f"{len(null_outcomes)} outcomes after g∅ for {len(feedbacks)} feedbacks")
        t2_null = [bool(ok) for ok in null_outcomes]
    else:
        gens = actors.backend.generate(solver.model, solver.tokenizer, null_prompts,
                                       max_new_tokens=sampling.max_new_tokens, temperature=sampling.temperature,
                                       top_p=sampling.top_p, stop=sampling.stop)
        probs = [ro.problems[ro.turns[fi].problem] for fi in feedbacks]
        t2_null = [bool(v.correct) for v in actors.verifier.score_batch(probs, [g.text for g in gens])]
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
            if t.redaction is not None:  # feedback.redact: what the refiner was shown of this feedback
                chain[-1]["shown_text"] = t.redaction.text
            node = t.children[0] if t.children else None
        problem = ro.problems[ro.turns[ai].problem]  # its statement and gold: the report's problem browser
        out.append({"problem_id": problem.id, "problem": problem.prompt, "gold": problem.answer, "turns": chain})
    return out

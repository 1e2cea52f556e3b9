"""Episode programs of METHOD.md as one tree: attempts → feedbacks → refinements.

A rollout over ``P`` problems generates ``G`` attempts z per problem; for programs with a
second turn, ``K`` feedbacks g per attempt (from the critic, the oracle, or the fixed g∅) and
``M`` refinements ŷ per feedback. Every generated turn is one :class:`TurnSample`, linked to
its parent, holding the exact ids that were generated (token-in/token-out).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from mlmt_bench.rollout.chat import chat_ids, close_turn, continuation_ids
from mlmt_bench.types import Problem, PromptTemplates, Redaction, Verdict

if TYPE_CHECKING:
    from mlmt_bench.rollout.backend import Backend
    from mlmt_bench.verifiers.base import Verifier

TurnKind = Literal["attempt", "feedback", "refine"]
FeedbackSource = Literal["none", "null", "critic", "oracle"]


@dataclass
class TurnSample:
    """One generated turn.

    kind:       attempt (z, solver) | feedback (g, critic / oracle / null) | refine (ŷ, solver)
    policy:     "solver" | "critic" | "oracle" | "null" (who produced it; only models train)
    problem:    index of the problem in the rollout
    parent:     index of the parent turn in ``Rollout.turns`` (None for attempts)
    prompt_ids: the context the policy saw, as token ids
    ids:        generated ids (with EOS if it stopped); ``logprobs`` aligned with them
    reward:     verifier reward (attempt, refine) or the turn's credit-assignment reward
    redaction:  a feedback under ``feedback.redact`` (METHOD v4): what the refiner was shown of
                ``text`` (the benchmark's rule applied); None when the refiner saw ``text`` itself.
                ``ids`` / ``text`` stay what the critic wrote (it is trained on them).
    """

    kind: TurnKind
    policy: str
    problem: int
    parent: int | None
    prompt_ids: list[int]
    ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str = "stop"
    reward: float | None = None
    verdict: Verdict | None = None
    children: list[int] = field(default_factory=list)
    redaction: Redaction | None = None

    @property
    def shown_text(self) -> str | None:
        """The redacted feedback the refiner saw, or None when it saw ``text`` unredacted."""
        return None if self.redaction is None else self.redaction.text

    @property
    def refiner_text(self) -> str:
        """What a refinement of this feedback was conditioned on: ``shown_text``, else ``text``."""
        return self.text if self.redaction is None else self.redaction.text

    @property
    def scored_reward(self) -> float:
        """``reward``, of a turn that has one (the rollout scores every attempt and refinement)."""
        assert self.reward is not None, f"a {self.kind} turn without a reward"
        return self.reward

    @property
    def scored_verdict(self) -> Verdict:
        """``verdict``, of a scored turn (the rollout scores every attempt and refinement)."""
        assert self.verdict is not None, f"a {self.kind} turn without a verdict"
        return self.verdict


@dataclass
class Rollout:
    """``gen_tokens`` / ``prompt_tokens``: tokens generated, and prompt tokens read (as prefill), by
    each model role ("solver", "critic") over all its sequences; rule-written feedback counts nothing."""

    problems: list[Problem]
    turns: list[TurnSample]
    gen_tokens: dict[str, int]
    seconds: float
    prompt_tokens: dict[str, int] = field(default_factory=dict)

    def of_kind(self, kind: TurnKind) -> list[int]:
        return [i for i, t in enumerate(self.turns) if t.kind == kind]

    def parent_index(self, i: int) -> int:
        """The index of the turn ``turns[i]`` answers: a feedback's attempt, a refinement's feedback."""
        parent = self.turns[i].parent
        assert parent is not None, f"turn {i} ({self.turns[i].kind}) has no parent"
        return parent

    def parent_of(self, i: int) -> TurnSample:
        """The turn ``turns[i]`` answers (:meth:`parent_index`)."""
        return self.turns[self.parent_index(i)]


@dataclass
class Program:
    """Who generates what: G attempts, then (unless feedback == "none") K feedbacks × M refinements."""

    attempts: int
    feedback: FeedbackSource = "none"
    feedbacks: int = 1
    refinements: int = 1


class Actor(Protocol):
    """What an episode needs of a policy: a causal LM and its tokenizer (a Policy is one)."""

    model: Any
    tokenizer: Any


@dataclass
class Actors:
    """What a program needs to run. ``critic`` may be None for the none / null / oracle sources.
    ``oracle``: the benchmark's rule-based critic (synthetic benchmarks); ``verdict``: how the
    benchmark reads a feedback's verdict (:meth:`Benchmark.feedback_verdict`), for the critic
    diagnostics. ``redact``: the benchmark's redaction rule (:meth:`Benchmark.redact_feedback`)
    when ``feedback.redact`` is on (METHOD v4): the refiner sees every critic or oracle feedback
    through it, at training and at evaluation (g∅ is never redacted); None: it sees the feedback
    as written. ``stated_answer``: the final answer a feedback states, as a response the verifier
    scores (:meth:`Benchmark.stated_answer`; the "critic as second solver" metrics), and
    ``stated_values``: the values it states (:meth:`Benchmark.stated_values`; ``copy_rate``)."""

    solver: Actor
    critic: Actor | None
    backend: Backend
    templates: PromptTemplates
    verifier: Verifier
    oracle: Callable[[Problem, str], str] | None = None
    verdict: Callable[[str], bool | None] | None = None
    redact: Callable[[Problem, str, str], Redaction] | None = None
    stated_answer: Callable[[str], str | None] | None = None
    stated_values: Callable[[str], list[str] | None] | None = None
    # whether ``verdict`` read a feedback by the benchmark's labelled keyword fallback
    # (:meth:`Benchmark.verdict_by_keywords`); None: the fallback is off
    verdict_by_keywords: Callable[[str], bool] | None = None


@dataclass
class Sampling:
    """How turns are sampled. ``temperature`` is the solver's (attempts, refinements);
    ``feedback_temperature`` the critic's (METHOD v3: each role has its own; None = the solver's)."""

    temperature: float
    top_p: float
    max_new_tokens: int
    feedback_max_new_tokens: int
    stop: list[str] | None = None
    feedback_temperature: float | None = None

    @property
    def critic_temperature(self) -> float:
        return self.temperature if self.feedback_temperature is None else self.feedback_temperature


def merge_rollouts(a: Rollout, b: Rollout) -> Rollout:
    """One rollout holding ``a``'s problems and turns, then ``b``'s (indices shifted)."""
    shift, offset = len(a.turns), len(a.problems)
    moved = [dataclasses.replace(t, problem=t.problem + offset,
                                 parent=None if t.parent is None else t.parent + shift,
                                 children=[c + shift for c in t.children]) for t in b.turns]
    tokens = {k: a.gen_tokens.get(k, 0) + b.gen_tokens.get(k, 0) for k in {*a.gen_tokens, *b.gen_tokens}}
    prompts = {k: a.prompt_tokens.get(k, 0) + b.prompt_tokens.get(k, 0) for k in {*a.prompt_tokens, *b.prompt_tokens}}
    return Rollout(a.problems + b.problems, a.turns + moved, tokens, a.seconds + b.seconds, prompts)


def _generate(actor: Any, prompts: list[list[int]], sampling: Sampling, max_new: int, backend: Any,
              temperature: float | None = None, keep: bool = False) -> list[Any]:
    """``keep``: later prompts will extend these (passed on to a backend that declares
    ``keeps_prefixes``)."""
    hint = {"keep": True} if keep and getattr(getattr(backend, "traits", None), "keeps_prefixes", False) else {}
    return backend.generate(actor.model, actor.tokenizer, prompts, max_new_tokens=max_new,
                            temperature=sampling.temperature if temperature is None else temperature,
                            top_p=sampling.top_p, stop=sampling.stop, **hint)


def feedback_prompt(tokenizer: Any, templates: PromptTemplates, problem: Problem, attempt_text: str) -> list[int]:
    """The critic's context for g: the problem and the attempt, in one user message."""
    return chat_ids(tokenizer, [{"role": "user", "content": templates.render_feedback(problem, attempt_text)}],
                    add_generation_prompt=True)


def critique(critic: Actor, backend: Backend, templates: PromptTemplates, problems: Sequence[Problem],
             attempts: Sequence[str], sampling: Sampling) -> list[str]:
    """The critic's feedback texts on given attempt texts (one each, at the critic's temperature):
    for probes of the critic on attempts no solver wrote (the base check's gold solutions)."""
    prompts = [feedback_prompt(critic.tokenizer, templates, p, a) for p, a in zip(problems, attempts)]
    gens = _generate(critic, prompts, sampling, sampling.feedback_max_new_tokens, backend, sampling.critic_temperature)
    return [g.text for g in gens]


def attempt_prompt(tokenizer: Any, templates: PromptTemplates, problem: Problem) -> list[int]:
    return chat_ids(tokenizer, [{"role": "user", "content": templates.render_attempt(problem)}],
                    add_generation_prompt=True)


def refine_prompt(tokenizer: Any, templates: PromptTemplates, problem: Problem, attempt_prompt_ids: list[int],
                  attempt_ids: list[int], attempt_text: str, feedback_text: str) -> list[int]:
    """The solver's context for ŷ: its turn-1 prompt and z exactly as generated (closed by EOS if
    it hit the length limit), then what the template writes after an assistant turn (ChatML: a
    newline) and the feedback message with a generation prompt. When z's ids are the template's
    own tokenization of its text, this is the template's rendering of the whole conversation."""
    history = [{"role": "user", "content": templates.render_attempt(problem)},
               {"role": "assistant", "content": attempt_text}]
    new = [{"role": "user", "content": templates.render_refine(feedback_text)}]
    return attempt_prompt_ids + close_turn(tokenizer, attempt_ids) + continuation_ids(tokenizer, history, new)


def rollout(program: Program, actors: Actors, problems: Sequence[Problem], sampling: Sampling, *,
            attempts_of: Rollout | None = None, keep_attempts: bool = False) -> Rollout:
    """Run ``program`` on ``problems``; every turn is scored by the verifier (feedback turns: not
    scored). ``attempts_of``: a rollout of the same problems and attempt count whose attempts are
    this one's, as they are (not generated again: a second protocol on identical attempts).
    ``keep_attempts``: a later rollout will refine these attempts (``attempts_of``), so the
    backend is told to keep them as it is when this program refines them itself."""
    start = time.perf_counter()
    solver, critic, tpl = actors.solver, actors.critic, actors.templates
    turns: list[TurnSample] = []
    gen_tokens = {"solver": 0, "critic": 0}
    prompt_tokens = {"solver": 0, "critic": 0}

    # Turn 1: G attempts per problem.
    if attempts_of is not None:
        turns = _same_attempts(attempts_of, problems, program.attempts)
    else:
        a_prompts, a_owner = [], []
        for pi, prob in enumerate(problems):
            ids = attempt_prompt(solver.tokenizer, tpl, prob)
            for _ in range(program.attempts):
                a_prompts.append(ids)
                a_owner.append(pi)
        gens = _generate(solver, a_prompts, sampling, sampling.max_new_tokens, actors.backend,
                         keep=keep_attempts or program.feedback != "none")  # refinements repeat every attempt
        verdicts = actors.verifier.score_batch([problems[pi] for pi in a_owner], [g.text for g in gens])
        for pi, prompt, g, v in zip(a_owner, a_prompts, gens, verdicts):
            turns.append(TurnSample("attempt", "solver", pi, None, prompt, g.ids, g.logprobs, g.text,
                                    g.finish_reason, v.reward, v))
    gen_tokens["solver"] += sum(len(t.ids) for t in turns)
    prompt_tokens["solver"] += sum(len(t.prompt_ids) for t in turns)
    if program.feedback == "none":
        return Rollout(list(problems), turns, gen_tokens, time.perf_counter() - start, prompt_tokens)
    attempts = list(range(len(turns)))

    # Turn 2: K feedbacks per attempt.
    fb_parent, fb_texts, fb_ids, fb_lp, fb_prompts, fb_finish = [], [], [], [], [], []
    if program.feedback == "critic":
        assert critic is not None  # a critic program's actors have one (Actors)
        prompts = []
        for ai in attempts:
            t = turns[ai]
            prompts += [feedback_prompt(critic.tokenizer, tpl, problems[t.problem], t.text)] * program.feedbacks
            fb_parent += [ai] * program.feedbacks
        gens = _generate(critic, prompts, sampling, sampling.feedback_max_new_tokens, actors.backend,
                         sampling.critic_temperature)
        for p, g in zip(prompts, gens):
            fb_prompts.append(p)
            fb_texts.append(g.text)
            fb_ids.append(g.ids)
            fb_lp.append(g.logprobs)
            fb_finish.append(g.finish_reason)
            gen_tokens["critic"] += len(g.ids)
            prompt_tokens["critic"] += len(p)
    else:
        for ai in attempts:
            t = turns[ai]
            for _ in range(program.feedbacks):
                if program.feedback == "oracle":
                    assert actors.oracle is not None  # an oracle program's actors have one (Actors)
                    text = actors.oracle(problems[t.problem], t.text)
                else:
                    text = tpl.null_feedback
                fb_parent.append(ai)
                fb_texts.append(text)
                fb_ids.append([])
                fb_lp.append([])
                fb_prompts.append([])
                fb_finish.append("stop")
    feedbacks = []
    for ai, p, text, ids, lp, fin in zip(fb_parent, fb_prompts, fb_texts, fb_ids, fb_lp, fb_finish):
        policy = "critic" if program.feedback == "critic" else program.feedback
        shown = _shown(program, actors, problems[turns[ai].problem], turns[ai].text, text)
        turns.append(TurnSample("feedback", policy, turns[ai].problem, ai, p, ids, lp, text, fin, redaction=shown))
        turns[ai].children.append(len(turns) - 1)
        feedbacks.append(len(turns) - 1)

    # Turn 3: M refinements per feedback, in the solver's own conversation.
    generated, read = _refine(turns, feedbacks, problems, program.refinements, actors, sampling)
    gen_tokens["solver"] += generated
    prompt_tokens["solver"] += read
    return Rollout(list(problems), turns, gen_tokens, time.perf_counter() - start, prompt_tokens)


def _same_attempts(ro: Rollout, problems: Sequence[Problem], per_problem: int) -> list[TurnSample]:
    """``ro``'s attempt turns, copied without their children, for a rollout of ``problems`` with
    ``per_problem`` attempts each; a rollout of other problems or counts is refused."""
    attempts = [dataclasses.replace(ro.turns[i], children=[]) for i in ro.of_kind("attempt")]
    if [p.id for p in ro.problems] != [p.id for p in problems] or len(attempts) != per_problem * len(problems):
        raise ValueError(f"attempts_of: {len(attempts)} attempts of {len(ro.problems)} problems, not "
                         f"{per_problem} of each of these {len(problems)}")
    if [t.problem for t in attempts] != [i for i in range(len(problems)) for _ in range(per_problem)]:
        raise ValueError("attempts_of: its attempts are not laid out problem by problem")
    return attempts


def refine_again(program: Program, ro: Rollout, actors: Actors, sampling: Sampling) -> Rollout:
    """``ro`` (a rollout of ``program``) with its attempts and feedbacks kept as they are, not
    generated again, each feedback shown to the refiner as ``actors.redact`` shows it (None: as
    written), and new refinements after them: a second protocol on identical attempts and feedback
    (``feedback.eval_unredacted``: the same episodes without redaction, paired turn for turn).
    Token counts are the protocol's: ``ro``'s attempts and feedbacks plus the new refinements."""
    start = time.perf_counter()
    first_refine = min(ro.of_kind("refine"), default=len(ro.turns))
    assert all(t.kind == "refine" for t in ro.turns[first_refine:]), "a rollout's refinements come last"
    turns = [dataclasses.replace(t, children=[c for c in t.children if c < first_refine])
             for t in ro.turns[:first_refine]]
    feedbacks = [i for i, t in enumerate(turns) if t.kind == "feedback"]
    for fi in feedbacks:
        f = turns[fi]
        a = ro.parent_of(fi)
        turns[fi] = dataclasses.replace(f, redaction=_shown(program, actors, ro.problems[a.problem], a.text, f.text))
    old = ro.turns[first_refine:]
    generated, read = _refine(turns, feedbacks, ro.problems, program.refinements, actors, sampling)
    gen_tokens, prompt_tokens = dict(ro.gen_tokens), dict(ro.prompt_tokens)
    gen_tokens["solver"] += generated - sum(len(t.ids) for t in old)
    prompt_tokens["solver"] += read - sum(len(t.prompt_ids) for t in old)
    return Rollout(list(ro.problems), turns, gen_tokens, time.perf_counter() - start, prompt_tokens)


def _shown(program: Program, actors: Actors, problem: Problem, attempt_text: str, text: str) -> Redaction | None:
    """What the refiner is shown of a feedback: its redaction under ``actors.redact``, or None
    (shown as written: no rule, or g∅, which is never redacted)."""
    if actors.redact is None or program.feedback not in ("critic", "oracle"):
        return None
    return actors.redact(problem, attempt_text, text)


def _refine(turns: list[TurnSample], feedbacks: Sequence[int], problems: Sequence[Problem], per_feedback: int,
            actors: Actors, sampling: Sampling) -> tuple[int, int]:
    """Turn 3: ``per_feedback`` refinements of each feedback turn ``turns[fi]`` (``fi`` in
    ``feedbacks``), conditioned on what the refiner is shown of it, scored and appended to
    ``turns`` (and to the feedback's children). Returns the tokens the solver generated and the
    prompt tokens it read."""
    solver = actors.solver
    r_prompts, r_parent = [], []
    for fi in feedbacks:
        f = turns[fi]
        assert f.parent is not None  # a feedback's attempt
        a = turns[f.parent]
        ids = refine_prompt(solver.tokenizer, actors.templates, problems[a.problem], a.prompt_ids, a.ids, a.text,
                            f.refiner_text)
        r_prompts += [ids] * per_feedback
        r_parent += [fi] * per_feedback
    gens = _generate(solver, r_prompts, sampling, sampling.max_new_tokens, actors.backend)
    verdicts = actors.verifier.score_batch([problems[turns[fi].problem] for fi in r_parent], [g.text for g in gens])
    generated = read = 0
    for fi, prompt, g, v in zip(r_parent, r_prompts, gens, verdicts):
        turns.append(TurnSample("refine", "solver", turns[fi].problem, fi, prompt, g.ids, g.logprobs, g.text,
                                g.finish_reason, v.reward, v))
        turns[fi].children.append(len(turns) - 1)
        generated += len(g.ids)
        read += len(prompt)
    return generated, read

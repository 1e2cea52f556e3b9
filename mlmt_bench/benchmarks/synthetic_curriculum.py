"""The shared base's curriculum on ``synthetic-arith``: SFT conversations for every role's skill.

METHOD.md v2 ("Where every policy starts"): one base per seed is trained on the union of the
skills every role needs, and every policy of every arm starts from it. The four kinds of
conversation, each an :data:`Example` (token ids and the trained spans):

- ``solve``: ``[user: attempt prompt, assistant: solution]``;
- ``refine`` (after feedback): ``[user: problem, assistant: attempt, user: refine prompt with
  the oracle's feedback, assistant: revision]``; the revision copies the corrected step from
  the feedback and recomputes the steps after it (``apply_feedback(..., revision=True)``);
  the feedback recomputes each step, quotes the attempt's and judges it (``9-6>3 9-6=3 ok;3+9>12
  3+9=11 wrong``, v3);
- ``resolve`` (after the null feedback g∅): the same shape with ``g∅``, and the target a
  *genuine new attempt*: a fresh draw of the solver's own solution, never a copy of the attempt
  (so that single-level self-correction has something to learn);
- ``critique``: ``[user: feedback prompt (problem + attempt), assistant: oracle feedback]``,
  a share ``critic_noise`` of the targets replaced by wrong or unhelpful feedback. **(v3)** The
  attempts come from a mixture that carries no information about *which* operation is wrong
  (``critique_mix``, :meth:`Curriculum.critique_attempt`): gold solutions, gold with one random
  slip at a uniformly random step, and solutions of solvers with *other*, freshly drawn
  misconception sets. Never the base's own misconceived solver: a critic taught on that one
  solver's errors learns to flag the seed's misconception operations by their identity (it
  recalls instead of checking), and breaks as soon as RL changes the solver's errors.

How often the base solves right is set by ``misconceptions``: that share of the operations
(e.g. ``+7``) it is taught one too high, everywhere it computes by itself (solutions, new
attempts, the steps a revision recomputes). The critique targets use the true arithmetic, so
the base checks better than it solves — a generation–verification gap, as in real LLMs, that
lives in the weights every arm starts from and that any arm may exploit.

Two devices make a ~0.5M-parameter model *use* the feedback instead of recomputing its own
belief: a share ``counterfactual_frac`` of the corrective feedbacks states a made-up value that
the target follows (only reading the feedback predicts it), and the tokens the feedback
dictates weigh ``feedback_token_weight`` in the loss; the critic's decisions weigh
``critic_token_weight``.

The data depends only on the configuration and the seed (never on a model), so two bases of
different sizes trained with the same configuration see exactly the same conversations.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from typing import Any

from mlmt_bench.benchmarks.base import OracleBenchmark
from mlmt_bench.benchmarks.synthetic import (
    _gold_steps,
    _modulus,
    _slip,
    apply_op,
    approve_all,
    corrected_step,
    feedback_is_ok,
    format_solution,
    format_step,
    parse_attempt,
    parse_problem,
    solve,
    step_feedback,
)
from mlmt_bench.errors import UserError

#: ids, and [start, end) spans of trained positions with their loss weight (later spans win).
Example = tuple[list[int], list[tuple[int, int, float]]]

#: The conversation kinds, in the order of the mixture weights.
KINDS = ("solve", "refine", "resolve", "critique")


class Misconceptions:
    """A solver's systematic arithmetic errors: ``round(rate x #operations)`` of the operations
    ``(op, b)`` (e.g. ``+7``) are believed to give one more than they do (``x+7`` taken as
    ``x+8``), chosen deterministically from the seed. Rate 0 is the true arithmetic.

    The errors all go the same way, so two of them never cancel into a right answer.
    """

    def __init__(self, rate: float, seed: int | str, ops: str, max_operand: int) -> None:
        rng = random.Random(f"bootstrap:{seed}:misconceptions")
        operations = [(op, b) for op in ops for b in range(1, max_operand + 1)]
        k = min(len(operations), int(round(rate * len(operations))))
        self.wrong: dict[tuple[str, int], int] = {o: 1 for o in rng.sample(operations, k)}

    def hits(self, problem: Any) -> bool:
        """Whether the problem uses one of these misconception operations."""
        _, ops = parse_problem(problem.prompt)
        return any((op, b) in self.wrong for op, b in ops)

    def op(self, a: int, op: str, b: int, modulus: int) -> int:
        return (apply_op(a, op, b, modulus) + self.wrong.get((op, b), 0)) % modulus

    def solution(self, problem: Any) -> str:
        if not self.wrong:
            return str(problem.metadata.get("solution")) if problem.metadata.get("solution") else \
                format_solution(solve(*parse_problem(problem.prompt), _modulus(problem)))
        first, ops = parse_problem(problem.prompt)
        return format_solution(solve(first, ops, _modulus(problem), self.op))


def counterfactual_feedback(problem: Any, feedback: str, rng: random.Random) -> str:
    """``C1 ok;...;a<op>b>r a<op>b=w wrong`` with ``r`` replaced by a nearby wrong value."""
    flagged = corrected_step(feedback)
    if flagged is None:
        return feedback
    head, _, tail = feedback.rpartition(">")
    value, _, rest = tail.partition(" ")
    return f"{head}>{_slip(flagged[1][3], rng, _modulus(problem))} {rest}"


def noisy_feedback(problem: Any, attempt: str, true_feedback: str, rng: random.Random, null_feedback: str) -> str:
    """Wrong or unhelpful feedback on ``attempt`` (a miss, a false alarm, a wrong step or value)."""
    gold = _gold_steps(problem)
    written, _ = parse_attempt(attempt)
    modulus = _modulus(problem)
    n = len(gold)
    options: list[Callable[[], str]] = [lambda: null_feedback]
    i = rng.randrange(n)
    a, op, b, r = gold[i]
    slipped = step_feedback(gold, i + 1, (a, op, b, _slip(r, rng, modulus)), written)
    options.append(lambda: slipped)  # a wrong value (a false alarm if the attempt is right)
    if not feedback_is_ok(true_feedback):
        options.append(lambda: approve_all(gold))  # a miss
        flagged = corrected_step(true_feedback)
        others = [j for j in range(n) if flagged is None or j != flagged[0] - 1]
        if others:
            j = rng.choice(others)
            options.append(lambda: step_feedback(gold, j + 1, gold[j], written))  # the wrong step
    return rng.choice(options)()


def decision_chars(feedback: str) -> list[tuple[int, int]]:
    """[start, end) character spans of a walk feedback's verdicts and computed values."""
    out = [(m.start(1), m.start(1) + 1) for m in re.finditer(r"(?:^|[;\s])(ok|wrong|answer)", feedback)]
    out += [(m.start(1), m.end(1)) for m in re.finditer(r"[>#]\s*(-?\d+)", feedback)]
    return out


class Curriculum:
    """Conversations for the base's SFT as :data:`Example` s, drawn from a caller's seeded RNG.

    ``cfg`` is a :class:`mlmt_bench.warmstart.shared_base.BaseConfig` (its data fields are read
    here), ``bench`` a synthetic benchmark with an oracle critic, ``tokenizer`` the tiny one.
    """

    def __init__(self, cfg: Any, bench: OracleBenchmark, tokenizer: Any, seed: int) -> None:
        from mlmt_bench.models.tokenizer import encode
        from mlmt_bench.rollout.chat import chat_ids

        self.cfg = cfg
        self.bench = bench
        self.tok = tokenizer
        self.chat_ids = chat_ids
        self.encode = lambda text: encode(tokenizer, text)
        self.templates = bench.templates
        problems = bench.load("train")
        self.problems = problems[: cfg.n_problems] if cfg.n_problems else problems
        if not self.problems:
            raise UserError(f"base: benchmark {cfg.benchmark!r} has no training problems")
        self.ops = bench.ops
        self.max_operand = bench.max_operand
        self.beliefs = Misconceptions(cfg.misconceptions, seed, self.ops, self.max_operand)
        self.makers = {"solve": self.solve, "refine": self.refine, "resolve": self.resolve, "critique": self.critique}

    def example(self, kind: str, rng: random.Random) -> Example:
        return self.makers[kind](rng)

    # -- pieces ---------------------------------------------------------------------------

    def believed(self, problem: Any) -> str:
        """The solution the base is taught: the gold one, except where a misconception hits."""
        return self.beliefs.solution(problem)

    def own_solution(self, problem: Any, rng: random.Random) -> str:
        """A fresh attempt of the solver: the taught solution, with random slips at ``solver_error_rate``."""
        target = self.believed(problem)
        return self.bench.inject_errors(target, rng) if rng.random() < self.cfg.solver_error_rate else target

    def _attempt(self, rng: random.Random, right_frac: float) -> tuple[Any, str, bool]:
        """(problem, attempt, attempt is the taught solution): with probability ``right_frac`` the
        taught solution (right unless a misconception hits), else one with injected errors."""
        p = rng.choice(self.problems)
        taught = self.believed(p)
        right = rng.random() < right_frac
        return p, taught if right else self.bench.inject_errors(taught, rng), right

    def _conv(self, messages: list[dict[str, str]], trained: tuple[int, ...] = (-1,)) -> Example:
        """Ids of the conversation and the spans of the assistant messages at indices ``trained``.

        A span covers the message's content and its EOS: what the model emits after
        ``<|assistant|>``.
        """
        ids = self.chat_ids(self.tok, messages)
        spans = []
        for i in sorted(j % len(messages) for j in trained):
            assert messages[i]["role"] == "assistant"
            start = len(self.chat_ids(self.tok, messages[:i], add_generation_prompt=True))
            end = len(self.chat_ids(self.tok, messages[: i + 1]))
            spans.append((start, end, 1.0))
        return ids, spans

    def _weight_chars(self, spans: list[tuple[int, int, float]], text: str, chars: list[tuple[int, int]],
                      weight: float) -> None:
        """Add spans of weight ``weight`` over character ranges of the last trained message ``text``."""
        base = spans[-1][0]
        for lo_char, hi_char in chars:
            if 0 <= lo_char < hi_char:
                spans.append((base + len(self.encode(text[:lo_char])), base + len(self.encode(text[:hi_char])),
                              weight))

    def _two_turns(self, p: Any, attempt: str, feedback: str, target: str, right: bool) -> Example:
        return self._conv([{"role": "user", "content": self.templates.render_attempt(p)},
                           {"role": "assistant", "content": attempt},
                           {"role": "user", "content": self.templates.render_refine(feedback)},
                           {"role": "assistant", "content": target}], trained=(1, 3) if right else (3,))

    # -- the four kinds -------------------------------------------------------------------

    def solve(self, rng: random.Random) -> Example:
        p = rng.choice(self.problems)
        return self._conv([{"role": "user", "content": self.templates.render_attempt(p)},
                           {"role": "assistant", "content": self.own_solution(p, rng)}])

    def refine(self, rng: random.Random) -> Example:
        """After the oracle's feedback: the revision; loss on it (and on the attempt when taught)."""
        p, attempt, right = self._attempt(rng, self.cfg.refine_correct_frac)
        feedback = self.bench.oracle_feedback(p, attempt)
        if corrected_step(feedback) and rng.random() < self.cfg.counterfactual_frac:
            feedback = counterfactual_feedback(p, feedback, rng)
        # The corrected step is copied from the feedback; the steps after it are the solver's own.
        target = self.bench.apply_feedback(p, attempt, feedback, revision=True, arithmetic=self.beliefs.op)
        ids, spans = self._two_turns(p, attempt, feedback, target, right)
        # Up-weight the tokens dictated by the context rather than computed: the corrected value
        # the feedback states, or the final answer a revision keeps or takes. They teach the
        # solver to read instead of recomputing its own (possibly wrong) belief.
        if self.cfg.feedback_token_weight != 1.0:
            chars = (-1, -1)
            flagged = corrected_step(feedback)
            if flagged:
                fixed = format_step(flagged[1])
                at = target.find(fixed)
                if at >= 0:
                    chars = (at + fixed.rindex("=") + 1, at + len(fixed))
            elif target.startswith("#"):
                chars = (1, len(target))
            self._weight_chars(spans, target, [chars], self.cfg.feedback_token_weight)
        return ids, spans

    def resolve(self, rng: random.Random) -> Example:
        """After the null feedback g∅: a genuine new attempt, drawn independently of the first."""
        p, attempt, right = self._attempt(rng, self.cfg.refine_correct_frac)
        return self._two_turns(p, attempt, self.templates.null_feedback, self.own_solution(p, rng), right)

    def critique_attempt(self, p: Any, rng: random.Random) -> str:
        """An attempt for a critique example, from ``cfg.critique_mix``: the gold solution, gold
        with one random slip (``inject_errors`` with no second error: a uniformly random step), or
        the solution of another solver, whose misconception set is drawn afresh for the example
        (the same rate as the base's, with its random slips at ``solver_error_rate``). Over the
        draws every operation is equally likely to be wrong, so its identity says nothing."""
        mix = self.cfg.critique_mix
        source = rng.choices(("gold", "slip", "other"), weights=(mix.gold, mix.slip, mix.other))[0]
        gold = self.bench.solution(p)
        if source == "gold":
            return gold
        if source == "slip":
            return self.bench.inject_errors(gold, rng, second_error_rate=0.0)
        other = Misconceptions(self.cfg.misconceptions, f"other:{rng.getrandbits(64)}", self.ops, self.max_operand)
        attempt = other.solution(p)
        return self.bench.inject_errors(attempt, rng) if rng.random() < self.cfg.solver_error_rate else attempt

    def critique(self, rng: random.Random) -> Example:
        p = rng.choice(self.problems)
        attempt = self.critique_attempt(p, rng)
        feedback = self.bench.oracle_feedback(p, attempt)
        if rng.random() < self.cfg.critic_noise:
            feedback = noisy_feedback(p, attempt, feedback, rng, self.templates.null_feedback)
        ids, spans = self._conv([{"role": "user", "content": self.templates.render_feedback(p, attempt)},
                                 {"role": "assistant", "content": feedback}])
        # Up-weight the decisions: each verdict's first character and the values the critic
        # computes; the rest (separators, copied operands) is easy.
        if self.cfg.critic_token_weight != 1.0:
            self._weight_chars(spans, feedback, decision_chars(feedback), self.cfg.critic_token_weight)
        return ids, spans

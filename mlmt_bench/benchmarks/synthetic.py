"""``synthetic-arith``: multi-step integer arithmetic with written steps and an oracle critic.

The embedded default benchmark: small enough that a 1-10M parameter character-level model
learns it on a laptop CPU in minutes, yet a real learning problem with a verifiable answer,
room to make (and to fix) mistakes, and a rule-based critic that knows the gold solution.

A problem is an expression over small positive integers evaluated **left to right** (no
operator precedence), every intermediate result reduced modulo ``modulus``::

    problem   7+5*3-4
    solution  7+5=12;12*3=36;36-4=32;#32
    answer    32

The solution writes one step per operator, ``a<op>b=r`` separated by ``;``, then ``#`` and the
final answer. ``difficulty`` is the number of steps (operators); ``max_operand`` bounds the
operands (1..max_operand) and ``modulus`` the intermediate values (0..modulus-1).

Besides the problems, the module provides what the bootstrap and the ``oracle_feedback``
ablation need:

- :func:`oracle_feedback` ``(problem, attempt) -> str``: a critic that sees the gold steps and
  names the first wrong step with its correct value (``step 2 wrong: 12*3=36``), a wrong final
  line (``answer wrong: #32``) or says ``answer ok``.
- :func:`inject_errors` ``(solution, rng) -> str``: a plausible wrong attempt (an arithmetic
  slip, a miscopied operand or operator, a dropped step ...) whose later steps are computed
  consistently from the mistake, as a model would.
- :func:`apply_feedback` ``(problem, attempt, feedback) -> str``: the scripted corrector that
  applies only the feedback's correction and recomputes what follows.
"""

from __future__ import annotations

import random
import re
from typing import Any, ClassVar, Sequence

from mlmt_bench.benchmarks.base import Benchmark
from mlmt_bench.errors import UserError
from mlmt_bench.types import Problem, PromptTemplates

OPS = "+-*"
ANSWER_MARK = "#"
STEP_SEP = ";"
OK_FEEDBACK = "answer ok"

#: Short on purpose: the tiny models pay for every character.
TEMPLATES = PromptTemplates(
    attempt="{problem}",
    feedback="{problem}\n{attempt}\ncheck",
    refine="feedback: {feedback}",
    null_feedback="check again",
)

Step = tuple[int, str, int, int]  # (a, op, b, result)

_STEP_RE = re.compile(r"^\s*(-?\d+)\s*([+\-*])\s*(-?\d+)\s*=\s*(-?\d+)\s*$")
_ANSWER_RE = re.compile(r"#\s*(-?\d+)")
_FEEDBACK_STEP_RE = re.compile(r"step\s+(\d+)\s+wrong:\s*(-?\d+)\s*([+\-*])\s*(-?\d+)\s*=\s*(-?\d+)")
_FEEDBACK_ANSWER_RE = re.compile(r"answer wrong:\s*#\s*(-?\d+)")
_PROBLEM_RE = re.compile(r"^\s*(\d+)((?:\s*[+\-*]\s*\d+)+)\s*$")


# --------------------------------------------------------------------------- arithmetic


def apply_op(a: int, op: str, b: int, modulus: int) -> int:
    if op == "+":
        r = a + b
    elif op == "-":
        r = a - b
    elif op == "*":
        r = a * b
    else:
        raise ValueError(f"unknown operator {op!r}")
    return r % modulus


def format_step(step: Step) -> str:
    a, op, b, r = step
    return f"{a}{op}{b}={r}"


def format_solution(steps: Sequence[Step], answer: int | None = None) -> str:
    if answer is None:
        answer = steps[-1][3]
    return STEP_SEP.join(format_step(s) for s in steps) + f"{STEP_SEP}{ANSWER_MARK}{answer}"


def solve(first: int, ops: Sequence[tuple[str, int]], modulus: int) -> list[Step]:
    """The gold steps for ``first op1 b1 op2 b2 ...`` evaluated left to right mod ``modulus``."""
    steps: list[Step] = []
    a = first % modulus
    for op, b in ops:
        r = apply_op(a, op, b, modulus)
        steps.append((a, op, b, r))
        a = r
    return steps


def parse_problem(text: str) -> tuple[int, list[tuple[str, int]]]:
    """``"7+5*3-4"`` -> ``(7, [("+", 5), ("*", 3), ("-", 4)])``; raises ValueError if malformed."""
    m = _PROBLEM_RE.match(text)
    if not m:
        raise ValueError(f"not a synthetic-arith problem: {text!r}")
    ops = [(op, int(b)) for op, b in re.findall(r"([+\-*])\s*(\d+)", m.group(2))]
    return int(m.group(1)), ops


def parse_attempt(text: str) -> tuple[list[Step | None], int | None]:
    """Steps written before the answer mark (None for an unreadable step) and the final answer.

    Never raises. The answer is the integer after the last ``#`` (None if there is none).
    """
    answers = _ANSWER_RE.findall(text)
    answer = int(answers[-1]) if answers else None
    body = text.split(ANSWER_MARK, 1)[0]
    steps: list[Step | None] = []
    for part in body.split(STEP_SEP):
        if not part.strip():
            continue
        m = _STEP_RE.match(part)
        steps.append((int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4))) if m else None)
    return steps, answer


def _gold_steps(problem: Problem) -> list[Step]:
    steps = problem.metadata.get("steps")
    if steps:
        return [(int(a), str(op), int(b), int(r)) for a, op, b, r in steps]
    first, ops = parse_problem(problem.prompt)
    return solve(first, ops, int(problem.metadata.get("modulus", 100)))


def _modulus(problem: Problem) -> int:
    return int(problem.metadata.get("modulus", 100))


# --------------------------------------------------------------------------- oracle critic


def oracle_feedback(problem: Problem, attempt: str) -> str:
    """Rule-based feedback from a critic that sees the gold steps.

    - ``answer ok`` if the final answer is right;
    - else ``step i wrong: <gold step i>`` for the first step (1-based) that is missing,
      unreadable or differs from the gold one;
    - else (all steps right, wrong or missing final line) ``answer wrong: #<gold answer>``.
    """
    gold = _gold_steps(problem)
    steps, answer = parse_attempt(attempt)
    if answer is not None and problem.answer is not None and str(answer) == str(problem.answer).strip():
        return OK_FEEDBACK
    for i, g in enumerate(gold):
        if i >= len(steps) or steps[i] != g:
            return f"step {i + 1} wrong: {format_step(g)}"
    return f"answer wrong: {ANSWER_MARK}{gold[-1][3]}"


def apply_feedback(problem: Problem, attempt: str, feedback: str) -> str:
    """The scripted "follow the feedback" corrector.

    Applies only what the feedback states: ``step i wrong: S`` keeps the attempt's steps
    before ``i``, writes ``S`` as step ``i`` and recomputes the remaining steps from the
    problem; ``answer wrong: #N`` keeps the steps and rewrites the final line. Any other
    feedback (``answer ok``, null feedback, nonsense) returns the attempt unchanged.
    """
    m = _FEEDBACK_STEP_RE.search(feedback)
    if m:
        i = int(m.group(1))
        first, ops = parse_problem(problem.prompt)
        n = len(ops)
        if not 1 <= i <= n:
            return attempt
        steps, _ = parse_attempt(attempt)
        kept = [s for s in steps[: i - 1]]
        if len(kept) < i - 1 or any(s is None for s in kept):
            return attempt  # the feedback claims earlier steps are fine, but they are unreadable
        fixed: Step = (int(m.group(2)), m.group(3), int(m.group(4)), int(m.group(5)))
        new_steps: list[Step] = [s for s in kept if s is not None] + [fixed]
        a = fixed[3]
        modulus = _modulus(problem)
        for op, b in ops[i:]:
            r = apply_op(a, op, b, modulus)
            new_steps.append((a, op, b, r))
            a = r
        return format_solution(new_steps)
    m = _FEEDBACK_ANSWER_RE.search(feedback)
    if m:
        body = attempt.split(ANSWER_MARK, 1)[0].rstrip().rstrip(STEP_SEP)
        return f"{body}{STEP_SEP}{ANSWER_MARK}{int(m.group(1))}" if body else f"{ANSWER_MARK}{int(m.group(1))}"
    return attempt


# --------------------------------------------------------------------------- error injection

_ERROR_KINDS = ("arith", "operand", "operator", "copy", "answer", "truncate")
_ERROR_WEIGHTS = (0.55, 0.15, 0.10, 0.10, 0.05, 0.05)


def inject_errors(solution: str, rng: random.Random, *, modulus: int = 100, max_operand: int = 9,
                  second_error_rate: float = 0.15) -> str:
    """A wrong attempt derived from a gold ``solution`` (as written by :func:`format_solution`).

    One mistake (kind drawn from arith 55%, operand 15%, operator 10%, copy 10%, answer 5%,
    truncate 5%) at a random step; later steps are recomputed from the mistaken value, the
    way a model that slipped once would continue. With probability ``second_error_rate`` a
    second arithmetic slip follows at a later step. The final answer always differs from the
    gold one.
    """
    gold, gold_answer = parse_attempt(solution)
    if not gold or any(s is None for s in gold) or gold_answer is None:
        raise ValueError(f"not a well-formed solution: {solution!r}")
    gold_steps: list[Step] = [s for s in gold if s is not None]
    for _ in range(50):
        text = _inject_once(gold_steps, rng, modulus, max_operand, second_error_rate)
        _, ans = parse_attempt(text)
        if ans != gold_answer:
            return text
    # Fallback that always differs: a wrong final line.
    return format_solution(gold_steps, (gold_answer + 1 + rng.randrange(modulus - 1)) % modulus)


def _slip(value: int, rng: random.Random, modulus: int) -> int:
    """A plausible wrong value near ``value`` (off by one, by ten, a swapped digit ...)."""
    for _ in range(20):
        choice = rng.random()
        if choice < 0.4:
            cand = value + rng.choice((-2, -1, 1, 2))
        elif choice < 0.6:
            cand = value + rng.choice((-10, 10))
        elif choice < 0.75 and value >= 10:
            cand = int(str(value)[::-1])
        else:
            cand = rng.randrange(modulus)
        cand %= modulus
        if cand != value:
            return cand
    return (value + 1) % modulus


def _inject_once(gold: list[Step], rng: random.Random, modulus: int, max_operand: int,
                 second_error_rate: float) -> str:
    n = len(gold)
    kind = rng.choices(_ERROR_KINDS, weights=_ERROR_WEIGHTS)[0]
    if kind == "answer":
        return format_solution(gold, _slip(gold[-1][3], rng, modulus))
    if kind == "truncate" and n >= 2:
        keep = rng.randrange(1, n)
        return format_solution(gold[:keep])
    i = rng.randrange(n)
    second = rng.randrange(i + 1, n) if i + 1 < n and rng.random() < second_error_rate else None
    steps: list[Step] = list(gold[:i])
    a = gold[i][0]
    for j in range(i, n):
        _, op, b, _ = gold[j]
        if j == i:
            if kind == "operand" and max_operand > 1:
                b = rng.choice([x for x in range(1, max_operand + 1) if x != b])
            elif kind == "operator":
                op = rng.choice([o for o in OPS if o != op])
            elif kind == "copy":
                a = _slip(a, rng, modulus)
            r = apply_op(a, op, b, modulus)
            if kind in ("arith", "truncate"):  # truncate falls back to a slip on one-step problems
                r = _slip(r, rng, modulus)
        else:
            r = apply_op(a, op, b, modulus)
            if j == second:
                r = _slip(r, rng, modulus)
        steps.append((a, op, b, r))
        a = r
    return format_solution(steps)


# --------------------------------------------------------------------------- benchmark


class SyntheticArith(Benchmark):
    """Left-to-right integer arithmetic with written steps (see the module docstring).

    Options: ``difficulty`` (steps per problem, default 3), ``max_operand`` (default 9),
    ``modulus`` (default 100), ``ops`` (operators used, default ``"+-*"``), ``n_train``
    (default 20000) and ``n_eval`` (default 500). Both splits are generated from ``seed``;
    the eval split depends only on the seed and the problem options (not on ``n_train``),
    and no expression appears in both splits.
    """

    name: ClassVar[str] = "synthetic-arith"
    default_verifier: ClassVar[str] = "synthetic"
    splits: ClassVar[tuple[str, ...]] = ("train", "eval")
    templates: ClassVar[PromptTemplates] = TEMPLATES

    def __init__(self, path: str | None = None, seed: int = 0, difficulty: int = 3, max_operand: int = 9,
                 modulus: int = 100, ops: str = OPS, n_train: int = 20000, n_eval: int = 500,
                 **options: Any) -> None:
        super().__init__(path=path, seed=seed, **options)
        if path is not None:
            raise UserError("benchmark synthetic-arith: generated locally, it takes no path")
        if not 1 <= int(difficulty) <= 32:
            raise UserError(f"benchmark synthetic-arith: difficulty must be 1..32 steps, got {difficulty!r}")
        if int(max_operand) < 1 or int(modulus) < 2:
            raise UserError("benchmark synthetic-arith: need max_operand >= 1 and modulus >= 2")
        if not ops or any(o not in OPS for o in ops):
            raise UserError(f"benchmark synthetic-arith: ops must be a non-empty subset of {OPS!r}, got {ops!r}")
        self.difficulty = int(difficulty)
        self.max_operand = int(max_operand)
        self.modulus = int(modulus)
        self.ops = "".join(dict.fromkeys(ops))
        self.n_train = int(n_train)
        self.n_eval = int(n_eval)
        space = self.max_operand ** (self.difficulty + 1) * len(self.ops) ** self.difficulty
        if self.n_train + self.n_eval > space // 2:
            raise UserError(f"benchmark synthetic-arith: {self.n_train + self.n_eval} problems asked but only "
                            f"{space} distinct expressions exist at difficulty {self.difficulty}; "
                            "lower n_train/n_eval or raise difficulty/max_operand")
        self._cache: dict[str, list[Problem]] = {}

    # -- problems

    def _options_key(self) -> str:
        return f"{self.difficulty}:{self.max_operand}:{self.modulus}:{self.ops}"

    def _expression(self, rng: random.Random) -> tuple[int, list[tuple[str, int]]]:
        first = rng.randint(1, self.max_operand)
        return first, [(rng.choice(self.ops), rng.randint(1, self.max_operand)) for _ in range(self.difficulty)]

    def _generate(self, split: str, n: int, exclude: set[str]) -> list[Problem]:
        rng = random.Random(f"synthetic-arith:{self.seed}:{self._options_key()}:{split}")
        seen = set(exclude)
        problems: list[Problem] = []
        while len(problems) < n:
            first, ops = self._expression(rng)
            prompt = str(first) + "".join(f"{op}{b}" for op, b in ops)
            if prompt in seen:
                continue
            seen.add(prompt)
            steps = solve(first, ops, self.modulus)
            problems.append(Problem(
                id=f"{split}/{len(problems):06d}",
                benchmark=self.name,
                prompt=prompt,
                answer=str(steps[-1][3]),
                metadata={
                    "steps": [list(s) for s in steps],
                    "solution": format_solution(steps),
                    "difficulty": self.difficulty,
                    "modulus": self.modulus,
                },
            ))
        return problems

    def load(self, split: str) -> list[Problem]:
        self.check_split(split)
        if split not in self._cache:
            eval_problems = self._cache.get("eval") or self._generate("eval", self.n_eval, set())
            self._cache["eval"] = eval_problems
            if split == "train":
                self._cache["train"] = self._generate("train", self.n_train, {p.prompt for p in eval_problems})
        return list(self._cache[split])

    # -- the pieces the bootstrap and the oracle ablation use

    @staticmethod
    def solution(problem: Problem) -> str:
        """The gold written solution of a problem."""
        return str(problem.metadata.get("solution") or format_solution(_gold_steps(problem)))

    def oracle_feedback(self, problem: Problem, attempt: str) -> str:
        return oracle_feedback(problem, attempt)

    def inject_errors(self, solution: str, rng: random.Random) -> str:
        return inject_errors(solution, rng, modulus=self.modulus, max_operand=self.max_operand)

    def apply_feedback(self, problem: Problem, attempt: str, feedback: str) -> str:
        return apply_feedback(problem, attempt, feedback)

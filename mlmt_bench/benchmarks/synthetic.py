"""``synthetic-arith``: multi-step integer arithmetic with written steps and an oracle critic.

The embedded default benchmark: small enough that a ~0.5M-parameter character-level model
learns it on a laptop CPU in a minute or two, yet a real learning problem with a verifiable
answer, room to make (and to fix) mistakes, and a rule-based critic that knows the gold steps.

A problem is an expression over small positive integers evaluated **left to right** (no
operator precedence), every intermediate result reduced modulo ``modulus``::

    problem   9-6+9+1                       7+5*3-4       (ops="+-*")
    solution  9-6=3;3+9=12;12+1=13;#13      7+5=12;12*3=36;36-4=32;#32
    answer    13                            32

The solution writes one step per operator, ``a<op>b=r`` separated by ``;``, then ``#`` and the
final answer. Options: ``difficulty`` is the number of steps (operators, default 3),
``ops`` the operators drawn from (default ``"+-"``; ``"+-*"`` adds products mod 100, much
harder for a tiny model), ``max_operand`` bounds the operands (1..max_operand, default 9) and
``modulus`` the values (0..modulus-1, default 100). Ready-made settings:
``registry/benchmarks/synthetic-*.yaml``.

Besides the problems, the module provides what the warm start and the ``oracle_feedback``
ablation need:

- :func:`oracle_feedback` ``(problem, attempt) -> str``: a critic that sees the gold steps. It
  recomputes each step, quotes the attempt's and judges it (``9-6>3 9-6=3 ok;3+9>12 3+9=11
  wrong``), stops at the first wrong one, whose recomputed form is the correction, or ends
  ``answer wrong: #13`` when only the final line is wrong.
- :func:`inject_errors` ``(solution, rng) -> str``: a plausible wrong attempt (an arithmetic
  slip, a miscopied operand or operator, a dropped step ...) whose later steps are computed
  consistently from the mistake, as a model would.
- :func:`apply_feedback` ``(problem, attempt, feedback) -> str``: the scripted corrector that
  applies only the feedback's correction and recomputes what follows (``revision=True``:
  only the part that changes, ``3+9=12;12+1=13;#13``, the form the warm solver writes).
- :func:`full_response` ``(problem, attempt, revision) -> str``: such a revision spliced into
  its attempt, the full corrected solution (what ``critique_grpo`` and ``self_distill`` train
  as a response to the problem alone).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from mlmt_bench.benchmarks.base import DEFAULT_MAX_OPERAND, DEFAULT_OPS, OracleBenchmark, generated_split
from mlmt_bench.benchmarks.redaction import redact_numbers
from mlmt_bench.errors import UserError
from mlmt_bench.types import Problem, PromptTemplates, Redaction

OPS = "+-*"
ANSWER_MARK = "#"
STEP_SEP = ";"
OK_FEEDBACK = "answer ok"
STEP_OK = "ok"
STEP_WRONG = "wrong"

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
#: ``C1 ok;C2 ok;a<op>b>r a<op>b=w wrong``: the approved checks (group 1), then the flagged step's
#: operation and its recomputed result (the quoted ``w`` is not used)
_FEEDBACK_STEP_RE = re.compile(r"^((?:[^;]*\bok\s*;)*)\s*(-?\d+)\s*([+\-*])\s*(-?\d+)\s*>\s*(-?\d+)\s+"
                               r"[^;]*?\bwrong\b")
_OK_RE = re.compile(r"\bok\b")
_FEEDBACK_ANSWER_RE = re.compile(r"answer wrong:\s*#\s*(-?\d+)")
_PROBLEM_RE = re.compile(r"^\s*(\d+)((?:\s*[+\-*]\s*\d+)+)\s*$")
#: a value the feedback supplies as an answer: after ``>`` or in ``answer wrong: #N`` (group 1), or
#: a redacted one (``?``: group 1 None)
_STATED_RE = re.compile(r"(?:>|answer wrong:\s*#)\s*(?:(-?\d+)|\?)")


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


Arithmetic = Callable[[int, str, int, int], int]  # (a, op, b, modulus) -> result


def solve(first: int, ops: Sequence[tuple[str, int]], modulus: int, arithmetic: Arithmetic = apply_op) -> list[Step]:
    """The gold steps for ``first op1 b1 op2 b2 ...`` evaluated left to right mod ``modulus``.

    ``arithmetic`` replaces the true one (e.g. to write the solution of a solver with
    misconceptions, as the warm start does).
    """
    steps: list[Step] = []
    a = first % modulus
    for op, b in ops:
        r = arithmetic(a, op, b, modulus)
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


def check_step(gold: Step, written: Step | None, verdict: str) -> str:
    """One step of a check: the gold step's operation, ``>`` and the recomputed result; the same
    operation, ``=`` and the result the attempt wrote (``?`` if unreadable or missing); then the
    verdict: ``3+9>12 3+9=11 wrong``."""
    a, op, b, r = gold
    seen = "?" if written is None else str(written[3])
    return f"{a}{op}{b}>{r} {a}{op}{b}={seen} {verdict}"


def _written(steps: Sequence[Step | None], j: int) -> Step | None:
    return steps[j] if j < len(steps) else None


def step_feedback(gold: Sequence[Step], i: int, step: Step, written: Sequence[Step | None] = ()) -> str:
    """Feedback flagging step ``i`` (1-based) with ``step`` as its correct form: the gold steps
    before it checked and approved, then step ``i`` judged wrong (``written``: the attempt's
    steps, whose results the check quotes): ``7+5>12 7+5=12 ok;12*3>36 12*3=35 wrong``."""
    return "".join(check_step(g, _written(written, j), STEP_OK) + STEP_SEP for j, g in enumerate(gold[: i - 1])) + \
        check_step(step, _written(written, i - 1), STEP_WRONG)


def approve_all(gold: Sequence[Step]) -> str:
    """Every step checked and approved, then the answer: ``7+5>12 7+5=12 ok;...;answer ok``."""
    return "".join(check_step(g, g, STEP_OK) + STEP_SEP for g in gold) + OK_FEEDBACK


def feedback_is_ok(feedback: str) -> bool:
    """Whether the feedback (oracle's or a critic's) says the attempt is right."""
    return feedback.strip().endswith(OK_FEEDBACK)


def corrected_step(feedback: str) -> tuple[int, Step] | None:
    """``(i, step)`` of a feedback that flags step ``i`` (1-based) with its correct form, else None."""
    m = _FEEDBACK_STEP_RE.search(feedback)
    if not m:
        return None
    return len(_OK_RE.findall(m.group(1))) + 1, (int(m.group(2)), m.group(3), int(m.group(4)), int(m.group(5)))


def oracle_feedback(problem: Problem, attempt: str) -> str:
    """Rule-based feedback from a critic that sees the gold steps.

    **(v3)** It checks the way a verifier would, step by step: the step's operation, ``>`` and
    the result recomputed from the problem; the operation again, ``=`` and the result the attempt
    wrote; then its verdict, ``ok`` when the attempt wrote the gold step. It stops at the first
    step that is missing, unreadable or differs, whose recomputed form is the correction. A right
    final answer gets every step approved and ``answer ok``::

        7+5=12;12*3=35;35-4=31;#31   ->  7+5>12 7+5=12 ok;12*3>36 12*3=35 wrong
        7+5=12;12*3=36;36-4=32;#32   ->  7+5>12 7+5=12 ok;12*3>36 12*3=36 ok;36-4>32 36-4=32 ok;answer ok
        7+5=12;12*3=36;36-4=32;#30   ->  ...;36-4>32 36-4=32 ok;answer wrong: #32

    Why this shape (each tried on a tiny-0.5m base; docs in README "Tiny models"): asked to judge
    a step in one token before computing anything, the model can only recall which operations a
    solver gets wrong (v2's shortcut); asked to recompute ``3+9=`` it copies the attempt's
    ``3+9=11`` (an induction copy), and right after quoting the attempt's result it copies the
    quote. After ``>``, which no attempt contains, there is nothing to copy, so it computes, with
    the true arithmetic (the solver's ``=`` carries its misconceptions) — but then, with the
    attempt's result far away, it approves everything. Writing the operation a second time with
    ``=`` makes the model quote the attempt's result (a copy it is good at) next to its own, and
    the verdict compares the two. The price: a long feedback (about 60 characters), and one on
    a right attempt states its (right) answer.
    """
    gold = _gold_steps(problem)
    steps, answer = parse_attempt(attempt)
    if answer is not None and problem.answer is not None and str(answer) == str(problem.answer).strip():
        return approve_all(gold)  # a right answer is never flagged, even if a step slipped
    for i, g in enumerate(gold):
        if i >= len(steps) or steps[i] != g:
            return step_feedback(gold, i + 1, g, steps)
    return "".join(check_step(g, g, STEP_OK) + STEP_SEP for g in gold) + f"answer wrong: {ANSWER_MARK}{gold[-1][3]}"


#: a value the feedback supplies: a step's recomputed result (after ``>``) or a final line (after ``#``)
_SUPPLIED_RE = re.compile(r"([>#]\s*)(\d+)")
_CHECKED_RE = re.compile(r"(>\s*)(\d+)")
_WRONG_ANSWER_RE = re.compile(r"(answer wrong:\s*#\s*)(\d+)")


def feedback_edits(problem: Problem, attempt: str, feedback: str) -> dict[str, str]:
    """The probe's edits of a feedback in the checking format of :func:`oracle_feedback` (the
    feedback perturbation probe, METHOD v4; :mod:`mlmt_bench.benchmarks.perturbations`)::

        attempt   9-6=3;3+9=11;11+1=12;#12
        feedback  9-6>3 9-6=3 ok;3+9>12 3+9=11 wrong
        values_removed  9-6>3 9-6=3 ok;3+9>11 3+9=11 wrong    (each > value: the attempt's step result)
        last_shifted    9-6>3 9-6=3 ok;3+9>13 3+9=11 wrong    (the last > or # value + 1)
        approve_gold    9-6>3 9-6=3 ok;3+9>12 3+9=12 ok;12+1>13 12+1=13 ok;answer ok
        approve_own     9-6>3 9-6=3 ok;3+9>11 3+9=11 ok;11+1>12 11+1=12 ok;answer ok

    ``values_removed``: the value after ``>`` in the feedback's ``j``-th check (``;``-separated)
    becomes the attempt's result at step ``j`` (its final answer where that step is missing or
    unreadable; nothing where it has none either), and ``answer wrong: #N`` the attempt's final
    answer: what is left states only the attempt's own values. ``last_shifted``: the last value
    after ``>`` or ``#`` + 1 (no modulus; unchanged when there is none). ``approve_gold`` is
    :func:`approve_all` of the gold steps, ``approve_own`` of the attempt's readable steps (only
    ``answer ok`` when none is readable). Pure; never raises.
    """
    steps, answer = parse_attempt(attempt)
    final = "" if answer is None else str(answer)

    def own(j: int) -> str:
        step = steps[j] if j < len(steps) else None
        return final if step is None else str(step[3])

    parts = feedback.split(STEP_SEP)
    removed = _put(_WRONG_ANSWER_RE, STEP_SEP.join(_put(_CHECKED_RE, part, own(j)) for j, part in enumerate(parts)),
                   final)
    supplied = list(_SUPPLIED_RE.finditer(feedback))
    shifted = feedback
    if supplied:
        m = supplied[-1]
        shifted = feedback[: m.start(2)] + str(int(m.group(2)) + 1) + feedback[m.end(2):]
    return {"values_removed": removed, "last_shifted": shifted, "approve_gold": approve_all(_gold_steps(problem)),
            "approve_own": approve_all([s for s in steps if s is not None])}


#: one check of the checking format, ``3+9>12 3+9=11 wrong``: its six numbers (groups 2, 4, 6, 8, 10, 12: the
#: operands and the recomputed result, then the operands and the quoted result) with what lies between them
_CHECK_RE = re.compile(r"^(\s*)(-?\d+|\?)(\s*[+\-*]\s*)(-?\d+|\?)(\s*>\s*)(-?\d+|\?)(\s+)(-?\d+|\?)(\s*[+\-*]\s*)"
                       r"(-?\d+|\?)(\s*=\s*)(-?\d+|\?)(.*)$", re.S)
_CHECK_NUMBERS = (2, 4, 6, 8, 10, 12)
_CHECK_OPS = (3, 9)


def redact_checks(attempt: str, feedback: str) -> Redaction:
    """synthetic-arith's redaction rule (``feedback.redact``, METHOD v4): what a check may show is
    the attempt's own step, so every number of the feedback's ``j``-th check (``;``-separated) is
    replaced by the attempt's number at the same place of its step ``j`` (operands, recomputed and
    quoted result), and ``answer wrong: #N`` by the attempt's final answer; ``?`` where the attempt
    has no such number (a step missing or unreadable). Any other number of a check that is not one
    of the attempt's step ``j`` becomes ``?``. Left: the verdicts and which step they judge::

        attempt   9-6=3;3+9=11;11+1=12;#12
        feedback  9-6>3 9-6=3 ok;3+9>12 3+9=11 wrong            (12: the critic's value)
        shown     9-6>3 9-6=3 ok;3+9>11 3+9=11 wrong            (1 number replaced)
        feedback  9-6>3 9-6=3 ok;3+9>12 3+9=12 ok;12+1>13 12+1=13 ok;answer ok    (approve-all, gold)
        shown     9-6>3 9-6=3 ok;3+9>11 3+9=11 ok;11+1>12 11+1=12 ok;answer ok

    Why not the numeric rule of other benchmarks (numbers in neither x nor z become ``?``): here
    operands are 1-9 and an attempt writes several results, so a shifted or gold value very often
    occurs somewhere in x or z and was kept and copied (the shipped seed-10 base, 500 test problems:
    the last value shifted by one still took acc@t2 from 36.0% to 4.8%); and the refiner reads a
    check in this format, whose ``>`` never held a ``?`` before, as a value to write (a stray
    digit). Replaced by the attempt's own, a check reads as no correction (the probe's
    ``values_removed`` row: acc@t2 = acc@t1). Pure; ``removed`` counts the numbers (and operators)
    replaced and ``share`` their characters' share of the feedback."""
    steps, answer = parse_attempt(attempt)
    final = "?" if answer is None else str(answer)
    shown: list[tuple[str, int, int]] = []  # per check: its text, numbers replaced, characters replaced
    for j, part in enumerate(feedback.split(STEP_SEP)):
        step = steps[j] if j < len(steps) else None
        check = _CHECK_RE.match(part)
        lead = len(part) - len(part.lstrip())
        wrong = _WRONG_ANSWER_RE.fullmatch(part.strip())
        if check is not None:
            shown.append(_check_as_own(part, check, step))
        elif wrong is not None:
            a, b = lead + wrong.start(2), lead + wrong.end(2)
            same = _same_number(part[a:b], final)
            shown.append((part, 0, 0) if same else (part[:a] + final + part[b:], 1, b - a))
        else:  # free text: only the numbers of the attempt's step j
            r = redact_numbers(part, ["" if step is None else f"{step[0]};{step[2]};{step[3]}"])
            shown.append((r.text, r.removed, round(r.share * len(part))))
    return Redaction(STEP_SEP.join(t for t, _, _ in shown), sum(n for _, n, _ in shown),
                     sum(c for _, _, c in shown) / len(feedback) if feedback else 0.0)


def _check_as_own(part: str, check: re.Match[str], step: Step | None) -> tuple[str, int, int]:
    """One check (``check``: :data:`_CHECK_RE` on ``part``) with its numbers and operators made
    the attempt's ``step``'s (``?`` for a missing step, whose operators are kept): the text, the
    numbers and operators replaced, and their characters."""
    own = ["?"] * 3 if step is None else [str(step[0]), str(step[2]), str(step[3])]
    pieces, last, removed, chars = [], 0, 0, 0
    for k in sorted(_CHECK_NUMBERS + _CHECK_OPS):
        a, b = check.span(k)
        written = check.group(k)
        if k in _CHECK_OPS:  # the operator, its spacing kept
            value = written if step is None else re.sub(r"[+\-*]", step[1], written)
        else:
            value = own[_CHECK_NUMBERS.index(k) % 3]
        same = _same_number(written, value)
        pieces += [part[last:a], written if same else value]
        removed, chars, last = removed + (not same), chars + (0 if same else b - a), b
    return "".join(pieces) + part[last:], removed, chars


def _same_number(written: str, value: str) -> bool:
    """Whether ``written`` (digits or ``?``) is the number ``value`` (``"07"`` is ``"7"``)."""
    if written == value:
        return True
    try:
        return int(written) == int(value)
    except ValueError:
        return False


def _put(pattern: re.Pattern[str], text: str, value: str) -> str:
    """``text`` with the value (group 2) of every match of ``pattern`` replaced by ``value``."""
    return pattern.sub(lambda m: m.group(1) + value, text)


def apply_feedback(problem: Problem, attempt: str, feedback: str, *, revision: bool = False,
                   arithmetic: Arithmetic = apply_op) -> str:
    """The scripted "follow the feedback" corrector.

    Applies only what the feedback states: ``S1 ok;...;S wrong`` (step ``i`` after ``i-1``
    approved ones) keeps the attempt's steps before ``i``, writes ``S`` as step ``i`` and recomputes \
the remaining steps from the
    problem; ``answer wrong: #N`` keeps the steps and rewrites the final line. Any other
    feedback (``answer ok``, null feedback, nonsense) keeps the attempt.

    ``revision=True`` returns only what changes, in the form the warm-started solver writes
    its refinements: the steps from the corrected one on and the final line
    (``S;...;#N``), just ``#N`` for a corrected final line, or the attempt's own final line
    when the feedback asks for no change. The final answer is the same either way.
    ``arithmetic`` computes the recomputed steps (default: the true arithmetic).
    """
    flagged = corrected_step(feedback)
    if flagged:
        i, fixed = flagged
        first, ops = parse_problem(problem.prompt)
        if not 1 <= i <= len(ops):
            return _keep(attempt, revision)
        kept: list[Step] = []
        if not revision:
            steps, _ = parse_attempt(attempt)
            if len(steps) < i - 1 or any(s is None for s in steps[: i - 1]):
                return attempt  # the feedback claims earlier steps are fine, but they are unreadable
            kept = [s for s in steps[: i - 1] if s is not None]
        new_steps: list[Step] = kept + [fixed]
        a = fixed[3]
        modulus = _modulus(problem)
        for op, b in ops[i:]:
            r = arithmetic(a, op, b, modulus)
            new_steps.append((a, op, b, r))
            a = r
        return format_solution(new_steps)
    m = _FEEDBACK_ANSWER_RE.search(feedback)
    if m:
        if revision:
            return f"{ANSWER_MARK}{int(m.group(1))}"
        body = attempt.split(ANSWER_MARK, 1)[0].rstrip().rstrip(STEP_SEP)
        return f"{body}{STEP_SEP}{ANSWER_MARK}{int(m.group(1))}" if body else f"{ANSWER_MARK}{int(m.group(1))}"
    return _keep(attempt, revision)


def _keep(attempt: str, revision: bool) -> str:
    if not revision:
        return attempt
    _, answer = parse_attempt(attempt)
    return attempt if answer is None else f"{ANSWER_MARK}{answer}"


_FINAL_LINE_RE = re.compile(r"^\s*#\s*-?\d+\s*$")


def full_response(problem: Problem, attempt: str, revision: str) -> str:
    """A revision (``apply_feedback(..., revision=True)``'s form) spliced into its attempt: the
    full corrected solution, a complete answer to the problem alone. Pure; never raises.

    A revision of ``k`` steps and a final line rewrites the last ``k`` of the problem's ``n``
    steps, so the attempt's first ``n - k`` steps (as written) go before it::

        9-6=3;3+9=11;11+1=12;#12  +  3+9=12;12+1=13;#13  ->  9-6=3;3+9=12;12+1=13;#13

    A bare final line ``#N`` keeps the attempt's steps and takes the new final line; when ``N``
    is the attempt's own answer (the attempt unchanged), it gives the attempt. A malformed
    revision (an unreadable step, no final line or text after it, more steps than the problem
    has), or an attempt without the readable steps to keep, gives the revision as is. The
    result ends with the revision (or is the attempt, for an unchanged one), so it has the
    revision's final answer.
    """
    parts = revision.split(STEP_SEP)
    if revision.count(ANSWER_MARK) != 1 or not _FINAL_LINE_RE.match(parts[-1]):
        return revision
    steps = parts[:-1]
    if any(not _STEP_RE.match(step) for step in steps):
        return revision
    written = [part.strip() for part in attempt.split(ANSWER_MARK, 1)[0].split(STEP_SEP) if part.strip()]
    if not steps:  # only the final line changes, or nothing does
        _, own = parse_attempt(attempt)
        if own is not None and own == parse_attempt(revision)[1]:
            return attempt
        keep = len(written)
    else:
        try:
            keep = len(_gold_steps(problem)) - len(steps)
        except (ValueError, TypeError):
            return revision
    if keep < 0 or len(written) < keep or any(not _STEP_RE.match(part) for part in written[:keep]):
        return revision
    return "".join(part + STEP_SEP for part in written[:keep]) + revision


# --------------------------------------------------------------------------- error injection

_ERROR_KINDS = ("arith", "operand", "operator", "copy", "answer", "truncate")
_ERROR_WEIGHTS = (0.55, 0.15, 0.10, 0.10, 0.05, 0.05)


def inject_errors(solution: str, rng: random.Random, *, modulus: int = 100, max_operand: int = 9,
                  ops: str = DEFAULT_OPS, second_error_rate: float = 0.15) -> str:
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
        text = _inject_once(gold_steps, rng, modulus, max_operand, ops, second_error_rate)
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


def _inject_once(gold: list[Step], rng: random.Random, modulus: int, max_operand: int, ops: str,
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
                others = [o for o in (ops if len(ops) > 1 else OPS) if o != op]
                op = rng.choice(others)
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


class SyntheticArith(OracleBenchmark):
    """Left-to-right integer arithmetic with written steps (see the module docstring).

    Options: ``difficulty`` (steps per problem, default 3), ``max_operand`` (default 9),
    ``modulus`` (default 100), ``ops`` (operators used, default ``"+-"``), ``n_train``
    (default 20000), ``n_validation`` (default 500) and ``n_test`` (default 500). The three
    splits are generated from ``seed`` and are disjoint (no expression appears in two); ``test``
    depends only on the seed and the problem options, ``validation`` also on ``n_test``, and
    neither on ``n_train``.
    """

    name: ClassVar[str] = "synthetic-arith"
    default_verifier: ClassVar[str] = "synthetic"
    splits: ClassVar[tuple[str, ...]] = ("train", "validation", "test")
    templates: ClassVar[PromptTemplates] = TEMPLATES
    generated: ClassVar[bool] = True

    def __init__(self, path: str | None = None, seed: int = 0, difficulty: int = 3,
                 max_operand: int = DEFAULT_MAX_OPERAND,
                 modulus: int = 100, ops: str = DEFAULT_OPS, n_train: int = 20000, n_validation: int = 500,
                 n_test: int = 500, **options: Any) -> None:
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
        self.sizes = {"test": int(n_test), "validation": int(n_validation), "train": int(n_train)}
        if min(self.sizes.values()) < 0:
            raise UserError(f"benchmark synthetic-arith: split sizes must be >= 0, got {self.sizes}")
        space = self.max_operand ** (self.difficulty + 1) * len(self.ops) ** self.difficulty
        if sum(self.sizes.values()) > space // 2:
            raise UserError(f"benchmark synthetic-arith: {sum(self.sizes.values())} problems asked but only "
                            f"{space} distinct expressions exist at difficulty {self.difficulty}; "
                            "lower n_train/n_validation/n_test or raise difficulty/max_operand")
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
        return generated_split(split, self.sizes, self._cache, self._generate, lambda p: p.prompt)

    # -- the pieces the bootstrap and the oracle ablation use

    @staticmethod
    def solution(problem: Problem) -> str:
        """The gold written solution of a problem."""
        return str(problem.metadata.get("solution") or format_solution(_gold_steps(problem)))

    def oracle_feedback(self, problem: Problem, attempt: str) -> str:
        return oracle_feedback(problem, attempt)

    def feedback_verdict(self, feedback: str) -> bool | None:
        """True when the feedback ends ``answer ok`` (approves the attempt), else False: every
        other walk, or unreadable text, asks for a change."""
        return feedback_is_ok(feedback)

    def inject_errors(self, solution: str, rng: random.Random, second_error_rate: float = 0.15) -> str:
        return inject_errors(solution, rng, modulus=self.modulus, max_operand=self.max_operand, ops=self.ops,
                             second_error_rate=second_error_rate)

    def apply_feedback(self, problem: Problem, attempt: str, feedback: str, *, revision: bool = False,
                       arithmetic: Arithmetic = apply_op, **options: Any) -> str:
        # **options: the base's signature; any but `arithmetic` is a TypeError, as before
        return apply_feedback(problem, attempt, feedback, revision=revision, arithmetic=arithmetic, **options)

    def full_response(self, problem: Problem, attempt: str, refinement: str) -> str:
        """The solver's refinements are revisions (the base's curriculum teaches that form): the
        revision spliced into its attempt (:func:`full_response`)."""
        return full_response(problem, attempt, refinement)

    def redact_feedback(self, problem: Problem, attempt: str, feedback: str) -> Redaction:
        """Every number of a check becomes the attempt's own at its place (:func:`redact_checks`):
        ``3+9>12 3+9=11 wrong`` on an attempt that wrote ``3+9=11`` reads ``3+9>11 3+9=11 wrong``,
        which :func:`corrected_step` and :func:`apply_feedback` read as no correction."""
        return redact_checks(attempt, feedback)

    def stated_answer(self, feedback: str) -> str | None:
        """The last value the feedback supplies, as a final line ``#N``: the recomputed result
        after its last ``>``, or the ``N`` of ``answer wrong: #N`` where that comes later; None
        when it supplies none (or the last one is ``?``). Read from what the critic wrote (the
        critic as a second solver); the refiner is shown it redacted (:meth:`redact_feedback`)."""
        found = list(_STATED_RE.finditer(feedback))
        if not found or found[-1].group(1) is None:
            return None
        return f"{ANSWER_MARK}{int(found[-1].group(1))}"

    def feedback_perturbations(self, problem: Problem, attempt: str, feedback: str, *,
                               answer: str | None = None) -> dict[str, str | None]:
        """The probe's rows on the checking format (:func:`feedback_edits`) and the oracle's
        feedback; ``answer`` is not needed (the attempt's steps are read here)."""
        return {**super().feedback_perturbations(problem, attempt, feedback, answer=answer),
                **feedback_edits(problem, attempt, feedback)}

    def stated_values(self, feedback: str) -> list[str] | None:
        """The values the feedback states as results, in order: each recomputed step result (after
        ``>``) and a final line (after ``#``), canonical (``"07"`` -> ``"7"``). Operands and the
        quoted results after ``=`` are the problem's and the attempt's, not the feedback's."""
        return [str(int(m.group(2))) for m in _SUPPLIED_RE.finditer(feedback)]

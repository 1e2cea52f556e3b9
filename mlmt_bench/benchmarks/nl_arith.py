"""``nl-arith``: arithmetic and word problems in natural language, at a small pretrained model's level.

METHOD v4's real testbed (issue 33): SmolLM2-135M-Instruct scores about 1% on GSM8K, so it needs
a task it can partly solve, with knobs to set how hard. A problem is a start value and ``steps``
operations applied in order (``ops`` from ``+``, ``-``, ``*``; operands of ``digits`` digits;
subtractions never go below 0), written as one of two ``style`` s::

    plain   What is 7 + 5?                     What is (7 + 5) * 3?
    word    Tom has 7 apples. He buys 5 more apples. Then he gives 3 apples to a friend.
            How many apples does Tom have now?
            Anna has 4 boxes with 6 eggs in each box. How many eggs does Anna have?

(``style: mixed`` draws one of the two per problem.) The gold solution writes one equation per
step and the answer line: ``Step 1: 7 + 5 = 12.`` ... ``Answer: 9``. The prompt asks "Think step by
step, then write the final answer as 'Answer: <number>'"; the default verifier is ``stated-answer``
(:mod:`mlmt_bench.verifiers.stated_answer`: the exact integer of the last answer statement).

Splits are generated from ``seed`` and the problem options, and are disjoint by problem: no start
value and sequence of operations (``7+5-3``) is in two splits, whatever its words. ``test`` depends
only on the seed and the problem options, ``validation`` also on ``n_test``, ``train`` on both.

The oracle critic (:func:`oracle_feedback`) checks the attempt's written equations against the
gold steps and writes, in words, where the first wrong step is and what is wrong with it (an
arithmetic slip, a wrong operation, a wrong number, a missing step, the answer line), never a
value the attempt and the problem do not already contain; it ends with the strict verdict line
(:func:`mlmt_bench.benchmarks.base.verdict_line`). Its redaction rule is the numeric one of
:meth:`Benchmark.redact_feedback` (numbers in neither x nor z become ``?``), which therefore leaves
the oracle's feedback unchanged; the probe's edits are the free-text maths ones
(:func:`mlmt_bench.benchmarks.perturbations.math_perturbations`) plus the oracle's feedback.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from mlmt_bench.benchmarks.base import OracleBenchmark, generated_split, verdict_line
from mlmt_bench.benchmarks.perturbations import math_perturbations, numbers
from mlmt_bench.benchmarks.redaction import last_number
from mlmt_bench.errors import UserError
from mlmt_bench.types import VERDICT_INSTRUCTION, Problem, PromptTemplates
from mlmt_bench.verifiers.leaks import is_leak
from mlmt_bench.verifiers.stated_answer import StatedAnswerVerifier, stated_integer

OPS = "+-*"
STYLES = ("plain", "word", "mixed")
ANSWER_INSTRUCTION = "Think step by step, then write the final answer as 'Answer: <number>'."

TEMPLATES = PromptTemplates(
    attempt="{problem}\n\n" + ANSWER_INSTRUCTION,
    feedback=(
        "Here is a math problem and an attempted solution.\n\nProblem:\n{problem}\n\n"
        "Attempted solution:\n{attempt}\n\n"
        "Check the attempt step by step. Point out the first wrong step, if any, and say what is "
        "wrong with it. Do not state the correct answer. " + VERDICT_INSTRUCTION
    ),
    refine=(
        "Feedback on your solution:\n{feedback}\n\n"
        "Using this feedback, solve the problem again step by step, then write the final answer as "
        "'Answer: <number>'."
    ),
    null_feedback="Check your solution carefully for errors.",
)

Step = tuple[int, str, int, int]  # (a, op, b, result): one operation on the running value

_OP_NAMES = {"+": "an addition", "-": "a subtraction", "*": "a multiplication"}
_OP_VERBS = {"+": "add {b}", "-": "subtract {b}", "*": "multiply by {b}"}

# --------------------------------------------------------------------------- words

#: (name, subject pronoun, object pronoun)
_PEOPLE = (("Tom", "he", "him"), ("Anna", "she", "her"), ("Sam", "he", "him"), ("Lily", "she", "her"),
           ("Ben", "he", "him"), ("Maya", "she", "her"), ("Leo", "he", "him"), ("Emma", "she", "her"))
#: (singular, plural)
_ITEMS = (("apple", "apples"), ("pencil", "pencils"), ("marble", "marbles"), ("book", "books"),
          ("sticker", "stickers"), ("coin", "coins"), ("card", "cards"), ("shell", "shells"),
          ("cookie", "cookies"), ("egg", "eggs"))
_CONTAINERS = (("box", "boxes"), ("bag", "bags"), ("jar", "jars"), ("basket", "baskets"))
_ADD = ("{He} buys {b} more {items}.", "{He} finds {b} more {items}.", "A friend gives {him} {b} more {items}.")
_SUB = ("{He} gives {b} {items} to a friend.", "{He} loses {b} {items}.", "{He} sells {b} {items}.")
_MUL = ("The number of {items} {he} has is multiplied by {b}.",)


def _plural(n: int, noun: tuple[str, str]) -> str:
    return noun[0] if n == 1 else noun[1]


def apply_op(a: int, op: str, b: int) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    raise ValueError(f"unknown operator {op!r}")


def solve(first: int, ops: Sequence[tuple[str, int]]) -> list[Step]:
    """The gold steps of ``first`` followed by ``ops`` applied in order."""
    steps: list[Step] = []
    a = first
    for op, b in ops:
        r = apply_op(a, op, b)
        steps.append((a, op, b, r))
        a = r
    return steps


def format_solution(steps: Sequence[Step]) -> str:
    """``Step 1: 7 + 5 = 12.`` per step, then ``Answer: <last result>``."""
    lines = [f"Step {i}: {a} {op} {b} = {r}." for i, (a, op, b, r) in enumerate(steps, 1)]
    return "\n".join([*lines, f"Answer: {steps[-1][3]}"])


def worked_solution(problem: Problem, attempt: str) -> str:
    """The gold solution as a refiner that recomputes the step the oracle flags writes it: the
    first gold step ``attempt`` does not compute rightly (:func:`_right_steps`) worked out by
    :func:`worked_check` before its result (``Step 2: 27 * 6: 27 = 20 + 7; 2 * 6 = 12, so 20 * 6 =
    120; 7 * 6 = 42; 120 + 42 = 162. So 27 * 6 = 162.``), every other step as
    :func:`format_solution` writes it. The gold solution itself when every step is right or the
    flagged step has nothing to work out (a one-digit product, a sum): the working is the skill the
    worked critic shows, and the refiner, reading that critic's redacted feedback ("27 = ? + ?;
    2 * 6 = ?, ..."), learns to fill it in itself. Pure."""
    gold: list[Step] = [(int(a), str(op), int(b), int(r)) for a, op, b, r in problem.metadata["steps"]]
    right = _right_steps(equations(attempt), gold)
    flagged = right[-1][2] + 1 if right else 0
    lines = format_solution(gold).split("\n")
    if flagged < len(gold):
        a, op, b, r = gold[flagged]
        working = worked_check(a, op, b)
        if working != f"{a} {op} {b} = {r}":
            lines[flagged] = f"Step {flagged + 1}: {a} {op} {b}: {working}. So {a} {op} {b} = {r}."
    return "\n".join(lines)


def plain_text(first: int, ops: Sequence[tuple[str, int]]) -> tuple[str, list[str]]:
    """``What is (7 + 5) * 3?`` (brackets fix the left-to-right order) and each step's description
    (``add 5``, ``multiply by 3``)."""
    expr = str(first)
    for j, (op, b) in enumerate(ops):
        expr = f"{expr} {op} {b}" if j == 0 else f"({expr}) {op} {b}"
    return f"What is {expr}?", [_OP_VERBS[op].format(b=b) for op, b in ops]


def word_text(first: int, ops: Sequence[tuple[str, int]], rng: random.Random) -> tuple[str, list[str]]:
    """A story with one sentence per step, and each step's sentence (quoted by the oracle). A first
    multiplication is ``<a> boxes with <b> <items> in each box``; later ones multiply the count."""
    name, he, him = rng.choice(_PEOPLE)
    item = rng.choice(_ITEMS)
    words = {"He": he.capitalize(), "he": he, "him": him}
    sentences: list[str] = []
    clauses: list[str] = []
    rest = list(ops)
    if rest and rest[0][0] == "*":
        box = rng.choice(_CONTAINERS)
        b = rest.pop(0)[1]
        first_sentence = (f"{name} has {first} {_plural(first, box)} with {b} {_plural(b, item)} "
                          f"in each {box[0]}.")
        clauses.append(first_sentence)
    else:
        first_sentence = f"{name} has {first} {_plural(first, item)}."
    sentences.append(first_sentence)
    for j, (op, b) in enumerate(rest):
        pattern = rng.choice({"+": _ADD, "-": _SUB, "*": _MUL}[op])
        sentence = pattern.format(b=b, items=_plural(b, item) if op != "*" else item[1], **words)
        if j > 0 or clauses:
            sentence = "Then " + sentence[0].lower() + sentence[1:]
        sentences.append(sentence)
        clauses.append(sentence)
    sentences.append(f"How many {item[1]} does {name} have{' now' if rest else ''}?")
    return " ".join(sentences), clauses


# --------------------------------------------------------------------------- reading attempts

#: an integer of at most 18 digits (longer runs are no number here: int() has a digit limit)
_NUM = r"-?\d{1,3}(?:,\d{3}){1,5}(?![\d,])|-?\d{1,18}(?!\d)"
_OP = r"[+\-*×xX·]|plus|minus|times|multiplied\s+by"
#: at most 8 operations in a chain, so that a long text without "=" is read in linear time
_EQUATION_RE = re.compile(rf"(?<![\w.])({_NUM})((?:\s*(?:{_OP})\s*(?:{_NUM})){{1,8}})\s*(?:=|equals)\s*({_NUM})"
                          r"(?!\.\d)")
_TERM_RE = re.compile(rf"\s*({_OP})\s*({_NUM})")
_OP_CANON = {"+": "+", "plus": "+", "-": "-", "minus": "-", "*": "*", "×": "*", "x": "*", "·": "*", "times": "*",
             "multiplied by": "*"}


@dataclass(frozen=True)
class Equation:
    """One equation an attempt writes: ``operands[0] ops[0] operands[1] ... = result`` and its text."""

    operands: tuple[int, ...]
    ops: tuple[str, ...]
    result: int
    text: str


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def equations(text: str) -> list[Equation]:
    """The equations ``text`` writes, in order: ``7 + 5 = 12``, ``7 plus 5 equals 12``, chains
    ``7 + 5 - 3 = 9``; ``x`` and ``×`` are multiplication. Brackets become spaces first (never
    glue digits: ``2(6`` is 2 and 6), so ``(7 + 5) * 3 = 36`` reads as the chain ``7 + 5 * 3 = 36``
    (its steps in order)."""
    out = []
    for m in _EQUATION_RE.finditer(re.sub(r"[()]", " ", text)):
        terms = _TERM_RE.findall(m.group(2))
        ops = tuple(_OP_CANON[re.sub(r"\s+", " ", op.lower())] for op, _ in terms)
        operands = (_int(m.group(1)), *(_int(n) for _, n in terms))
        out.append(Equation(operands, ops, _int(m.group(3)), re.sub(r"\s+", " ", m.group(0).strip())))
    return out


def _covers(eq: Equation, gold: Sequence[Step], i: int) -> bool:
    """Whether ``eq`` computes gold steps ``i .. i + len(eq.ops) - 1`` (operands and operations in
    order; a single addition or multiplication in either order)."""
    k = len(eq.ops)
    if i + k > len(gold):
        return False
    want_ops = tuple(g[1] for g in gold[i:i + k])
    want = (gold[i][0], *(g[2] for g in gold[i:i + k]))
    if eq.ops != want_ops:
        return False
    return eq.operands == want or (k == 1 and eq.ops[0] in "+*" and eq.operands == want[::-1])


def _restates(eq: Equation, gold: Sequence[Step], done: int) -> bool:
    """Whether ``eq`` computes, rightly, one of the first ``done`` gold steps again (``So, 7 * 3 = 21
    is the final answer.``): a restatement, neither a new step nor a wrong one."""
    return any(_covers(eq, gold, j) and eq.result == gold[j + len(eq.ops) - 1][3] for j in range(done))


# --------------------------------------------------------------------------- oracle critic

APPROVAL = "I checked every step: each calculation is right and the final answer follows from them."


#: steps are named in words, so that the oracle writes no number the problem and attempt lack
_ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth")


def _nth(i: int) -> str:
    """``the second step`` for ``i`` = 1 (0-based)."""
    return f"the {_ORDINALS[i]} step" if i < len(_ORDINALS) else "a later step"


def _quote(eq: Equation) -> str:
    return f'"{eq.text}"'


def _diagnose(eq: Equation, gold: Sequence[Step], i: int, clauses: Sequence[str]) -> tuple[str, str]:
    """What is wrong with ``eq``, the attempt's equation in place of gold step ``i`` (0-based), which
    does not compute it: the first of its operations (a chain has several) with a wrong operation,
    start value or number; as ``(specific, number-free)`` sentences (:func:`oracle_feedback` says the
    second where the first would state the gold answer). Numbers of the problem and the attempt only."""
    for k, (op_k, operand) in enumerate(zip(eq.ops, eq.operands[1:])):
        if i + k >= len(gold):
            return (f"{_nth(i + k - 1).capitalize()} should be the last, but {_quote(eq)} goes on.",
                    f"{_nth(i + k - 1).capitalize()} should be the last, but the attempt goes on.")
        a, op, b, _ = gold[i + k]
        where, nth = f"{_nth(i + k).capitalize()} is wrong: in {_quote(eq)},", f"{_nth(i + k).capitalize()} is wrong:"
        if op_k != op:
            return (f"{where} {_clause(clauses, gold, i + k)} calls for {_OP_NAMES[op]}, not {_OP_NAMES[op_k]}.",
                    f"{nth} it calls for {_OP_NAMES[op]}, not {_OP_NAMES[op_k]}.")
        swapped = k == 0 and op in "+*" and (operand, eq.operands[0]) == (a, b)
        if k == 0 and eq.operands[0] != a and not swapped:
            source = f"the result of {_nth(i - 1)}" if i > 0 else "what the problem starts with"
            return (f"{where} the calculation should start from {a}, {source}, not from {eq.operands[0]}.",
                    f"{nth} the calculation should start from {source}.")
        if operand != b and not swapped:
            return (f"{where} {_clause(clauses, gold, i + k)} uses the number {b}, not {operand}.",
                    f"{nth} it uses a number the problem does not give for it.")
    return (f"{_nth(i).capitalize()} is wrong: {_quote(eq)} does not do {_clause(clauses, gold, i)}.",
            f"{_nth(i).capitalize()} is wrong: it does not do what the problem asks.")


def worked_check(a: int, op: str, b: int) -> str:
    """How a critic recomputes ``a op b`` by steps it can trust: a product with a multi-digit
    factor split by place values, every digit multiplied alone, then the sum, always in the same
    shape (``63 * 9``: ``63 = 60 + 3; 6 * 9 = 54, so 60 * 9 = 540; 3 * 9 = 27; 540 + 27 = 567``;
    a zero digit too: ``10 = 10 + 0; 1 * 5 = 5, so 10 * 5 = 50; 0 * 5 = 0; 50 + 0 = 50``);
    anything else as one equation (``12 + 5 = 17``)."""
    result = apply_op(a, op, b)
    many, one = (a, b) if a >= b else (b, a)
    if op != "*" or many < 10 or one >= 10:
        return f"{a} {op} {b} = {result}"
    text = str(many)
    digits = [(int(d), 10 ** (len(text) - 1 - i)) for i, d in enumerate(text)]  # 63 -> (6, 10), (3, 1)
    pieces = [f"{many} = " + " + ".join(str(k * scale) for k, scale in digits)]
    for k, scale in digits:
        pieces.append(f"{k} * {one} = {k * one}" + (f", so {k * scale} * {one} = {k * one * scale}"
                                                     if scale > 1 and k else ""))
    pieces.append(" + ".join(str(k * one * scale) for k, scale in digits) + f" = {result}")
    return "; ".join(pieces)


def _worked_line(i: int, eq: Equation, gold: Sequence[Step]) -> str:
    """A one-operation step of the attempt checked by :func:`worked_check` (its own operands), then
    judged: the step's own result is written again beside the recomputed one before the judgement
    (``...; 540 + 27 = 567; the step says 549: not the same, a calculation error``), so a critic
    that learns this compares two adjacent numbers instead of one written a line earlier (the
    first worked warm start's false alarms were "160 + 20 = 180, not 180": right value, wrong word)."""
    a, op, b = eq.operands[0], eq.ops[0], eq.operands[1]
    right = eq.result == gold[i][3]  # eq computes gold step i (:func:`_covers`)
    verdict = "the same, right." if right else f"not the same, a calculation error. Recompute {a} {op} {b}."
    return f"{_nth(i).capitalize()}, {eq.text}: {worked_check(a, op, b)}; the step says {eq.result}: {verdict}"


def oracle_feedback(problem: Problem, attempt: str, *, worked: bool = False) -> str:
    """Rule-based feedback from a critic that sees the gold steps, in words, answer-free.

    A right final answer (as the ``stated-answer`` verifier reads it) is approved, after the steps
    it computes rightly are named and quoted one per line (:func:`_right_steps`): a critic that
    learns from the oracle (the warm start) checks each step before its verdict, on right attempts
    as on wrong ones, instead of deciding in its first token. Those quotes hold the attempt's own
    numbers, its answer included, so they tell the refiner nothing it was not shown. Otherwise the
    gold steps are walked in order against the attempt's equations (:func:`equations`): step ``i``
    is done by the first later equation that computes it (:func:`_covers`; a chain covers several
    steps); the first step not done is the wrong one: an equation that computes it with a wrong
    result is an arithmetic slip ("recompute 12 * 3"); else the next unused equation is diagnosed
    (:func:`_diagnose`: wrong operation, start value or number); else the step is missing. When
    every step is done right, what is wrong is an equation after them (a step the problem does not
    ask for) or the answer line (missing, or not the last result)::

        What is (7 + 5) * 3?   7 + 5 = 12. 12 * 3 = 35. Answer: 35
        ->  The first step (7 + 5 = 12) is right.
            The second step is wrong: "12 * 3 = 35" has a calculation error. Recompute 12 * 3.
            Verdict: incorrect

    Answer-free, in two ways: steps are named in words and every number it writes occurs in the
    problem or the attempt, so the numeric redaction rule leaves it unchanged; and a sentence that
    would state the gold answer (by the verifier's leak rule: a right step quoted, or an extra step
    starting from the right result, "21 * 3 = 62") is said without its numbers ("The first step is
    right."), unless the problem itself states the answer. Pure; never raises on an attempt.

    ``worked``: each one-operation step the walk reaches is recomputed before it is judged
    (:func:`worked_check`: ``The second step, 63 * 9 = 549: 63 = 60 + 3; 6 * 9 = 54, so 60 * 9 =
    540; 3 * 9 = 27; 540 + 27 = 567; the step says 549: not the same, a calculation error. Recompute
    63 * 9.``): what a critic that checks by steps it can trust writes. It states values, the gold
    answer among them, so it is answer-free only as the refiner reads it, redacted (``feedback.redact``).
    """
    gold: list[Step] = [(int(a), str(op), int(b), int(r)) for a, op, b, r in problem.metadata["steps"]]
    clauses = list(problem.metadata.get("clauses") or [])
    answer = stated_integer(attempt)
    eqs = equations(attempt)
    right = _right_steps(eqs, gold)

    def right_line(j: int, i: int, last: int, say: Callable[[str, str], str]) -> str:
        if worked and last == i:
            return _worked_line(i, eqs[j], gold)
        done, verb = _steps_named(i, last), "is" if last == i else "are"
        return say(f"{done} ({eqs[j].text}) {verb} right.", f"{done} {verb} right.")

    if answer is not None and problem.answer is not None and answer == str(problem.answer).strip():
        quoted = [right_line(*r, lambda specific, _: specific) for r in right]  # the attempt states the answer
        return "\n".join([*quoted, APPROVAL, "Verdict: correct"])
    kind = StatedAnswerVerifier.leak_kind
    given = bool(is_leak(problem.prompt, problem.answer, kind))  # the problem states it: nothing to hide

    def say(specific: str, generic: str) -> str:
        return specific if given or worked or not is_leak(specific, problem.answer, kind) else generic

    lines = [right_line(*r, say) for r in right]
    i, at = (right[-1][2] + 1, right[-1][0] + 1) if right else (0, 0)
    if i < len(gold):  # step i is the first not computed rightly
        found = next((j for j in range(at, len(eqs)) if _covers(eqs[j], gold, i)), None)
        if found is None:
            rest = [eq for eq in eqs[at:] if not _restates(eq, gold, i)]
            if rest:
                lines.append(say(*_diagnose(rest[0], gold, i, clauses)))
            elif not eqs:
                lines.append(say(f"The attempt writes no equation such as 'a + b = c'. {_nth(i).capitalize()} should "
                                 f"work out {_clause(clauses, gold, i)}.",
                                 "The attempt writes no equation such as 'a + b = c'."))
            else:
                lines.append(say(f"{_nth(i).capitalize()} is missing: the attempt never works out "
                                 f"{_clause(clauses, gold, i)}.", f"{_nth(i).capitalize()} is missing."))
            return _close(lines)
        eq = eqs[found]  # computes step i with a wrong result (else _right_steps would have gone on)
        if worked and len(eq.ops) == 1:
            return _close([*lines, _worked_line(i, eq, gold)])
        redo = (f"Recompute {eq.operands[0]} {eq.ops[0]} {eq.operands[1]}." if len(eq.ops) == 1
                else "Recompute it one operation at a time.")
        lines.append(say(f"{_nth(i).capitalize()} is wrong: {_quote(eq)} has a calculation error. {redo}",
                         f"{_nth(i).capitalize()} is wrong: it has a calculation error. Recompute it."))
        return _close(lines)
    extra = [eq for eq in eqs[at:] if not _restates(eq, gold, len(gold))]
    if extra:
        lines.append(say(f"Every step the problem asks for is right, but then {_quote(extra[0])} is a step it does not "
                         "ask for.", "Every step the problem asks for is right, but then the attempt goes on with a "
                         "step it does not ask for."))
    elif answer is None:
        lines.append("Every step is right, but the attempt does not end with a line 'Answer: <number>'.")
    else:
        lines.append(f"Every step is right, but the answer line gives {answer}, which is not the result of the "
                     "last step.")
    return _close(lines)


def _steps_named(i: int, last: int) -> str:
    """``The second step`` (``i`` = ``last`` = 1) or ``The first to third steps`` (a chain)."""
    return _nth(i).capitalize() if last == i else f"The {_ORDINALS[i]} to {_nth(last)[4:]}s"


def _right_steps(eqs: Sequence[Equation], gold: Sequence[Step]) -> list[tuple[int, int, int]]:
    """The gold steps an attempt's equations compute rightly, in order (step ``i`` done by the first
    later equation that computes it, :func:`_covers`), up to the first step that none does rightly:
    ``(index in eqs, first step, last step)`` each (0-based; a chain covers several)."""
    out: list[tuple[int, int, int]] = []
    i, at = 0, 0
    while i < len(gold):
        found = next((j for j in range(at, len(eqs)) if _covers(eqs[j], gold, i)), None)
        if found is None:
            break
        last = i + len(eqs[found].ops) - 1
        if eqs[found].result != gold[last][3]:
            break
        out.append((found, i, last))
        i, at = last + 1, found + 1
    return out


def _clause(clauses: Sequence[str], gold: Sequence[Step], i: int) -> str:
    """How the oracle names gold step ``i``: the problem's sentence for it, quoted, else its
    operation in words (``add 5``): always numbers of the problem, or of the attempt's previous step."""
    if i < len(clauses):
        return f'the sentence "{clauses[i].rstrip(".")}"'
    _, op, b, _ = gold[i]
    return f'the operation "{_OP_VERBS[op].format(b=b)}"'


def _close(lines: list[str]) -> str:
    return "\n".join([*lines, "Verdict: incorrect"])


# --------------------------------------------------------------------------- benchmark

#: how far a planted slip is off: small ones and the sizes SmolLM2's own slips at two-step products have
#: (63 * 9 = 549, 9 * 5 * 8 = 380: -18, +20; issue 33's probe of its warm start)
SLIPS = (-20, -10, -6, -3, -2, -1, 1, 2, 3, 6, 10, 20)


class NLArith(OracleBenchmark):
    """Arithmetic and word problems in natural language (see the module docstring).

    Options: ``ops`` (operations drawn from, a subset of ``"+-*"``, default ``"*"``), ``digits``
    (operand digits, 1-4, default 1), ``steps`` (operations per problem, 1-4, default 1), ``style``
    (``plain``, ``word`` or ``mixed``, default ``plain``), ``n_train`` (default 33),
    ``n_validation`` (default 24), ``n_test`` (default 24).

    The default level, one-digit products (``What is 6 * 8?``), is where SmolLM2-135M-Instruct (the
    shipped Q4_1 conversion) was measured in 20-60% on validation at sampling temperatures 0.4 and
    0.7 (19/48 and 12/48; greedy 9/48, temperature 1.0 4/48); every two-digit or two-step level
    probed was at 8% or less greedy (``registry/runs/smollm2-nl-arith-level.yaml`` has the table).
    It has 81 distinct problems (a * b, both 1-9), all of them in the default splits.
    """

    name: ClassVar[str] = "nl-arith"
    default_verifier: ClassVar[str] = "stated-answer"
    splits: ClassVar[tuple[str, ...]] = ("train", "validation", "test")
    templates: ClassVar[PromptTemplates] = TEMPLATES

    def __init__(self, path: str | None = None, seed: int = 0, ops: str = "*", digits: int = 1, steps: int = 1,
                 style: str = "plain", n_train: int = 33, n_validation: int = 24, n_test: int = 24,
                 **options: Any) -> None:
        super().__init__(path=path, seed=seed, **options)
        if path is not None:
            raise UserError("benchmark nl-arith: generated locally, it takes no path")
        if not isinstance(ops, str) or not ops or any(o not in OPS for o in ops):
            raise UserError(f"benchmark nl-arith: ops must be a non-empty subset of {OPS!r}, got {ops!r}")
        counts = (digits, steps, n_train, n_validation, n_test)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in counts):
            raise UserError("benchmark nl-arith: digits, steps, n_train, n_validation and n_test must be integers")
        if not 1 <= digits <= 4 or not 1 <= steps <= 4:
            raise UserError(f"benchmark nl-arith: digits and steps must be 1..4, got {digits!r} and {steps!r}")
        if style not in STYLES:
            raise UserError(f"benchmark nl-arith: style must be one of {', '.join(STYLES)}, got {style!r}")
        self.ops = "".join(dict.fromkeys(ops))
        self.digits, self.steps, self.style = int(digits), int(steps), style
        self.sizes = {"test": int(n_test), "validation": int(n_validation), "train": int(n_train)}
        if min(self.sizes.values()) < 0:
            raise UserError(f"benchmark nl-arith: split sizes must be >= 0, got {self.sizes}")
        lo, hi = self._operand_range()
        space = (hi - lo + 1) ** (self.steps + 1) * len(self.ops) ** self.steps
        if sum(self.sizes.values()) > space:
            raise UserError(self._too_many(space))
        self._cache: dict[str, list[Problem]] = {}

    # -- problems

    def _too_many(self, space: int) -> str:
        return (f"benchmark nl-arith: {sum(self.sizes.values())} problems asked, but at most {space} distinct ones "
                f"exist at digits {self.digits}, steps {self.steps}, ops {self.ops!r} (fewer with subtractions, which "
                "never go below 0); lower n_train/n_validation/n_test or widen the options")

    def _operand_range(self) -> tuple[int, int]:
        return (1 if self.digits == 1 else 10 ** (self.digits - 1)), 10 ** self.digits - 1

    def _draw(self, rng: random.Random) -> tuple[int, list[tuple[str, int]]] | None:
        """A start value and operations, or None when a subtraction would go below 0 (redrawn)."""
        lo, hi = self._operand_range()
        first = rng.randint(lo, hi)
        ops, value = [], first
        for _ in range(self.steps):
            op, b = rng.choice(self.ops), rng.randint(lo, hi)
            if op == "-" and b > value:
                if value < lo:
                    return None
                b = rng.randint(lo, value)
            ops.append((op, b))
            value = apply_op(value, op, b)
        return first, ops

    def _generate(self, split: str, n: int, exclude: set[str]) -> list[Problem]:
        rng = random.Random(f"nl-arith:{self.seed}:{self.ops}:{self.digits}:{self.steps}:{self.style}:{split}")
        seen = set(exclude)
        problems: list[Problem] = []
        misses = 0  # draws in a row that gave no new problem: the space is (nearly) used up
        while len(problems) < n:
            drawn = self._draw(rng)
            key = "" if drawn is None else str(drawn[0]) + "".join(f"{op}{b}" for op, b in drawn[1])
            if drawn is None or key in seen:
                misses += 1
                if misses > 100_000:
                    raise UserError(self._too_many(len(seen)))
                continue
            misses = 0
            first, ops = drawn
            style = rng.choice(("plain", "word")) if self.style == "mixed" else self.style
            seen.add(key)
            prompt, clauses = plain_text(first, ops) if style == "plain" else word_text(first, ops, rng)
            steps = solve(first, ops)
            problems.append(Problem(
                id=f"{split}/{len(problems):06d}",
                benchmark=self.name,
                prompt=prompt,
                answer=str(steps[-1][3]),
                metadata={"steps": [list(s) for s in steps], "solution": format_solution(steps), "key": key,
                          "style": style, "clauses": clauses if style == "word" else []},
            ))
        return problems

    def load(self, split: str) -> list[Problem]:
        self.check_split(split)
        return generated_split(split, self.sizes, self._cache, self._generate, lambda p: p.metadata["key"])

    # -- the oracle critic and what the probe needs

    def identity(self, problem: Problem) -> str:
        """The start value and operations (``7+5-3``), the splits' disjointness key."""
        return str(problem.metadata["key"])

    def solution(self, problem: Problem) -> str:
        return str(problem.metadata["solution"])

    def oracle_feedback(self, problem: Problem, attempt: str) -> str:
        return oracle_feedback(problem, attempt)

    def worked_feedback(self, problem: Problem, attempt: str) -> str:
        return oracle_feedback(problem, attempt, worked=True)

    def worked_refinement(self, problem: Problem, attempt: str) -> str:
        return worked_solution(problem, attempt)

    def inject_errors(self, solution: str, rng: random.Random, second_error_rate: float = 0.15) -> str:
        """``solution`` (:func:`format_solution`'s form) with one arithmetic slip at a random step
        (later steps recomputed from it, the answer line following): a wrong attempt for tests and
        diagnostics. ``second_error_rate`` is not used (one slip)."""
        eqs = equations(solution)
        if not eqs or any(len(e.ops) != 1 for e in eqs):
            raise ValueError(f"not a well-formed nl-arith solution: {solution!r}")
        gold = solve(eqs[0].operands[0], [(e.ops[0], e.operands[1]) for e in eqs])
        i = rng.randrange(len(gold))
        a, op, b, r = gold[i]
        slip = rng.choice(SLIPS)
        steps = list(gold[:i]) + [(a, op, b, r + slip if r + slip >= 0 else r - slip)]
        for _, op2, b2, _ in gold[i + 1:]:
            prev = steps[-1][3]
            steps.append((prev, op2, b2, apply_op(prev, op2, b2)))
        return format_solution(steps)

    def apply_feedback(self, problem: Problem, attempt: str, feedback: str, *, revision: bool = False,
                       **options: Any) -> str:
        """The refinement that follows an oracle feedback exactly: the attempt when it approves,
        else the gold solution (the flagged step redone and every later step recomputed; the steps
        before it are right by the oracle's walk). ``revision`` is not used (full solutions)."""
        return attempt if verdict_line(feedback) else self.solution(problem)

    def stated_answer(self, feedback: str) -> str | None:
        """The last number the feedback writes, as an answer line ``Answer: N``; None without one."""
        value = last_number(feedback)
        return None if value is None else f"Answer: {value}"

    def feedback_perturbations(self, problem: Problem, attempt: str, feedback: str, *,
                               answer: str | None = None) -> dict[str, str | None]:
        """Free-text maths edits (:func:`~mlmt_bench.benchmarks.perturbations.math_perturbations`)
        and the oracle's feedback (:class:`OracleBenchmark`)."""
        return {**math_perturbations(problem.prompt, attempt, feedback, problem.answer, answer),
                "oracle": self.oracle_feedback(problem, attempt)}

    def stated_values(self, feedback: str) -> list[str] | None:
        """The numbers the feedback writes (:func:`~mlmt_bench.benchmarks.perturbations.numbers`)."""
        return numbers(feedback)

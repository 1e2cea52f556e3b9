"""``stated-answer``: the exact integer that a response's last answer statement gives.

For natural-language arithmetic (``nl-arith``). The prompt asks for a final line ``Answer: <number>``;
SmolLM2-135M-Instruct, asked so, ends with ``The answer is 24.`` instead (6 of 6 responses read on
2026-12-04), so the statement is read by the maths verifier's phrase rule
(:func:`mlmt_bench.verifiers.math_text.phrase_answer`: the last ``Answer: X``, ``the answer is X``,
``final answer is X`` or ``#### X``, up to the end of its sentence or line). It is strict where the
maths verifier is lenient:

- no ``\\boxed{}`` and no last-number fallback: a response without an answer statement has no answer;
- the statement must be one integer, optionally after ``$`` and before words without digits
  (``Answer: 12``, ``the answer is 12 apples.``, ``**Answer:** 12``); a statement with a second
  number (``Answer: 7 + 5 = 12``), a decimal or no number is no answer;
- the integer equals the gold one exactly (``1,234`` reads 1234; ``012`` reads 12).

Kinds: ``ok``, ``wrong`` (an answer, not the gold one), ``no_answer``. Never raises on model output.
"""

from __future__ import annotations

import re
from typing import ClassVar

from mlmt_bench.types import Problem, Verdict
from mlmt_bench.verifiers.base import Verifier
from mlmt_bench.verifiers.leaks import LeakKind
from mlmt_bench.verifiers.math_text import phrase_answer

#: one integer (thousands groups allowed), optionally after ``$``, then words without digits
_STATEMENT_RE = re.compile(r"\$?\s*(-?(?:\d{1,3}(?:,\d{3})+|\d+))(?:\s+[^\W\d]+)*\s*")


def stated_integer(response: str) -> str | None:
    """The integer the last answer statement of ``response`` gives, canonical (``"-12"``, ``"1234"``),
    or None when there is no statement or it is not exactly one integer (see the module docstring)."""
    statement = phrase_answer(response or "")
    if statement is None:
        return None
    m = _STATEMENT_RE.fullmatch(statement.replace("*", "").strip())
    if m is None:
        return None
    number = m.group(1).replace(",", "")
    digits = number.lstrip("-").lstrip("0") or "0"  # on the text: no int() limit on a model's 10,000 digits
    return "-" + digits if number.startswith("-") and digits != "0" else digits


class StatedAnswerVerifier(Verifier):
    name: ClassVar[str] = "stated-answer"
    # "math": the gold as a standalone number, not after "step" ("Step 2" does not leak 2)
    leak_kind: ClassVar[LeakKind] = "math"

    def score(self, problem: Problem, response: str) -> Verdict:
        extracted = stated_integer(response if isinstance(response, str) else str(response))
        if extracted is None:
            return Verdict(0.0, False, None, "no_answer", "no answer statement of one integer ('Answer: <number>')")
        gold = stated_integer(f"Answer: {problem.answer}") if problem.answer is not None else None
        if gold is None:
            return Verdict(0.0, False, extracted, "wrong", f"gold answer {problem.answer!r} is not an integer")
        if extracted == gold:
            return Verdict(1.0, True, extracted, "ok", "")
        return Verdict(0.0, False, extracted, "wrong", f"expected {gold}, got {extracted}")

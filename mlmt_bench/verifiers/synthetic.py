"""``synthetic``: the exact integer answer of a synthetic problem.

Reads the integer after the last ``#`` in the response and compares it with the gold answer.
Kinds: ``ok`` (right), ``wrong`` (an answer, not the gold one), ``no_answer`` (no ``#<int>``).
Never raises on model output.
"""

from __future__ import annotations

import re
from typing import ClassVar

from mlmt_bench.types import Problem, Verdict
from mlmt_bench.verifiers.base import Verifier
from mlmt_bench.verifiers.leaks import LeakKind

_ANSWER_RE = re.compile(r"#\s*(-?\d+)")


def extract_answer(response: str) -> str | None:
    """The integer after the last ``#`` in ``response`` as a canonical string, or None."""
    found = _ANSWER_RE.findall(response or "")
    if not found:
        return None
    return str(int(found[-1]))


class SyntheticVerifier(Verifier):
    name: ClassVar[str] = "synthetic"
    leak_kind: ClassVar[LeakKind] = "exact"  # the answer is an integer: "#54" leaks 54

    def score(self, problem: Problem, response: str) -> Verdict:
        try:
            extracted = extract_answer(response if isinstance(response, str) else str(response))
        except Exception as exc:  # pragma: no cover - defensive: never raise on model output
            return Verdict(0.0, False, None, "no_answer", f"unreadable response: {exc}")
        if extracted is None:
            return Verdict(0.0, False, None, "no_answer", "no '#<integer>' final answer")
        try:
            gold = int(str(problem.answer).strip())
        except (TypeError, ValueError):
            return Verdict(0.0, False, extracted, "wrong", f"gold answer {problem.answer!r} is not an integer")
        if int(extracted) == gold:
            return Verdict(1.0, True, extracted, "ok", "")
        return Verdict(0.0, False, extracted, "wrong", f"expected {gold}, got {extracted}")

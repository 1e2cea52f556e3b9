"""Edited feedbacks for the feedback perturbation probe (METHOD v4, "Copy-channel controls").

The probe (:mod:`mlmt_bench.probe`) refines identical attempts after the critic's own feedback
and after edits of it, and watches acc@t2 move. The rows it reports, in order:

=================  ==========================================================================
``own``            the critic's own feedback, unedited (the probe adds it)
``values_removed`` the feedback with every value it supplies replaced by the attempt's own
``last_shifted``   the feedback with only the last value it states + 1
``approve_gold``   approve everything, stating the gold values
``approve_own``    approve everything, stating the attempt's own values
``oracle``         the benchmark's oracle feedback (an :class:`OracleBenchmark` only)
``null``           g∅, the templates' ``null_feedback`` (the probe adds it)
=================  ==========================================================================

A benchmark declares the five middle rows with ``Benchmark.feedback_perturbations(problem,
attempt, feedback, *, answer) -> {row: text | None}`` (``answer``: the attempt's final answer as
the verifier read it; None for a row that does not apply to that benchmark or problem) and the
values a feedback states with ``Benchmark.stated_values(feedback)`` (the probe's ``copy_rate``;
None: it reads none). This module holds the free-text rules several benchmarks share: numbers
(maths: MATH-500, GSM8K) and option letters (multiple choice: GPQA). Pure text in, text out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from mlmt_bench.benchmarks.redaction import redact_code

#: The rows a benchmark declares (``Benchmark.feedback_perturbations``' keys), in the probe's order.
PERTURBATIONS: tuple[str, ...] = ("values_removed", "last_shifted", "approve_gold", "approve_own", "oracle")
#: Every row of the probe's table, in order: the critic's own feedback, the declared edits, g∅.
PROBE_ROWS: tuple[str, ...] = ("own", *PERTURBATIONS, "null")

#: A number as a maths text writes it: ``12``, ``-3``, ``1,234.5``, ``.5``, ``3/4``. A ``-``
#: counts as a sign only where no letter, digit or closing bracket precedes it (``5-3`` is two
#: numbers, 5 and 3).
_NUMBER_RE = re.compile(r"(?:(?<![\w)\]])-)?(?:\d{1,3}(?:,\d{3})+(?![\d])|\d+)(?:\.\d+)?(?:/\d+)?"
                        r"|(?<![\w.])\.\d+")


def numbers(text: str) -> list[str]:
    """The numbers written in ``text``, in order, as written (``"1,234"``, ``"-3"``, ``"3/4"``)."""
    return [m.group(0) for m in _NUMBER_RE.finditer(text)]


def number_value(text: str) -> float | None:
    """A number's value (commas dropped, ``a/b`` divided), or None for text that is not one."""
    s = text.replace(",", "").replace("$", "").strip()
    try:
        if s.count("/") == 1:
            num, den = s.split("/")
            return float(num) / float(den)
        return float(s)
    except (ValueError, ZeroDivisionError):
        return None


def same_value(a: str, b: str) -> bool:
    """Whether two answers are the same value: equal numbers (``"12"``, ``"12.0"``, ``"1,2"``
    are compared by value when both read as numbers), else equal text after stripping."""
    va, vb = number_value(a), number_value(b)
    if va is not None and vb is not None:
        return abs(va - vb) <= 1e-9 * max(1.0, abs(va))
    return a.strip() == b.strip()


def states_any(answer: str | None, values: Iterable[str]) -> bool:
    """Whether ``answer`` (a refinement's extracted final answer) is one of ``values``."""
    return answer is not None and any(same_value(answer, v) for v in values)


def _shifted(number: str) -> str:
    """``number`` + 1, written like it (an integer stays an integer; ``1,234`` -> ``1235``)."""
    value = number_value(number)
    if value is None:  # pragma: no cover - only numbers reach here
        return number
    if "/" not in number and "." not in number:
        return str(int(number.replace(",", "")) + 1)
    return f"{value + 1:g}"


def shift_last_number(text: str) -> str:
    """``text`` with its last number + 1 (unchanged when it states none):
    ``"x = 12, so 14"`` -> ``"x = 12, so 15"``."""
    found = list(_NUMBER_RE.finditer(text))
    if not found:
        return text
    m = found[-1]
    return text[: m.start()] + _shifted(m.group(0)) + text[m.end():]


def replace_new_numbers(text: str, given: Iterable[str], by: str | None) -> str:
    """``text`` with every number that is not one of ``given`` (the numbers of x and z, compared
    by value) replaced by ``by`` (the attempt's final answer), or removed when ``by`` is None:
    what is left is what the critic quoted, not what it supplied."""
    keep = list(given)

    def edit(m: re.Match[str]) -> str:
        if states_any(m.group(0), keep):
            return m.group(0)
        return "" if by is None else by

    return _NUMBER_RE.sub(edit, text)


# --------------------------------------------------------------------------- free-text maths

#: What a maths feedback says when it approves everything; ``{value}`` is the final answer stated.
MATH_APPROVAL = "Every step is correct. The final answer {value} is correct."
MATH_APPROVAL_NO_VALUE = "Every step is correct."


def math_perturbations(question: str, attempt: str, feedback: str, gold: str | None,
                       attempt_answer: str | None) -> dict[str, str | None]:
    """The probe's edits of a free-text maths feedback (MATH-500, GSM8K):

    - ``values_removed``: every number of the feedback that occurs in neither the question nor
      the attempt (a value the critic supplied) replaced by the attempt's final answer
      (``attempt_answer``, as the verifier reads it), or removed when the attempt has none;
    - ``last_shifted``: the last number the feedback states + 1 (unchanged when it states none);
    - ``approve_gold`` / ``approve_own``: :data:`MATH_APPROVAL` with the gold answer / the
      attempt's answer (without a value when there is none);
    - ``oracle``: None (no oracle critic).
    """
    given = numbers(question) + numbers(attempt)
    return {
        "values_removed": replace_new_numbers(feedback, given, attempt_answer),
        "last_shifted": shift_last_number(feedback),
        "approve_gold": MATH_APPROVAL.format(value=gold) if gold is not None else None,
        "approve_own": MATH_APPROVAL.format(value=attempt_answer) if attempt_answer is not None
        else MATH_APPROVAL_NO_VALUE,
        "oracle": None,
    }


# --------------------------------------------------------------------------- multiple choice

#: What a multiple-choice feedback says when it approves the answer; ``{letter}`` is the option.
CHOICE_APPROVAL = "The reasoning is correct. The answer ({letter}) is correct."
CHOICE_APPROVAL_NO_LETTER = "The reasoning is correct."


def _letter_matches(text: str, letters: str) -> list[re.Match[str]]:
    """The option letters ``text`` names, as matches: a letter written as a word of its own
    (``(B)``, ``B.``, ``option B``), except the article ``A`` before a lower-case word."""
    out = []
    for m in re.finditer(r"(?<![A-Za-z0-9_'])([" + letters + r"])(?![A-Za-z0-9_'])", text):
        if m.group(1) == "A" and re.match(r"\s+[a-z]", text[m.end(): m.end() + 3]):
            continue
        out.append(m)
    return out


def option_letters(text: str, letters: str = "ABCD") -> list[str]:
    """The option letters ``text`` names, in order (:func:`_letter_matches`)."""
    return [m.group(1) for m in _letter_matches(text, letters)]


def _splice(text: str, found: list[re.Match[str]], by: list[str]) -> str:
    out, at = [], 0
    for m, new in zip(found, by):
        out += [text[at: m.start(1)], new]
        at = m.end(1)
    return "".join(out) + text[at:]


def choice_perturbations(feedback: str, gold: str | None, attempt_letter: str | None,
                         letters: str = "ABCD") -> dict[str, str | None]:
    """The probe's edits of a multiple-choice feedback (GPQA); the letters are its "values":

    - ``values_removed``: every option letter the feedback names replaced by the attempt's own
      letter (removed when the attempt chose none);
    - ``last_shifted``: the last letter it names moved to the next option (D -> A); unchanged
      when it names none;
    - ``approve_gold`` / ``approve_own``: :data:`CHOICE_APPROVAL` with the gold / the attempt's
      letter;
    - ``oracle``: None.
    """
    found = _letter_matches(feedback, letters)
    removed = _splice(feedback, found, [attempt_letter or ""] * len(found))
    shifted = feedback
    if found:
        last = found[-1].group(1)
        shifted = _splice(feedback, found, [m.group(1) for m in found[:-1]]
                          + [letters[(letters.index(last) + 1) % len(letters)]])
    return {
        "values_removed": removed,
        "last_shifted": shifted,
        "approve_gold": CHOICE_APPROVAL.format(letter=gold) if gold is not None else None,
        "approve_own": CHOICE_APPROVAL.format(letter=attempt_letter) if attempt_letter is not None
        else CHOICE_APPROVAL_NO_LETTER,
        "oracle": None,
    }


def none_apply() -> dict[str, str | None]:
    """Every declared row not applicable (a benchmark that declares no perturbation)."""
    return dict.fromkeys(PERTURBATIONS)


# --------------------------------------------------------------------------- code

#: What a code feedback says when it approves the attempt.
CODE_APPROVAL = "The code is correct: it passes every test."


def code_perturbations(feedback: str, gold_code: str | None) -> dict[str, str | None]:
    """The probe's edits of a code feedback (MBPP), code being the value it can supply:

    - ``values_removed``: the feedback without its code blocks and inline code;
    - ``approve_gold``: :data:`CODE_APPROVAL` followed by the reference solution in a
      ```python block (None without one);
    - ``approve_own``: :data:`CODE_APPROVAL` alone (the attempt's code is in the refiner's context);
    - ``last_shifted``, ``oracle``: None (no value to shift, no oracle critic).
    """
    removed = redact_code(feedback, placeholder="").text  # the redaction rule's code spans, dropped
    return {
        "values_removed": removed,
        "last_shifted": None,
        "approve_gold": f"{CODE_APPROVAL}\n```python\n{gold_code.strip()}\n```" if gold_code else None,
        "approve_own": CODE_APPROVAL,
        "oracle": None,
    }

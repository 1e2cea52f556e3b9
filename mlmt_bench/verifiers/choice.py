"""Multiple-choice verifier: read the chosen letter from a response, compare with the gold.

Extraction (:func:`extract_choice`), first rule that finds a letter wins, and within a rule
the last occurrence in the response wins (models restate options before concluding):

1. an answer phrase: "Answer: B", "the answer is (b)", "correct option is **C**",
   "I choose D" (lower-case letters are accepted here when they end the phrase, so the
   article in "the answer is a function" is not read as A);
2. ``\\boxed{B}`` / ``\\boxed{\\text{(B)}}``;
3. a line that is only the letter: "B", "B.", "(B)", "**B**";
4. a parenthesised letter "(B)" or a bold one "**B**" anywhere;
5. the last standalone capital letter A-D (not inside a word; a sentence-initial article
   "A" followed by a lower-case word is skipped).

Letters run from A to the number of options in ``problem.metadata["options"]`` (default
four). The gold is ``problem.answer``. ``score`` never raises and never echoes the question
or the options (GPQA text must not be logged).
"""

from __future__ import annotations

import re
from typing import Any

from mlmt_bench.errors import UserError
from mlmt_bench.types import Problem, Verdict
from mlmt_bench.verifiers.base import Verifier


def _letters(n: int) -> str:
    return "ABCDEFGHIJ"[: max(2, min(n, 10))]


def _patterns(letters: str) -> list[re.Pattern[str]]:
    up = f"[{letters}]"
    both = f"[{letters}{letters.lower()}]"
    lead = r"(?:\*\*|\\textbf\{|\\text\{|\$)*\s*"
    tail = r"(?:\*\*|\}|\$)*"
    phrase = (
        r"(?i:(?:final\s+answer|correct\s+answer|the\s+answer|answer|correct\s+(?:option|choice)|"
        r"best\s+(?:option|choice|answer)|I\s+(?:choose|pick|select))"
        r"(?:\s+(?:is|would\s+be|should\s+be|must\s+be))?\s*(?:[:=]|\bis\b)?\s*(?:option|choice)?\s*)"
    )
    return [
        # 1. answer phrase, capital letter (any continuation but a letter), or a lower-case
        #    letter that ends the phrase (followed by punctuation / end of line).
        re.compile(phrase + lead + r"\(?(" + up + r")\)?" + tail + r"(?![A-Za-z0-9])"),
        re.compile(phrase + lead + r"\(?(" + both + r")\)?" + tail + r"(?=\s*(?:[.,;:!)]|$))",
                   re.IGNORECASE | re.MULTILINE),
        # 2. boxed
        re.compile(r"\\boxed\s*\{\s*(?:\\text(?:bf)?\s*\{\s*)?\(?(" + both + r")\)?\s*\}?\s*\}"),
        # 3. a line that is only the letter (plus light decoration)
        re.compile(r"^\s*(?:\*\*)?\(?(" + up + r")\)?[.:]?(?:\*\*)?\s*$", re.MULTILINE),
        # 4. "(B)" or "**B**" anywhere
        re.compile(r"\((" + up + r")\)|\*\*\(?(" + up + r")\)?\*\*"),
    ]


def _last_standalone(text: str, letters: str) -> str | None:
    found = None
    for m in re.finditer(r"(?<![A-Za-z0-9_'])([" + letters + r"])(?![A-Za-z0-9_'])", text):
        letter = m.group(1)
        after = text[m.end() : m.end() + 3]
        if letter == "A" and re.match(r"\s+[a-z]", after):
            continue  # the article "A bond forms ..."
        found = letter
    return found


def extract_choice(response: str, n_options: int = 4) -> str | None:
    """The letter a response chose (upper case), or None. See the module docstring."""
    if not response:
        return None
    letters = _letters(n_options)
    for pat in _patterns(letters):
        last = None
        for m in pat.finditer(response):
            last = m
        if last is not None:
            letter = next(g for g in last.groups() if g)
            return letter.upper()
    return _last_standalone(response, letters)


class ChoiceVerifier(Verifier):
    """``ChoiceVerifier()``: reward 1 when the extracted letter equals ``problem.answer``."""

    name = "choice"
    leak_kind = "choice"

    def __init__(self, **options: Any) -> None:
        options.pop("workers", None)  # accepted for a uniform interface; scoring is instant
        if options:
            raise UserError(f"verifier choice: unknown option(s) {', '.join(sorted(options))}")
        super().__init__()

    def score(self, problem: Problem, response: str) -> Verdict:
        try:
            gold = (problem.answer or "").strip().strip("()").upper()
            if not gold:
                return Verdict(0.0, False, None, "crash", "problem has no gold letter")
            options = problem.metadata.get("options") if isinstance(problem.metadata, dict) else None
            n = len(options) if isinstance(options, (list, tuple)) and options else 4
            n = max(n, "ABCDEFGHIJ".find(gold) + 1)
            if not isinstance(response, str):
                response = "" if response is None else str(response)
            letter = extract_choice(response, n)
            if letter is None:
                return Verdict(0.0, False, None, "no_answer", "no option letter found")
            if letter == gold:
                return Verdict(1.0, True, letter, "ok", "right letter")
            return Verdict(0.0, False, letter, "wrong", f"chose {letter}, gold {gold}")
        except Exception as exc:  # never raise on model output
            return Verdict(0.0, False, None, "crash", f"{type(exc).__name__}"[:100])

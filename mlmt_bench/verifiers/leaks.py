"""Leak checks: whether a feedback reveals the gold answer, one rule per kind of answer (a
verifier declares its rule as ``leak_kind``, or its own check as ``leaks``). The feedback
metrics (:func:`mlmt_bench.metrics.feedback.leakage_rate`) count what these rules find."""

from __future__ import annotations

import re
from typing import Literal

LeakKind = Literal["math", "code", "choice", "exact"]
LEAK_RULES: tuple[str, ...] = ("math", "code", "choice", "exact")


def normalize_math_text(text: str) -> str:
    """A feedback or gold text as the math verifier normalises answers
    (:func:`mlmt_bench.verifiers.math_text.normalize_answer`, spaces kept as single spaces), with every
    ``\\boxed{...}`` / ``\\fbox{...}`` unwrapped: one normaliser for verdicts and for leakage."""
    from mlmt_bench.verifiers.math_text import normalize_answer, unwrap_commands

    return normalize_answer(unwrap_commands(text, ("boxed", "fbox")), strip_spaces=False)


def normalize_math_answer(gold: str) -> str:
    """Gold math answer as the verifier normalises it, with no spaces. E.g.
    "$\\boxed{\\dfrac{1}{2}}$" -> "\\frac{1}{2}", " 42. " -> "42"."""
    return re.sub(r"\s+", "", normalize_math_text(gold))


# Characters that, next to a candidate match, make it part of a larger expression:
# "12", "x2", "2.5", "-2", "x^2", "3/2", "{2}" (inside \frac), "2,000", "2+x" ...
_LEFT_GLUE = r"(?<![\w.^_{/\\+\-*])"
_RIGHT_GLUE = r"(?![\w}^/*+\-]|\.\d|,\d{3})"
# A number right after one of these words is an enumeration, not an answer: "step 2".
_ORDINAL_CONTEXT = re.compile(
    r"(?:\b(?:step|steps|line|lines|case|cases|part|item|eq|eqn|equation|stage|paragraph|"
    r"attempt|turn|point|problem|question|no)\.?|#)\s*$",
    re.IGNORECASE,
)


def _math_leaks(feedback: str, gold: str) -> bool:
    g = normalize_math_answer(gold)
    if not g:
        return False
    body = r"\s*".join(re.escape(c) for c in g)  # spaces inside the answer are free: "1 / 2"
    pattern = re.compile(_LEFT_GLUE + body + _RIGHT_GLUE)
    text = normalize_math_text(feedback)
    for m in pattern.finditer(text):
        if not _ORDINAL_CONTEXT.search(text[: m.start()]):
            return True
    return False


_CODE_BLOCK = re.compile(r"```|^[ \t]*~~~|^[ \t]*def [A-Za-z_]\w*\s*\(", re.MULTILINE)


def _normalize_choice(gold: str) -> str:
    letter = re.sub(r"[\s()$]", "", gold).upper()
    if not re.fullmatch(r"[A-Z]", letter):
        raise ValueError(f"a choice gold must be one letter such as 'B' or '(B)', got {gold!r}")
    return letter


def _choice_leaks(feedback: str, gold: str) -> bool:
    letter = re.escape(_normalize_choice(gold))
    patterns = (
        rf"\(\s*{letter}\s*\)",  # "(B)"
        rf"\\boxed\{{\s*{letter}\s*\}}",  # "\boxed{B}"
        rf"(?<!\w){letter}\)",  # "B) is right"
        # "answer is B", "answer: (B", "option B", "choice B", "should be B"
        rf"(?i:answer|option|choice|should\s+be)\s*(?i:is|:|=)?\s*:?\s*\(?\s*{letter}(?!\w)",
    )
    return any(re.search(p, feedback) for p in patterns)


def _exact_leaks(feedback: str, gold: str) -> bool:
    g = gold.strip()
    if not g:
        return False
    return re.search(rf"(?<!\w){re.escape(g)}(?!\w)", feedback, re.IGNORECASE) is not None


def is_leak(feedback: str, gold: str | None, kind: LeakKind) -> bool | None:
    """Whether one feedback reveals the gold answer; None when it cannot be judged.

    kind:
      "math":   the normalised gold (see `normalize_math_answer`; spaces inside it are
                optional in the feedback) appears as a *standalone* expression in the
                normalised feedback: not glued to letters, digits, a decimal point,
                `^ _ { } / * + -` or a thousands separator ("2" does not leak from
                "12", "2.5", "x^2", "3/2", "-2", "\\frac{2}{3}"), and not right after an
                enumeration word ("step 2", "case 2", "line 2", "#2"). This is a string
                heuristic: equivalent forms ("0.5" for "1/2", "2,000" for "2000") are
                missed, and a gold number used for something else ("x + 2") is counted.
      "code":   the feedback contains a fenced code block (``` anywhere, ~~~ at a line
                start) or a line starting `def name(`; the gold is not used.
      "choice": the gold letter is named as an option: "(B)", "B)", "\\boxed{B}",
                "answer is B", "answer: B", "option B", "choice B", "should be B". A bare
                capital letter alone does not count (it is too often a word or a label).
      "exact":  the stripped gold appears case-insensitively as a standalone token
                (not glued to word characters).
    Returns None for a gold that is None (math/choice/exact), since nothing can leak.
    """
    if kind not in LEAK_RULES:
        raise ValueError(f"unknown leakage kind {kind!r}; expected one of {LEAK_RULES}")
    if kind == "code":
        return _CODE_BLOCK.search(feedback) is not None
    if gold is None:
        return None
    if kind == "math":
        return _math_leaks(feedback, gold)
    if kind == "choice":
        return _choice_leaks(feedback, gold)
    return _exact_leaks(feedback, gold)

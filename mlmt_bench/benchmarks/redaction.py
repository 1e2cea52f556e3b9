"""Answer-free feedback (METHOD v4, ``feedback.redact``): the redaction rules the benchmarks
declare, and what a feedback states as its final answer. Pure text in, text out.

A rule removes spans of the feedback and puts a placeholder in each: ``?`` for a number (so that
``6+250 = 257, not 256`` on an attempt that wrote 256 reads ``6+250 = ?, not 256``), ``[…]`` for
code and for an option letter or text. (synthetic-arith declares a stricter rule of its own:
:func:`mlmt_bench.benchmarks.synthetic.redact_checks`.) It returns a :class:`~mlmt_bench.types.Redaction`:
the shown text, the number of spans removed and their share of the feedback's characters.

**Numbers** (:func:`number_spans`), for arithmetic and free-text maths. A number is a whole token:

- digits, with an optional decimal part (``3.25``) or thousands groups (``1,234`` reads 1234);
  ``.5`` is a number too. Digits inside an identifier are not (``x2``, ``a_1``, ``H2O``), but
  digits after a LaTeX command are (``2\\times3``: 2 and 3), and a coefficient is
  (``2x``: 2). Digits inside a longer number are never a number of their own (``11`` in ``113``).
- a sign belongs to the number where the ``-`` cannot be a binary minus: at the start, or after
  a space, an opening bracket or one of ``=,:;<>$`` (``x=-3``: -3; ``5-3``: 5 and 3; ``5 - 3``:
  5 and 3, a spaced minus is an operator).
- a fraction is one number: ``3/4`` (digits on both sides of the slash) and ``\\frac{3}{4}``
  (also ``\\dfrac``, ``\\tfrac``), both read ``3/4``; it is not reduced (``2/4`` is not ``1/2``).

Values are compared as written after normalisation (commas dropped, leading zeros and trailing
decimal zeros dropped: ``1,000``, ``1000.0`` and ``01000`` are all ``1000``). A number of the
feedback is kept when its value occurs in the problem or the attempt; an unsigned one is also
kept when it occurs there with a sign (``-3`` contains the digits ``3``), and a fraction's
numerator and denominator are kept on their own when the fraction occurs. Everything else,
including a new fraction of quoted numbers, is replaced by ``?``.

**Code** (:func:`redact_code`): every fenced block (three backticks to three backticks, or to
the end of a feedback cut off inside one) and every inline code span (one backtick to the next
on the same line). Indented code without fences is not recognised.

**Multiple choice** (:func:`redact_choice`): the options' texts wherever they occur (case and
runs of white space ignored, whole words), and option letters where they are used as answers:
``(B)``, ``B)``, ``**B**``, ``\\boxed{B}``, a line that is only the letter, and a letter (or a
list ``B and C``, ``B, C or D``) after ``answer``, ``option``, ``choice``, ``choose``, ``pick``
or ``select`` (``the answer is B``, ``Answer: B``, ``options A and C``). A capital letter in
running text (``A bond forms``) is not removed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from decimal import Decimal, InvalidOperation

from mlmt_bench.types import Redaction

NUMBER_PLACEHOLDER = "?"
SPAN_PLACEHOLDER = "[…]"

Span = tuple[int, int]

# ------------------------------------------------------------------------------------- numbers

_FRAC_RE = re.compile(r"\\[dt]?frac\s*\{\s*(-?)\s*(\d+)\s*\}\s*\{\s*(\d+)\s*\}")
_DIGITS_RE = re.compile(r"(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?(?:\s*/\s*\d+(?!\.\d))?|\.\d+")
_SIGN_BEFORE = set(" \t\n([{=,:;<>$")


def _canonical(digits: str) -> str:
    """``"1,000.50"`` -> ``"1000.5"``; ``"007"`` -> ``"7"``; ``"3 / 4"`` -> ``"3/4"``."""
    text = digits.replace(",", "").replace(" ", "")
    if "/" in text:
        num, den = text.split("/", 1)
        return f"{_canonical(num)}/{_canonical(den)}"
    try:
        value = Decimal(text)
    except InvalidOperation:  # pragma: no cover - the pattern only matches numbers
        return text
    if value == value.to_integral_value():
        return str(int(value))
    return format(value.normalize(), "f")


def _is_identifier_digit(text: str, start: int) -> bool:
    """Whether the digits at ``start`` continue an identifier (``x2``, ``a_1``) rather than follow
    a LaTeX command (``\\times3``) or stand alone."""
    j = start
    while j > 0 and (text[j - 1].isalpha() or text[j - 1] == "_"):
        j -= 1
    if j == start:
        return False
    return not (j > 0 and text[j - 1] == "\\" and text[j:start].isalpha())


def number_spans(text: str) -> list[tuple[int, int, str]]:
    """``(start, end, value)`` of every number token of ``text`` (see the module docstring), in
    order; ``value`` is the normalised number with its sign (``"-3"``, ``"1000"``, ``"3/4"``)."""
    out: list[tuple[int, int, str]] = []
    taken: list[Span] = []
    for m in _FRAC_RE.finditer(text):
        value = f"{m.group(1)}{_canonical(m.group(2))}/{_canonical(m.group(3))}"
        out.append((m.start(), m.end(), value))
        taken.append((m.start(), m.end()))
    for m in _DIGITS_RE.finditer(text):
        start, end = m.start(), m.end()
        if any(a <= start < b for a, b in taken):
            continue
        if start > 0 and (text[start - 1].isdigit() or text[start - 1] == "."):
            continue  # inside a longer number (the pattern would have taken it) or "v1.2"-like
        if _is_identifier_digit(text, start):
            continue
        sign = ""
        if start > 0 and text[start - 1] == "-" and (start == 1 or text[start - 2] in _SIGN_BEFORE):
            start, sign = start - 1, "-"
        value = _canonical(m.group(0))
        out.append((start, end, sign + value if value.strip("0/.") else value))
    out.sort()
    return out


def number_values(texts: Iterable[str]) -> set[str]:
    """The values a feedback may quote from ``texts`` (the problem and the attempt): every number
    they write, the same without its sign, and a fraction's numerator and denominator."""
    allowed: set[str] = set()
    for text in texts:
        for _, _, value in number_spans(text):
            allowed.add(value)
            unsigned = value.lstrip("-")
            allowed.add(unsigned)
            if "/" in unsigned:
                allowed.update(unsigned.split("/", 1))
    return allowed


def redact_numbers(feedback: str, sources: Sequence[str], placeholder: str = NUMBER_PLACEHOLDER) -> Redaction:
    """``feedback`` with every number that occurs in none of ``sources`` (the problem x and the
    attempt z) replaced by ``placeholder``; see the module docstring for what a number is."""
    allowed = number_values(sources)
    spans = [(a, b) for a, b, value in number_spans(feedback) if value not in allowed]
    return replace_spans(feedback, spans, placeholder)


def last_number(text: str) -> str | None:
    """The last number of ``text`` as written (sign included, commas kept), or None."""
    spans = number_spans(text)
    return text[spans[-1][0]:spans[-1][1]] if spans else None


# ------------------------------------------------------------------------------------- spans


def merge_spans(spans: Iterable[Span]) -> list[Span]:
    """Sorted, non-overlapping spans covering the same characters (touching ones merged)."""
    out: list[Span] = []
    for a, b in sorted(s for s in spans if s[1] > s[0]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def replace_spans(text: str, spans: Iterable[Span], placeholder: str) -> Redaction:
    """``text`` with each of ``spans`` (merged first) replaced by ``placeholder``: the redaction's
    text, the number of merged spans, and their share of ``text``'s characters."""
    merged = merge_spans(spans)
    parts, last = [], 0
    for a, b in merged:
        parts += [text[last:a], placeholder]
        last = b
    parts.append(text[last:])
    share = sum(b - a for a, b in merged) / len(text) if text else 0.0
    return Redaction("".join(parts), len(merged), share)


# ------------------------------------------------------------------------------------- code

#: a fenced block (to the closing fence, or to the end of a feedback cut off inside it), else
#: an inline code span on one line
_CODE_RE = re.compile(r"```[\s\S]*?(?:```|\Z)|`[^`\n]+`")
_FENCED_RE = re.compile(r"```[^\n`]*\n?([\s\S]*?)(?:```|\Z)")


def redact_code(feedback: str, placeholder: str = SPAN_PLACEHOLDER) -> Redaction:
    """``feedback`` with its fenced code blocks and inline code replaced by ``placeholder``."""
    return replace_spans(feedback, [m.span() for m in _CODE_RE.finditer(feedback)], placeholder)


def last_code_block(feedback: str) -> str | None:
    """The body of the last fenced code block of ``feedback`` (a block cut off at the end counts),
    or None when it has none (or only empty ones)."""
    bodies = [m.group(1).strip("\n") for m in _FENCED_RE.finditer(feedback)]
    bodies = [b for b in bodies if b.strip()]
    return bodies[-1] if bodies else None


# ------------------------------------------------------------------------------------- choice


def _letter_patterns(letters: str) -> list[re.Pattern[str]]:
    up = f"[{letters}]"
    lead = r"(?:\*\*|\$|\\text(?:bf)?\{|\()*\s*"
    listed = rf"{up}(?:(?:\s*,\s*(?:and\s+|or\s+)?|\s+(?:and|or)\s+){lead}{up})*"
    phrase = (r"(?i:\b(?:answers?|options?|choices?|choose|chose|chosen|pick|picked|select|selected)\b"
              r"(?:\s+(?:is|are|was|were|would\s+be|should\s+be|must\s+be))?\s*[:=]?\s*)")
    return [
        re.compile(rf"\(\s*{up}\s*\)"),                              # (B)
        re.compile(rf"(?<![A-Za-z0-9(]){up}\)"),                       # B)
        re.compile(rf"\*\*\(?{up}\)?\*\*"),                            # **B**
        re.compile(rf"\\boxed\s*\{{\s*(?:\\text(?:bf)?\s*\{{\s*)?\(?{up}\)?\s*\}}?\s*\}}"),  # \boxed{B}
        re.compile(rf"^[ \t]*{up}[.:]?[ \t]*$", re.MULTILINE),         # a line that is only "B"
        # after an answer phrase: "the answer is B", "Answer: B", "options A and C", "I choose D"
        # a lower-case letter that ends an answer phrase: "Answer: b", "the answer is (c)."
        re.compile(phrase + lead + rf"({up.lower()})\)?(?=[ \t]*(?:[.,;:!)*$}}]|$))", re.MULTILINE),
        re.compile(phrase + lead + rf"({listed})(?![A-Za-z0-9])"),
    ]


def _letter_spans(text: str, letters: str) -> list[Span]:
    """Spans of the option letters ``text`` uses as answers (the letters only, inside phrases)."""
    spans: list[Span] = []
    pats = _letter_patterns(letters)
    for pat in pats[:-2]:  # the letter with its decoration
        spans += [m.span() for m in pat.finditer(text)]
    for m in pats[-2].finditer(text):  # the letter only, not the phrase before it
        spans.append(m.span(1))
    for m in pats[-1].finditer(text):  # each letter of the list
        start = m.start(1)
        spans += [(start + k.start(), start + k.end()) for k in re.finditer(f"[{letters}]", m.group(1))]
    return spans


def _option_spans(text: str, options: Iterable[str]) -> list[Span]:
    spans: list[Span] = []
    for option in options:
        words = str(option).split()
        if not words:
            continue
        body = r"\s+".join(map(re.escape, words))
        head = r"(?<![A-Za-z0-9])" if words[0][0].isalnum() else ""
        tail = r"(?![A-Za-z0-9])" if words[-1][-1].isalnum() else ""
        spans += [m.span() for m in re.finditer(head + body + tail, text, re.IGNORECASE)]
    return spans


def option_letters(n_options: int) -> str:
    """The letters of ``n_options`` options: ``"ABCD"`` for four (2 to 10)."""
    return "ABCDEFGHIJ"[: max(2, min(n_options, 10))]


def redact_choice(feedback: str, options: Sequence[str], placeholder: str = SPAN_PLACEHOLDER) -> Redaction:
    """``feedback`` with the options' texts and the option letters used as answers replaced by
    ``placeholder`` (see the module docstring)."""
    letters = option_letters(len(options) or 4)
    spans = _letter_spans(feedback, letters) + _option_spans(feedback, options)
    return replace_spans(feedback, spans, placeholder)


def last_option_letter(feedback: str, n_options: int = 4) -> str | None:
    """The option letter ``feedback`` states last as an answer (the patterns of
    :func:`redact_choice`), or None."""
    letters = option_letters(n_options)
    spans = _letter_spans(feedback, letters)
    if not spans:
        return None
    a, b = max(spans, key=lambda s: (s[1], s[0]))
    found = re.findall(f"[{letters}]", feedback[a:b].upper())
    return found[-1] if found else None


# ------------------------------------------------------------------------------------- maths answers

_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` of ``text`` (braces matched), or None (none, or
    one never closed)."""
    found = None
    for m in _BOXED_RE.finditer(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            if text[i] == "\\":
                i += 2
                continue
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            found = text[m.end():i - 1].strip()
    return found


def stated_math_answer(feedback: str) -> str | None:
    """The final answer a free-text maths feedback states, as a response the maths verifier
    scores: its last ``\\boxed{...}``, else its last number, boxed; None when it has neither."""
    answer = last_boxed(feedback)
    if not answer:
        answer = last_number(feedback)
    return None if not answer else f"\\boxed{{{answer}}}"

"""Reading a final answer out of maths text, and normalising it: pure string functions.

The maths verifier (:mod:`mlmt_bench.verifiers.math`) extracts and compares answers with them,
and the leakage metric (:mod:`mlmt_bench.metrics.feedback`) normalises feedbacks with the same
rules, so that one normaliser decides both verdicts and leaks. Every function is linear in its
input (a 1 MB response is read in about a second): answers come from models and from users'
files. The extraction and normalisation rules are described in :mod:`mlmt_bench.verifiers.math`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

# ---------------------------------------------------------------------------------------
# Extraction
# ---------------------------------------------------------------------------------------

_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_BRACE_TOKENS = re.compile(r"\\[\s\S]|[{}]")  # what brace matching looks at: an escape pair, a brace
_BLANKS = re.compile(r"[ \t]*")
_TOKEN_RE = re.compile(r"[^\s$]+")
_NON_SPACE = re.compile(r"\S")


def _closing_braces(text: str, opens: set[int]) -> dict[int, int]:
    """``{i: index just past the } that closes the { at text[i]}`` for each ``i`` of ``opens``
    that is closed (backslash-escaped braces do not count), in one pass over ``text``.

    One pass for all of them, so finding the ends of N ``\\boxed{`` is linear in the text, not
    N scans to its end each (1 MB of unclosed ``\\boxed{`` took minutes). Each ``{`` of ``opens``
    must follow a character that is not a backslash (as after ``\\boxed`` or a space): the pass
    then parses escapes exactly as a scan starting at that brace would."""
    closes: dict[int, int] = {}
    if not opens:
        return closes
    stack: list[int] = []  # open braces not closed yet: their index if in opens, else -1
    for m in _BRACE_TOKENS.finditer(text, min(opens)):
        c = text[m.start()]
        if c == "{":
            stack.append(m.start() if m.start() in opens else -1)
        elif c == "}" and stack:
            i = stack.pop()
            if i >= 0:
                closes[i] = m.end()
    return closes


def _after_blanks(text: str, i: int) -> int:
    """The index after the spaces and tabs at ``text[i:]`` (``[ \\t]*`` always matches)."""
    m = _BLANKS.match(text, i)
    assert m is not None
    return m.end()


def extract_boxed(text: str) -> str | None:
    """Content of the last complete, non-empty ``\\boxed{...}`` / ``\\fbox{...}``.

    Linear in the length of ``text`` (the braces of every ``\\boxed{`` are matched in one pass,
    and no content but the answer is copied), so a response of a million unclosed ``\\boxed{``
    is answered at once."""
    starts = [_after_blanks(text, m.end()) for m in _BOX_RE.finditer(text)]
    opens = {i for i in starts if text.startswith("{", i)}
    closes = _closing_braces(text, opens)
    found: tuple[int, int] | None = None  # the span of the last non-empty content
    token_end = -1
    for i in starts:
        if i in opens:
            end = closes.get(i)
            if end is not None and _NON_SPACE.search(text, i + 1, end - 1):
                found = (i + 1, end - 1)
        else:  # "\boxed 5": one token (tokens after several "\boxed" end at the same place)
            if i >= token_end:
                tok = _TOKEN_RE.match(text, i)
                if tok is None:
                    continue
                token_end = tok.end()
            found = (i, token_end)
    return text[found[0]:found[1]].strip() if found is not None else None


_PHRASE_RE = re.compile(
    r"(?:final\s+answer|the\s+answer|\banswer)\s*(?:is|:|=)\s*:?\s*|####\s*", re.IGNORECASE
)
_NUMBER_RE = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?|-?\.\d+")


def _strip_math_delims(s: str) -> str:
    s = s.strip()
    for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"), ("**", "**")):
        if s.startswith(left) and s.endswith(right) and len(s) >= len(left) + len(right):
            s = s[len(left) : len(s) - len(right)].strip()
    return s


def phrase_answer(text: str) -> str | None:
    """What the last answer phrase of ``text`` states ("final answer is X", "the answer is X",
    "Answer: X", "#### X"), up to the end of its sentence or line; None without one."""
    last = None
    for m in _PHRASE_RE.finditer(text):
        last = m
    if last is None:
        return None
    rest = text[last.end() :]
    # up to the end of the line, or of the sentence (". " / "." at the end); not inside $...$
    line = rest.split("\n", 1)[0]
    out = []
    in_math = False
    i = 0
    while i < len(line):
        c = line[i]
        if c == "$":
            in_math = not in_math
        elif not in_math and c == "." and (i + 1 == len(line) or line[i + 1] in " \t"):
            break
        out.append(c)
        i += 1
    ans = _strip_math_delims("".join(out).strip().rstrip(".").strip())
    return ans or None


def extract_answer(response: str) -> str | None:
    """The final answer written in ``response`` (see the module docstring), or None."""
    if not response:
        return None
    boxed = extract_boxed(response)
    if boxed is not None:
        return boxed
    phrase = phrase_answer(response)
    if phrase is not None:
        return phrase
    last = None
    for m in _NUMBER_RE.finditer(response):
        last = m
    if last is not None:
        return re.sub(r"\s+", "", last.group(0))
    return None


# ---------------------------------------------------------------------------------------
# Normalisation
# ---------------------------------------------------------------------------------------

_UNITS = (
    r"units?|square|sq\.?|cubic|cm|mm|km|m|meters?|metres?|centimeters?|centimetres?|"
    r"kilometers?|kilometres?|inch(?:es)?|in\.|feet|foot|ft|yards?|yds?|miles?|mph|"
    r"seconds?|secs?|minutes?|mins?|hours?|hrs?|days?|weeks?|months?|years?|"
    r"cents?|dollars?|euros?|pounds?|lbs?|ounces?|oz|grams?|kg|kilograms?|liters?|litres?|"
    r"ml|gallons?|degrees?|radians?|people|persons?|students?|points?|times|ways"
)
_UNIT_RE = re.compile(r"(?:" + _UNITS + r")(?:\^\{?[23]\}?)?", re.IGNORECASE)


def strip_unit_tails(s: str) -> str:
    """``s`` without trailing whitespace and trailing unit words (``5 cm`` -> ``5``, ``3 sq. ft``
    -> ``3``): while the last word is a unit (with an optional ``^2`` / ``^{3}``) after spaces that
    follow a digit, ``}`` or ``.`` (or after two spaces or more), it is dropped.

    Read from the end, each character once: the regex it replaces, applied once per unit,
    backtracked through every run of spaces (``5`` + 10,000 spaces + ``x``: 84 s)."""
    end = len(s.rstrip())
    while True:
        word = end
        while word > 0 and not s[word - 1].isspace():
            word -= 1
        run = word
        while run > 0 and s[run - 1].isspace():
            run -= 1
        after = run > 0 and (s[run - 1].isdecimal() or s[run - 1] in "}.")
        if run == word or not (after or word - run >= 2) or not _UNIT_RE.fullmatch(s, word, end):
            return s[:end]
        end = run


_TEXT_CMDS = ("text", "textbf", "textit", "textrm", "mbox", "mathrm", "mathbf", "mathit", "operatorname")


def unwrap_commands(s: str, names: Sequence[str]) -> str:
    """``\\text{abc}`` -> `` abc`` (a space, so "5\\text{cm}" keeps its unit apart), for every
    command of ``names``, nested ones too; at the first unbalanced one only its command word is
    dropped and the rest is kept as it is. One pass (:func:`_closing_braces`), not one scan of
    the string per command."""
    pat = re.compile(r"\\(?:" + "|".join(names) + r")\s*\{")
    matches = list(pat.finditer(s))
    if not matches:
        return s
    closes = _closing_braces(s, {m.end() - 1 for m in matches})
    edits: list[tuple[int, int, str]] = []  # (start, end, replacement), in order of start
    drop: set[int] = set()  # the closing braces of the unwrapped commands
    for m in matches:
        end = closes.get(m.end() - 1)
        if end is None:  # unbalanced: drop the command word only, and stop
            edits.append((m.start(), m.end() - 1, ""))
            break
        edits.append((m.start(), m.end(), " "))
        drop.add(end - 1)
    edits.extend((i, i + 1, "") for i in drop)
    edits.sort()
    out, pos = [], 0
    for start, end, text in edits:
        out.append(s[pos:start])
        out.append(text)
        pos = end
    out.append(s[pos:])
    return "".join(out)


def normalize_answer(s: str, *, strip_spaces: bool = True) -> str:
    """Fallback normaliser used before (and alongside) math-verify. Deterministic, pure."""
    s = str(s).strip()
    s = s.replace("\n", " ")
    s = s.replace("\\$", "").replace("$", "")
    s = re.sub(r"\\(?:displaystyle|left|right|bigl|bigr|Bigl|Bigr|big|Big|bigg|Bigg)(?![A-Za-z])", "", s)
    s = re.sub(r"\\[dt]frac(?![A-Za-z])", r"\\frac", s)
    s = s.replace("\\\\", "\x00")  # protect LaTeX row breaks (a double backslash) from the spacing rule
    s = re.sub(r"\\[!,;:> ]", " ", s)
    s = s.replace("\x00", "\\\\").replace("~", " ")
    s = re.sub(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\circ|°|\\degree", "", s)
    s = s.replace("\\%", "").replace("%", "")
    s = unwrap_commands(s, _TEXT_CMDS)
    s = strip_unit_tails(s)
    s = s.strip().rstrip(".").strip()
    # \frac12, \frac 59, \frac9{19}, \frac{270}7, \sqrt2
    s = re.sub(r"\\frac\s*(\d)\s*(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac\s*(\d)\s*\{", r"\\frac{\1}{", s)
    s = re.sub(r"\\frac\s*\{([^{}]*)\}\s*(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\sqrt\s*(\d)", r"\\sqrt{\1}", s)
    s = re.sub(r"\s+", "" if strip_spaces else " ", s).strip()
    compact = s.replace(" ", "")
    # thousands separators: only for a plain number such as 1,000 or 11,111,111,100.5
    if re.fullmatch(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?", compact):
        s = compact.replace(",", "")
    # .5 -> 0.5 ; 2.50 -> 2.5 ; 3.0 -> 3
    s = re.sub(r"(?<![\d.])\.(\d)", r"0.\1", s)
    if re.fullmatch(r"-?\d+\.\d+", s):
        s = s.rstrip("0").rstrip(".")
    m = re.fullmatch(r"\(([A-Za-z])\)", s)
    if m:
        s = m.group(1)
    return s

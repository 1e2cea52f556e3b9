"""MathVerifier: extraction, equivalence tables, real MATH-500 / GSM8K golds, timeouts."""

from __future__ import annotations

import threading
import time

import pytest

from mlmt_bench import registry
from mlmt_bench.benchmarks.gsm8k import GSM8K
from mlmt_bench.benchmarks.math500 import Math500
from mlmt_bench.types import Problem, Verdict
from mlmt_bench.verifiers.math import (
    MathVerifier,
    answers_equivalent,
    extract_answer,
    integer_rule,
    math_verify_equal,
    normalize_answer,
)


@pytest.fixture(scope="module")
def verifier() -> MathVerifier:
    return MathVerifier()


def prob(answer: str | None) -> Problem:
    return Problem(id="t/1", benchmark="test", prompt="?", answer=answer)


# ---------------------------------------------------------------------------------------
# Equivalent pairs (gold, response answer) that must be judged correct
# ---------------------------------------------------------------------------------------
EQUIVALENT = [
    # fractions and decimals
    ("\\frac{1}{2}", "0.5"),
    ("0.5", "\\frac12"),
    ("\\frac{1}{2}", "1/2"),
    ("\\dfrac{3}{4}", "\\frac{3}{4}"),
    ("\\tfrac{3}{4}", "0.75"),
    ("\\frac 59", "\\frac{5}{9}"),
    ("\\frac9{19}", "\\frac{9}{19}"),
    ("\\dfrac{17}{50}", "0.34"),
    ("-\\frac{3}{8}", "\\frac{-3}{8}"),
    ("-0.375", "-\\frac{3}{8}"),
    ("1\\frac{4}{5}", "\\frac{9}{5}"),
    ("\\frac{14}{3}", "4\\frac{2}{3}"),
    ("0.15", "\\frac{3}{20}"),
    ("4.5", "\\frac{9}{2}"),
    (".0000672", "6.72\\times10^{-5}"),
    ("-2", "-2.0"),
    ("2", "+2"),
    # thousands separators and money
    ("1,000", "1000"),
    ("1000", "1,000"),
    ("10,\\!080", "10080"),
    ("11,\\! 111,\\! 111,\\! 100", "11111111100"),
    ("58,500", "58500"),
    ("\\$32,\\!348", "32348"),
    ("\\$18.90", "18.9"),
    # degrees, units, percent, text
    ("90^\\circ", "90"),
    ("30^{\\circ}", "30"),
    ("120^\\circ", "120^{\\circ}"),
    ("\\frac{270}7\\text{ degrees}", "\\frac{270}{7}"),
    ("5.4 \\text{ cents}", "5.4"),
    ("864 \\mbox{ inches}^2", "864"),
    ("15\\mbox{ cm}^2", "15"),
    ("12 \\text{ square units}", "12"),
    ("10\\%", "10"),
    ("\\frac{1}{4}", "25\\%"),
    ("\\text{Evelyn}", "Evelyn"),
    ("\\text{(C)}", "C"),
    ("\\text{(C)}", "(C)"),
    # intervals, unions, sets, tuples, lists
    ("(3,4]", "(3, 4]"),
    ("(-\\infty, 0]", "(-\\infty,0]"),
    ("(0,9) \\cup (9,36)", "(0,9)\\cup(9,36)"),
    ("\\left(\\frac{3}{5},\\frac{8}{3}\\right]", "(0.6, \\frac{8}{3}]"),
    ("x \\in [-2,7]", "[-2,7]"),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})"),
    ("(6,31,-1)", "(6, 31, -1)"),
    ("\\{1\\pm\\sqrt{5},-2\\}", "\\{-2, 1+\\sqrt{5}, 1-\\sqrt{5}\\}"),
    ("3, 5, 7", "7, 5, 3"),
    ("1,-2", "-2, 1"),
    # radicals, pi, complex, algebra
    ("11\\sqrt2", "11\\sqrt{2}"),
    ("3\\sqrt{13}", "\\sqrt{117}"),
    ("\\frac{\\sqrt{3}}{3}", "\\frac{1}{\\sqrt{3}}"),
    ("2\\pi", "\\pi \\cdot 2"),
    ("6 - 5i", "-5i+6"),
    ("x=5", "5"),
    ("y = 2x + 3", "y=3+2x"),
    ("p - q", "-q+p"),
    ("x^3+3x-6", "x^3 + 3x - 6"),
    ("(a+5)(b+2)", "(b+2)(a+5)"),
    (
        "\\begin{pmatrix} -1/3 \\\\ 2/3 \\\\ 5/3 \\end{pmatrix}",
        "\\begin{pmatrix} -\\frac{1}{3} \\\\ \\frac{2}{3} \\\\ \\frac{5}{3} \\end{pmatrix}",
    ),
    # numbers in a base
    ("52_8", "52_{8}"),
    ("4210_{5}", "4210_5"),
    ("52_8", "52"),
]

# ---------------------------------------------------------------------------------------
# Near misses that must be judged wrong
# ---------------------------------------------------------------------------------------
NEAR_MISSES = [
    ("\\frac{1}{2}", "0.51"),
    ("\\frac{1}{2}", "\\frac{2}{1}"),
    ("0.5", "\\frac13"),
    ("\\dfrac{3}{4}", "\\frac{4}{3}"),
    ("\\frac{14}{3}", "14/4"),
    ("1\\frac{4}{5}", "\\frac{4}{5}"),
    ("0.15", "0.015"),
    ("1.25", "125"),
    ("4.5", "45"),
    ("326.5", "326"),
    ("1,000", "100"),
    ("1000", "1001"),
    ("10,\\!080", "10800"),
    ("\\$18.90", "18.09"),
    ("5.4 \\text{ cents}", "54"),
    ("90^\\circ", "45^\\circ"),
    ("30^\\circ", "60"),
    ("(3,4]", "(3,4)"),
    ("(3,4]", "[3,4]"),
    ("(-\\infty, 0]", "(-\\infty, 0)"),
    ("(2,\\infty)", "[2,\\infty)"),
    ("(0,9) \\cup (9,36)", "(0,36)"),
    ("(6,31,-1)", "(6,31,1)"),
    ("(6,31,-1)", "(31,6,-1)"),
    ("(-2,1)", "(1,-2)"),
    ("\\{1\\pm\\sqrt{5},-2\\}", "\\{1+\\sqrt{5},-2\\}"),
    ("3, 5, 7", "3, 5"),
    ("1 \\pm \\sqrt{19}", "1 + \\sqrt{19}"),
    ("-2", "2"),
    ("-\\frac{35}{9}", "\\frac{35}{9}"),
    ("-\\frac{\\pi}{6}", "\\frac{\\pi}{6}"),
    ("6 - 5i", "6+5i"),
    ("1+274i", "274+i"),
    ("11\\sqrt2", "11\\sqrt{3}"),
    ("3\\sqrt{13}", "13\\sqrt{3}"),
    ("\\sqrt{51}", "51"),
    ("\\pi", "3.14"),
    ("288 \\pi", "288"),
    ("2\\pi", "\\pi"),
    ("x^3+3x-6", "x^3+3x+6"),
    ("p - q", "q - p"),
    ("2k+2", "2k"),
    ("x=5", "x=-5"),
    ("y = 2x + 3", "y = 3x + 2"),
    ("\\text{Evelyn}", "Navin"),
    ("\\text{(C)}", "D"),
    ("\\text{east}", "west"),
    ("\\text{even}", "odd"),
    ("52_8", "52_7"),
    ("52_8", "42"),
    ("2516_8", "2516_{9}"),
    (
        "\\begin{pmatrix} -2 \\\\ -14 \\\\ -7 \\end{pmatrix}",
        "\\begin{pmatrix} -2 \\\\ -14 \\\\ 7 \\end{pmatrix}",
    ),
]


def test_table_sizes() -> None:
    assert len(EQUIVALENT) >= 40 and len(NEAR_MISSES) >= 40


@pytest.mark.parametrize("gold,pred", EQUIVALENT)
def test_equivalent_pairs(verifier: MathVerifier, gold: str, pred: str) -> None:
    v = verifier.score(prob(gold), f"Working... so the result is \\boxed{{{pred}}}.")
    assert v.correct and v.kind == "ok" and v.reward == 1.0, (gold, pred, v)


@pytest.mark.parametrize("gold,pred", NEAR_MISSES)
def test_near_misses(verifier: MathVerifier, gold: str, pred: str) -> None:
    v = verifier.score(prob(gold), f"Working... so the result is \\boxed{{{pred}}}.")
    assert not v.correct and v.kind == "wrong" and v.reward == 0.0, (gold, pred, v)


# ---------------------------------------------------------------------------------------
# Real data
# ---------------------------------------------------------------------------------------


def _count(verdicts: list[Verdict]) -> int:
    return sum(v.correct for v in verdicts)


def test_math500_all_golds_verify(verifier: MathVerifier) -> None:
    problems = Math500().all_problems()
    assert len(problems) == 500
    verdicts = verifier.score_batch(problems, [f"The answer is therefore \\boxed{{{p.answer}}}." for p in problems])
    bad = [(p.answer, v) for p, v in zip(problems, verdicts) if not v.correct]
    assert _count(verdicts) == 500, bad[:5]
    # The reference solutions themselves, as full responses.
    verdicts = verifier.score_batch(problems, [p.metadata["solution"] for p in problems])
    assert _count(verdicts) == 500


def test_math500_golds_pass_math_verify_alone() -> None:
    """Without the normaliser's string shortcut, math-verify accepts every gold too."""
    problems = Math500().all_problems()
    assert sum(math_verify_equal(p.answer, p.answer) for p in problems) == 500


def test_math500_golds_survive_rewriting(verifier: MathVerifier) -> None:
    """Golds re-typed the way models write them (\\dfrac, \\left(, spaces, $...$) still match."""
    problems = Math500().all_problems()
    responses = []
    for p in problems:
        a = p.answer.replace("\\frac", "\\dfrac").replace("(", "\\left(").replace(")", "\\right)")
        responses.append(f"Final: $\\boxed{{ {a} }}$")
    assert _count(verifier.score_batch(problems, responses)) == 500


def test_gsm8k_all_golds_verify(verifier: MathVerifier) -> None:
    problems = GSM8K().all_problems()
    assert len(problems) == 1319
    verdicts = verifier.score_batch(problems, [f"\\boxed{{{p.answer}}}" for p in problems])
    assert _count(verdicts) == 1319
    # the upstream solution text, ending "#### <n>", read by the phrase rule
    solutions = [p.metadata["solution"] + "\n#### " + p.answer for p in problems]
    assert _count(verifier.score_batch(problems, solutions)) == 1319
    # with thousands separators and a unit, as models write them
    spelled = [f"So she earns ${int(float(p.answer)):,} dollars in total." if "." not in p.answer else p.answer
               for p in problems]
    assert _count(verifier.score_batch(problems, spelled)) == 1319


# ---------------------------------------------------------------------------------------
# Extraction
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "response,expected",
    [
        ("so \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("first \\boxed{1} then \\boxed{2}", "2"),
        ("\\boxed{\\{1,2\\}} done", "\\{1,2\\}"),
        ("\\boxed{\\frac{\\sqrt{3}}{2}}.", "\\frac{\\sqrt{3}}{2}"),
        ("\\fbox{42}", "42"),
        ("\\boxed 7 is it", "7"),
        ("good \\boxed{5} then truncated \\boxed{6", "5"),
        ("\\boxed{} and \\boxed{3}", "3"),
        ("The final answer is $\\frac{3}{4}$.", "\\frac{3}{4}"),
        ("The final answer is 12. I hope it is correct.", "12"),
        ("Answer: 3.5", "3.5"),
        ("blah\n#### 1,234", "1,234"),
        ("We get 3 apples, then 4, so 12 in all", "12"),
        ("it is -2.5 or so", "-2.5"),
        ("ratio 3/4", "3/4"),
        ("a total of 1,000,000 people", "1,000,000"),
    ],
)
def test_extract_answer(response: str, expected: str) -> None:
    assert extract_answer(response) == expected


def test_no_answer(verifier: MathVerifier) -> None:
    v = verifier.score(prob("5"), "I do not know.")
    assert v.kind == "no_answer" and v.extracted is None and v.reward == 0.0
    assert verifier.score(prob("5"), "").kind == "no_answer"


def test_wrong_answer(verifier: MathVerifier) -> None:
    v = verifier.score(prob("5"), "so \\boxed{6}")
    assert v.kind == "wrong" and v.extracted == "6" and not v.correct


@pytest.mark.parametrize(("gold", "pred", "expected"), [
    ("2", "3", False), ("7", "007", True), ("0", "-0", True), ("-12", "12", False),
    ("+5", "5", True), ("1" + "0" * 5000, "1" + "0" * 5000, True), ("1" + "0" * 5000, "1" + "0" * 4999, False),
    ("0.5", "1/2", None), ("2", "2.0", None), ("x", "3", None),
])
def test_integer_rule(gold: str, pred: str, expected: bool | None) -> None:
    assert integer_rule(gold, pred) is expected
    if expected is not None and len(gold) < 20:
        assert math_verify_equal(gold, pred) is expected  # the shortcut agrees with math-verify


def test_integers_need_no_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    v = MathVerifier()
    checked: list[tuple[str, str]] = []
    monkeypatch.setattr(v, "_check", lambda gold, pred: checked.append((gold, pred)) or False)
    assert v.score(prob("2"), "it is 3").kind == "wrong"
    assert v.score(prob("-0"), "\\boxed{0}").kind == "ok"
    assert checked == []
    assert v.score(prob("1/2"), "\\boxed{0.6}").kind == "wrong"
    assert checked == [("1/2", "0.6")]


def test_never_raises(verifier: MathVerifier) -> None:
    for response in ["\\boxed{\\frac{", "\\boxed{)(}", "\\boxed{\\}", "$$$$", "\x00\\boxed{\x00}", "\\boxed{" * 50]:
        v = verifier.score(prob("5"), response)
        assert isinstance(v, Verdict) and not v.correct
    v = verifier.score(prob(None), "\\boxed{5}")
    assert v.kind == "crash"
    v = verifier.score(prob("5"), None)  # type: ignore[arg-type]
    assert v.kind == "no_answer"


def test_normalize_answer() -> None:
    assert normalize_answer("\\$1,000.50") == "1000.5"
    assert normalize_answer("\\left( 1, 2 \\right)") == "(1,2)"
    assert normalize_answer("\\dfrac12") == "\\frac{1}{2}"
    assert normalize_answer("90^{\\circ}") == "90"
    assert normalize_answer("\\text{(B)}") == "B"
    assert normalize_answer("5 \\text{ cm}^2") == "5"
    assert normalize_answer("2k") == "2k"  # a variable is not a unit
    assert answers_equivalent("\\frac{1}{2}", "0.5")


# ---------------------------------------------------------------------------------------
# Timeouts and threads
# ---------------------------------------------------------------------------------------


def test_timeout_is_enforced() -> None:
    v = MathVerifier(timeout=1.0)
    v.score(prob("5"), "\\boxed{9/2}")  # start the worker outside the measured call
    start = time.monotonic()
    verdict = v.score(prob("5"), "\\boxed{9^{9^{9^{9}}}}")
    took = time.monotonic() - start
    assert verdict.kind == "timeout" and verdict.reward == 0.0 and verdict.extracted == "9^{9^{9^{9}}}"
    assert took < 10, took
    # the killed worker is replaced and the verifier keeps working
    assert v.score(prob("5"), "\\boxed{10/2}").correct


def test_works_off_the_main_thread(verifier: MathVerifier) -> None:
    results: list[Verdict] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(verifier.score(prob("\\frac{1}{2}"), "\\boxed{2/4}"))
        except BaseException as exc:  # pragma: no cover - the assertion reports it
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and len(results) == 4 and all(v.correct and v.kind == "ok" for v in results)


def test_inline_isolation() -> None:
    v = MathVerifier(isolation="inline", timeout=5)
    assert v.score(prob("\\frac{1}{2}"), "\\boxed{2/4}").correct
    assert v.score(prob("\\frac{1}{2}"), "\\boxed{3/4}").kind == "wrong"


def test_registry_and_options() -> None:
    cls = registry.verifiers.get("math")
    assert cls is MathVerifier
    from mlmt_bench.errors import UserError

    with pytest.raises(UserError):
        MathVerifier(bogus=1)
    with pytest.raises(UserError):
        MathVerifier(timeout=0)
    with pytest.raises(UserError):
        MathVerifier(isolation="thread")

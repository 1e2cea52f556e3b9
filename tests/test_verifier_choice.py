"""ChoiceVerifier: letter extraction, and every GPQA gold / distractor letter."""

from __future__ import annotations

import pytest

from mlmt_bench import registry
from mlmt_bench.benchmarks.gpqa import GPQADiamond, GPQAExtended, GPQAMain
from mlmt_bench.types import Problem
from mlmt_bench.verifiers.choice import ChoiceVerifier, extract_choice


@pytest.mark.parametrize(
    "response,letter",
    [
        ("(B)", "B"),
        ("Answer: B", "B"),
        ("answer: b", "B"),
        ("**B**", "B"),
        ("the answer is b", "B"),
        ("The answer is (c).", "C"),
        ("So the correct answer is **D**.", "D"),
        ("Final Answer: $\\boxed{A}$", "A"),
        ("\\boxed{\\text{(D)}}", "D"),
        ("B.", "B"),
        ("B", "B"),
        ("After all that:\nC\n", "C"),
        ("I choose D because it is stable.", "D"),
        ("The correct option is (a).", "A"),
        ("Options (A) and (B) fail, so I pick C", "C"),
        ("(A) is wrong, (B) is wrong, (C) is right.\nAnswer: C", "C"),
        ("Comparing A and B, B is larger; answer: A", "A"),
        ("so I think C is right", "C"),
        ("The answer is a function of x. Final: D", "D"),
        ("ANSWER: c", "C"),
    ],
)
def test_extract_choice(response: str, letter: str) -> None:
    assert extract_choice(response) == letter


@pytest.mark.parametrize(
    "response",
    [
        "",
        "Apple Banana Cherry Date",  # letters inside words
        "the answer is a function",  # article, not option A
        "A cat sat on the mat.",  # sentence-initial article
        "I am not sure. Vitamin E?",  # E is not an option of a 4-way question
        "DNA and RNA differ",
    ],
)
def test_no_letter(response: str) -> None:
    assert extract_choice(response) is None


def _p(answer: str) -> Problem:
    return Problem(id="q1", benchmark="test", prompt="?", answer=answer,
                   metadata={"options": ["w", "x", "y", "z"]})


def test_verdict_kinds() -> None:
    v = ChoiceVerifier()
    assert v.score(_p("B"), "Answer: B").kind == "ok"
    w = v.score(_p("B"), "Answer: C")
    assert w.kind == "wrong" and w.extracted == "C" and w.reward == 0.0
    n = v.score(_p("B"), "I cannot decide.")
    assert n.kind == "no_answer" and n.extracted is None
    assert v.score(_p(""), "Answer: B").kind == "crash"
    assert v.score(_p("B"), None).kind == "no_answer"  # type: ignore[arg-type]
    assert registry.verifiers.get("choice") is ChoiceVerifier


def test_five_options() -> None:
    p = Problem(id="q", benchmark="t", prompt="?", answer="E", metadata={"options": list("vwxyz")})
    assert ChoiceVerifier().score(p, "Answer: E").correct


@pytest.mark.parametrize("cls,n", [(GPQADiamond, 198), (GPQAMain, 448), (GPQAExtended, 546)])
def test_gpqa_golds_and_distractors(cls: type, n: int) -> None:
    v = ChoiceVerifier()
    problems = cls(seed=0).all_problems()
    assert len(problems) == n
    right = wrong = 0
    for p in problems:
        for letter in "ABCD":
            for template in ("Answer: {L}", "The answer is ({L}).", "**{L}**"):
                verdict = v.score(p, "Reasoning...\n" + template.format(L=letter))
                if letter == p.answer:
                    right += verdict.correct and verdict.kind == "ok"
                else:
                    wrong += (not verdict.correct) and verdict.kind == "wrong"
    assert right == 3 * n
    assert wrong == 9 * n

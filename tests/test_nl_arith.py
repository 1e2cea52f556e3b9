"""nl-arith: generated natural-language arithmetic, its strict verifier and its answer-free oracle critic."""

from __future__ import annotations

import random

import pytest

from mlmt_bench import registry
from mlmt_bench.benchmarks.base import verdict_line
from mlmt_bench.benchmarks.nl_arith import (
    NLArith,
    equations,
    format_solution,
    oracle_feedback,
    plain_text,
    solve,
    worked_check,
    worked_solution,
)
from mlmt_bench.benchmarks.perturbations import PERTURBATIONS
from mlmt_bench.errors import UserError
from mlmt_bench.types import Problem
from mlmt_bench.verifiers.leaks import is_leak
from mlmt_bench.verifiers.stated_answer import StatedAnswerVerifier, stated_integer

#: What is (7 + 5) * 3?  gold steps 7 + 5 = 12, 12 * 3 = 36
PLAIN = Problem("p", "nl-arith", "What is (7 + 5) * 3?", "36",
                metadata={"steps": [[7, "+", 5, 12], [12, "*", 3, 36]], "clauses": []})
#: 12 - 4 = 8, 8 + 6 = 14
WORD = Problem("w", "nl-arith", "Anna has 12 pencils. She gives 4 pencils to a friend. Then she buys 6 more "
               "pencils. How many pencils does Anna have now?", "14",
               metadata={"steps": [[12, "-", 4, 8], [8, "+", 6, 14]],
                         "clauses": ["She gives 4 pencils to a friend.", "Then she buys 6 more pencils."]})


def small(**options: object) -> NLArith:
    opts: dict[str, object] = {"n_train": 30, "n_validation": 20, "n_test": 20}
    opts.update(options)
    return NLArith(**opts)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- generation


def test_gold_steps_and_texts_by_hand() -> None:
    assert solve(7, [("+", 5), ("*", 3)]) == [(7, "+", 5, 12), (12, "*", 3, 36)]
    assert plain_text(7, [("+", 5), ("*", 3), ("-", 4)])[0] == "What is ((7 + 5) * 3) - 4?"
    assert plain_text(7, [("+", 5)]) == ("What is 7 + 5?", ["add 5"])
    assert format_solution(solve(7, [("+", 5), ("*", 3)])) == "Step 1: 7 + 5 = 12.\nStep 2: 12 * 3 = 36.\nAnswer: 36"


@pytest.mark.parametrize("options", [{}, {"style": "word", "ops": "+-*", "steps": 2},
                                     {"style": "mixed", "ops": "-*", "digits": 2, "steps": 3}])
def test_generation_is_deterministic_from_the_seed(options: dict[str, object]) -> None:
    def problems(seed: int) -> list[tuple[str, str | None]]:
        return [(p.prompt, p.answer) for p in small(seed=seed, **options).load("validation")]

    assert problems(3) == problems(3)
    assert problems(3) != problems(4)


@pytest.mark.parametrize("options", [{"ops": "+*"}, {"style": "word", "ops": "+-", "steps": 2},
                                     {"style": "mixed", "ops": "+-*", "digits": 2, "steps": 2}])
def test_splits_are_disjoint_by_problem(options: dict[str, object]) -> None:
    bench = small(**options)
    splits = {s: bench.load(s) for s in bench.splits}
    assert {s: len(ps) for s, ps in splits.items()} == {"train": 30, "validation": 20, "test": 20}
    keys = {s: {p.metadata["key"] for p in ps} for s, ps in splits.items()}
    assert sum(len(k) for k in keys.values()) == 70  # no arithmetic twice, in a split or across them
    prompts = {s: {p.prompt for p in ps} for s, ps in splits.items()}
    assert not (prompts["train"] & prompts["test"]) and not (prompts["validation"] & prompts["test"])


def test_test_split_does_not_depend_on_the_train_size() -> None:
    assert [p.prompt for p in small(n_train=5).load("test")] == [p.prompt for p in small(n_train=40).load("test")]


def test_answers_are_the_steps_and_never_negative() -> None:
    for p in small(style="mixed", ops="+-*", steps=3, digits=2).load("train"):
        steps = p.metadata["steps"]
        assert all(r >= 0 for *_, r in steps)
        assert p.answer == str(steps[-1][3])
        assert [e.result for e in equations(p.metadata["solution"])] == [r for *_, r in steps]


def test_a_word_problem_with_a_first_multiplication_reads_as_groups() -> None:
    bench = small(style="word", ops="*", steps=1)
    p = bench.load("test")[0]
    a, _, b, r = p.metadata["steps"][0]
    assert f"has {a} " in p.prompt and f"with {b} " in p.prompt and " in each " in p.prompt
    assert p.answer == str(a * b) == str(r)
    assert p.prompt.endswith("?") and p.metadata["clauses"] == [p.prompt.split(". How")[0] + "."]


@pytest.mark.parametrize("options, message", [
    ({"ops": "/"}, "ops must be"), ({"style": "poem"}, "style must be"), ({"digits": 0}, "digits and steps"),
    ({"n_train": 100, "n_validation": 10, "n_test": 10}, "at most 81 distinct"), ({"path": "x"}, "takes no path"),
    ({"colour": 1}, "unknown option"), ({"digits": "two"}, "must be integers"), ({"n_test": 2.5}, "must be integers"),
])
def test_bad_options_are_one_line_errors(options: dict[str, object], message: str) -> None:
    with pytest.raises(UserError, match=message):
        small(**options)


def test_a_space_smaller_than_its_bound_is_an_error_not_a_hang() -> None:
    with pytest.raises(UserError, match="at most 45 distinct"):  # 1-digit a - b with b <= a: 45 pairs
        NLArith(ops="-", n_train=30, n_validation=10, n_test=30).load("train")


def test_registered_with_its_verifier() -> None:
    cls = registry.benchmarks.get("nl-arith")
    assert cls is NLArith and registry.verifiers.get(cls.default_verifier) is StatedAnswerVerifier
    assert NLArith.templates.render_attempt(PLAIN).endswith(
        "Think step by step, then write the final answer as 'Answer: <number>'.")


# --------------------------------------------------------------------------- verifier


@pytest.mark.parametrize("response, kind, extracted", [
    ("7 + 5 = 12\n12 * 3 = 36\nAnswer: 36", "ok", "36"),
    ("So, the answer is 36.", "ok", "36"),
    ("**Answer:** 36", "ok", "36"),
    ("The answer is 36 apples.", "ok", "36"),
    ("Answer: 0036", "ok", "36"),
    ("The answer is 35.\nAnswer: 36", "ok", "36"),  # the last statement
    ("Answer: 36\nWait, the answer is 35.", "wrong", "35"),
    ("7 + 5 = 12\n12 * 3 = 35\nAnswer: 35", "wrong", "35"),
    ("Answer: -36", "wrong", "-36"),
    ("7 + 5 = 12, then 12 * 3 = 36.", "no_answer", None),  # no statement: no last-number fallback
    ("\\boxed{36}", "no_answer", None),
    ("Answer: 12 * 3 = 36", "no_answer", None),  # a statement of more than one number
    ("Answer: 36.5", "no_answer", None),
    ("Answer: thirty-six", "no_answer", None),
    ("", "no_answer", None),
])
def test_verifier_reads_the_answer_statement_strictly(response: str, kind: str, extracted: str | None) -> None:
    v = StatedAnswerVerifier().score(PLAIN, response)
    assert (v.kind, v.extracted, v.correct, v.reward) == (kind, extracted, kind == "ok", 1.0 if kind == "ok" else 0.0)


def test_verifier_reads_thousands_and_huge_numbers() -> None:
    assert stated_integer("Answer: 1,234") == "1234"
    assert stated_integer("Answer: " + "9" * 5000) == "9" * 5000  # no int() limit
    assert StatedAnswerVerifier().score(Problem("q", "nl-arith", "?", "1234"), "The answer is 1,234.").correct


# --------------------------------------------------------------------------- oracle critic


@pytest.mark.parametrize("attempt, says", [
    # an arithmetic slip in the second step
    ("7 + 5 = 12. Then 12 * 3 = 35.\nAnswer: 35",
     ["The first step (7 + 5 = 12) is right.", 'The second step is wrong: "12 * 3 = 35" has a calculation error.',
      "Recompute 12 * 3."]),
    # the wrong operation first
    ("7 - 5 = 2, 2 * 3 = 6. Answer: 6", ['The first step is wrong: in "7 - 5 = 2",', "calls for an addition, "
                                         "not a subtraction"]),
    # the second step does not start from the first one's result
    ("7 + 5 = 12. 7 * 3 = 21. Answer: 21", ["should start from 12, the result of the first step, not from 7"]),
    # a wrong number
    ("7 + 6 = 13. 13 * 3 = 39. Answer: 39", ['the operation "add 5" uses the number 5, not 6']),
    # a missing step
    ("7 + 5 = 12.\nAnswer: 12", ['The second step is missing: the attempt never works out the operation '
                                 '"multiply by 3".']),
    # no working at all
    ("The answer is 40.", ["The attempt writes no equation such as 'a + b = c'. The first step should work out"]),
    # every step right, then one the problem does not ask for: said without the right result 36
    ("7 + 5 = 12. 12 * 3 = 36. Then 36 + 3 = 39. The answer is 39.",
     ["The first step (7 + 5 = 12) is right.\nThe second step is right.\nEvery step the problem asks for is right, "
      "but then the attempt goes on with a step it does not ask for."]),
    # a right step said again is no extra step, and no wrong one
    ("7 + 5 = 12. 12 * 3 = 36. So 12 * 3 = 36 is the result.", ["Every step is right, but the attempt does not end"]),
    ("7 + 5 = 12. So, 7 + 5 = 12. Then 12 + 3 = 15. Answer: 15",
     ['The second step is wrong: in "12 + 3 = 15", the operation "multiply by 3" calls for a multiplication, not an '
      "addition."]),
    # the same with an extra step that does not start from the gold: quoted
    ("7 + 5 = 12. 12 * 3 = 36. Then 12 + 3 = 15. The answer is 15.",
     ['but then "12 + 3 = 15" is a step it does not ask for.']),
    # every step right, the answer line not
    ("7 + 5 = 12. 12 * 3 = 36.\nAnswer: 38", ["Every step is right, but the answer line gives 38"]),
    ("7 + 5 = 12. 12 * 3 = 36.", ["Every step is right, but the attempt does not end with a line"]),
    # a bracketed chain with a wrong result
    ("(7 + 5) * 3 = 35. Answer: 35", ['"7 + 5 * 3 = 35" has a calculation error', "one operation at a time"]),
])
def test_oracle_locates_the_first_wrong_step_in_words(attempt: str, says: list[str]) -> None:
    feedback = oracle_feedback(PLAIN, attempt)
    for text in says:
        assert text in feedback, feedback
    assert feedback.endswith("\nVerdict: incorrect") and verdict_line(feedback) is False
    assert not is_leak(feedback, PLAIN.answer, "math")  # never 36, even where the attempt wrote it


def test_oracle_quotes_the_word_problems_sentence() -> None:
    feedback = oracle_feedback(WORD, "Anna gives 4 pencils, so 12 + 4 = 16. Then 16 + 6 = 22. The answer is 22.")
    assert 'the sentence "She gives 4 pencils to a friend" calls for a subtraction, not an addition' in feedback
    assert "14" not in feedback and verdict_line(feedback) is False


def test_oracle_approves_a_right_answer_with_the_verdict_line() -> None:
    for attempt in ("7 + 5 = 12, 12 * 3 = 36. Answer: 36", "So, the answer is 36."):
        feedback = oracle_feedback(PLAIN, attempt)
        assert feedback.endswith("\nVerdict: correct") and small().feedback_verdict(feedback) is True


@pytest.mark.parametrize(("attempt", "checked"), [
    ("7 + 5 = 12, 12 * 3 = 36. Answer: 36",
     ["The first step (7 + 5 = 12) is right.", "The second step (12 * 3 = 36) is right."]),
    ("(7 + 5) * 3 = 36. Answer: 36", ["The first to second steps (7 + 5 * 3 = 36) are right."]),
    ("5 + 7 = 12, so the answer is 36.", ["The first step (5 + 7 = 12) is right."]),
    ("So, the answer is 36.", []),
])
def test_the_oracle_checks_a_right_attempts_steps_before_approving(attempt: str, checked: list[str]) -> None:
    """Step by step on right attempts too (a critic trained on it never decides in one token), up
    to the first step not computed rightly; the quotes are the attempt's, so redaction keeps them."""
    feedback = oracle_feedback(PLAIN, attempt)
    assert feedback.split("\n")[:-2] == checked, feedback
    assert small().redact_feedback(PLAIN, attempt, feedback).removed == 0


@pytest.mark.parametrize(("a", "op", "b", "check"), [
    (63, "*", 9, "63 = 60 + 3; 6 * 9 = 54, so 60 * 9 = 540; 3 * 9 = 27; 540 + 27 = 567"),
    (9, "*", 63, "63 = 60 + 3; 6 * 9 = 54, so 60 * 9 = 540; 3 * 9 = 27; 540 + 27 = 567"),
    (10, "*", 5, "10 = 10 + 0; 1 * 5 = 5, so 10 * 5 = 50; 0 * 5 = 0; 50 + 0 = 50"),
    (105, "*", 7, "105 = 100 + 0 + 5; 1 * 7 = 7, so 100 * 7 = 700; 0 * 7 = 0; 5 * 7 = 35; 700 + 0 + 35 = 735"),
    (7, "*", 8, "7 * 8 = 56"), (12, "*", 34, "12 * 34 = 408"), (12, "-", 5, "12 - 5 = 7"),
])
def test_a_worked_check_uses_one_digit_products_and_a_sum(a: int, op: str, b: int, check: str) -> None:
    assert worked_check(a, op, b) == check


def test_worked_feedback_recomputes_each_step_then_judges_it() -> None:
    wrong = "7 + 5 = 12. 12 * 3 = 35. Answer: 35"
    assert oracle_feedback(PLAIN, wrong, worked=True).split("\n") == [
        "The first step, 7 + 5 = 12: 7 + 5 = 12; the step says 12: the same, right.",
        "The second step, 12 * 3 = 35: 12 = 10 + 2; 1 * 3 = 3, so 10 * 3 = 30; 2 * 3 = 6; 30 + 6 = 36; the step says "
        "35: not the same, a calculation error. Recompute 12 * 3.", "Verdict: incorrect"]
    right = oracle_feedback(PLAIN, "7 + 5 = 12. 12 * 3 = 36. Answer: 36", worked=True).split("\n")
    assert right[1] == ("The second step, 12 * 3 = 36: 12 = 10 + 2; 1 * 3 = 3, so 10 * 3 = 30; 2 * 3 = 6; 30 + 6 = 36; "
                        "the step says 36: the same, right.")
    assert right[-1] == "Verdict: correct"
    shown = small().redact_feedback(PLAIN, wrong, oracle_feedback(PLAIN, wrong, worked=True)).text
    assert not is_leak(shown, PLAIN.answer, "math") and "says 35: not the same" in shown  # the refiner reads no 36
    # a wrong operation is diagnosed as by the plain oracle
    assert "calls for a multiplication" in oracle_feedback(PLAIN, "7 + 5 = 12. 12 + 3 = 15. Answer: 15", worked=True)


def test_a_worked_refinement_works_out_the_first_wrong_step_and_nothing_else() -> None:
    wrong = "7 + 5 = 12. 12 * 3 = 35. Answer: 35"
    worked = worked_solution(PLAIN, wrong)
    assert worked.split("\n") == [
        "Step 1: 7 + 5 = 12.",
        "Step 2: 12 * 3: 12 = 10 + 2; 1 * 3 = 3, so 10 * 3 = 30; 2 * 3 = 6; 30 + 6 = 36. So 12 * 3 = 36.",
        "Answer: 36"]
    assert stated_integer(worked) == "36" and small().worked_refinement(PLAIN, wrong) == worked
    gold = format_solution([(7, "+", 5, 12), (12, "*", 3, 36)])
    assert worked_solution(PLAIN, gold) == gold  # nothing flagged
    assert worked_solution(PLAIN, "7 + 5 = 13. 13 * 3 = 39. Answer: 39") == gold  # a sum: nothing to work out
    assert worked_solution(PLAIN, "7 + 5 = 12. 12 * 3 = 36. Answer: 35") == gold  # only the answer line is wrong


def _wrong_attempts(bench: NLArith, problem: Problem, rng: random.Random) -> list[str]:
    gold = bench.solution(problem)
    last = problem.metadata["steps"][-1]
    return [bench.inject_errors(gold, rng) for _ in range(3)] + [
        gold.rsplit("Answer:", 1)[0] + f"Answer: {int(problem.answer or 0) + 7}",  # steps right, answer line not
        gold.rsplit("\n", 1)[0],  # no answer line
        f"{last[0]} {last[1]} {last[2]} = {last[3] + 1}. The answer is {last[3] + 1}.",  # only the last step
        "I think the answer is 1000.", "",
    ]


@pytest.mark.parametrize("options", [{"style": "plain", "ops": "+-*", "steps": 2},
                                     {"style": "word", "ops": "+-*", "steps": 3, "digits": 2}])
def test_oracle_feedback_on_a_wrong_attempt_never_states_the_gold_answer(options: dict[str, object]) -> None:
    """Answer-free: every number it writes is the problem's or the attempt's, so the redaction rule
    removes nothing; and it never states the gold answer, even where the attempt wrote it (a right
    step before a wrong answer line), unless the problem itself states it."""
    bench = small(**options)
    verifier = StatedAnswerVerifier()
    rng = random.Random(0)
    checked = 0
    for p in bench.load("validation"):
        for attempt in _wrong_attempts(bench, p, rng):
            assert not verifier.score(p, attempt).correct
            feedback = bench.oracle_feedback(p, attempt)
            assert verdict_line(feedback) is False
            assert bench.redact_feedback(p, attempt, feedback).removed == 0, feedback
            if not is_leak(p.prompt, p.answer, "math"):  # only a problem that states its answer may be quoted
                assert not is_leak(feedback, p.answer, "math"), (attempt, feedback)
                checked += 1
    assert checked > 50


def test_following_the_oracle_gives_the_gold_solution() -> None:
    bench = small(style="word", ops="+-*", steps=2)
    p = bench.load("test")[0]
    wrong = bench.inject_errors(bench.solution(p), random.Random(1))
    fixed = bench.apply_feedback(p, wrong, bench.oracle_feedback(p, wrong))
    assert StatedAnswerVerifier().score(p, fixed).correct
    right = bench.solution(p)
    assert bench.apply_feedback(p, right, bench.oracle_feedback(p, right)) == right


# --------------------------------------------------------------------------- redaction and the probe


def test_redaction_removes_the_numbers_in_neither_problem_nor_attempt() -> None:
    attempt = "7 + 5 = 12. 12 * 3 = 35. Answer: 35"
    shown = small().redact_feedback(PLAIN, attempt, "The second step gives 36, not 35: 12 * 3 is 36.\n"
                                                      "Verdict: incorrect")
    assert shown.text == "The second step gives ?, not 35: 12 * 3 is ?.\nVerdict: incorrect"
    assert shown.removed == 2


def test_the_probes_perturbations_are_declared() -> None:
    bench = small()
    attempt = "7 + 5 = 12. 12 * 3 = 35. Answer: 35"
    own = "The second step is wrong: 12 * 3 is 36.\nVerdict: incorrect"
    rows = bench.feedback_perturbations(PLAIN, attempt, own, answer="35")
    assert set(rows) == set(PERTURBATIONS) and all(rows[r] is not None for r in PERTURBATIONS)
    assert rows["values_removed"] == "The second step is wrong: 12 * 3 is 35.\nVerdict: incorrect"
    assert rows["last_shifted"] == "The second step is wrong: 12 * 3 is 37.\nVerdict: incorrect"
    assert "36" in str(rows["approve_gold"]) and "35" in str(rows["approve_own"])
    assert rows["oracle"] == oracle_feedback(PLAIN, attempt)
    assert bench.stated_values(own) == ["12", "3", "36"]


def test_the_critic_as_second_solver_reads_the_feedbacks_last_number() -> None:
    bench = small()
    stated = bench.stated_answer("Recompute 12 * 3: it is 36.\nVerdict: incorrect")
    assert stated == "Answer: 36" and StatedAnswerVerifier().score(PLAIN, stated).correct
    assert bench.stated_answer("The second step is wrong.\nVerdict: incorrect") is None


def test_equations_are_read_from_words_symbols_and_brackets() -> None:
    read = [(e.operands, e.ops, e.result) for e in equations(
        "First 7 plus 5 equals 12, then (12 x 3) = 36 and 1,234 + 5 - 1 = 1,238; 2.5 + 1 = 3.5 is no integer step. "
        "1 + 2 = 2((6 - 2) = 4)")]
    assert read == [((7, 5), ("+",), 12), ((12, 3), ("*",), 36), ((1234, 5, 1), ("+", "-"), 1238),
                    ((1, 2), ("+",), 2), ((6, 2), ("-",), 4)]  # a bracket never glues 2(6 into 26


def test_the_oracle_reads_hostile_attempts_quickly_and_never_raises() -> None:
    import time

    start = time.monotonic()
    for attempt in ("1 + " * 50_000, "9" * 100_000 + " + 1 = 2", "7 + 5 = " + "9" * 5000, "=" * 100_000):
        feedback = oracle_feedback(PLAIN, attempt)
        assert verdict_line(feedback) is False
    assert time.monotonic() - start < 10


def test_the_default_level_is_one_digit_products_split_three_ways() -> None:
    bench = NLArith()
    splits = {s: bench.load(s) for s in bench.splits}
    keys = {p.metadata["key"] for ps in splits.values() for p in ps}
    assert {s: len(ps) for s, ps in splits.items()} == {"train": 33, "validation": 24, "test": 24}
    assert keys == {f"{a}*{b}" for a in range(1, 10) for b in range(1, 10)}  # all 81, each once
    assert all(p.prompt == "What is {} * {}?".format(*p.metadata["key"].split("*"))
               for ps in splits.values() for p in ps)

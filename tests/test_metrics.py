"""Tests for mlmt_bench.metrics.turns and mlmt_bench.metrics.feedback on hand-built examples."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mlmt_bench.metrics.feedback import (
    feedback_effect,
    feedback_length_stats,
    feedback_sensitivity,
    flops_estimate,
    leakage_rate,
)
from mlmt_bench.metrics.turns import oracle_gated_accuracy, turn_metrics
from mlmt_bench.verifiers.leaks import is_leak, normalize_math_answer

# --------------------------------------------------------------------------- turns


def test_turn_metrics_by_hand():
    # problem:  1  2  3  4  5
    # t1:       1  1  0  0  0   -> acc@t1 = 2/5
    # t2:       1  0  1  1  0   -> acc@t2 = 3/5, delta = 1/5
    # c->c: p1; c->i: p2 (1/5); i->c: p3, p4 (2/5); i->i: p5 (1/5)
    # correction_rate = (2/5)/(3/5) = 2/3; regression_rate = (1/5)/(2/5) = 1/2
    m = turn_metrics([1, 1, 0, 0, 0], [1, 0, 1, 1, 0])
    assert m["acc@t1"] == pytest.approx(0.4)
    assert m["acc@t2"] == pytest.approx(0.6)
    assert m["delta"] == pytest.approx(0.2)
    assert m["i->c"] == pytest.approx(0.4)
    assert m["c->i"] == pytest.approx(0.2)
    assert m["i->i"] == pytest.approx(0.2)
    assert m["correction_rate"] == pytest.approx(2 / 3)
    assert m["regression_rate"] == pytest.approx(0.5)
    assert set(m) == {
        "acc@t1", "acc@t2", "delta", "i->c", "c->i", "i->i", "correction_rate", "regression_rate"
    }


def test_turn_metrics_undefined_rates_are_none():
    # every first attempt right: P(z wrong) = 0 -> correction_rate None; c->i = 1/2 -> regression 1/2
    m = turn_metrics([True, True], [True, False])
    assert m["correction_rate"] is None
    assert m["regression_rate"] == pytest.approx(0.5)
    # every first attempt wrong: regression_rate None; i->c = 1/3 -> correction (1/3)/1
    m = turn_metrics(np.array([0, 0, 0]), np.array([1, 0, 0]))
    assert m["regression_rate"] is None
    assert m["correction_rate"] == pytest.approx(1 / 3)


def test_turn_metrics_rejects_bad_input():
    with pytest.raises(ValueError):
        turn_metrics([1, 0], [1])
    with pytest.raises(ValueError):
        turn_metrics([], [])
    with pytest.raises(ValueError):
        turn_metrics([1, 0.5], [1, 1])  # a partial reward is not a correctness flag


def test_oracle_gated_accuracy_by_hand():
    # t1 = [1,1,0,0,0], t2 = [1,0,1,1,0]: solved if either turn -> [1,1,1,1,0] = 4/5
    # (= acc@t1 + i->c = 2/5 + 2/5); p2's regression is ignored because p2 is not refined
    assert oracle_gated_accuracy([1, 1, 0, 0, 0], [1, 0, 1, 1, 0]) == pytest.approx(0.8)
    assert oracle_gated_accuracy([0, 0], [0, 0]) == 0.0


# --------------------------------------------------------------------------- feedback


def test_feedback_effect_by_hand():
    # diffs [1-1, 1-0, 0-0, 1-0] = [0, 1, 0, 1] -> mean 0.5
    assert feedback_effect([1, 1, 0, 1], [1, 0, 0, 0]) == pytest.approx(0.5)
    # the feedback can hurt: [0-1, 0-0] -> -0.5
    assert feedback_effect([False, False], [True, False]) == pytest.approx(-0.5)
    with pytest.raises(ValueError):
        feedback_effect([1], [1, 0])


def test_feedback_sensitivity_by_hand():
    # sample 1: (-10 - -14)/4 = 1.0 nats/token; sample 2: (-4 - -4.5)/2 = 0.25
    # mean over samples = 0.625 (a pooled per-token mean would be 4.5/6 = 0.75)
    assert feedback_sensitivity([-10.0, -4.0], [-14.0, -4.5], [4, 2]) == pytest.approx(0.625)
    with pytest.raises(ValueError):
        feedback_sensitivity([-1.0], [-1.0], [0])


def test_normalize_math_answer():
    assert normalize_math_answer("$\\boxed{\\dfrac{1}{2}}$") == "\\frac{1}{2}"
    assert normalize_math_answer(" 42. ") == "42"
    assert normalize_math_answer("\\boxed{x = 3}") == "x=3"
    assert normalize_math_answer("\\left( 1, 2 \\right)") == "(1,2)"


@pytest.mark.parametrize(
    "feedback, leaks",
    [
        ("The answer should be 2.", True),
        ("So $\\boxed{2}$ is what you want.", True),
        ("x = 2 works", True),
        ("In step 2 you dropped a sign.", False),  # enumeration, not the answer
        ("Check Step  2 and case 2 again, see #2.", False),
        ("You got 12 instead.", False),
        ("The x^2 term is wrong.", False),
        ("It is 2.5, not an integer.", False),
        ("Dividing gives 3/2.", False),
        ("The root is -2.", False),
        ("Simplify \\frac{2}{3} first.", False),
        ("About 2,000 cases.", False),
        ("Nothing numeric here.", False),
    ],
)
def test_math_leak_short_gold_standalone(feedback, leaks):
    assert is_leak(feedback, "2", "math") is leaks


def test_math_leak_latex_and_spacing():
    gold = "\\boxed{\\dfrac{1}{2}}"
    assert is_leak("the result is $\\frac{1}{2}$", gold, "math") is True
    assert is_leak("the result is \\dfrac{1}{2}", gold, "math") is True
    assert is_leak("the result is \\frac{1}{23}", gold, "math") is False
    assert is_leak("so 1 / 2 of them", "1/2", "math") is True  # spaces inside are optional
    assert is_leak("hence x = 3.", "x=3", "math") is True
    assert is_leak("anything", None, "math") is None


def test_leakage_rate_math_skips_unknown_gold():
    # judged: feedback 1 (leaks), feedback 2 (step 2: no leak); feedback 3 has no gold
    # -> 1 leak / 2 judged = 0.5
    fbs = ["The answer is 2.", "step 2 is wrong", "The answer is 7."]
    assert leakage_rate(fbs, ["2", "2", None], "math") == pytest.approx(0.5)
    assert math.isnan(leakage_rate(["a"], [None], "math"))


def test_leakage_rate_code():
    # fenced block: leak; def line: leak; prose mentioning "define": no; indented def: leak;
    # "def is" without a signature: no  -> 3 / 5
    fbs = [
        "Use this:\n```python\nprint(1)\n```",
        "def f(x):\n    return x",
        "Your loop is off by one; define the helper first.",
        "Try\n    def helper(a):\n        pass",
        "the word def is a keyword",
    ]
    assert [is_leak(f, None, "code") for f in fbs] == [True, True, False, True, False]
    assert leakage_rate(fbs, [None] * 5, "code") == pytest.approx(3 / 5)


@pytest.mark.parametrize(
    "feedback, gold, leaks",
    [
        ("I think (B) is right.", "B", True),
        ("The answer is B.", "B", True),
        ("answer: (B", "(B)", True),
        ("Option B deserves a second look.", "B", True),
        ("B) follows from the premise.", "B", True),
        ("A careful reading helps.", "A", False),  # article, not an option
        ("The answer is a bit off.", "A", False),  # lower-case word
        ("Check (D) again.", "C", False),
        ("Bad reasoning in step 2.", "B", False),
    ],
)
def test_choice_leak(feedback, gold, leaks):
    assert is_leak(feedback, gold, "choice") is leaks


def test_exact_leak_and_rate():
    # "paris" standalone (case-insensitive): leak; "Parisian": no -> 1/2
    fbs = ["The capital is paris.", "A Parisian detail."]
    assert leakage_rate(fbs, ["Paris", "Paris"], "exact") == pytest.approx(0.5)
    with pytest.raises(ValueError):
        leakage_rate(fbs, ["Paris"], "exact")
    with pytest.raises(ValueError):
        is_leak("x", "y", "regex")


def test_feedback_length_stats_by_hand():
    # feedbacks of 10 and 30 tokens -> mean 20; share (10+30)/(100+100) = 0.2
    s = feedback_length_stats([10, 30], [100, 100])
    assert s == {"feedback_tokens": pytest.approx(20.0), "feedback_share": pytest.approx(0.2)}
    assert feedback_length_stats([], [0]) == {"feedback_tokens": None, "feedback_share": None}
    with pytest.raises(ValueError):
        feedback_length_stats([50], [10])  # totals must include the feedback


def test_flops_estimate_by_hand():
    # P = 1e9, 1000 generated, 500 trained: 2*1e9*1000 + 6*1e9*500 = 2e12 + 3e12 = 5e12
    assert flops_estimate(10**9, 1000, 500) == pytest.approx(5e12)
    assert flops_estimate(10**9, 0, 0) == 0.0

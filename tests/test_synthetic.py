"""synthetic-arith: generation, oracle critic, error injection, scripted corrector, verifier."""

from __future__ import annotations

import random

import pytest

from mlmt_bench import registry
from mlmt_bench.benchmarks.synthetic import (
    OK_FEEDBACK,
    SyntheticArith,
    apply_feedback,
    corrected_step,
    feedback_is_ok,
    inject_errors,
    oracle_feedback,
    parse_attempt,
    parse_problem,
    solve,
)
from mlmt_bench.errors import UserError
from mlmt_bench.types import Problem
from mlmt_bench.verifiers.synthetic import SyntheticVerifier


def _problem(prompt: str, modulus: int = 100) -> Problem:
    steps = solve(*parse_problem(prompt), modulus)
    return Problem(id="x", benchmark="synthetic-arith", prompt=prompt, answer=str(steps[-1][3]),
                   metadata={"steps": [list(s) for s in steps], "modulus": modulus})


# --------------------------------------------------------------------------- problems


def test_left_to_right_mod_100_by_hand():
    # 7+5=12, 12*3=36, 36-4=32; and 3-7 wraps to 96.
    assert solve(*parse_problem("7+5*3-4"), 100) == [(7, "+", 5, 12), (12, "*", 3, 36), (36, "-", 4, 32)]
    assert solve(*parse_problem("3-7"), 100) == [(3, "-", 7, 96)]
    p = SyntheticArith(ops="+-*").load("test")[0]
    assert p.metadata["solution"].endswith(f"#{p.answer}")


def test_generation_is_deterministic_and_splits_disjoint():
    kw = dict(seed=3, n_train=500, n_validation=50, n_test=100)
    a, b = SyntheticArith(**kw), SyntheticArith(**kw)
    assert [p.to_json() for p in a.load("train")] == [p.to_json() for p in b.load("train")]
    assert [p.to_json() for p in a.load("test")] == [p.to_json() for p in b.load("test")]
    train, val, test = a.load("train"), a.load("validation"), a.load("test")
    assert (len(train), len(val), len(test)) == (500, 50, 100)
    prompts = [{p.prompt for p in s} for s in (train, val, test)]
    assert not prompts[0] & prompts[1] and not prompts[0] & prompts[2] and not prompts[1] & prompts[2]
    assert sum(map(len, prompts)) == 650 and len({p.id for p in train + val + test}) == 650
    # The order splits are asked for does not matter.
    c = SyntheticArith(**kw)
    assert [p.prompt for p in c.load("validation")] == [p.prompt for p in val]
    # Test does not move when the other splits grow; another seed gives other problems.
    bigger = SyntheticArith(seed=3, n_train=900, n_validation=80, n_test=100)
    assert [p.prompt for p in bigger.load("test")] == [p.prompt for p in test]
    assert [p.prompt for p in SyntheticArith(seed=4, n_test=100).load("test")] != [p.prompt for p in test]


def test_options_and_errors():
    b = SyntheticArith(difficulty=5, max_operand=5, modulus=10, ops="*", n_train=50, n_validation=5, n_test=10)
    p = b.load("train")[0]
    first, ops = parse_problem(p.prompt)
    assert len(ops) == 5 and all(op == "*" and 1 <= x <= 5 for op, x in ops) and 1 <= first <= 5
    assert all(0 <= s[3] < 10 for s in p.metadata["steps"])
    with pytest.raises(UserError, match="unknown option"):
        SyntheticArith(levels=3)
    with pytest.raises(UserError, match="distinct expressions"):
        SyntheticArith(difficulty=1, n_train=1000)
    with pytest.raises(UserError, match="ops"):
        SyntheticArith(ops="/")
    with pytest.raises(UserError, match="unknown split"):  # v2: train / validation / test only
        b.load("eval")
    assert registry.benchmarks.get("synthetic-arith") is SyntheticArith
    assert registry.verifiers.get("synthetic") is SyntheticVerifier


def test_templates_are_short():
    t = SyntheticArith.templates
    assert len(t.render_feedback(_problem("1+2"), "")) < 20 and len(t.null_feedback) < 16 and t.attempt == "{problem}"


# --------------------------------------------------------------------------- oracle critic


def test_oracle_feedback_recomputes_quotes_and_judges_each_step():
    p = _problem("7+5*3-4")
    ok = "7+5>12 7+5=12 ok;12*3>36 12*3=36 ok;36-4>32 36-4=32 ok;"
    assert oracle_feedback(p, "7+5=12;12*3=36;36-4=32;#32") == ok + "answer ok"
    assert oracle_feedback(p, "7+5=12;12*3=35;35-4=31;#31") == "7+5>12 7+5=12 ok;12*3>36 12*3=35 wrong"
    assert oracle_feedback(p, "7+5=13;13*3=39;39-4=35;#35") == "7+5>12 7+5=13 wrong"
    assert oracle_feedback(p, "7+5=12;12*3=36;36-4=32;#30") == ok + "answer wrong: #32"
    assert oracle_feedback(p, "7+5=12;12*3=36") == \
        "7+5>12 7+5=12 ok;12*3>36 12*3=36 ok;36-4>32 36-4=? wrong"  # a missing step
    assert oracle_feedback(p, "") == "7+5>12 7+5=? wrong"
    assert oracle_feedback(p, "blah;;#") == "7+5>12 7+5=? wrong"
    assert oracle_feedback(p, "7+6=13;13*3=39;39-4=35;#35") == "7+5>12 7+5=13 wrong"  # a miscopied operand
    assert feedback_is_ok(ok + "answer ok") and not feedback_is_ok("7+5>12 7+5=12 ok;12*3>36 12*3=35 wrong")
    assert corrected_step("7+5>12 7+5=12 ok;12*3>36 12*3=35 wrong") == (2, (12, "*", 3, 36))
    assert corrected_step(" 7+5>12 7+5=? wrong") == (1, (7, "+", 5, 12))
    assert corrected_step(ok + "answer wrong: #32") is None
    assert corrected_step("answer ok") is None and corrected_step("wrong") is None


def test_inject_errors_gives_wrong_parseable_attempts():
    bench = SyntheticArith(ops="+-*", n_train=1000)
    rng = random.Random(0)
    for p in bench.load("train")[:1000]:
        wrong = bench.inject_errors(bench.solution(p), rng)
        steps, answer = parse_attempt(wrong)
        assert answer is not None and str(answer) != p.answer
        assert all(s is not None for s in steps)
    # Deterministic for the RNG.
    sol = bench.solution(bench.load("train")[0])
    assert inject_errors(sol, random.Random(5)) == inject_errors(sol, random.Random(5))


@pytest.mark.parametrize("ops", ["+-", "+-*"])
def test_scripted_corrector_follows_oracle_feedback(ops):
    """Applying only the feedback's correction fixes >= 95% of wrong attempts; null feedback fixes none."""
    bench = SyntheticArith(ops=ops, n_train=2000)
    verifier = SyntheticVerifier()
    rng = random.Random(1)
    fixed = fixed_revision = fixed_null = 0
    problems = bench.load("train")
    for p in problems:
        wrong = bench.inject_errors(bench.solution(p), rng)
        fb = bench.oracle_feedback(p, wrong)
        assert not feedback_is_ok(fb)
        fixed += verifier.score(p, bench.apply_feedback(p, wrong, fb)).correct
        fixed_revision += verifier.score(p, bench.apply_feedback(p, wrong, fb, revision=True)).correct
        fixed_null += verifier.score(p, bench.apply_feedback(p, wrong, bench.templates.null_feedback)).correct
    assert fixed / len(problems) >= 0.95
    assert fixed_revision / len(problems) >= 0.95
    assert fixed_null == 0


def test_corrector_applies_only_what_the_feedback_says():
    p = _problem("7+5*3-4")
    wrong = "7+5=12;12*3=35;35-4=31;#31"
    assert apply_feedback(p, wrong, "7+5>12 7+5=12 ok;12*3>36 12*3=35 wrong") == "7+5=12;12*3=36;36-4=32;#32"
    assert apply_feedback(p, wrong, "7+5>12 7+5=12 ok;12*3>36 12*3=35 wrong", revision=True) == "12*3=36;36-4=32;#32"
    # A wrong correction is followed too (it is the feedback's fault, not the corrector's).
    assert apply_feedback(p, wrong, "7+5>12 7+5=12 ok;12*3>37 12*3=35 wrong", revision=True) == "12*3=37;37-4=33;#33"
    assert apply_feedback(p, "7+5=12;12*3=36;36-4=32;#30",
                          "7+5>12 7+5=12 ok;12*3>36 12*3=36 ok;36-4>32 36-4=32 ok;answer wrong: #32"
                          ) == "7+5=12;12*3=36;36-4=32;#32"
    assert apply_feedback(p, wrong, OK_FEEDBACK) == wrong
    assert apply_feedback(p, wrong, "7+5>12 7+5=12 ok;answer ok", revision=True) == "#31"
    assert apply_feedback(p, wrong, "gibberish") == wrong
    # the steps it keeps are unreadable
    assert apply_feedback(p, "junk", "7+5>12 7+5=12 ok;12*3>36 12*3=35 wrong") == "junk"
    # A custom arithmetic computes the recomputed steps (the warm start's misconceptions).
    assert apply_feedback(p, wrong, "7+5>12 7+5=12 wrong", revision=True,
                          arithmetic=lambda a, op, b, m: (a + b if op == "+" else a * b if op == "*" else a - b) % m + 1
                          ) == "7+5=12;12*3=37;37-4=34;#34"


# --------------------------------------------------------------------------- verifier


@pytest.mark.parametrize("response,kind,extracted", [
    ("7+5=12;12*3=36;36-4=32;#32", "ok", "32"),
    ("#32", "ok", "32"),
    ("# 32", "ok", "32"),
    ("#31;#32", "ok", "32"),  # the last answer counts
    ("#032", "ok", "32"),
    ("7+5=12;12*3=36;36-4=32;#31", "wrong", "31"),
    ("#-68", "wrong", "-68"),
    ("7+5=12;12*3=36;36-4=32", "no_answer", None),
    ("", "no_answer", None),
    ("#", "no_answer", None),
    ("\x00\uffff#x", "no_answer", None),
])
def test_verifier_cases(response, kind, extracted):
    v = SyntheticVerifier().score(_problem("7+5*3-4"), response)
    assert (v.kind, v.extracted, v.correct, v.reward) == (kind, extracted, kind == "ok", 1.0 if kind == "ok" else 0.0)


def test_verifier_never_raises():
    v = SyntheticVerifier()
    assert v.score(_problem("1+2"), None).kind == "no_answer"  # type: ignore[arg-type]
    bad = Problem(id="x", benchmark="synthetic-arith", prompt="1+2", answer=None)
    assert v.score(bad, "#3").kind == "wrong"
    assert [x.correct for x in v.score_batch([_problem("1+2")] * 2, ["#3", "#4"])] == [True, False]


def test_registry_benchmark_yaml_files_are_consistent():
    """Each registry/benchmarks/synthetic-*.yaml builds, and its warm start uses the same problems."""
    from pathlib import Path

    import yaml

    from mlmt_bench.warmstart.shared_base import BaseConfig

    files = sorted((Path(__file__).resolve().parents[1] / "registry" / "benchmarks").glob("synthetic-*.yaml"))
    assert len(files) >= 3
    for f in files:
        d = yaml.safe_load(f.read_text())
        assert d["benchmark"]["name"] == "synthetic-arith" and d["description"]
        SyntheticArith(**d["benchmark"]["options"]).load("test")
        assert BaseConfig(**d["base"]).benchmark_options == d["benchmark"]["options"], f.name

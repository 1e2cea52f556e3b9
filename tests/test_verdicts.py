"""Strict verdicts: a feedback's verdict is its last ``Verdict: correct|incorrect`` line, nothing
else; free text is read by keywords only as a labelled fallback (``verdict_fallback: keywords``).

Keyword reading misread approvals (issue 32): "There are no errors; the solution is correct." was
False, "Looks good." None, and a critic echoing the prompt's "Point out the first error" counted
as "wrong".
"""

from __future__ import annotations

import pytest

from mlmt_bench import registry
from mlmt_bench.benchmarks.base import keyword_verdict, verdict_line
from mlmt_bench.benchmarks.gsm8k import GSM8K
from mlmt_bench.errors import UserError
from mlmt_bench.evaluate import diagnose_critic
from mlmt_bench.rollout.episodes import Actors, Rollout, TurnSample
from mlmt_bench.types import VERDICT_INSTRUCTION, Problem, PromptTemplates, Verdict
from support import ParityVerifier

APPROVALS = ["There are no errors; the solution is correct.", "I see no mistake here, well done.", "Looks good."]
ECHO = "Point out the first error in the attempt, if any, and explain how to fix it."


def test_free_text_has_no_verdict():
    g = GSM8K()
    for text in [*APPROVALS, ECHO, "The answer is wrong.", ""]:
        assert g.feedback_verdict(text) is None, text


def test_the_last_verdict_line_is_the_verdict():
    g = GSM8K()
    assert g.feedback_verdict("Step 2 adds 3 and 5 as 9.\nVerdict: incorrect") is False
    assert g.feedback_verdict("There are no errors; the solution is correct.\nVerdict: correct") is True
    assert g.feedback_verdict("  verdict :  CORRECT  \n") is True  # case and whitespace around its words
    assert g.feedback_verdict("Verdict: correct\nOn second thought, step 2 is off.\nVerdict: incorrect") is False
    assert g.feedback_verdict("Verdict: incorrect\nThe rest checks out.") is False  # the last verdict line
    for loose in ["Verdict: correct.", "**Verdict: correct**", "My verdict: correct", "Verdict: correct!",
                  "Verdict: partly correct", "Verdict:correctness", "The verdict: correct or incorrect"]:
        assert verdict_line(loose) is None, loose


def test_every_feedback_template_asks_for_the_line_and_its_echo_is_no_verdict():
    problem = Problem(id="p", benchmark="b", prompt="What is 2+3?", answer="5")
    templates = [PromptTemplates()] + [registry.benchmarks.get(n).templates
                                       for n in ("gsm8k", "math500", "mbpp", "mbpp-sanitized", "gpqa-diamond")]
    for tpl in templates:
        prompt = tpl.render_feedback(problem, "2+3=5")
        assert VERDICT_INSTRUCTION in prompt
        assert verdict_line(prompt) is None  # a critic that echoes its prompt states no verdict
    assert verdict_line(VERDICT_INSTRUCTION) is None


def test_keywords_are_a_labelled_fallback_only():
    keywords = GSM8K(verdict_fallback="keywords")
    # what the fallback reads (and misreads: an approval that says "no errors" is False)
    assert keywords.feedback_verdict(APPROVALS[0]) is False and keyword_verdict(APPROVALS[0]) is False
    assert keywords.feedback_verdict("The answer is correct.") is True
    assert keywords.feedback_verdict("Looks good.") is None
    assert keywords.feedback_verdict("The answer is wrong.\nVerdict: correct") is True  # the line comes first
    assert keywords.verdict_by_keywords("The answer is correct.")
    assert not keywords.verdict_by_keywords("Verdict: correct") and not keywords.verdict_by_keywords("Looks good.")
    assert not GSM8K().verdict_by_keywords("The answer is correct.")  # off by default
    with pytest.raises(UserError, match="verdict_fallback must be one of None, keywords, got 'words'"):
        GSM8K(verdict_fallback="words")


def test_synthetic_arith_keeps_its_structured_verdict():
    s = registry.benchmarks.get("synthetic-arith")()
    assert s.feedback_verdict("1+2>3 1+2=3 ok;answer ok") is True
    assert s.feedback_verdict("1+2>3 1+2=4 wrong") is False


def _rollout(feedbacks: list[str], correct: list[bool]) -> Rollout:
    problem = Problem(id="p", benchmark="gsm8k", prompt="2+3?", answer="5")
    turns = []
    for text, ok in zip(feedbacks, correct):
        verdict = Verdict(float(ok), ok, "5" if ok else "6", "ok" if ok else "wrong")
        turns.append(TurnSample("attempt", "solver", 0, None, [1], [2], [0.0], "x", "stop", verdict.reward, verdict))
        turns.append(TurnSample("feedback", "critic", 0, len(turns) - 1, [1], [2], [0.0], text))
    return Rollout([problem], turns, {}, 0.0)


@pytest.mark.parametrize("fallback", [None, "keywords"])
def test_evaluation_reports_the_unparsed_share(fallback):
    bench = GSM8K(verdict_fallback=fallback)
    ro = _rollout(["Looks fine.\nVerdict: correct", "Step 1 is off.\nVerdict: incorrect",
                   "There are no errors; the solution is correct.", "Looks good."], [True, False, True, True])
    actors = Actors(None, None, None, PromptTemplates(), ParityVerifier(), verdict=bench.feedback_verdict,
                    verdict_by_keywords=bench.verdict_by_keywords if bench.verdict_fallback else None)
    m = diagnose_critic(ro, actors)
    if fallback is None:
        # two lines read; the approval without a line and "Looks good." are unparsed
        assert m["critic/verdict_unparsed"] == pytest.approx(2 / 4) and "critic/verdict_keywords" not in m
        assert m["verdict_accuracy"] == pytest.approx(2 / 4) and m["false_alarm_rate"] == pytest.approx(2 / 3)
    else:
        # the fallback reads the approval as "wrong" (its known misreading) and says it did
        assert m["critic/verdict_unparsed"] == pytest.approx(1 / 4) and m["critic/verdict_keywords"] == 0.25
        assert m["verdict_accuracy"] == pytest.approx(2 / 4)

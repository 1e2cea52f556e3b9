"""Answer-free feedback (METHOD v4, ``feedback.redact``) and the critic as a second solver: each
benchmark's redaction rule and stated answer on hand-written feedback, the rollout showing the
refiner the redacted text while the critic keeps what it wrote, ū computed after redaction, the
metrics, the spec field and the report's rows."""

from __future__ import annotations

import json
import re
import time

import pytest

from mlmt_bench.algorithms.base import CreditInputs
from mlmt_bench.benchmarks.gpqa import GPQADiamond
from mlmt_bench.benchmarks.gsm8k import GSM8K
from mlmt_bench.benchmarks.math500 import Math500
from mlmt_bench.benchmarks.mbpp import MBPP
from mlmt_bench.benchmarks.redaction import number_spans
from mlmt_bench.benchmarks.synthetic import SyntheticArith, apply_feedback, corrected_step
from mlmt_bench.errors import UserError
from mlmt_bench.evaluate import evaluate
from mlmt_bench.metrics import feedback as fbm
from mlmt_bench.rollout.backend import Generation
from mlmt_bench.rollout.episodes import Actors, Program, Sampling, refine_again, refine_prompt, rollout
from mlmt_bench.types import Problem, Redaction
from mlmt_bench.verifiers.choice import ChoiceVerifier, extract_choice
from mlmt_bench.verifiers.code import extract_program
from mlmt_bench.verifiers.math import MathVerifier
from mlmt_bench.verifiers.synthetic import SyntheticVerifier
from support import build_trainer, make_run, make_spec, table_column

SYN = SyntheticArith(n_train=10, n_validation=10, n_test=10)
#: 9-6+9+1 = 13: steps 9-6=3, 3+9=12, 12+1=13
ARITH = Problem("p0", "synthetic-arith", "9-6+9+1", "13",
                metadata={"steps": [[9, "-", 6, 3], [3, "+", 9, 12], [12, "+", 1, 13]], "modulus": 100})


# --------------------------------------------------------------------------- rules, per benchmark


def test_synthetic_shows_only_the_attempts_own_numbers_in_each_check():
    """A check may quote the attempt's step, not supply a value: each of its numbers becomes the
    attempt's at the same place (operands, recomputed and quoted result, operator), ``answer
    wrong: #N`` the attempt's final answer, ``?`` where the attempt has none."""
    feedback = "9-6>3 9-6=3 ok;3+9>12 3+9=11 wrong"
    shown = SYN.redact_feedback(ARITH, "9-6=3;3+9=11;11+1=15;#15", feedback)
    assert shown == Redaction("9-6>3 9-6=3 ok;3+9>11 3+9=11 wrong", 1, 2 / len(feedback))
    # a value the attempt wrote elsewhere (11+1=12) is not the attempt's at that place: replaced all the same
    assert SYN.redact_feedback(ARITH, "9-6=3;3+9=11;11+1=12;#12", feedback).text == "9-6>3 9-6=3 ok;3+9>11 3+9=11 wrong"
    # approve-all with the gold values (operands of later steps included) reads as approve-all with the attempt's
    gold = "9-6>3 9-6=3 ok;3+9>12 3+9=12 ok;12+1>13 12+1=13 ok;answer ok"
    shown = SYN.redact_feedback(ARITH, "9-6=3;3+9=11;11+1=12;#12", gold)
    assert shown.text == "9-6>3 9-6=3 ok;3+9>11 3+9=11 ok;11+1>12 11+1=12 ok;answer ok" and shown.removed == 6
    # the final line, a check of a step the attempt lacks, a check out of place (operator too), free text
    shown = SYN.redact_feedback(ARITH, "9-6=3;3+9=113;#113", "3+9>12 3+9=113 wrong;answer wrong: #13")
    assert shown.text == "9-6>3 9-6=3 wrong;answer wrong: #113" and shown.removed == 9  # 6 numbers, 2 ops, 13
    assert SYN.redact_feedback(ARITH, "9-6=3;#3", "9-6>3 9-6=3 ok;3+9>12 3+9=? wrong").text == \
        "9-6>3 9-6=3 ok;?+?>? ?+?=? wrong"
    assert SYN.redact_feedback(ARITH, "9-6=3;#3", "step 1 gives 3, not 12").text == "step ? gives 3, not ?"
    assert SYN.redact_feedback(ARITH, "9-6=3;#3", "answer wrong: #?") == Redaction("answer wrong: #?", 0, 0.0)
    # a final line that quotes the attempt's own answer is kept as it is (not made a "?")
    quoted = "9-6>3 9-6=3 ok;answer wrong: #3"
    assert SYN.redact_feedback(ARITH, "9-6=3;#3", quoted) == Redaction(quoted, 0, 0.0)
    # nothing to replace: the feedback as written
    own = "9-6>3 9-6=3 ok;3+9>11 3+9=11 wrong"
    assert SYN.redact_feedback(ARITH, "9-6=3;3+9=11;11+1=12;#12", own) == Redaction(own, 0, 0.0)
    assert SYN.redact_feedback(ARITH, "", "") == Redaction("", 0, 0.0)


def test_synthetic_refiner_reads_a_redacted_correction_as_none():
    attempt = "9-6=3;3+9=11;11+1=12;#12"
    shown = SYN.redact_feedback(ARITH, attempt, "9-6>3 9-6=3 ok;3+9>12 3+9=11 wrong").text
    assert corrected_step("9-6>3 9-6=3 ok;3+9>12 3+9=11 wrong") == (2, (3, "+", 9, 12))
    assert corrected_step(shown) == (2, (3, "+", 9, 11))  # the attempt's own step 2
    assert apply_feedback(ARITH, attempt, shown) == attempt  # kept: the feedback supplies no value
    assert apply_feedback(ARITH, attempt, "9-6>3 9-6=3 ok;answer wrong: #?") == attempt


def test_synthetic_stated_answer_is_the_last_supplied_value():
    verifier = SyntheticVerifier()
    assert SYN.stated_answer("9-6>3 9-6=3 ok;3+9>12 3+9=11 wrong") == "#12"
    assert SYN.stated_answer("9-6>3 9-6=3 ok;3+9>12 3+9=12 ok;12+1>13 12+1=13 ok;answer wrong: #13") == "#13"
    assert SYN.stated_answer("9-6>3 9-6=3 ok;3+9>12 3+9=12 ok;12+1>13 12+1=13 ok;answer ok") == "#13"
    assert SYN.stated_answer("9-6>3 9-6=3 ok;3+9>? 3+9=11 wrong") is None  # the last one was redacted
    assert SYN.stated_answer("check again") is None
    assert verifier.score(ARITH, SYN.stated_answer("12+1>13 12+1=14 wrong")).correct


MATH_X = "Compute $2\\times3 + x_2$ and 1,000/4, then subtract 0.5."
MATH_Z = "We get 6 + 250 = 256, minus 0.50 is 255.5, so \\boxed{255.5}."


@pytest.mark.parametrize("feedback,shown,removed", [
    # the attempt's 256 and the problem's 2 may be quoted; 257 is a new value
    ("Step 2 is wrong: 6+250 = 257, not 256.", "Step 2 is wrong: 6+250 = ?, not 256.", 1),
    # whole tokens: 25 inside 250 and 55 inside 255.5 are not occurrences
    ("It is 25, or 55.", "It is ?, or ?.", 2),
    # a sign is part of a number unless it is a binary minus: -3 is new, 6-3 quotes 6 and 3
    ("x = -3 here, and 6-3 there, and 6 - 3.", "x = ? here, and 6-3 there, and 6 - 3.", 1),
    # decimals and thousands by value (0.5 = 0.50, 1000 = 1,000); 0.25 is new
    ("Use 0.50 and 1000 and 1,000.0, not 0.25.", "Use 0.50 and 1000 and 1,000.0, not ?.", 1),
    # fractions are one number: 1,000/4 occurs; 3/4 and \frac{1}{2} do not, though 3, 4, 1, 2 do
    ("1,000/4 is fine but 3/4 and \\frac{1}{2} are not.", "1,000/4 is fine but ? and ? are not.", 2),
    # digits of an identifier are no number (x_3, H2O); after a LaTeX command they are; a coefficient is
    ("x_3 and H2O, but 2\\times7 and 7y.", "x_3 and H2O, but 2\\times? and ?y.", 2),
    ("the answer is \\boxed{256.5}", "the answer is \\boxed{?}", 1),
])
def test_math_rule_replaces_numbers_in_neither_problem_nor_attempt(feedback, shown, removed):
    for bench in (Math500(), GSM8K()):  # both use the base's free-text maths rule
        got = bench.redact_feedback(Problem("m", bench.name, MATH_X, "255.5"), MATH_Z, feedback)
        assert (got.text, got.removed) == (shown, removed)
        assert got.share == pytest.approx((len(feedback) - len(shown) + removed) / len(feedback))


def test_number_tokens_read_signs_decimals_fractions():
    assert [v for _, _, v in number_spans("a=-3, b=1,234.50, c=3 / 4, d=\\dfrac{6}{8}, e=.5, v2")] == \
        ["-3", "1234.5", "3/4", "6/8", "0.5"]


def test_math_stated_answer_is_the_boxed_or_last_number_and_scores():
    bench, verifier = Math500(), MathVerifier(isolation="inline")
    problem = Problem("m", "math500", "What is 2+3?", "5")
    assert bench.stated_answer("Step 1 is wrong; it should be 5, see \\boxed{5} and then 7.") == "\\boxed{5}"
    assert bench.stated_answer("Step 1 is wrong: 2+3 = 5.") == "\\boxed{5}"
    assert bench.stated_answer("The last step is wrong.") is None
    assert verifier.score(problem, bench.stated_answer("Step 1 is wrong: 2+3 = 5.")).correct
    assert not verifier.score(problem, bench.stated_answer("2+3 is 6")).correct


CODE_FB = ("The loop is off by one: use `range(n + 1)`.\n```python\ndef f(n):\n    return sum(range(n + 1))\n```\n"
           "Or:\n```py\ndef f(n):\n    return n * (n + 1) // 2")


def test_code_rule_removes_code_blocks_and_inline_code():
    got = MBPP().redact_feedback(Problem("c", "mbpp", "Sum 0..n"), "def f(n): return sum(range(n))", CODE_FB)
    assert got.text == "The loop is off by one: use […].\n[…]\nOr:\n[…]"
    assert got.removed == 3
    assert got.share == pytest.approx((len(CODE_FB) - len("The loop is off by one: use .\n\nOr:\n")) / len(CODE_FB))
    plain = "The loop stops one short of n."
    assert MBPP().redact_feedback(Problem("c", "mbpp", "x"), "", plain) == Redaction(plain, 0, 0.0)


def test_code_stated_answer_is_the_last_code_block():
    stated = MBPP().stated_answer(CODE_FB)
    assert extract_program(stated) == "def f(n):\n    return n * (n + 1) // 2"
    assert MBPP().stated_answer("Use `range(n + 1)`.") is None


GPQA = Problem("r", "gpqa-diamond", "Which organelle?\n\n(A) Golgi body\n(B) Mitochondria\n(C) 12 eV\n(D) None",
               answer="B", metadata={"options": ["Golgi body", "Mitochondria", "12 eV", "None"]})


@pytest.mark.parametrize("feedback,shown", [
    ("The answer is (B), not C).", "The answer is […], not […]."),
    ("The correct option is **D**; options A and C are wrong.",
     "The correct option is […]; options […] and […] are wrong."),
    ("Answer: b.", "Answer: […]."),
    ("B\n", "[…]\n"),
    ("It must be the mitochondria, not the golgi  body.", "It must be the […], not the […]."),
    ("A bond forms, so the attempt fails at step 2.", "A bond forms, so the attempt fails at step 2."),
    ("\\boxed{C} is 12 eV", "[…] is […]"),
])
def test_choice_rule_removes_option_letters_and_texts(feedback, shown):
    got = GPQADiamond().redact_feedback(GPQA, "Answer: A", feedback)
    assert got.text == shown
    assert got.removed == shown.count("[…]")


def test_choice_stated_answer_is_the_last_option_letter():
    bench, verifier = GPQADiamond(), ChoiceVerifier()
    assert bench.stated_answer("Not (A); the answer is C. Final: **B**") == "Answer: B"
    assert extract_choice(bench.stated_answer("options A and D")) == "D"
    assert bench.stated_answer("A bond forms; step 2 is wrong.") is None
    assert verifier.score(GPQA, bench.stated_answer("the answer is (B)")).correct


# --------------------------------------------------------------------------- rollout, credit, metrics


class CopyingBackend:
    """A synthetic-arith solver and critic that read a number, not feedback: an attempt writes
    ``attempt``, a critic writes ``feedback``, and a refinement copies the answer the feedback it
    was shown states (``stated_answer`` of the refine prompt's feedback), or writes ``fallback``
    when that states none (a redacted one, g∅)."""

    def __init__(self, attempt: str, feedback: str, fallback: str = "#14") -> None:
        self.attempt, self.feedback, self.fallback = attempt, feedback, fallback

    def generate(self, model, tokenizer, prompts, *, max_new_tokens, **_):
        out = []
        for p in prompts:
            context = tokenizer.decode(p)
            if "feedback:" in context:  # the refine template: "feedback: {feedback}"
                text = SYN.stated_answer(context.split("feedback:")[-1]) or self.fallback
            elif "\ncheck" in context:  # the critic's template: "{problem}\n{attempt}\ncheck"
                text = self.feedback
            else:
                text = self.attempt
            ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
            out.append(Generation(ids, [0.0] * len(ids), "stop", text))
        return out


ATTEMPT = "9-6=3;3+9=12;12+1=14;#14"  # the last step slipped: 14, gold 13
FEEDBACK = "9-6>3 9-6=3 ok;3+9>12 3+9=12 ok;12+1>13 12+1=14 wrong"  # supplies 13, which the attempt never wrote
SHOWN = "9-6>3 9-6=3 ok;3+9>12 3+9=12 ok;12+1>14 12+1=14 wrong"


@pytest.fixture(scope="module")
def policy(tiny_ckpt):
    from mlmt_bench import registry
    from mlmt_bench.models.policy_spec import PolicySpec

    return registry.models.get("tiny")("solver", PolicySpec(model="tiny", path=str(tiny_ckpt)), None, None)


def _actors(policy, backend, redact: bool) -> Actors:
    return Actors(policy, policy, backend, SYN.templates, SyntheticVerifier(), SYN.oracle_feedback,
                  SYN.feedback_verdict, redact=SYN.redact_feedback if redact else None,
                  stated_answer=SYN.stated_answer, stated_values=SYN.stated_values)


@pytest.mark.parametrize("redact", [True, False])
def test_refiner_sees_the_redacted_feedback_and_the_critic_keeps_its_ids(policy, redact):
    tok = policy.tokenizer
    ro = rollout(Program(1, "critic", 1, 1), _actors(policy, CopyingBackend(ATTEMPT, FEEDBACK), redact),
                 [ARITH], Sampling(0.0, 1.0, 40, 80))
    attempt, feedback, refine = ro.turns
    assert feedback.text == FEEDBACK  # what the critic wrote, and trains on
    assert feedback.ids == tok.encode(FEEDBACK, add_special_tokens=False) + [tok.eos_token_id]
    seen = SHOWN if redact else FEEDBACK
    assert feedback.shown_text == (SHOWN if redact else None)
    assert feedback.redaction == (Redaction(SHOWN, 1, 2 / len(FEEDBACK)) if redact else None)
    assert refine.prompt_ids == refine_prompt(tok, SYN.templates, ARITH, attempt.prompt_ids, attempt.ids,
                                              attempt.text, seen)
    assert ("12+1>13" in tok.decode(refine.prompt_ids)) is not redact
    assert refine.text == ("#14" if redact else "#13") and refine.reward == (0.0 if redact else 1.0)


def test_oracle_feedback_is_redacted_and_null_feedback_is_not(policy):
    ro = rollout(Program(1, "oracle", 1, 1), _actors(policy, CopyingBackend(ATTEMPT, FEEDBACK), True),
                 [ARITH], Sampling(0.0, 1.0, 40, 80))
    assert ro.turns[1].text == FEEDBACK and ro.turns[1].shown_text == SHOWN
    ro = rollout(Program(1, "null", 1, 1), _actors(policy, CopyingBackend(ATTEMPT, FEEDBACK), True),
                 [ARITH], Sampling(0.0, 1.0, 40, 80))
    assert ro.turns[1].text == SYN.templates.null_feedback and ro.turns[1].redaction is None


@pytest.mark.parametrize("redact", [True, False])
def test_critic_reward_is_computed_on_refinements_after_the_redacted_feedback(tiny_ckpt, tmp_path, redact):
    """ū(g), the critic's reward, is the mean reward of the refinements of g: after the redacted
    g, the copying solver has no value to copy, so the feedback that stated the gold value earns 0."""
    spec = make_spec(tmp_path, tiny_ckpt, "mlmt", {"group_size": 2, "value": "none"},
                     feedback={"redact": redact})
    trainer = build_trainer(spec, tmp_path)
    assert (trainer.actors.redact is not None) is redact  # spec -> runner -> Actors
    trainer.actors.backend = CopyingBackend(ATTEMPT, FEEDBACK)
    trainer.actors.verifier = SyntheticVerifier()
    ro = rollout(trainer.algorithm.program(0), trainer.actors, [ARITH], trainer.sampling)
    credit = trainer.algorithm.credit(ro, 0, CreditInputs(0.0, None))
    feedbacks = ro.of_kind("feedback")
    assert len(feedbacks) == 2 and all(ro.turns[f].text == FEEDBACK for f in feedbacks)
    assert [credit.rewards[f] for f in feedbacks] == ([0.0, 0.0] if redact else [1.0, 1.0])
    assert credit.stats["critic_reward"] == (0.0 if redact else 1.0)


def test_evaluation_logs_redaction_copy_rate_and_the_critic_as_second_solver(policy):
    n_attempt = len(policy.tokenizer.encode(ATTEMPT, add_special_tokens=False)) + 1
    n_feedback = len(policy.tokenizer.encode(FEEDBACK, add_special_tokens=False)) + 1
    res = evaluate(Program(1, "critic", 1, 1), _actors(policy, CopyingBackend(ATTEMPT, FEEDBACK), True), [ARITH],
                   Sampling(0.0, 1.0, 40, 80), feedback_metrics=False, n_samples=1)
    m = res.metrics
    assert m["feedback/redacted_share"] == pytest.approx(2 / len(FEEDBACK))
    # the critic's own text states 13: as a second solver it is right, whatever the refiner saw
    assert (m["acc_critic_as_solver"], m["critic_states_answer_rate"]) == (1.0, 1.0)
    assert m["critic_as_solver_tokens"] == n_attempt + n_feedback
    assert m["acc@t2"] == 0.0
    # the shown feedback states only the attempt's own values (3, 12, 14): the refinement's 14, the attempt's
    # answer kept, is one of them
    assert m["copy_rate"] == 1.0
    assert res.per_problem[0]["t2_critic_solver"] is True
    feedback_turn = res.samples[0]["turns"][1]
    assert (feedback_turn["text"], feedback_turn["shown_text"]) == (FEEDBACK, SHOWN)
    assert (res.samples[0]["problem"], res.samples[0]["gold"]) == (ARITH.prompt, ARITH.answer)  # the problem browser's
    # unredacted, the refinement copies the 13 the feedback supplies
    res = evaluate(Program(1, "critic", 1, 1), _actors(policy, CopyingBackend(ATTEMPT, FEEDBACK), False), [ARITH],
                   Sampling(0.0, 1.0, 40, 80), feedback_metrics=False, n_samples=1)
    assert (res.metrics["acc@t2"], res.metrics["copy_rate"], res.metrics["acc_critic_as_solver"]) == (1.0, 1.0, 1.0)
    assert "feedback/redacted_share" not in res.metrics and "shown_text" not in res.samples[0]["turns"][1]
    # a refinement that writes a value the feedback does not state is no copy
    res = evaluate(Program(1, "critic", 1, 1),
                   _actors(policy, CopyingBackend(ATTEMPT, "9-6>3 9-6=3 ok;answer wrong: #?", "#50"), False),
                   [ARITH], Sampling(0.0, 1.0, 40, 80), feedback_metrics=False, n_samples=1)
    assert res.metrics["copy_rate"] == 0.0
    assert (res.metrics["acc_critic_as_solver"], res.metrics["critic_states_answer_rate"]) == (0.0, 0.0)


class RecordingBackend(CopyingBackend):
    """A :class:`CopyingBackend` that keeps every context it was asked to continue, decoded."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.contexts: list[str] = []

    def generate(self, model, tokenizer, prompts, **kw):
        self.contexts += [tokenizer.decode(p) for p in prompts]
        return super().generate(model, tokenizer, prompts, **kw)


def test_refine_again_keeps_the_attempts_and_feedbacks_and_refines_after_what_is_shown(policy):
    program, sampling = Program(2, "critic", 1, 2), Sampling(0.0, 1.0, 40, 80)
    problems = [ARITH, Problem("p1", "synthetic-arith", "9-6+9+1", "14")]  # the attempt's 14 is right here
    first = rollout(program, _actors(policy, CopyingBackend(ATTEMPT, FEEDBACK), True), problems, sampling)
    before = [(t.kind, t.text, list(t.children)) for t in first.turns]
    backend = RecordingBackend(ATTEMPT, FEEDBACK)
    again = refine_again(program, first, _actors(policy, backend, False), sampling)
    # only the refinements were generated: 2 problems x 2 attempts x 1 feedback x 2 refinements
    assert len(backend.contexts) == 8 and all("feedback:" in c for c in backend.contexts)
    assert all(FEEDBACK in c and SHOWN not in c for c in backend.contexts)  # shown as written now
    assert [(t.kind, t.text, list(t.children)) for t in first.turns] == before  # the first rollout untouched
    # the same as a rollout of the unredacted protocol from scratch, turn for turn and token for token
    fresh = rollout(program, _actors(policy, CopyingBackend(ATTEMPT, FEEDBACK), False), problems, sampling)
    assert len(again.turns) == len(fresh.turns) == 4 + 4 + 8
    for a, b in zip(again.turns, fresh.turns):
        assert (a.kind, a.parent, a.children, a.prompt_ids, a.ids, a.text, a.reward, a.redaction) == \
            (b.kind, b.parent, b.children, b.prompt_ids, b.ids, b.text, b.reward, b.redaction)
    assert (again.gen_tokens, again.prompt_tokens) == (fresh.gen_tokens, fresh.prompt_tokens)
    assert [again.turns[i].text for i in again.of_kind("refine")] == ["#13"] * 8  # copied from what it saw
    # and back: redacted again, the refinements are the first rollout's
    back = refine_again(program, again, _actors(policy, CopyingBackend(ATTEMPT, FEEDBACK), True), sampling)
    assert [(t.text, t.redaction) for t in back.turns] == [(t.text, t.redaction) for t in first.turns]
    assert (back.gen_tokens, back.prompt_tokens) == (first.gen_tokens, first.prompt_tokens)


def test_a_rollout_on_another_rollouts_attempts_generates_only_the_turns_after_them(policy):
    sampling = Sampling(0.0, 1.0, 40, 80)
    problems = [ARITH, Problem("p1", "synthetic-arith", "9-6+9+1", "14")]
    single = rollout(Program(2), _actors(policy, CopyingBackend(ATTEMPT, FEEDBACK), True), problems, sampling)
    backend = RecordingBackend(ATTEMPT, FEEDBACK)
    ro = rollout(Program(2, "critic"), _actors(policy, backend, True), problems, sampling, attempts_of=single)
    # 4 feedbacks and 4 refinements, no attempt
    assert len(backend.contexts) == 8 and sum("feedback:" in c for c in backend.contexts) == 4
    assert sum("\ncheck" in c and "feedback:" not in c for c in backend.contexts) == 4
    fresh = rollout(Program(2, "critic"), _actors(policy, CopyingBackend(ATTEMPT, FEEDBACK), True), problems, sampling)
    assert [(t.kind, t.parent, t.children, t.prompt_ids, t.ids, t.reward) for t in ro.turns] == \
        [(t.kind, t.parent, t.children, t.prompt_ids, t.ids, t.reward) for t in fresh.turns]
    assert (ro.gen_tokens, ro.prompt_tokens) == (fresh.gen_tokens, fresh.prompt_tokens)
    assert single.turns[0].children == []  # the attempts were copied, not adopted
    with pytest.raises(ValueError, match="attempts_of: 4 attempts of 2 problems, not 1 of each of these 2"):
        rollout(Program(1, "critic"), _actors(policy, backend, True), problems, sampling, attempts_of=single)
    with pytest.raises(ValueError, match="not 2 of each of these 1"):
        rollout(Program(2, "critic"), _actors(policy, backend, True), problems[:1], sampling, attempts_of=single)


def test_known_outcomes_after_null_feedback_are_not_generated_again(policy):
    program, sampling = Program(1, "critic", 1, 1), Sampling(0.0, 1.0, 40, 80)
    first = evaluate(program, _actors(policy, CopyingBackend(ATTEMPT, FEEDBACK), True), [ARITH], sampling)
    backend = RecordingBackend(ATTEMPT, FEEDBACK)
    actors = _actors(policy, backend, False)
    episodes = refine_again(program, first.rollout, actors, sampling)
    assert len(backend.contexts) == 1
    res = evaluate(program, actors, [ARITH], sampling, episodes=episodes, null_outcomes=[True])
    assert len(backend.contexts) == 1  # g∅'s refinement not generated: its outcome was given
    assert (res.metrics["acc@t2"], res.metrics["acc@t2_null"], res.metrics["feedback_effect"]) == (1.0, 1.0, 0.0)
    assert res.per_problem == [{"problem_id": "p0", "t1": False, "t2": True, "t2_null": True,
                                "t2_critic_solver": True}]
    with pytest.raises(ValueError, match="2 outcomes after g∅ for 1 feedbacks"):
        evaluate(program, actors, [ARITH], sampling, episodes=episodes, null_outcomes=[True, False])


def test_metric_functions_by_hand():
    assert fbm.redacted_share([0.1, 0.3]) == pytest.approx(0.2)
    assert fbm.redacted_share([]) is None
    with pytest.raises(ValueError):
        fbm.redacted_share([1.5])
    assert fbm.critic_as_solver([True, False, None, True]) == {"acc_critic_as_solver": 0.5,
                                                               "critic_states_answer_rate": 0.75}
    assert fbm.copy_rate([True, None, False, False]) == pytest.approx(1 / 3)
    assert fbm.copy_rate([None]) is None


def test_trainer_logs_the_share_and_evaluates_unredacted_on_request(tiny_ckpt, tmp_path):
    spec = make_spec(tmp_path, tiny_ckpt, "mlmt", {"group_size": 2, "value": "none"},
                     feedback={"redact": True, "eval_unredacted": True})
    trainer = build_trainer(spec, tmp_path)
    trainer.eval_problems = [ARITH]
    trainer.actors.verifier = SyntheticVerifier()
    trainer.actors.backend = backend = RecordingBackend(ATTEMPT, FEEDBACK)
    record = trainer.evaluate(time.perf_counter(), final=True)
    assert record["acc@t2"] == 0.0 and record["unredacted/acc@t2"] == 1.0  # the same policies, redaction off
    # attempt, feedback, refinement and g∅'s refinement once; without redaction only the refinement again
    refinements = [c for c in backend.contexts if "feedback:" in c]
    assert len(backend.contexts) == 5 and [SHOWN in c for c in refinements] == [True, False, False]
    assert record["unredacted/acc@t2_null"] == record["acc@t2_null"]
    assert record["unredacted/test_flops_eval"] == pytest.approx(record["test_flops_eval"], rel=0.05)
    assert record["feedback/redacted_share"] > 0 and "unredacted/feedback/redacted_share" not in record
    rows = [json.loads(line) for line in (trainer.run_dir.path / "eval_problems.jsonl").read_text().splitlines()]
    assert [(r["t2"], r["t2_unredacted"], r["t2_critic_solver"]) for r in rows] == [(False, True, True)]


def test_a_base_critic_evaluation_is_repeated_unredacted_on_request(tiny_ckpt, tmp_path):
    """grpo with eval.base_critic: the `+ base critic` evaluation is repeated without redaction too
    (its refinements after the same feedback, shown as written), logged under
    base_critic/unredacted/ with each problem's t2_base_critic_unredacted; grpo's own row, with no
    feedback, has none."""
    spec = make_spec(tmp_path, tiny_ckpt, "grpo", feedback={"redact": True, "eval_unredacted": True})
    spec = spec.model_copy(update={"eval": spec.eval.model_copy(update={"base_critic": True})})
    trainer = build_trainer(spec, tmp_path)
    trainer.eval_problems = [ARITH]
    trainer.actors.verifier = SyntheticVerifier()
    trainer.actors.backend = backend = RecordingBackend(ATTEMPT, FEEDBACK)
    record = trainer.evaluate(time.perf_counter(), final=True)
    assert record["base_critic/acc@t2"] == 0.0 and record["base_critic/unredacted/acc@t2"] == 1.0
    assert record["base_critic/unredacted/acc@t2_null"] == record["base_critic/acc@t2_null"]
    assert not any(k.startswith("unredacted/") for k in record)
    refinements = [c for c in backend.contexts if "feedback:" in c]
    assert [SHOWN in c for c in refinements] == [True, False, False]  # redacted, g∅, then as written
    rows = [json.loads(line) for line in (trainer.run_dir.path / "eval_problems.jsonl").read_text().splitlines()]
    assert [(r["t2_base_critic"], r["t2_base_critic_unredacted"]) for r in rows] == [(False, True)]
    assert "t2_unredacted" not in rows[0]
    not_final = trainer.evaluate(time.perf_counter())
    assert not any("unredacted" in k for k in not_final)  # only the final evaluation is repeated


def test_training_steps_log_the_redacted_share(tiny_ckpt, tmp_path):
    spec = make_spec(tmp_path, tiny_ckpt, "mlmt", {"group_size": 2, "value": "none"}, feedback={"redact": True},
                     train={"steps": 1, "problems_per_step": 2})
    trainer = build_trainer(spec, tmp_path)
    trainer.eval_problems = [ARITH]
    trainer.actors.verifier = SyntheticVerifier()
    trainer.actors.backend = CopyingBackend(ATTEMPT, FEEDBACK)
    trainer.after_train = None  # no end-of-run probe here: this test is about the training record
    trainer.train()
    records = [json.loads(line) for line in (trainer.run_dir.path / "metrics.jsonl").read_text().splitlines()]
    (train,) = [r for r in records if r["kind"] == "train"]
    assert 0 < train["feedback/redacted_share"] <= 1


# --------------------------------------------------------------------------- spec


def test_spec_feedback_section(tiny_ckpt, tmp_path):
    from mlmt_bench.spec import dump_yaml

    spec = make_spec(tmp_path, tiny_ckpt, "mlmt")
    assert spec.feedback.redact is False and "\nfeedback:" not in dump_yaml(spec)  # default: dumps as before
    on = make_spec(tmp_path, tiny_ckpt, "mlmt", feedback={"redact": True})
    assert on.feedback.redact is True and "\nfeedback:\n  redact: true" in dump_yaml(on)
    with pytest.raises(UserError, match=r"feedback\.redact: input should be a valid boolean"):
        make_spec(tmp_path, tiny_ckpt, "mlmt", feedback={"redact": "maybe"})
    with pytest.raises(UserError, match=r"feedback: eval_unredacted: needs redact: true"):
        make_spec(tmp_path, tiny_ckpt, "mlmt", feedback={"eval_unredacted": True})


def test_set_override_reaches_the_feedback_section(write_spec, tiny_ckpt):
    from conftest import minimal_spec
    from mlmt_bench.spec import load_any

    path = write_spec(minimal_spec(policies={"solver": {"model": "tiny", "path": str(tiny_ckpt)}}))
    assert load_any(path, ["feedback.redact=true"]).feedback.redact is True
    with pytest.raises(UserError, match=r"--set feedback\.redcat=true: .*did you mean 'redact'"):
        load_any(path, ["feedback.redcat=true"])


# --------------------------------------------------------------------------- report rows


def _final_rows(run, fields) -> None:
    """Add ``fields(i, row)`` to each step-2 (final) row of a run's eval_problems.jsonl."""
    lines = [json.loads(line) for line in (run / "eval_problems.jsonl").read_text().splitlines()]
    for i, row in enumerate(lines):
        if row["step"] == 2:
            row.update(fields(i, row))
    (run / "eval_problems.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


def test_report_gains_the_critic_as_second_solver_and_unredacted_rows(tmp_path):
    from mlmt_bench.report.compare import build_comparison

    runs = []
    for seed in (0, 1):
        d = make_run(tmp_path, f"mlmt-s{seed}", seed=seed, arm="mlmt",
                     curve=[(0, 0, 0.0, 0.5, 0.5), (2, 90, 9e6, 0.5, 0.5)], t1=[1, 0, 1, 0], t2=[1, 0, 1, 0],
                     eval_extra={2: {"acc_critic_as_solver": 0.75, "critic_states_answer_rate": 1.0,
                                     "critic_as_solver_tokens": 30.0, "feedback/redacted_share": 0.1,
                                     "unredacted/acc@t1": 0.5, "unredacted/acc@t2": 1.0,
                                     "unredacted/gen_tokens_eval": 200}})
        _final_rows(d, lambda i, row: dict(t2_critic_solver=i % 4 != 3, t2_unredacted=True))
        runs.append(d)
    summary = build_comparison({"mlmt": runs}, tmp_path / "out")
    assert list(summary["arms"]) == ["mlmt", "mlmt without redaction", "mlmt critic as second solver"]
    md = (tmp_path / "out" / "comparison.md").read_text()
    assert table_column(md, "acc@t2 (refine-all)") == ["50.0% ± 0.0", "100.0% ± 0.0", "75.0% ± 0.0"]
    ci = summary["arms"]["mlmt critic as second solver"]["ci"]["acc@t2"]
    assert ci["mean"] == pytest.approx(0.75)
    assert table_column(md, "test-time generated tokens per problem")[1:] == ["50.0 ± 0.0", "30.0 ± 0.0"]
    assert re.search(r"feedback redacted share", md)


def test_report_gains_a_base_critic_row_without_redaction(tmp_path):
    from mlmt_bench.report.compare import build_comparison

    runs = []
    for seed in (0, 1):
        d = make_run(tmp_path, f"grpo-s{seed}", seed=seed, arm="grpo", feedback=False,
                     curve=[(0, 0, 0.0, 0.5, 0.5), (2, 90, 9e6, 0.5, 0.5)], t1=[1, 0, 1, 0], t2=[1, 0, 1, 0],
                     eval_extra={2: {"base_critic/acc@t1": 0.5, "base_critic/acc@t2": 0.5,
                                     "base_critic/unredacted/acc@t1": 0.5, "base_critic/unredacted/acc@t2": 0.75}})
        _final_rows(d, lambda i, row: dict(t2_base_critic=bool(row["t1"]), t2_base_critic_unredacted=i % 4 != 3))
        runs.append(d)
    summary = build_comparison({"grpo": runs}, tmp_path / "out")
    assert list(summary["arms"]) == ["grpo", "grpo + base critic", "grpo + base critic without redaction"]
    md = (tmp_path / "out" / "comparison.md").read_text()
    assert table_column(md, "acc@t2 (refine-all)") == ["50.0% ± 0.0", "50.0% ± 0.0", "75.0% ± 0.0"]
    assert summary["arms"]["grpo + base critic without redaction"]["ci"]["acc@t2"]["mean"] == pytest.approx(0.75)


def test_a_baseline_may_name_a_copy_channel_row():
    from mlmt_bench.report.compare import check_baseline

    for name in ("mlmt without redaction", "mlmt critic as second solver", "grpo + base critic as second solver",
                 "grpo + base critic without redaction"):
        check_baseline(name, ["grpo", "mlmt"])
    with pytest.raises(UserError, match="unknown arm"):
        check_baseline("sc critic as second solver", ["grpo", "mlmt"])
    with pytest.raises(UserError, match="unknown arm"):
        check_baseline("grpo + base as second solver", ["grpo", "mlmt"])

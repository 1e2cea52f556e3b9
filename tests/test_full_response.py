"""What critique_grpo and self_distill train as "a response to x" (issue 17, item 8).

On synthetic-arith the solver's refinement is a *revision* (the steps from the corrected one on
and the final line), which reads right only after the attempt and its feedback. Both papers train
a complete answer to x, so :meth:`Benchmark.full_response` splices the revision into its attempt
and the algorithms train its tokens. Checked here on hand-written strings and hand-built
rollouts tokenised by the tiny char tokenizer."""

from __future__ import annotations

import random

import pytest

from mlmt_bench.algorithms.base import CreditInputs, ResponseToX
from mlmt_bench.algorithms.critique_grpo import CritiqueGRPO, CritiqueGRPOParams
from mlmt_bench.algorithms.self_distill import SelfDistill, SelfDistillParams
from mlmt_bench.benchmarks.base import Benchmark
from mlmt_bench.benchmarks.synthetic import SyntheticArith, apply_feedback, full_response, oracle_feedback
from mlmt_bench.models.tokenizer import build_char_tokenizer, encode
from mlmt_bench.rollout.episodes import Rollout, TurnSample
from mlmt_bench.types import Problem
from mlmt_bench.verifiers.synthetic import SyntheticVerifier

P = Problem(id="p", benchmark="synthetic-arith", prompt="9-6+9+1", answer="13")  # 9-6=3;3+9=12;12+1=13;#13
ATTEMPT = "9-6=3;3+9=11;11+1=12;#12"  # step 2 wrong


@pytest.mark.parametrize("attempt,revision,full", [
    (ATTEMPT, "3+9=12;12+1=13;#13", "9-6=3;3+9=12;12+1=13;#13"),  # from step 2 on: step 1 kept
    ("9-6=3;3+9=12;12+1=14;#14", "12+1=13;#13", "9-6=3;3+9=12;12+1=13;#13"),  # the last step: two kept
    ("9-7=2;2+9=11;11+1=12;#12", "9-6=3;3+9=12;12+1=13;#13", "9-6=3;3+9=12;12+1=13;#13"),  # all steps: itself
    ("9-6=3;3+9=12;12+1=13;#31", "#13", "9-6=3;3+9=12;12+1=13;#13"),  # a new final line: the steps kept
    ("9-6=3;3+9=12;12+1=13; #13 ", "#13", "9-6=3;3+9=12;12+1=13; #13 "),  # the kept final line: the attempt
    ("9-6=3;3+9=12;#12", "12+1=13;#13", "9-6=3;3+9=12;12+1=13;#13"),  # a truncated attempt, completed
    (" 9-6=3 ; 3+9=11;11+1=12;#12", "3+9=12;12+1=13;#13", "9-6=3;3+9=12;12+1=13;#13"),  # kept as written, trimmed
])
def test_a_revision_is_spliced_into_its_attempt(attempt, revision, full):
    assert full_response(P, attempt, revision) == full
    assert SyntheticArith(n_train=10, n_validation=5, n_test=5).full_response(P, attempt, revision) == full
    verifier = SyntheticVerifier()
    assert verifier.score(P, full).kind == verifier.score(P, revision).kind  # the full response shares the verdict


@pytest.mark.parametrize("attempt,revision", [
    (ATTEMPT, "3+9=12;oops;#13"),  # an unreadable step
    (ATTEMPT, "3+9=12;12+1=13"),  # no final line
    (ATTEMPT, "3+9=12;12+1=13;#13 done"),  # text after the final line
    (ATTEMPT, "#12;#13"),  # two final lines
    (ATTEMPT, "1+8=9;9-6=3;3+9=12;12+1=13;#13"),  # more steps than the problem has
    (ATTEMPT, ""),
    ("9-6=?;3+9=11;11+1=12;#12", "3+9=12;12+1=13;#13"),  # the step to keep is unreadable
    ("9-6=3;#3", "12+1=13;#13"),  # the attempt lacks a step to keep
    ("oops", "#13"),  # a final line for an attempt with no readable steps
])
def test_a_malformed_revision_is_trained_as_it_is(attempt, revision):
    assert full_response(P, attempt, revision) == revision


def test_spliced_revisions_are_the_full_corrections_of_the_scripted_corrector():
    # an independent path to the same text: apply_feedback without revision=True writes the whole
    # corrected solution; on oracle feedback for injected errors (and right attempts) they agree
    bench = SyntheticArith(difficulty=4, n_train=10, n_validation=5, n_test=60)
    rng = random.Random(0)
    seen = set()
    for p in bench.load("test"):
        for attempt in (bench.solution(p), bench.inject_errors(bench.solution(p), rng)):
            g = oracle_feedback(p, attempt)
            revision = apply_feedback(p, attempt, g, revision=True)
            assert bench.full_response(p, attempt, revision) == apply_feedback(p, attempt, g)
            seen.add("ok" if g.endswith("answer ok") else "answer" if "answer wrong" in g else "step")
    assert seen == {"ok", "answer", "step"}


def test_a_benchmark_with_complete_refinements_keeps_them():
    assert Benchmark().full_response(P, ATTEMPT, "anything at all") == "anything at all"


# ------------------------------------------------------------------------- what credit trains

TOK = build_char_tokenizer()
EOS = TOK.eos_token_id
X = [TOK.convert_tokens_to_ids("<|user|>")] + encode(TOK, P.prompt) + [EOS, TOK.convert_tokens_to_ids("<|assistant|>")]
REVISION = "3+9=12;12+1=13;#13"
FULL = "9-6=3;3+9=12;12+1=13;#13"


def _ids(text: str, eos: bool = True) -> list[int]:
    return encode(TOK, text) + ([EOS] if eos else [])


def rollout_of(episodes: list[tuple[str, float, str, str, float]], refine_ids=None) -> Rollout:
    """Episodes of problem P: (attempt, r1, feedback, refinement, r2), each refinement's context
    x, z, g as ids (its own ids: the char tokenizer's, with EOS, unless ``refine_ids`` gives them)."""
    turns: list[TurnSample] = []
    for k, (z, r1, g, y, r2) in enumerate(episodes):
        turns.append(TurnSample("attempt", "solver", 0, None, X, _ids(z), [0.0] * len(_ids(z)), z, reward=r1))
        a = len(turns) - 1
        turns.append(TurnSample("feedback", "oracle", 0, a, [], [], [], g))
        turns[a].children.append(a + 1)
        ids = refine_ids[k] if refine_ids else _ids(y)
        turns.append(TurnSample("refine", "solver", 0, a + 1, X + _ids(z) + _ids(g), ids, [0.0] * len(ids), y,
                                reward=r2))
        turns[a + 1].children.append(a + 2)
    return Rollout([P], turns, {"solver": 0}, 0.0)


EPISODES = [(ATTEMPT, 0.0, oracle_feedback(P, ATTEMPT), REVISION, 1.0),  # a correct revision
            ("9-6=3;3+9=12;12+1=14;#14", 0.0, oracle_feedback(P, "9-6=3;3+9=12;12+1=14;#14"), "12+1=14;#14", 0.0)]
SYNTH = ResponseToX(SyntheticArith(n_train=10, n_validation=5, n_test=5).full_response, TOK)
DONE = CreditInputs(frac_done=1.0)


def _critique_grpo(respond, **params) -> CritiqueGRPO:
    algo = CritiqueGRPO(CritiqueGRPOParams(group_size=2, **params), 10)
    algo.response_to_x = respond
    return algo


def _self_distill(respond, distill: str) -> SelfDistill:
    algo = SelfDistill(SelfDistillParams(group_size=2, critique_source="oracle", distill=distill), 10)
    algo.response_to_x = respond
    return algo


def test_critique_grpo_adds_the_full_corrected_solution_to_the_group():
    c = _critique_grpo(SYNTH).credit(rollout_of(EPISODES), 0, DONE)
    off = [it for it in c.items["solver"] if it.kind == "shaped"]
    assert len(off) == 1 and off[0].prompt_ids == X  # a response to x alone
    assert off[0].ids == _ids(FULL) and off[0].ids != _ids(REVISION)  # the full solution, not the revision
    assert TOK.decode(off[0].ids, skip_special_tokens=True) == FULL
    # the reward is the refinement's verdict: group [0, 0, 1] -> advantage 1.1547 (mean 1/3, std 0.5774)
    assert c.advantages[2] == pytest.approx(1.1547, abs=1e-4)


def test_self_distill_sft_learns_the_full_corrected_solution_as_a_response_to_x():
    c = _self_distill(SYNTH, "sft").credit(rollout_of(EPISODES), 0, DONE)
    aux = [it for it in c.items["solver"] if it.kind == "sft"]
    assert len(aux) == 1 and aux[0].prompt_ids == X and aux[0].ids == _ids(FULL)


def test_self_distill_kl_distils_the_revision_after_the_attempts_kept_steps():
    # the teacher (x, z, g) has distributions for the revision's tokens only: they stay the trained
    # tokens, and the student reads the kept step after x, as a one-turn answer would have it
    ro = rollout_of(EPISODES)
    c = _self_distill(SYNTH, "kl").credit(ro, 0, DONE)
    aux = [it for it in c.items["solver"] if it.kind == "distill"]
    assert len(aux) == 1 and aux[0].ids == _ids(REVISION)
    assert aux[0].prompt_ids == X + encode(TOK, "9-6=3;") and aux[0].teacher_prompt_ids == ro.turns[2].prompt_ids
    assert aux[0].prompt_ids + aux[0].ids == X + _ids(FULL)  # the student's tokens are x and the full solution


@pytest.mark.parametrize("arm", ["critique_grpo", "sft", "kl"])
def test_a_benchmark_whose_refinements_are_complete_answers_trains_them_unchanged(arm):
    # the base contract returns the refinement: its own ids are trained (not re-tokenised: [5, 6]
    # are not the char tokenizer's ids of its text), exactly as with no response_to_x at all
    complete = ResponseToX(Benchmark().full_response, TOK)
    own = [[5, 6, EOS], [5, EOS]]
    for respond in (complete, None):
        ro = rollout_of(EPISODES, refine_ids=own)
        if arm == "critique_grpo":
            items = [it for it in _critique_grpo(respond).credit(ro, 0, DONE).items["solver"] if it.kind == "shaped"]
        else:
            items = [it for it in _self_distill(respond, arm).credit(ro, 0, DONE).items["solver"]
                     if it.kind in ("sft", "distill")]
        assert [(it.prompt_ids, it.ids) for it in items] == [(X, [5, 6, EOS])]


def test_the_full_response_has_eos_only_where_the_refinement_had_it():
    ro = rollout_of(EPISODES, refine_ids=[_ids(REVISION, eos=False), _ids("12+1=14;#14")])
    assert SYNTH(ro, 2) == (_ids(FULL, eos=False), encode(TOK, "9-6=3;"))
    assert SYNTH(ro, 5) == (_ids("9-6=3;3+9=12;12+1=14;#14"), encode(TOK, "9-6=3;3+9=12;"))


def test_overlong_shaping_reads_the_length_of_the_full_response():
    # revisions: 19 and 12 tokens (characters + EOS), their full responses 25 each; limit 30,
    # buffer 10 -> free up to 20: no revision is penalised, each full response trained in its
    # place is, by (20 - 25) / 10 = -0.5
    inputs = CreditInputs(frac_done=1.0, max_new_tokens=30)
    ro = rollout_of(EPISODES)
    c = _critique_grpo(SYNTH, refinements_in_group="all", overlong_buffer=10).credit(ro, 0, inputs)
    assert c.stats["r2"] == pytest.approx((0.5 - 0.5) / 2)
    # the attempts (25 tokens) get -0.5 too: group [-0.5, -0.5, 0.5, -0.5], mean -0.25, sample std 0.5
    assert [c.advantages[i] for i in (0, 3, 2, 5)] == pytest.approx([-0.5, -0.5, 1.5, -0.5], abs=1e-4)
    c = _critique_grpo(None, refinements_in_group="all", overlong_buffer=10).credit(ro, 0, inputs)
    assert c.stats["r2"] == pytest.approx((1.0 + 0.0) / 2)  # the revisions' own lengths: no penalty


def test_the_runner_hands_the_benchmarks_full_response_to_the_algorithm(tiny_ckpt, tmp_path):
    from conftest import minimal_spec
    from mlmt_bench import runner
    from mlmt_bench.spec import validate_run

    d = minimal_spec()
    d["output_dir"] = str(tmp_path / "runs")
    d["policies"] = {"solver": {"model": "tiny", "path": str(tiny_ckpt)}}
    d["algorithm"] = {"name": "critique_grpo", "params": {"group_size": 2, "critique_source": "oracle"}}
    comp = runner.build(validate_run(d, "test"), progress=False)
    respond = comp.algorithm.response_to_x
    assert isinstance(respond, ResponseToX) and respond.tokenizer is comp.policies["solver"].tokenizer
    assert respond.full_response(P, ATTEMPT, REVISION) == FULL

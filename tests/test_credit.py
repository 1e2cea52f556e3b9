"""Turn credit of each algorithm on hand-built rollouts with known rewards."""

from __future__ import annotations

import copy

import pytest
import torch

from mlmt_bench.algorithms.base import CreditInputs
from mlmt_bench.algorithms.grpo import GRPO
from mlmt_bench.algorithms.mlmt import MLMT
from mlmt_bench.algorithms.params import GRPOParams, MLMTParams, SelfCorrectParams
from mlmt_bench.algorithms.self_correct import SelfCorrect
from mlmt_bench.rollout.episodes import Rollout, TurnSample
from mlmt_bench.types import Problem


def turn(kind, problem, parent, reward=None, policy="solver"):
    return TurnSample(kind, policy, problem, parent, [1, 2], [3, 4], [0.0, 0.0], "x", reward=reward)


def tree(rewards):
    """rewards: per problem, a list of (r1, [r2 of each refinement]) per attempt; one feedback per attempt."""
    turns = []
    for p, attempts in enumerate(rewards):
        for r1, r2s in attempts:
            turns.append(turn("attempt", p, None, r1))
            a = len(turns) - 1
            if r2s is None:
                continue
            turns.append(turn("feedback", p, a, None, "critic"))
            f = len(turns) - 1
            turns[a].children.append(f)
            for r2 in r2s:
                turns.append(turn("refine", p, f, r2))
                turns[f].children.append(len(turns) - 1)
    probs = [Problem(id=str(i), benchmark="t", prompt="q") for i in range(len(rewards))]
    return Rollout(probs, turns, {"solver": 0, "critic": 0}, 0.0)


def adv(credit, ro, kind):
    return [round(credit.advantages.get(i, 0.0), 4) for i, t in enumerate(ro.turns) if t.kind == kind]


def r_h(credit, ro):
    return [round(credit.rewards[i], 4) for i, t in enumerate(ro.turns) if t.kind == "feedback"]


DONE = CreditInputs(frac_done=1.0)


def test_grpo_credit_is_group_relative_per_problem():
    ro = tree([[(1, None), (0, None), (0, None), (1, None)], [(1, None), (1, None), (1, None), (1, None)]])
    before = copy.deepcopy(ro)
    c = GRPO(GRPOParams(group_size=4), 10).credit(ro, 0, DONE)
    # problem 0: mean .5, sample std .5774 -> ±0.866; problem 1: all equal -> 0 and skipped
    assert adv(c, ro, "attempt") == [0.866, -0.866, -0.866, 0.866, 0, 0, 0, 0]
    assert len(c.items["solver"]) == 4 and c.stats["frac_zero_std"] == 0.5
    assert [round(it.advantage, 4) for it in c.items["solver"]] == [0.866, -0.866, -0.866, 0.866]
    assert c.sampled == {"solver": 8}  # the constant_norm normaliser counts the skipped ones too
    assert ro == before  # pure: the rollout is not written to


def test_self_correct_stage_two_progress_bonus():
    # two attempts of one problem: r1 = 1, 0; refinements r2 = 0, 1
    ro = tree([[(1, [0]), (0, [1])]])
    c = SelfCorrect(SelfCorrectParams(group_size=2, alpha=10), 10).credit(ro, 0, DONE)
    # turn 1 on r1 = [1, 0] -> ±0.7071; turn 2 on r2 + 10 (r2 - r1) = [-10, 11] -> ∓0.7071
    assert adv(c, ro, "attempt") == [0.7071, -0.7071]
    assert adv(c, ro, "refine") == [-0.7071, 0.7071]
    assert c.sampled == {"solver": 4}


def test_self_correct_stage_one_holds_turn_one_by_kl_only():
    ro = tree([[(1, [0]), (0, [1])]])
    c = SelfCorrect(SelfCorrectParams(group_size=2, beta2=0.3), 10).credit(ro, 0, CreditInputs(frac_done=0.1))
    assert adv(c, ro, "attempt") == [0, 0] and adv(c, ro, "refine") == [-0.7071, 0.7071]  # r2 alone
    turn1 = [it for it in c.items["solver"] if it.advantage == 0.0]
    assert len(turn1) == 2 and all(it.beta == 0.3 for it in turn1) and c.stats["stage"] == 1.0


def test_mlmt_lower_and_higher_level_credit():
    # one problem, G = 2 attempts, K = 1 feedback, M = 2 refinements each
    # attempt A: r1 = 1, r2 = [1, 1]; attempt B: r1 = 0, r2 = [1, 0]
    ro = tree([[(1, [1, 1]), (0, [1, 0])]])
    p = MLMTParams(group_size=2, refinements=2, eta=1.0, lam=0.5)
    # the value model's predictions V_L(x, z, g) for the two feedbacks, computed beforehand
    c = MLMT(p, 10).credit(ro, 0, CreditInputs(1.0, values=torch.tensor([0.2, 0.9], dtype=torch.float64)))
    # turn 1: r1 + η r̄2 = [1 + 1, 0 + .5] = [2, .5] -> ±0.7071
    assert adv(c, ro, "attempt") == [0.7071, -0.7071]
    # turn 3: r2 over all refinements of the problem [1, 1, 1, 0]: mean .75, std .5 -> [.5, .5, .5, -1.5]
    assert adv(c, ro, "refine") == [0.5, 0.5, 0.5, -1.5]
    # critic: ū = [1, .5]; R_H = ū + λ V = [1 + .1, .5 + .45] = [1.1, .95] -> ±0.7071
    assert r_h(c, ro) == [1.1, 0.95]
    assert adv(c, ro, "feedback") == [0.7071, -0.7071]
    assert len(c.items["critic"]) == 2 and len(c.items["solver"]) == 6
    assert c.sampled == {"solver": 6, "critic": 2}
    # the value can reverse the ranking: V = [0, 1.2] -> R_H = [1, 1.1]
    c = MLMT(p, 10).credit(ro, 0, CreditInputs(1.0, values=torch.tensor([0.0, 1.2], dtype=torch.float64)))
    assert r_h(c, ro) == [1.0, 1.1] and adv(c, ro, "feedback") == [-0.7071, 0.7071]
    with pytest.raises(ValueError, match="predictions"):
        MLMT(p, 10).credit(ro, 0, DONE)


def test_value_mc_is_rejected_with_a_pointer_to_method():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="removed in METHOD.md v2"):
        MLMTParams(value="mc")


def test_mlmt_value_none_uses_u_bar_only_and_fixed_critic_gets_no_items():
    ro = tree([[(1, [1, 1]), (0, [1, 0])]])
    c = MLMT(MLMTParams(group_size=2, refinements=2, value="none", lam=0.9), 10).credit(ro, 0, DONE)
    assert r_h(c, ro) == [1.0, 0.5]
    c = MLMT(MLMTParams(group_size=2, refinements=2, variant="fixed_feedback"), 10).credit(ro, 0, DONE)
    assert "critic" not in c.items and "critic" not in c.sampled


def test_critic_only_trains_only_the_critic():
    ro = tree([[(1, [1, 1]), (0, [1, 0])]])
    algo = MLMT(MLMTParams(group_size=2, refinements=2, variant="critic_only", value="none"), 10)
    assert algo.roles().solver == "frozen" and algo.roles().critic == "trained"
    assert algo.updates(0) == {"critic"}
    c = algo.credit(ro, 0, DONE)
    assert adv(c, ro, "feedback") == [0.7071, -0.7071]


def test_mlmt_k_feedbacks_grouped_by_attempt():
    # K = 2 feedbacks per attempt: critic advantages are relative among the feedbacks of one attempt
    turns = []
    turns.append(turn("attempt", 0, None, 0))
    for r2 in (1, 0):
        turns.append(turn("feedback", 0, 0, None, "critic"))
        f = len(turns) - 1
        turns[0].children.append(f)
        turns.append(turn("refine", 0, f, r2))
        turns[f].children.append(len(turns) - 1)
    turns.append(turn("attempt", 0, None, 1))
    a = len(turns) - 1
    for r2 in (1, 1):
        turns.append(turn("feedback", 0, a, None, "critic"))
        f = len(turns) - 1
        turns[a].children.append(f)
        turns.append(turn("refine", 0, f, r2))
        turns[f].children.append(len(turns) - 1)
    ro = Rollout([Problem(id="0", benchmark="t", prompt="q")], turns, {}, 0.0)
    c = MLMT(MLMTParams(group_size=2, feedbacks=2, value="none"), 10).credit(ro, 0, DONE)
    # attempt 0's feedbacks: ū = [1, 0] -> ±0.7071; attempt 1's: [1, 1] -> 0, 0
    assert adv(c, ro, "feedback") == [0.7071, -0.7071, 0, 0]

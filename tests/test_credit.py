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
    # critic: ū = [1, .5]; R_H = ū + λ V = [1 + .1, .5 + .45] = [1.1, .95] (logged)
    assert r_h(c, ro) == [1.1, 0.95]
    # A_H = std(ū) + λ (V − mean V) / σ_V (METHOD.md v4; σ_V the batch sample std of V, .7/√2 = .4950)
    #     = ±0.7071 + 0.5 * [-.35, .35] / .4950 = ±0.7071 ∓ 0.3536 = [0.3536, -0.3536]
    assert adv(c, ro, "feedback") == [0.3536, -0.3536]
    assert len(c.items["critic"]) == 2 and len(c.items["solver"]) == 6
    assert c.sampled == {"solver": 6, "critic": 2}
    # the value can reverse the ranking: λ = 2, V = [0, 1] (σ_V 1/√2) -> ±0.7071 + 2 * [-.7071, .7071]
    c = MLMT(p.model_copy(update={"lam": 2.0}), 10).credit(
        ro, 0, CreditInputs(1.0, values=torch.tensor([0.0, 1.0], dtype=torch.float64)))
    assert r_h(c, ro) == [1.0, 2.5] and adv(c, ro, "feedback") == [-0.7071, 0.7071]
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
    # the value is centred in the same groups: V = [0.4, 0.8 | 0.2, 0.2] -> [-0.2, 0.2 | 0, 0], over the
    # batch's σ_V (mean .4, squared deviations .24 / 3 -> .2828) x λ 0.5 -> + [-0.3536, 0.3536 | 0, 0]
    c = MLMT(MLMTParams(group_size=2, feedbacks=2, lam=0.5), 10).credit(
        ro, 0, CreditInputs(1.0, values=torch.tensor([0.4, 0.8, 0.2, 0.2], dtype=torch.float64)))
    assert adv(c, ro, "feedback") == [0.3536, -0.3536, 0, 0]


# --------------------------------------------------------------------------- v3: the value after standardisation


def values(*v):
    return torch.tensor(v, dtype=torch.float64)


def adv_raw(credit, ro, kind):
    return [credit.advantages.get(i, 0.0) for i, t in enumerate(ro.turns) if t.kind == kind]


def test_mlmt_flat_u_bar_with_constant_value_trains_nothing():
    # ū = [1, 1] (both refinements right): no helpfulness signal; V = [0.1, 0.1]: no value signal
    ro = tree([[(1, [1]), (0, [1])]])
    c = MLMT(MLMTParams(group_size=2, lam=0.5), 10).credit(ro, 0, CreditInputs(1.0, values=values(0.1, 0.1)))
    assert adv(c, ro, "feedback") == [0, 0] and c.items["critic"] == []
    assert c.stats["frac_zero_std_critic"] == 1.0  # flat ū counts, whatever V is
    assert c.sampled["critic"] == 2  # constant_norm still counts them


def test_mlmt_flat_u_bar_with_varying_value_gets_exactly_lambda_centred_value():
    # ū = [1, 1]; V = [0.2, 0.6], mean 0.4, σ_V .4/√2 = .2828; λ = 0.5 -> 0.5 * [-.2, .2] / .2828
    # = [-0.3536, 0.3536] (the value term alone, in units of the standardised advantage)
    ro = tree([[(1, [1]), (0, [1])]])
    c = MLMT(MLMTParams(group_size=2, lam=0.5), 10).credit(ro, 0, CreditInputs(1.0, values=values(0.2, 0.6)))
    assert adv(c, ro, "feedback") == [-0.3536, 0.3536] and len(c.items["critic"]) == 2
    assert c.stats["frac_zero_std_critic"] == 1.0
    assert r_h(c, ro) == [1.1, 1.3]


def test_mlmt_non_flat_group_gets_standardised_u_bar_plus_centred_value():
    # three attempts of one problem, M = 1: ū = [1, 0, 0]: mean 1/3, sample std 0.57735 ->
    # [1.1547, -0.57735, -0.57735]; V = [0.2, 0.5, 0.8] centred [-0.3, 0, 0.3] over σ_V 0.3 x λ 0.5 ->
    # + [-0.5, 0, 0.5]: A_H = [0.654700, -0.577350, -0.077350] (the std's eps of 1e-6 moves the 6th decimal)
    ro = tree([[(0, [1]), (0, [0]), (1, [0])]])
    c = MLMT(MLMTParams(group_size=3, lam=0.5), 10).credit(ro, 0, CreditInputs(1.0, values=values(0.2, 0.5, 0.8)))
    assert adv_raw(c, ro, "feedback") == pytest.approx([0.654700, -0.577350, -0.077350], abs=2e-6)
    assert c.stats["frac_zero_std_critic"] == 0.0
    # Dr.GRPO (scale none): ū centred [2/3, -1/3, -1/3] + [-0.5, 0, 0.5]
    c = MLMT(MLMTParams(group_size=3, lam=0.5, scale="none"), 10).credit(
        ro, 0, CreditInputs(1.0, values=values(0.2, 0.5, 0.8)))
    assert adv(c, ro, "feedback") == [0.1667, -0.3333, 0.1667]


# --------------------------------------------------------------------------- critic_reward: helpfulness+verdict


def test_verdict_reward_is_standardised_with_u_bar_then_the_value_added():
    # ū = [1, 0, 1]; verdict matches [1, 1, 0]; ν = 0.5 -> R = [1.5, 0.5, 1.0]: mean 1, deviations
    # [.5, -.5, 0], sample std 0.5 -> [1, -1, 0]; V = [0.2, 0.5, 0.8] (σ_V 0.3), λ 0.5 -> + [-0.5, 0, 0.5]
    ro = tree([[(1, [1]), (0, [0]), (0, [1])]])
    p = MLMTParams(group_size=3, lam=0.5, critic_reward="helpfulness+verdict", nu=0.5)
    inputs = CreditInputs(1.0, values=values(0.2, 0.5, 0.8), verdict_match=values(1, 1, 0))
    c = MLMT(p, 10).credit(ro, 0, inputs)
    assert adv(c, ro, "feedback") == [0.5, -1.0, 0.5]
    assert r_h(c, ro) == [1.6, 0.75, 1.4]  # R + λ V
    assert c.stats["critic_verdict_match"] == pytest.approx(2 / 3)
    # equally helpful feedbacks (ū = [1, 1]) are ranked by their verdicts: R = [1, 1.5] -> ∓0.7071
    ro = tree([[(1, [1]), (0, [1])]])
    c = MLMT(p.model_copy(update={"value": "none"}), 10).credit(ro, 0, CreditInputs(1.0, verdict_match=values(0, 1)))
    assert adv(c, ro, "feedback") == [-0.7071, 0.7071] and c.stats["frac_zero_std_critic"] == 0.0


def test_helpfulness_ignores_nu_and_verdict_needs_the_matches():
    from pydantic import ValidationError

    ro = tree([[(1, [1]), (0, [0]), (0, [1])]])
    inputs = CreditInputs(1.0, verdict_match=values(1, 1, 0))
    c = MLMT(MLMTParams(group_size=3, value="none", nu=3.0), 10).credit(ro, 0, inputs)
    # ū = [1, 0, 1]: mean 2/3, sample std 0.57735 -> [0.577350, -1.154700, 0.577350]
    assert r_h(c, ro) == [1.0, 0.0, 1.0]
    assert adv_raw(c, ro, "feedback") == pytest.approx([0.577350, -1.154700, 0.577350], abs=2e-6)
    assert c.stats["critic_verdict_match"] == pytest.approx(2 / 3)  # logged as a diagnostic
    p = MLMTParams(group_size=3, value="none", critic_reward="helpfulness+verdict")
    assert p.nu == 0.5
    with pytest.raises(ValueError, match="verdict_match"):
        MLMT(p, 10).credit(ro, 0, DONE)
    with pytest.raises(ValidationError):
        MLMTParams(nu=-0.1)
    with pytest.raises(ValidationError):
        MLMTParams(critic_reward="verdict")


def test_verdict_matches_reads_each_feedback_against_its_attempt():
    import dataclasses

    from mlmt_bench.algorithms.base import verdict_matches

    # attempts: right, wrong, right, wrong; feedbacks say ok, bad, bad, (unreadable)
    ro = tree([[(1, [0]), (0, [0]), (1, [0]), (0, [0])]])
    texts = iter(["ok", "bad", "bad", "??"])
    ro.turns = [dataclasses.replace(t, text=next(texts)) if t.kind == "feedback" else t for t in ro.turns]
    judge = {"ok": True, "bad": False}.get
    assert verdict_matches(ro, judge).tolist() == [1.0, 1.0, 0.0, 0.0]


def test_critic_credit_returns_the_critics_credit_and_merging_changes_neither():
    """critic_credit is pure: it returns the critic role's credit; Credit.merged makes a new one."""
    from mlmt_bench.algorithms.base import Credit
    from mlmt_bench.algorithms.critic_credit import critic_credit, feedback_means
    from mlmt_bench.algorithms.update import TrainItem

    ro = tree([[(0, [1, 1]), (0, [0, 0]), (1, [1, 0])]])  # ū = [1, 0, 0.5]
    algo = MLMT(MLMTParams(group_size=3, value="none"), 10)
    r2 = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 0.0], dtype=torch.float64)
    assert feedback_means(ro, r2).tolist() == [1.0, 0.0, 0.5]
    critic = critic_credit(algo, algo.step_plan(0), ro, feedback_means(ro, r2), None, 0.0)
    assert set(critic.items) == set(critic.sampled) == {"critic"} and critic.sampled["critic"] == 3
    # ū standardised over the problem's three feedbacks: mean 0.5, sample std 0.5 -> [1, -1, 0]
    assert adv(critic, ro, "feedback") == [1.0, -1.0, 0.0] and r_h(critic, ro) == [1.0, 0.0, 0.5]
    assert [round(it.advantage, 4) for it in critic.items["critic"]] == [1.0, -1.0]  # the zero advantage dropped
    solver = Credit({"solver": [TrainItem([1], [2], 0.5)]}, {"solver": 9}, {0: 0.5}, stats={"r1": 0.25})
    before = copy.deepcopy(solver), copy.deepcopy(critic)
    both = solver.merged(critic)
    assert (solver, critic) == before  # neither input changed
    assert both.items == {**solver.items, **critic.items} and both.sampled == {"solver": 9, "critic": 3}
    assert both.advantages == {0: 0.5, **critic.advantages} and both.rewards == critic.rewards
    assert both.stats == {"r1": 0.25, **critic.stats}


def test_every_algorithm_logs_the_same_reward_statistics():
    """r1 / r2 are the attempts' and refinements' mean rewards, reward_mean / reward_std those of
    the rewards each algorithm's main advantage uses (GRPO: r1; self_correct, mlmt: r2)."""
    from mlmt_bench.algorithms.base import reward_stats

    assert reward_stats(torch.tensor([1.0, 0.0]), torch.tensor([1.0, 1.0, 1.0, 0.0]), torch.tensor([1.0, 0.0])) == {
        "r1": 0.5, "r2": 0.75, "reward_mean": 0.5, "reward_std": pytest.approx(0.5 ** 0.5)}
    assert reward_stats(torch.tensor([1.0]), None, torch.tensor([1.0])) == {"r1": 1.0, "reward_mean": 1.0,
                                                                            "reward_std": 0.0}
    assert reward_stats(torch.tensor([1.0]), torch.zeros(0), torch.tensor([1.0]))["r2"] == 0.0
    ro = tree([[(1, [1]), (0, [1]), (0, [0]), (1, [1])]])  # r1 mean 0.5, r2 mean 0.75
    grpo = GRPO(GRPOParams(group_size=4), 10).credit(tree([[(1, None), (0, None), (0, None), (0, None)]]), 0, DONE)
    assert (grpo.stats["r1"], grpo.stats["reward_mean"]) == (0.25, 0.25) and "r2" not in grpo.stats
    for c in (SelfCorrect(SelfCorrectParams(group_size=4), 10).credit(ro, 0, DONE),
              MLMT(MLMTParams(group_size=4, value="none"), 10).credit(ro, 0, DONE)):
        assert (c.stats["r1"], c.stats["r2"], c.stats["reward_mean"]) == (0.5, 0.75, 0.75)
        assert c.stats["reward_std"] == pytest.approx(0.5)

"""Advantage estimators are registered pure functions (mlmt_bench/algorithms/advantages.py), each
pinned here against numbers computed by hand, and selected per role by the params' ``advantage``."""

from __future__ import annotations

import math

import pytest
import torch

from mlmt_bench.algorithms import advantages
from mlmt_bench.algorithms.base import CreditInputs
from mlmt_bench.algorithms.grpo import GRPO
from mlmt_bench.algorithms.mlmt import MLMT
from mlmt_bench.algorithms.params import GRPOParams, MLMTParams, SelfDistillParams
from mlmt_bench.rollout.episodes import Rollout, TurnSample
from mlmt_bench.types import Problem

D = torch.float64
# two groups of 4 and 2 siblings (ids need not be contiguous) and a singleton
REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.25, 0.75, 0.5], dtype=D)
GROUPS = torch.tensor([0, 0, 0, 0, 5, 5, 9])


def test_the_four_estimators_are_registered():
    assert list(advantages.ADVANTAGES) == ["grpo", "dr_grpo", "rloo", "reinforce_plus_plus"]


def test_grpo_standardises_in_the_group_by_hand():
    # group 0: mean 0.5, deviations ±0.5, sample var 4 * 0.25 / 3 = 1/3 -> ±0.5 / 0.57735 = ±0.866025;
    # group 5: deviations ∓0.25, sample var 0.125 -> std 0.353553 -> ∓0.707107; the singleton: 0
    a = advantages.grpo(REWARDS, GROUPS, eps=0.0)
    assert a.tolist() == pytest.approx([0.866025, -0.866025, -0.866025, 0.866025, -0.707107, 0.707107, 0.0], abs=1e-6)


def test_dr_grpo_only_centres_by_hand():
    a = advantages.dr_grpo(REWARDS, GROUPS)
    assert a.tolist() == [0.5, -0.5, -0.5, 0.5, -0.25, 0.25, 0.0]


def test_rloo_subtracts_the_mean_of_the_others_by_hand():
    # group 0: a 1 sees others (0, 0, 1), mean 1/3 -> 2/3; a 0 sees (1, 0, 1) -> -2/3;
    # group 5: 0.25 - 0.75 = -0.5 and 0.75 - 0.25 = 0.5; the singleton has no baseline: 0
    a = advantages.rloo(REWARDS, GROUPS)
    assert a.tolist() == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3, -0.5, 0.5, 0.0], abs=1e-12)
    # = n / (n - 1) * the Dr.GRPO advantage
    assert a[:4].tolist() == pytest.approx((4 / 3 * advantages.dr_grpo(REWARDS, GROUPS)[:4]).tolist(), abs=1e-12)


def test_reinforce_plus_plus_normalises_over_the_batch_by_hand():
    # all 7: mean 3.5 / 7 = 0.5; squared deviations 4 * 0.25 + 2 * 0.0625 + 0 = 1.125, sample var
    # 1.125 / 6 = 0.1875, std 0.433013 -> ±0.5 / std = ±2/√3 = ±1.154701, ∓0.25 / std = ∓1/√3; the
    # singleton at the batch mean: 0. The group ids are not read
    a = advantages.reinforce_plus_plus(REWARDS, GROUPS, eps=0.0)
    h = 1 / math.sqrt(3)
    assert a.tolist() == pytest.approx([2 * h, -2 * h, -2 * h, 2 * h, -h, h, 0.0], abs=1e-12)
    assert torch.equal(a, advantages.reinforce_plus_plus(REWARDS, torch.zeros(7, dtype=torch.long), eps=0.0))


def test_a_flat_group_gets_exactly_zero_from_the_group_relative_estimators():
    flat, g = torch.tensor([0.1, 0.1, 0.1], dtype=D), torch.zeros(3, dtype=torch.long)  # 0.1 * 3 is not 0.3
    for name in ("grpo", "dr_grpo", "rloo", "reinforce_plus_plus"):
        assert advantages.estimator(name)(flat, g).tolist() == [0.0, 0.0, 0.0], name
        assert advantages.estimator(name)(flat[:1], g[:1]).tolist() == [0.0], name  # one sample
    # REINFORCE++ has no group baseline: a flat group in a varied batch keeps the batch's signal
    # (mean 0.75, deviations [.25, .25, .25, -.75], sample std 0.5)
    r, g = torch.tensor([1.0, 1.0, 1.0, 0.0], dtype=D), torch.tensor([0, 0, 1, 1])
    assert advantages.reinforce_plus_plus(r, g, eps=0.0).tolist() == [0.5, 0.5, 0.5, -1.5]
    assert advantages.grpo(r, g, eps=0.0).tolist()[:2] == [0.0, 0.0]


def _pre_registry_group_advantages(rewards, group_ids, scale, eps=1e-6):
    """core.group_advantages as it was before the estimators were registered (commit f90dda0): the
    frozen reference the default estimators must equal bit for bit."""
    _, idx = torch.unique(group_ids, return_inverse=True)
    g = int(idx.max().item()) + 1
    zeros = torch.zeros(g, dtype=rewards.dtype)
    counts = zeros.index_add(0, idx, torch.ones_like(rewards))
    centred = rewards - (zeros.index_add(0, idx, rewards) / counts)[idx]
    adv = centred
    if scale == "std":
        adv = centred / (torch.sqrt(zeros.index_add(0, idx, centred * centred) / (counts - 1).clamp(min=1))[idx] + eps)
    hi = torch.full((g,), -math.inf, dtype=rewards.dtype).scatter_reduce(0, idx, rewards, "amax", include_self=True)
    lo = torch.full((g,), math.inf, dtype=rewards.dtype).scatter_reduce(0, idx, rewards, "amin", include_self=True)
    return torch.where((counts[idx] < 2) | (hi == lo)[idx], torch.zeros_like(adv), adv)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_the_default_estimators_are_bit_identical_to_the_pre_registry_code(dtype):
    gen = torch.Generator().manual_seed(0)
    for trial in range(50):
        n = int(torch.randint(1, 40, (1,), generator=gen))
        groups = torch.randint(0, max(1, n // 3), (n,), generator=gen) * 7  # sizes vary, singletons occur
        levels = torch.tensor([0.0, 0.25, 0.1, 1.0, 1.3], dtype=dtype)  # rewards repeat: flat groups occur
        r = (levels[torch.randint(0, 5, (n,), generator=gen)] if trial % 2
             else torch.rand(n, generator=gen, dtype=dtype))
        for scale, name in advantages.SCALE_ESTIMATORS.items():
            assert torch.equal(advantages.estimator(name)(r, groups), _pre_registry_group_advantages(r, groups, scale))


def test_registration_checks_the_signature_and_names():
    with pytest.raises(TypeError, match="eps=..."):
        advantages.register_advantage("bad")(lambda rewards, group_ids: rewards)
    with pytest.raises(TypeError, match="eps=..."):
        advantages.register_advantage("bad")(lambda rewards, group_ids, *, eps: rewards)  # no default
    with pytest.raises(TypeError, match="eps=..."):
        advantages.register_advantage("bad")(lambda rewards, group_ids, *, eps=0.0, **kw: rewards)
    with pytest.raises(ValueError, match="already registered"):
        advantages.register_advantage("rloo")(advantages.rloo)
    assert "bad" not in advantages.ADVANTAGES
    with pytest.raises(ValueError, match=r"unknown advantage 'rlo'; did you mean 'rloo'\?"):
        advantages.estimator("rlo")


# --------------------------------------------------------------------------- the params' selection


def test_params_name_an_estimator_per_role():
    assert GRPOParams().advantage_of("solver") == "grpo"
    assert GRPOParams(scale="none").advantage_of("solver") == "dr_grpo"
    assert GRPOParams(advantage="rloo").advantage_of("solver") == "rloo"
    p = MLMTParams(advantage={"critic": "rloo"})
    assert (p.advantage_of("solver"), p.advantage_of("critic")) == ("grpo", "rloo")
    assert MLMTParams(scale="none", advantage={"critic": "dr_grpo"}).advantage_of("solver") == "dr_grpo"
    assert MLMTParams(advantage="reinforce_plus_plus").advantage_of("critic") == "reinforce_plus_plus"


@pytest.mark.parametrize("params, match", [
    (dict(advantage="rlo"), r"unknown advantage 'rlo'; did you mean 'rloo'\?"),
    (dict(advantage={"solver": "dr_grop"}), r"did you mean 'dr_grpo'\?"),
    (dict(advantage={"solvr": "rloo"}), r"unknown role 'solvr'; did you mean 'solver'\?"),
    (dict(advantage={"critic": "rloo"}), r"advantage.critic: these parameters train no critic \(trained: solver\)"),
    (dict(advantage="rloo", scale="none"), "scale: none .* contradicts advantage: rloo"),
])
def test_params_refuse_unknown_names_roles_and_contradictions(params, match):
    with pytest.raises(ValueError, match=match):
        GRPOParams(**params)


def test_the_critic_of_a_variant_without_one_cannot_be_given_an_estimator():
    with pytest.raises(ValueError, match="train no critic"):
        MLMTParams(variant="oracle_feedback", advantage={"critic": "rloo"})
    with pytest.raises(ValueError, match="train no critic"):  # frozen base critic: nothing to train
        SelfDistillParams(advantage={"critic": "rloo"})
    assert SelfDistillParams(critique_source="mlmt", advantage={"critic": "rloo"}).advantage_of("critic") == "rloo"


def test_a_spec_names_the_estimator_and_a_typo_is_one_error_line(tmp_path):
    from mlmt_bench import spec
    from mlmt_bench.errors import UserError

    path = tmp_path / "s.yaml"
    base = ("name: t\nbenchmark: {name: synthetic-arith}\npolicies: {solver: {model: tiny}}\n"
            "algorithm: {name: grpo, params: {group_size: 2, advantage: %s}}\n")
    path.write_text(base % "rloo")
    assert GRPOParams(**spec.load_run_spec(path).algorithm.params).advantage_of("solver") == "rloo"
    path.write_text(base % "reinforce_plus")
    with pytest.raises(UserError) as err:
        spec.load_run_spec(path)
    assert str(err.value).count("\n") == 0
    assert "algorithm.params.advantage: unknown advantage 'reinforce_plus'; did you mean 'reinforce_plus_plus'?" \
        in str(err.value)


# --------------------------------------------------------------------------- through credit


def _rollout(per_problem):
    """per problem, a list of (r1, r2 or None) per attempt: one feedback and one refinement per attempt
    when r2 is given."""
    turns: list[TurnSample] = []

    def add(kind, p, parent, reward, policy="solver"):
        turns.append(TurnSample(kind, policy, p, parent, [1, 2], [3, 4], [0.0, 0.0], "x", reward=reward))
        if parent is not None:
            turns[parent].children.append(len(turns) - 1)
        return len(turns) - 1

    for p, attempts in enumerate(per_problem):
        for r1, r2 in attempts:
            a = add("attempt", p, None, r1)
            if r2 is not None:
                add("refine", p, add("feedback", p, a, None, "critic"), r2)
    return Rollout([Problem(id=str(i), benchmark="t", prompt="q") for i in range(len(per_problem))], turns,
                   {"solver": 0, "critic": 0}, 0.0)


def _adv(credit, rollout, kind):
    return [round(credit.advantages[i], 4) for i in rollout.of_kind(kind)]


def test_grpo_credit_uses_the_named_estimator():
    # rewards [1, 1 | 1, 0]: grpo gives the flat first problem 0; REINFORCE++ over the batch (mean
    # 0.75, sample std 0.5) gives [0.5, 0.5, 0.5, -1.5]; frac_zero_std counts the flat group either way
    ro = _rollout([[(1, None), (1, None)], [(1, None), (0, None)]])
    c = GRPO(GRPOParams(group_size=2), 1).credit(ro, 0, CreditInputs(1.0))
    assert _adv(c, ro, "attempt") == [0.0, 0.0, 0.7071, -0.7071] and len(c.items["solver"]) == 2
    c = GRPO(GRPOParams(group_size=2, advantage="reinforce_plus_plus"), 1).credit(ro, 0, CreditInputs(1.0))
    assert _adv(c, ro, "attempt") == [0.5, 0.5, 0.5, -1.5] and len(c.items["solver"]) == 4
    assert c.stats["frac_zero_std"] == 0.5


def test_mlmt_credit_reads_each_role_s_estimator():
    # one problem, 4 attempts: r1 = [1, 0, 0, 1], r2 = ū = [1, 0, 1, 0]; turn-1 reward r1 + r2 =
    # [2, 0, 1, 1]: mean 1, sample std √(2/3) -> [1.2247, -1.2247, 0, 0] (grpo); turn 3: ±0.5 / √(1/3)
    # = ±0.866 (grpo); the critic by RLOO: a 1 sees others' mean 1/3 -> 2/3, a 0 sees 2/3 -> -2/3
    ro = _rollout([[(1, 1), (0, 0), (0, 1), (1, 0)]])
    p = MLMTParams(group_size=4, value="none", advantage={"critic": "rloo"})
    c = MLMT(p, 10).credit(ro, 0, CreditInputs(1.0))
    assert _adv(c, ro, "attempt") == [1.2247, -1.2247, 0.0, 0.0]
    assert _adv(c, ro, "refine") == [0.866, -0.866, 0.866, -0.866]
    assert _adv(c, ro, "feedback") == [0.6667, -0.6667, 0.6667, -0.6667]
    # one name for every role: RLOO on the solver's turns too (4/3 of the centred rewards)
    c = MLMT(MLMTParams(group_size=4, value="none", advantage="rloo"), 10).credit(ro, 0, CreditInputs(1.0))
    assert _adv(c, ro, "attempt") == [1.3333, -1.3333, 0.0, 0.0]
    assert _adv(c, ro, "refine") == _adv(c, ro, "feedback") == [0.6667, -0.6667, 0.6667, -0.6667]


@pytest.fixture
def toy_sign():
    """A toy estimator, sign(r - 1/2), registered for one test from outside the package."""

    @advantages.register_advantage("toy_sign")
    def toy(rewards, group_ids, *, eps=0.0):
        return (rewards - 0.5).sign()

    yield toy
    del advantages.ADVANTAGES["toy_sign"]


def test_an_estimator_registered_outside_the_package_is_selectable(toy_sign):
    ro = _rollout([[(1, None), (1, None)], [(1, None), (0, None)]])
    c = GRPO(GRPOParams(group_size=2, advantage="toy_sign"), 1).credit(ro, 0, CreditInputs(1.0))
    assert _adv(c, ro, "attempt") == [1.0, 1.0, 1.0, -1.0]

"""Single-level multi-turn self-correction (`self_correct`, SCoRe-style), METHOD.md.

z ~ π_L(·|x), then ŷ ~ π_L(·|x, z, c₀) with the fixed instruction c₀ = g∅.
Stage I (the first ``stage1_frac`` of training, by steps or by budget, whichever is further):
turn 2 trained on r2; turn 1 only held near π_ref by a KL of weight β₂. Stage II: turn 1 on r1,
turn 2 on r2 + α·(r2 − r1). Advantages are group-relative among siblings of the same turn
(same problem).
"""

from __future__ import annotations

import torch

from mlmt_bench.algorithms import core
from mlmt_bench.algorithms.base import (
    Algorithm,
    Credit,
    CreditInputs,
    ancestor,
    by_turn,
    group_advantages,
    problem_of,
    reward_stats,
)
from mlmt_bench.algorithms.params import SelfCorrectParams
from mlmt_bench.algorithms.step_plan import POLICY, StepPlan
from mlmt_bench.rollout.episodes import Rollout


class SelfCorrect(Algorithm):
    Params = SelfCorrectParams
    params: SelfCorrectParams  # what __init__ is given: an instance of Params
    budget_dependent = True  # stage I is the first stage1_frac of the budget

    def step_plan(self, step: int) -> StepPlan:
        # stage I trains turn 1 too: its KL toward π_ref (β₂) is a gradient
        return StepPlan.of(self.params.group_size, "null", train={"attempt": POLICY, "refine": POLICY})

    @staticmethod
    def stage_of(frac_done: float, stage1_frac: float) -> int:
        """Stage I while the share of training done is below ``stage1_frac``."""
        return 1 if frac_done < stage1_frac else 2

    def credit(self, rollout: Rollout, step: int, inputs: CreditInputs) -> Credit:
        p = self.params
        attempts, refines = rollout.of_kind("attempt"), rollout.of_kind("refine")
        r1, r2 = self.solver_rewards(rollout, attempts, inputs), self.solver_rewards(rollout, refines, inputs)
        r1_of_refine = self.solver_rewards(rollout, [ancestor(rollout, i, 2) for i in refines], inputs)
        stage = self.stage_of(inputs.frac_done, p.stage1_frac)
        if stage == 1:
            shaped2, adv1, beta1 = r2, torch.zeros_like(r1), p.beta2
        else:
            shaped2, beta1 = core.progress_bonus_reward(r1_of_refine, r2, p.alpha), p.beta
            adv1, _ = group_advantages(r1, problem_of(rollout, attempts), p.advantage_of("solver"))
        adv2, zero = group_advantages(shaped2, problem_of(rollout, refines), p.advantage_of("solver"))
        items, sampled = self.role_items(rollout, self.step_plan(step), [("attempt", attempts, adv1, beta1),
                                                                         ("refine", refines, adv2, p.beta)])
        stats = {**reward_stats(r1, r2, r2), "stage": float(stage), "frac_zero_std": zero}
        return Credit({"solver": items}, {"solver": sampled},
                      {**by_turn(attempts, adv1), **by_turn(refines, adv2)}, stats=stats)

"""GRPO (`single`): G samples per problem, group-relative advantage on r = R(y)."""

from __future__ import annotations

from mlmt_bench.algorithms.base import (
    Algorithm,
    Credit,
    CreditInputs,
    by_turn,
    group_advantages,
    problem_of,
    reward_stats,
)
from mlmt_bench.algorithms.params import GRPOParams
from mlmt_bench.algorithms.step_plan import POLICY, StepPlan
from mlmt_bench.rollout.episodes import Rollout


class GRPO(Algorithm):
    Params = GRPOParams
    params: GRPOParams  # what __init__ is given: an instance of Params

    def step_plan(self, step: int) -> StepPlan:
        return StepPlan.of(self.params.group_size, train={"attempt": POLICY})

    def credit(self, rollout: Rollout, step: int, inputs: CreditInputs) -> Credit:
        attempts = rollout.of_kind("attempt")
        r = self.solver_rewards(rollout, attempts, inputs)
        adv, zero = group_advantages(r, problem_of(rollout, attempts),
                                     self.params.advantage_of("solver"))
        stats = {**reward_stats(r, None, r), "frac_zero_std": zero}
        items, sampled = self.role_items(rollout, self.step_plan(step), [("attempt", attempts, adv, self.params.beta)])
        return Credit({"solver": items}, {"solver": sampled}, by_turn(attempts, adv), stats=stats)

"""A plugin algorithm: attempts, the benchmark's oracle feedback, refinements, each turn trained
on its group-relative advantage (its own ``Params``, declared once on the class)."""

from __future__ import annotations

from pydantic import Field

from mlmt_bench.algorithms.base import Algorithm, Credit, CreditInputs, by_turn, group_advantages, problem_of
from mlmt_bench.algorithms.params import LossParams, Roles
from mlmt_bench.algorithms.step_plan import POLICY, StepPlan
from mlmt_bench.rollout.episodes import Rollout


class RefineParams(LossParams):
    group_size: int = Field(2, ge=2, le=64, description="G: attempts per problem")
    refine_weight: float = Field(1.0, ge=0.0, description="multiplies the refinements' advantages")

    def roles(self) -> Roles:
        return Roles("trained", "absent", "oracle")

    def sample_factors(self) -> dict[str, int]:
        return {"group_size": self.group_size}


class OracleRefine(Algorithm):
    Params = RefineParams
    params: RefineParams

    def step_plan(self, step: int) -> StepPlan:
        return StepPlan.of(self.params.group_size, "oracle", train={"attempt": POLICY, "refine": POLICY})

    def credit(self, rollout: Rollout, step: int, inputs: CreditInputs) -> Credit:
        p = self.params
        attempts, refines = rollout.of_kind("attempt"), rollout.of_kind("refine")
        r1 = self.solver_rewards(rollout, attempts, inputs)
        r2 = self.solver_rewards(rollout, refines, inputs)
        adv1, _ = group_advantages(r1, problem_of(rollout, attempts), p.advantage_of("solver"))
        adv2, _ = group_advantages(r2, problem_of(rollout, refines), p.advantage_of("solver"))
        adv2 = adv2 * p.refine_weight
        items, sampled = self.role_items(rollout, self.step_plan(step), [("attempt", attempts, adv1, p.beta),
                                                                         ("refine", refines, adv2, p.beta)])
        return Credit({"solver": items}, {"solver": sampled},
                      {**by_turn(attempts, adv1), **by_turn(refines, adv2)},
                      stats={"demo_refines": float(len(refines)), "reward_mean": float(r2.mean())})

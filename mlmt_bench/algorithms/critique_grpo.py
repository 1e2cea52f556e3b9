"""Critique-GRPO (`critique_grpo`, arXiv 2506.03106; METHOD.md v2, "Further arms").

G attempts z ~ π(·|x); each gets feedback from a *fixed* source (``critique_source: critic``, the
frozen base critic, or ``oracle``, the rule-based critic that sees y* — an upper bound); the
solver refines, ŷ ~ π(·|x, z, g). The refinements then join the problem's group as off-policy
responses *to x alone* (``refinements_in_group``: the correct ones, or all), advantages are
group-relative over the mixed group, and the off-policy tokens are trained with policy shaping
π/(π + γ) instead of the clipped ratio (their behaviour policy saw a different context). One
policy is trained; it answers in one turn at test time (acc@t1), and its refine-protocol
accuracy with the same feedback source is reported beside it (acc@t2).

As in the paper, what joins the group is a complete answer to x: the benchmark's full response
(:meth:`Benchmark.full_response`; on ``synthetic-arith``, where the solver writes a revision, the
revision spliced into its attempt), with the refinement's verdict as its reward (the full response
keeps its final answer). Its tokens, not the revision's, are what the policy shaping, π_old, π_ref
and the overlong shaping read (:class:`ResponseToX`, handed in through ``response_to_x``).
"""

from __future__ import annotations

import torch

from mlmt_bench.algorithms.base import (
    Algorithm,
    Credit,
    CreditInputs,
    by_turn,
    group_advantages,
    problem_of,
    response_to_x,
    reward_stats,
)
from mlmt_bench.algorithms.params import CritiqueGRPOParams
from mlmt_bench.algorithms.step_plan import POLICY, StepPlan, Training
from mlmt_bench.rollout.episodes import Rollout

#: the refinements join the problem's group as off-policy responses to x alone
OFF_POLICY_TO_X = Training("shaped", context="x")


class CritiqueGRPO(Algorithm):
    Params = CritiqueGRPOParams
    params: CritiqueGRPOParams  # what __init__ is given: an instance of Params

    def step_plan(self, step: int) -> StepPlan:
        return StepPlan.of(self.params.group_size, self.params.critique_source,
                           train={"attempt": POLICY, "refine": OFF_POLICY_TO_X})

    def credit(self, rollout: Rollout, step: int, inputs: CreditInputs) -> Credit:
        p = self.params
        attempts, refines = rollout.of_kind("attempt"), rollout.of_kind("refine")
        full = [len(response_to_x(rollout, i, self.response_to_x)[0]) for i in refines]  # the lengths trained
        r1, r2 = self.solver_rewards(rollout, attempts, inputs), self.solver_rewards(rollout, refines, inputs, full)
        joined = [i for i, r in zip(refines, r2.tolist()) if p.refinements_in_group == "all" or r == 1.0]
        r_joined = r2[[refines.index(i) for i in joined]] if joined else torch.zeros(0, dtype=r2.dtype)
        adv, zero = group_advantages(torch.cat([r1, r_joined]), problem_of(rollout, attempts + joined),
                                     p.advantage_of("solver"))
        adv1, adv_off = adv[:len(attempts)], adv[len(attempts):]
        items, sampled = self.role_items(rollout, self.step_plan(step), [("attempt", attempts, adv1, p.beta),
                                                                         ("refine", joined, adv_off, p.beta)])
        stats = {**reward_stats(r1, r2, r1), "frac_zero_std": zero,
                 "off_policy_share": len(joined) / max(1, len(attempts) + len(joined))}
        return Credit({"solver": items}, {"solver": sampled},
                      {**by_turn(attempts, adv1), **by_turn(joined, adv_off)}, stats=stats)

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
from mlmt_bench.rollout.episodes import Program, Rollout


class GRPO(Algorithm):
    Params = GRPOParams
    params: GRPOParams  # what __init__ is given: an instance of Params
    trained_turns = {"attempt": "own"}

    def program(self, step: int) -> Program:
        return Program(attempts=self.params.group_size, feedback="none")

    def credit(self, rollout: Rollout, step: int, inputs: CreditInputs) -> Credit:
        attempts = rollout.of_kind("attempt")
        r = self.solver_rewards(rollout, attempts, inputs)
        adv, zero = group_advantages(r, problem_of(rollout, attempts),
                                     self.params.advantage_of("solver"))
        stats = {**reward_stats(r, None, r), "frac_zero_std": zero}
        return Credit({"solver": self.items(rollout, attempts, adv, self.params.beta)},
                      {"solver": len(attempts)}, by_turn(attempts, adv), stats=stats)

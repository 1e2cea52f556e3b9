"""GRPO (`single`): G samples per problem, group-relative advantage on r = R(y)."""

from __future__ import annotations

from mlmt_bench.algorithms.base import Algorithm
from mlmt_bench.algorithms.params import GRPOParams
from mlmt_bench.rollout.episodes import Program


class GRPO(Algorithm):
    Params = GRPOParams

    def program(self, step: int) -> Program:
        return Program(attempts=self.p.group_size, feedback="none")

    def credit(self, rollout, step, ctx):
        attempts = rollout.of_kind("attempt")
        r = self.rewards(rollout, attempts)
        stats = self.advantages(rollout, attempts, r, self.by_problem(rollout, attempts))
        stats.update(reward_mean=float(r.mean()), reward_std=float(r.std()) if len(r) > 1 else 0.0, r1=float(r.mean()))
        return {"solver": self.items(rollout, attempts, self.p.beta)}, stats

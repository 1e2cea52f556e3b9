"""Single-level multi-turn self-correction (`self_correct`, SCoRe-style), METHOD.md.

z ~ π_L(·|x), then ŷ ~ π_L(·|x, z, c₀) with the fixed instruction c₀ = g∅.
Stage I (the first ``stage1_frac`` of training, by steps or by token budget, whichever is
further): turn 2 trained on r2; turn 1 only held near π_ref by a KL of weight β₂. Stage II: turn 1 on r1, turn 2 on r2 + α·(r2 − r1).
Advantages are group-relative among siblings of the same turn (same problem).
"""

from __future__ import annotations

import torch

from mlmt_bench.algorithms import core
from mlmt_bench.algorithms.base import Algorithm
from mlmt_bench.algorithms.params import SelfCorrectParams
from mlmt_bench.rollout.episodes import Program


class SelfCorrect(Algorithm):
    Params = SelfCorrectParams

    def program(self, step: int) -> Program:
        return Program(attempts=self.p.group_size, feedback="null", feedbacks=1, refinements=1)

    @staticmethod
    def stage_of(frac_done: float, stage1_frac: float) -> int:
        """Stage I while the share of training done (steps or token budget) is below ``stage1_frac``."""
        return 1 if frac_done < stage1_frac else 2

    def credit(self, rollout, step, ctx):
        attempts, refines = rollout.of_kind("attempt"), rollout.of_kind("refine")
        r1 = self.rewards(rollout, attempts)
        r2 = self.rewards(rollout, refines)
        # the attempt each refinement descends from (refine -> feedback -> attempt)
        r1_of_refine = torch.tensor([rollout.turns[rollout.turns[rollout.turns[i].parent].parent].reward
                                     for i in refines], dtype=torch.float64)
        stage = self.stage_of(ctx.frac_done, self.p.stage1_frac)
        stats = {"r1": float(r1.mean()), "r2": float(r2.mean()), "stage": float(stage),
                 "reward_mean": float(r2.mean()), "reward_std": float(r2.std()) if len(r2) > 1 else 0.0}
        if stage == 1:
            shaped2, beta1 = r2, self.p.beta2
            for i in attempts:
                rollout.turns[i].advantage = 0.0
            items1 = self.items(rollout, attempts, beta1)
        else:
            shaped2 = core.progress_bonus_reward(r1_of_refine, r2, self.p.alpha)
            self.advantages(rollout, attempts, r1, self.by_problem(rollout, attempts))
            items1 = self.items(rollout, attempts, self.p.beta)
        stats.update(self.advantages(rollout, refines, shaped2, self.by_problem(rollout, refines)))
        return {"solver": items1 + self.items(rollout, refines, self.p.beta)}, stats

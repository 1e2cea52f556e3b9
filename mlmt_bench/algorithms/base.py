"""What an algorithm is (METHOD.md): an episode program, a credit assignment, an update schedule.

Trainers never branch on the algorithm: they ask it for the program of a step, hand it the
rollout for credit, and update the policies it names with the items it returns.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from mlmt_bench.algorithms import core
from mlmt_bench.algorithms.update import TrainItem
from mlmt_bench.rollout.episodes import Program, Rollout


class Algorithm:
    Params: ClassVar[type]
    #: roles whose policies this algorithm needs ("solver", and "critic" for mlmt)
    needs_critic: ClassVar[bool] = False

    def __init__(self, params: Any, total_steps: int) -> None:
        self.p = params
        self.total_steps = total_steps

    def program(self, step: int) -> Program:
        raise NotImplementedError

    def eval_program(self) -> Program:
        """One greedy episode per problem with the same turn structure."""
        prog = self.program(self.total_steps)
        return Program(attempts=1, feedback=prog.feedback, feedbacks=1, refinements=1)

    def updates(self, step: int) -> set[str]:
        """Roles ("solver", "critic") updated at ``step``."""
        return {"solver"}

    def credit(self, rollout: Rollout, step: int, ctx: Any) -> tuple[dict[str, list[TrainItem]], dict[str, float]]:
        """Advantages per turn -> (train items per role, logged stats)."""
        raise NotImplementedError

    def after_update(self, rollout: Rollout, step: int, ctx: Any) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    # shared helpers -----------------------------------------------------------------------
    def advantages(self, rollout: Rollout, indices: list[int], rewards: torch.Tensor, groups: list[int]) -> dict[str, float]:
        """Group-relative advantages of ``rewards`` written to the turns at ``indices``."""
        gid = torch.tensor(groups, dtype=torch.long)
        adv = core.group_advantages(rewards, gid, scale=self.p.scale)
        for i, a in zip(indices, adv.tolist()):
            rollout.turns[i].advantage = a
        return {"frac_zero_std": core.frac_zero_std(rewards, gid)}

    @staticmethod
    def items(rollout: Rollout, indices: list[int], beta: float) -> list[TrainItem]:
        """Train items for turns whose gradient is non-zero (advantage ≠ 0 or a KL term).

        Dropping zero-advantage turns saves their forward/backward pass, and it also takes them
        out of the loss normaliser: as with DAPO's dynamic sampling, a flat group leaves the
        batch instead of being averaged in as zeros (TRL's ``dapo`` loss keeps them in the
        denominator, so its effective step is smaller when many groups are flat).
        """
        return [TrainItem(rollout.turns[i].prompt_ids, rollout.turns[i].ids, rollout.turns[i].advantage, beta)
                for i in indices if rollout.turns[i].ids and (rollout.turns[i].advantage != 0.0 or beta > 0)]

    @staticmethod
    def rewards(rollout: Rollout, indices: list[int]) -> torch.Tensor:
        return torch.tensor([float(rollout.turns[i].reward) for i in indices], dtype=torch.float64)

    @staticmethod
    def by_problem(rollout: Rollout, indices: list[int]) -> list[int]:
        return [rollout.turns[i].problem for i in indices]

"""MLMT-RL (`mlmt`): a critic writes feedback g on the solver's attempt z; the solver refines.

Credit (METHOD.md "MLMT-RL"):
- solver, turn 1: group-relative advantage of r1 + η·r̄2 over the G attempts of a problem,
  r̄2 the mean r2 of the refinements descending from the attempt;
- solver, turn 3: group-relative advantage of r2 over all refinements of the problem;
- critic: R_H(g) = ū(g) + λ·sg[V_L(x, z, g)], group-relative among the K feedbacks of the same
  attempt when K > 1, else among all feedbacks of the problem, with the value added *after*
  standardisation (v3) and in units of the standardised advantage (v4):
  A_H = std_group(ū) + λ·(V − mean_group V)/σ_V, σ_V the batch std of V (core.critic_advantages),
  so a flat-ū group carries no standardised noise and λ = 0.5 can matter. ``value: learned``
  takes V_L from a value model (algorithms/value.py, on the features ``value_features`` names)
  whose predictions the trainer computes and passes in; ``none`` sets
  λ = 0. The penalty form ū − λ·(V* − V) gives the same advantages (core.value_penalty_reward;
  tested). ``critic_reward: helpfulness+verdict`` (Critique-RL) standardises ū + ν·match instead
  of ū, match = 1 where the feedback's verdict on z agrees with the verifier (the trainer reads
  the verdicts, ``CreditInputs.verdict_match``).
Schedule: ``simultaneous`` updates both policies every step; ``alternate`` runs blocks of t_L
solver-only steps then t_H critic-only steps, so (2, 2) and (1, 1) are different schedules.
Variants: the table ``params.MLMT_VARIANTS`` (who is trained, frozen, shared or absent, the
feedback source, and which solver turns train), read into the step plan.
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
    rewards,
)
from mlmt_bench.algorithms.critic_credit import critic_credit, feedback_means
from mlmt_bench.algorithms.params import MLMT_VARIANTS, MLMTParams
from mlmt_bench.algorithms.step_plan import POLICY, StepPlan, Training
from mlmt_bench.algorithms.value import ValueModel, refinement_contexts
from mlmt_bench.rollout.episodes import Rollout


class MLMT(Algorithm):
    Params = MLMTParams
    params: MLMTParams  # what __init__ is given: an instance of Params

    def __init__(self, params: MLMTParams, total_steps: int) -> None:
        super().__init__(params, total_steps)
        self._value = (ValueModel(params.value_lr, params.value_hidden, params.value_fit_steps, params.value_batch,
                                  params.value_buffer, buffer_steps=params.value_buffer_steps)
                       if self._uses_value() else None)

    def _uses_value(self) -> bool:
        return self.params.value == "learned" and self.roles().critic in ("trained", "shared")

    def step_plan(self, step: int) -> StepPlan:
        p, roles = self.params, self.roles()
        trained = roles.trained()
        train: dict[str, Training | None] = {kind: POLICY for kind in MLMT_VARIANTS[p.variant].solver_trains
                                             if "solver" in trained}
        if "critic" in trained:
            train["feedback"] = POLICY
        return StepPlan.of(p.group_size, roles.feedback, p.feedbacks, p.refinements, train=train)

    def updates(self, step: int) -> set[str]:
        trained = set(self.roles().trained())
        if self.params.schedule == "simultaneous":
            return trained
        t_l, t_h = self.params.lower_steps, self.params.upper_steps
        return trained & ({"solver"} if step % (t_l + t_h) < t_l else {"critic"})

    # value model ------------------------------------------------------------------------------
    @property
    def value_model(self) -> ValueModel | None:
        return self._value

    def value_contexts(self, rollout: Rollout) -> list[list[int]]:
        """The solver's context (x, z, g) of each feedback's refinements."""
        return refinement_contexts(rollout, self.params.value_features)[0]

    def value_spans(self, rollout: Rollout) -> list[tuple[int, int]] | None:
        """The feedback message's tokens in each of :meth:`value_contexts` (``value_features:
        feedback_pool``), None with ``last``."""
        return refinement_contexts(rollout, self.params.value_features)[1]

    def value_targets(self, rollout: Rollout) -> tuple[list[int], torch.Tensor]:
        f_pos = {f: n for n, f in enumerate(rollout.of_kind("feedback"))}
        refines = rollout.of_kind("refine")
        return [f_pos[rollout.parent_index(r)] for r in refines], rewards(rollout, refines)

    # credit -----------------------------------------------------------------------------------
    def credit(self, rollout: Rollout, step: int, inputs: CreditInputs) -> Credit:
        p = self.params
        attempts, feedbacks, refines = (rollout.of_kind(k) for k in ("attempt", "feedback", "refine"))
        r1, r2 = self.solver_rewards(rollout, attempts, inputs), self.solver_rewards(rollout, refines, inputs)
        a_pos = {t: n for n, t in enumerate(attempts)}
        r2_per_attempt = core.mean_by_parent(r2, torch.tensor([a_pos[ancestor(rollout, i, 2)] for i in refines]),
                                             len(attempts))
        u_bar = feedback_means(rollout, r2)

        adv1, zero1 = group_advantages(core.mlmt_turn1_reward(r1, r2_per_attempt, p.eta),
                                       problem_of(rollout, attempts), p.advantage_of("solver"))
        adv3, zero3 = group_advantages(r2, problem_of(rollout, refines), p.advantage_of("solver"))
        plan = self.step_plan(step)
        items, sampled = self.role_items(rollout, plan, [("attempt", attempts, adv1, p.beta),
                                                         ("refine", refines, adv3, p.beta)])
        stats = {**reward_stats(r1, r2, r2), "frac_zero_std_t1": zero1, "frac_zero_std": zero3}
        credit = Credit({"solver": items}, {"solver": sampled}, {**by_turn(attempts, adv1), **by_turn(refines, adv3)},
                        stats=stats)

        if plan.training("feedback") is not None:
            if self._value is not None and inputs.values is None:
                raise ValueError("value: learned needs the value model's predictions in CreditInputs.values")
            lam = p.lam if self._value is not None else 0.0
            credit = credit.merged(critic_credit(self, plan, rollout, u_bar, inputs.values, lam,
                                                 verdict_match=inputs.verdict_match, reward_kind=p.critic_reward,
                                                 nu=p.nu, feedbacks_per_attempt=p.feedbacks))
        return credit

    def state_dict(self) -> dict:
        return {"value_model": self._value.state_dict()} if self._value is not None else {}

    def load_state_dict(self, state: dict) -> None:
        if self._value is not None:
            self._value.load_state_dict(state.get("value_model") or {})


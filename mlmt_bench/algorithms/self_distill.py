"""Self-distillation from feedback (`self_distill`: RLTF-SD, arXiv 2602.02482; SDPO, arXiv
2601.20802; METHOD.md v2, "Further arms").

GRPO on the G attempts z ~ π(·|x), plus δ · a distillation term that moves the unconditioned
solver π(·|x) toward what the feedback-conditioned solver π(·|x, z, g) produced:

- ``distill: sft``: the log-likelihood of refinements as responses to x (``distill_on``: the
  correct ones, or all), each as a complete answer to x: the benchmark's full response
  (:meth:`Benchmark.full_response`; on ``synthetic-arith``, where the solver writes a revision,
  the revision spliced into its attempt), tokenised anew (:class:`ResponseToX`);
- ``distill: kl``: a token-level KL(π(·|x, z, g, ŷ<t) ‖ π(·|x, k, ŷ<t)) on the refinements' own
  tokens, the feedback-conditioned distribution as a fixed teacher. The teacher has distributions
  for ŷ's tokens only, so the full response is not re-tokenised here; instead the student reads
  the attempt's kept part k (the full response's text before ŷ: empty for a complete refinement)
  after x, so that ŷ<t continues an answer to x rather than starting one mid-solution.

The term has its own normaliser (a token mean over its tokens), so δ weighs it against the
GRPO loss. Feedback comes from ``critique_source``: the frozen base ``critic``, the ``oracle``
(an upper bound), or ``mlmt``: a critic trained as MLMT-RL's higher level on ū (λ = 0).
Evaluation: acc@t1 is the distilled one-turn skill, acc@t2 the refine protocol.
"""

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
from mlmt_bench.algorithms.critic_credit import critic_credit, feedback_means
from mlmt_bench.algorithms.params import SelfDistillParams
from mlmt_bench.algorithms.step_plan import POLICY, StepPlan, Training
from mlmt_bench.rollout.episodes import Rollout


class SelfDistill(Algorithm):
    Params = SelfDistillParams
    params: SelfDistillParams  # what __init__ is given: an instance of Params

    def step_plan(self, step: int) -> StepPlan:
        # refinements distilled into π(·|x) (δ·L); the KL teacher reads ŷ after (x, z, g)
        distilled = Training("sft" if self.params.distill == "sft" else "distill", context="x")
        trains_critic = self.roles().critic in ("trained", "shared")  # critique_source: mlmt
        return StepPlan.of(self.params.group_size, self.roles().feedback,
                           train={"attempt": POLICY, "refine": distilled,
                                  **({"feedback": POLICY} if trains_critic else {})})

    def credit(self, rollout: Rollout, step: int, inputs: CreditInputs) -> Credit:
        p = self.params
        attempts, refines = rollout.of_kind("attempt"), rollout.of_kind("refine")
        r1, r2 = self.solver_rewards(rollout, attempts, inputs), self.solver_rewards(rollout, refines, inputs)
        adv, zero = group_advantages(r1, problem_of(rollout, attempts), p.advantage_of("solver"))
        distilled = [i for i, r in zip(refines, r2.tolist()) if p.distill_on == "all" or r == 1.0]
        plan = self.step_plan(step)
        items, sampled = self.role_items(rollout, plan, [("attempt", attempts, adv, p.beta),
                                                         ("refine", distilled, [p.delta] * len(distilled), 0.0)])
        stats = {**reward_stats(r1, r2, r1), "frac_zero_std": zero, "distilled": float(len(distilled))}
        credit = Credit({"solver": items}, {"solver": sampled}, by_turn(attempts, adv), stats=stats)
        if plan.training("feedback") is not None:  # the critic trained as MLMT-RL's higher level on ū (λ = 0)
            credit = credit.merged(critic_credit(self, plan, rollout, feedback_means(rollout, r2), None, 0.0))
        return credit

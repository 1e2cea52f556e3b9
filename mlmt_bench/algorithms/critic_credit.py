"""The higher level's credit (METHOD.md "Higher level", v3): how a critic that writes feedback is
rewarded by what its feedback does to the refinements. ``mlmt`` trains its critic with it, and
``self_distill`` with ``critique_source: mlmt``. Pure: it returns a :class:`Credit` of the critic
role alone, which the caller merges (:meth:`Credit.merged`) into its own."""

from __future__ import annotations

import torch

from mlmt_bench.algorithms import core
from mlmt_bench.algorithms.base import Algorithm, Credit, ancestor, by_turn, problem_of
from mlmt_bench.algorithms.step_plan import StepPlan
from mlmt_bench.rollout.episodes import Rollout


def feedback_means(rollout: Rollout, r2: torch.Tensor) -> torch.Tensor:
    """ū(g): ``[F]`` mean reward of each feedback's refinements (``r2`` [R], in refinement order)."""
    f_pos = {t: n for n, t in enumerate(rollout.of_kind("feedback"))}
    parents = torch.tensor([f_pos[ancestor(rollout, i, 1)] for i in rollout.of_kind("refine")])
    return core.mean_by_parent(r2, parents, len(f_pos))


def critic_credit(algo: Algorithm, plan: StepPlan, rollout: Rollout, u_bar: torch.Tensor, values: torch.Tensor | None,
                  lam: float,
                  *, verdict_match: torch.Tensor | None = None, reward_kind: str = "helpfulness",
                  nu: float = 0.0, feedbacks_per_attempt: int = 1) -> Credit:
    """The critic's credit: its reward R(g) = ū(g) (``critic_reward: helpfulness``) or
    ū(g) + ν·match(g) (``helpfulness+verdict``) is standardised (by the critic's estimator,
    ``advantage_of("critic")``, ``grpo`` by default) among the K feedbacks of an
    attempt when K > 1, else among the feedbacks of the problem, and λ·sg[V_L(x, z, g)] centred in
    the same group, over σ_V (the batch std of V, logged as ``value/sigma``), is added after it
    (:func:`core.critic_advantages`, METHOD v4). The verdict term is a
    reward, standardised with ū: within a group of equally helpful feedbacks, the one whose verdict
    is right ranks higher.

    ``u_bar`` [F] is each feedback's mean r2, ``values`` [F] the value model's predictions (None
    when λ = 0), ``verdict_match`` [F] 1.0 where the feedback's verdict on its attempt matches the
    verifier (None: not read; required by ``helpfulness+verdict``). ``reward_kind``
    (``critic_reward``), ``nu`` and ``feedbacks_per_attempt`` (K) are the caller's parameters.

    ``plan`` is the step's plan: the feedback turns are trained as it declares.

    Returns a Credit of the role ``critic``: its train items, its sampled count (F), each
    feedback's advantage, its rewards R(g) + λ·V (``rewards``) and the logged stats;
    ``frac_zero_std_critic`` counts the groups whose R is flat (the value does not make a group
    informative)."""
    p = algo.params
    feedbacks = rollout.of_kind("feedback")
    value = values.to(u_bar) if values is not None else torch.zeros_like(u_bar)
    reward = u_bar
    if reward_kind == "helpfulness+verdict":
        if verdict_match is None:
            raise ValueError("critic_reward: helpfulness+verdict needs each feedback's verdict match in "
                             "CreditInputs.verdict_match (the trainer reads it with Benchmark.feedback_verdict)")
        reward = core.verdict_reward(u_bar, verdict_match, nu)
    groups = ([rollout.parent_index(f) for f in feedbacks] if feedbacks_per_attempt > 1
              else problem_of(rollout, feedbacks))
    gid = torch.tensor(groups, dtype=torch.long)
    adv_h = core.critic_advantages(reward, value, lam, gid, p.advantage_of("critic"))
    r_h = core.higher_level_reward(reward, value, lam)
    stats = {"critic_reward": float(r_h.mean()), "frac_zero_std_critic": core.frac_zero_std(reward, gid)}
    if values is not None:
        stats["value_mean"] = float(value.mean())
        stats["value/sigma"] = core.value_sigma(value)  # the unit of the value term (v4)
    if verdict_match is not None and len(verdict_match):
        stats["critic_verdict_match"] = float(verdict_match.double().mean())
    items, sampled = algo.role_items(rollout, plan, [("feedback", feedbacks, adv_h, p.beta)])
    return Credit({"critic": items}, {"critic": sampled}, by_turn(feedbacks, adv_h), by_turn(feedbacks, r_h), stats)

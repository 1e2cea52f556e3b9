"""MLMT-RL (`mlmt`): a critic writes feedback g on the solver's attempt z; the solver refines.

Credit (METHOD.md "MLMT-RL"):
- solver, turn 1: group-relative advantage of r1 + η·r̄2 over the G attempts of a problem,
  r̄2 the mean r2 of the refinements descending from the attempt;
- solver, turn 3: group-relative advantage of r2 over all refinements of the problem;
- critic: R_H(g) = ū(g) + λ·sg[V_L(x, z, g)], group-relative among the K feedbacks of the same
  attempt when K > 1, else among all feedbacks of the problem. ``value: mc`` uses ū as V_L,
  ``learned`` a value head (algorithms/value.py), ``none`` sets λ = 0. The penalty form
  ū − λ·(V* − V) gives the same advantages (core.value_penalty_reward; tested).
Schedule: with P = max(t_L, t_H), the solver updates at steps s with s mod P < t_L and the
critic at steps with s mod P ≥ P − t_H: t_L solver updates for every t_H critic updates,
both every step by default (1, 1).
Variants: fixed_feedback (critic frozen), shared_policy (one model plays both roles),
oracle_feedback (rule-based critic that sees the gold; synthetic only), null_feedback (g = g∅).
"""

from __future__ import annotations

import torch

from mlmt_bench.algorithms import core
from mlmt_bench.algorithms.base import Algorithm
from mlmt_bench.algorithms.params import MLMTParams
from mlmt_bench.algorithms.value import ValueHead
from mlmt_bench.rollout.episodes import Program

_SOURCE = {"full": "critic", "fixed_feedback": "critic", "shared_policy": "critic",
           "oracle_feedback": "oracle", "null_feedback": "null"}


class MLMT(Algorithm):
    Params = MLMTParams

    def __init__(self, params, total_steps):
        super().__init__(params, total_steps)
        self.value_head: ValueHead | None = None
        self._pending_value_state = None

    @property
    def trains_critic(self) -> bool:
        return self.p.variant in ("full", "shared_policy")

    def program(self, step: int) -> Program:
        return Program(attempts=self.p.group_size, feedback=_SOURCE[self.p.variant],
                       feedbacks=self.p.feedbacks, refinements=self.p.refinements)

    def updates(self, step: int) -> set[str]:
        period = max(self.p.lower_steps, self.p.upper_steps)
        roles = set()
        if step % period < self.p.lower_steps:
            roles.add("solver")
        if self.trains_critic and step % period >= period - self.p.upper_steps:
            roles.add("critic")
        return roles

    def credit(self, rollout, step, ctx):
        turns = rollout.turns
        attempts, feedbacks, refines = (rollout.of_kind(k) for k in ("attempt", "feedback", "refine"))
        r1 = self.rewards(rollout, attempts)
        r2 = self.rewards(rollout, refines)
        # refinement -> its feedback -> its attempt, as positions in the attempts / feedbacks lists
        a_pos = {ti: n for n, ti in enumerate(attempts)}
        f_pos = {ti: n for n, ti in enumerate(feedbacks)}
        fb_of_refine = torch.tensor([f_pos[turns[i].parent] for i in refines])
        att_of_refine = torch.tensor([a_pos[turns[turns[i].parent].parent] for i in refines])
        r2_per_attempt = core.mean_by_parent(r2, att_of_refine, len(attempts))
        u_bar = core.mean_by_parent(r2, fb_of_refine, len(feedbacks))

        stats = {"r1": float(r1.mean()), "r2": float(r2.mean()), "reward_mean": float(r2.mean()),
                 "reward_std": float(r2.std()) if len(r2) > 1 else 0.0}
        shaped1 = core.mlmt_turn1_reward(r1, r2_per_attempt, self.p.eta)
        s1 = self.advantages(rollout, attempts, shaped1, self.by_problem(rollout, attempts))
        s3 = self.advantages(rollout, refines, r2, self.by_problem(rollout, refines))
        stats.update(frac_zero_std_t1=s1["frac_zero_std"], frac_zero_std=s3["frac_zero_std"])
        items = {"solver": self.items(rollout, attempts, self.p.beta) + self.items(rollout, refines, self.p.beta)}

        if self.trains_critic:
            value = self._value(rollout, feedbacks, u_bar, ctx)
            lam = 0.0 if self.p.value == "none" else self.p.lam
            r_h = core.higher_level_reward(u_bar, value, lam)
            groups = ([turns[i].parent for i in feedbacks] if self.p.feedbacks > 1
                      else self.by_problem(rollout, feedbacks))
            sh = self.advantages(rollout, feedbacks, r_h, groups)
            for i, r in zip(feedbacks, r_h.tolist()):
                turns[i].reward = r
            stats.update(critic_reward=float(r_h.mean()), frac_zero_std_critic=sh["frac_zero_std"],
                         value_mean=float(value.mean()))
            items["critic"] = self.items(rollout, feedbacks, self.p.beta)
        return items, stats

    def _value(self, rollout, feedbacks, u_bar, ctx) -> torch.Tensor:
        if self.p.value == "mc":
            return u_bar
        if self.p.value == "none":
            return torch.zeros_like(u_bar)
        feats = self._features(rollout, feedbacks, ctx)
        return self._head(feats.shape[1], ctx).predict(feats)

    def _features(self, rollout, feedbacks, ctx) -> torch.Tensor:
        # the context of a feedback's refinements: (x, z, g) as the solver sees it
        contexts = [rollout.turns[rollout.turns[i].children[0]].prompt_ids for i in feedbacks]
        solver = ctx.policies["solver"]
        return ValueHead.features(solver.model, solver.tokenizer.pad_token_id, contexts, ctx.micro_batch_tokens)

    def _head(self, hidden: int, ctx) -> ValueHead:
        if self.value_head is None:
            self.value_head = ValueHead(hidden, self.p.value_lr, seed=ctx.seed)
            if self._pending_value_state is not None:
                self.value_head.load_state_dict(self._pending_value_state)
        return self.value_head

    def after_update(self, rollout, step, ctx):
        if not (self.trains_critic and self.p.value == "learned"):
            return {}
        refines = rollout.of_kind("refine")
        feats = ValueHead.features(ctx.policies["solver"].model, ctx.policies["solver"].tokenizer.pad_token_id,
                                   [rollout.turns[i].prompt_ids for i in refines], ctx.micro_batch_tokens)
        loss = self._head(feats.shape[1], ctx).fit(feats, self.rewards(rollout, refines))
        return {"value_loss": loss}

    def state_dict(self):
        if self.value_head is not None:
            return {"value_head": self.value_head.state_dict()}
        return {"value_head": self._pending_value_state} if self._pending_value_state else {}

    def load_state_dict(self, state):
        self._pending_value_state = state.get("value_head")
        self.value_head = None

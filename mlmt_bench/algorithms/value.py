"""The lower-level value function V_L(x, z, g) ≈ E[R(ŷ) | x, z, g] (``value: learned``).

A small MLP on features of the solver's refinement context (x, z, g), ``value_features``:
``feedback_pool`` (the default, METHOD v4) is the solver's last-layer hidden state at the final
token concatenated with its mean over the feedback message's tokens, so the value sees g itself;
``last`` (v3) is the final token's state alone (the v3 audit: held-out EV -0.006 on 4,096 rows).
:func:`refinement_contexts` says which contexts and spans. The trainer computes those features
(a forward pass of the current solver, without gradient) and hands them here: the value model
never runs the solver and never moves it (stop-gradient: it is trained only by its own MSE loss
on r2). :func:`holdout_explained_variance` is the value probe's fit (``mlmt-bench probe value``).

So that it is good enough to matter (METHOD.md v2), every training step it is fitted for
``fit_steps`` Adam steps on minibatches drawn from a buffer of the refinements of the last
``buffer_steps`` steps (at most ``buffer`` of the newest), and before it sees a step's fresh
refinements it is scored on them: ``value/explained_variance`` = 1 − Var(r2 − V) / Var(r2),
its out-of-sample skill. The buffer keeps no older steps (METHOD.md v3): their features were
computed by an older solver, and V_L estimates the value under the current one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from mlmt_bench.errors import UserError
from mlmt_bench.models.frozen_cast import drop_cached_casts
from mlmt_bench.rollout.episodes import Rollout

#: what the value model reads of a refinement context (MLMTParams.value_features)
VALUE_FEATURES = ("feedback_pool", "last")


def refinement_contexts(rollout: Rollout, features: str = "feedback_pool"
                        ) -> tuple[list[list[int]], list[tuple[int, int]] | None]:
    """The solver's context (x, z, g) of each feedback's (first) refinement, in feedback order, and
    with ``feedback_pool`` the token span ``(start, end)`` of the feedback message in it (None
    with ``last``).

    The span comes from lengths, not from re-tokenising text: a refinement context is the
    attempt's prompt and its ids as generated, then the ids the chat template adds for the
    feedback message (``rollout.episodes.refine_prompt``), so the message starts after
    ``len(attempt prompt) + len(attempt ids)`` and runs to the end of the context; it includes
    the template's markup around g and the generation prompt (the same tokens in every row), and
    the closing EOS the context adds to a z cut at the length limit."""
    if features not in VALUE_FEATURES:
        raise ValueError(f"value_features must be one of {VALUE_FEATURES}, got {features!r}")
    contexts, spans = [], []
    for f in rollout.of_kind("feedback"):
        ctx = rollout.turns[rollout.turns[f].children[0]].prompt_ids
        a = rollout.parent_of(f)
        contexts.append(ctx)
        spans.append((min(len(a.prompt_ids) + len(a.ids), len(ctx) - 1), len(ctx)))
    return contexts, (spans if features == "feedback_pool" else None)


class ValueModel:
    """``predict(features [F, H]) -> [F]`` in [0, 1]; ``fit(features [N, H], targets [N])``, once per
    training step: the buffer holds the last ``buffer_steps`` calls' rows (at most ``buffer``)."""

    def __init__(self, lr: float, hidden: int = 64, fit_steps: int = 32, batch: int = 64, buffer: int = 2048,
                 seed: int = 0, *, buffer_steps: int = 2) -> None:
        if buffer_steps < 1:
            raise ValueError(f"buffer_steps must be >= 1, got {buffer_steps}")
        self.lr, self.hidden, self.fit_steps, self.batch, self.capacity = lr, hidden, fit_steps, batch, buffer
        self.buffer_steps = buffer_steps
        self.seed = seed
        self.net: torch.nn.Sequential | None = None  # built on the first features (their width is H)
        self.opt: torch.optim.Optimizer | None = None
        self.gen = torch.Generator().manual_seed(seed)
        self.feats = torch.zeros(0)
        self.targets = torch.zeros(0)
        self.sizes: list[int] = []  # rows of each step in the buffer, oldest first
        self._pending: dict[str, Any] | None = None

    def _build(self, width: int) -> None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            self.net = torch.nn.Sequential(torch.nn.LayerNorm(width), torch.nn.Linear(width, self.hidden),
                                           torch.nn.Tanh(), torch.nn.Linear(self.hidden, 1))
        self.opt = torch.optim.Adam(self.net.parameters(), lr=self.lr)
        if self._pending is not None:
            self._restore(self._pending)
            self._pending = None

    def _ensure(self, feats: torch.Tensor) -> torch.nn.Sequential:
        if self.net is None:
            self._build(feats.shape[1])
        assert self.net is not None
        return self.net

    @torch.no_grad()
    def predict(self, feats: torch.Tensor) -> torch.Tensor:
        """``[F]`` value estimates (float64), a sigmoid: in [0, 1] like the rewards."""
        return torch.sigmoid(self._ensure(feats)(feats.float()).squeeze(-1)).double()

    def fit(self, feats: torch.Tensor, targets: torch.Tensor) -> dict[str, float | None]:
        """Score on the fresh ``(feats, targets)`` (one training step's refinements), add them to the
        buffer and drop the steps older than the last ``buffer_steps``, then ``fit_steps`` Adam steps
        of MSE on minibatches of the buffer. Returns the logged stats."""
        self._ensure(feats)
        targets = targets.float()
        pred = self.predict(feats).float()
        stats: dict[str, float | None] = {"value/explained_variance": explained_variance(pred, targets),
                                          "value/mse_before": float(((pred - targets) ** 2).mean())}
        self.add(feats, targets)
        stats["value/loss"] = self.train(self.fit_steps)
        return stats

    def train(self, steps: int) -> float:
        """``steps`` Adam steps of MSE on minibatches of the buffer; returns the last minibatch's loss."""
        assert self.net is not None and self.opt is not None, "train after the first features (add or fit)"
        loss = torch.tensor(0.0)
        for _ in range(steps):
            idx = torch.randint(0, len(self.targets), (min(self.batch, len(self.targets)),), generator=self.gen)
            loss = torch.nn.functional.mse_loss(torch.sigmoid(self.net(self.feats[idx]).squeeze(-1)),
                                                self.targets[idx])
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            drop_cached_casts()  # the next minibatch's forward sees the new weights under autocast
        return float(loss.detach())

    def add(self, feats: torch.Tensor, targets: torch.Tensor) -> None:
        """Append one step's rows to the buffer; keep only the last ``buffer_steps`` steps, and of
        those at most ``buffer`` rows (the newest)."""
        self._ensure(feats)
        self.feats = torch.cat([self.feats.reshape(-1, feats.shape[1]), feats.float()])
        self.targets = torch.cat([self.targets, targets.float()])
        self.sizes = (self.sizes + [len(targets)])[-self.buffer_steps:]
        keep = min(sum(self.sizes), self.capacity)
        self.feats, self.targets = self.feats[len(self.targets) - keep:], self.targets[len(self.targets) - keep:]
        while self.sizes and sum(self.sizes[1:]) >= keep:  # steps entirely cut by the row cap
            self.sizes.pop(0)
        if self.sizes:
            self.sizes[0] = keep - sum(self.sizes[1:])

    def state_dict(self) -> dict[str, Any]:
        if self.net is None:
            return self._pending or {}
        assert self.opt is not None
        return {"net": self.net.state_dict(), "opt": self.opt.state_dict(), "gen": self.gen.get_state(),
                "feats": self.feats.clone(), "targets": self.targets.clone(), "sizes": list(self.sizes)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            return
        if self.net is None:
            self._pending = state  # restored once the features' width is known
        else:
            self._restore(state)

    def _restore(self, state: dict[str, Any]) -> None:
        assert self.net is not None and self.opt is not None
        width, saved = self.net.state_dict()["0.weight"].shape[0], state["net"]["0.weight"].shape[0]
        if saved != width:  # a checkpoint of other features (v3's `last` are half as wide as `feedback_pool`)
            raise UserError(f"the value model's checkpoint reads {saved} features, this run computes {width}: "
                            "resume with the value_features it was trained with (a run from before METHOD v4: "
                            "algorithm.params.value_features: last)")
        self.net.load_state_dict(state["net"])
        self.opt.load_state_dict(state["opt"])
        self.gen.set_state(state["gen"])
        self.feats, self.targets = state["feats"].clone(), state["targets"].clone()
        # a checkpoint from before the per-step buffer: its rows count as one (the oldest) step
        self.sizes = list(state.get("sizes", [len(self.targets)] if len(self.targets) else []))


def explained_variance(pred: torch.Tensor, targets: torch.Tensor) -> float | None:
    """1 − Var(targets − pred) / Var(targets) (population variances); None when the targets are constant."""
    var = float(targets.double().var(unbiased=False))
    if var == 0.0:
        return None
    return 1.0 - float((targets.double() - pred.double()).var(unbiased=False)) / var


def holdout_explained_variance(feats: torch.Tensor, targets: torch.Tensor, groups: Sequence[int], *,
                               test_frac: float = 0.2, steps: int = 1000, seed: int = 0, lr: float = 1e-3,
                               hidden: int = 64, batch: int = 64) -> dict[str, Any]:
    """The value probe's number (METHOD v4, "Value gate"): a :class:`ValueModel` fitted on the rows
    of a seeded ``1 - test_frac`` share of the groups (problems: no problem on both sides) for
    ``steps`` Adam steps, and its explained variance on the other rows.

    feats [N, D], targets [N] in [0, 1] (r2), groups [N] (the problem of each row). Returns
    ``explained_variance`` (held out; None when the held-out targets are constant), ``train_ev``
    (on the rows it was fitted on), ``n_train``, ``n_test`` and ``width`` (D)."""
    if len(feats) != len(targets) or len(targets) != len(groups):
        raise ValueError(f"need rows of one length, got {len(feats)}, {len(targets)}, {len(groups)}")
    ids = sorted(set(groups))
    if len(ids) < 2:
        raise ValueError("the probe needs at least two groups (one to fit on, one to hold out)")
    order = torch.randperm(len(ids), generator=torch.Generator().manual_seed(seed)).tolist()
    n_test = min(max(1, round(test_frac * len(ids))), len(ids) - 1)
    held = {ids[i] for i in order[:n_test]}
    test = torch.tensor([g in held for g in groups])
    model = ValueModel(lr, hidden, batch=batch, buffer=int((~test).sum()), seed=seed, buffer_steps=1)
    model.add(feats[~test], targets[~test])
    model.train(steps)
    y = targets.float()
    return {"explained_variance": explained_variance(model.predict(feats[test]).float(), y[test]),
            "train_ev": explained_variance(model.predict(feats[~test]).float(), y[~test]),
            "n_train": int((~test).sum()), "n_test": int(test.sum()), "width": int(feats.shape[1])}

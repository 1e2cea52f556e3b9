"""The lower-level value function V_L(x, z, g) ≈ E[R(ŷ) | x, z, g] (``value: learned``).

A small MLP on the solver's last hidden state at the final token of the refinement context
(x, z, g). The trainer computes those features (a forward pass of the current solver, without
gradient) and hands them here: the value model never runs the solver and never moves it
(stop-gradient: it is trained only by its own MSE loss on r2).

So that it is good enough to matter (METHOD.md v2), every training step it is fitted for
``fit_steps`` Adam steps on minibatches drawn from a buffer of the refinements of the last
``buffer_steps`` steps (at most ``buffer`` of the newest), and before it sees a step's fresh
refinements it is scored on them: ``value/explained_variance`` = 1 − Var(r2 − V) / Var(r2),
its out-of-sample skill. The buffer keeps no older steps (METHOD.md v3): their features were
computed by an older solver, and V_L estimates the value under the current one.
"""

from __future__ import annotations

from typing import Any

import torch


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
        net = self._ensure(feats)
        targets = targets.float()
        pred = self.predict(feats).float()
        stats: dict[str, float | None] = {"value/explained_variance": explained_variance(pred, targets),
                                          "value/mse_before": float(((pred - targets) ** 2).mean())}
        self.add(feats, targets)
        assert self.opt is not None
        loss = torch.tensor(0.0)
        for _ in range(self.fit_steps):
            idx = torch.randint(0, len(self.targets), (min(self.batch, len(self.targets)),), generator=self.gen)
            loss = torch.nn.functional.mse_loss(torch.sigmoid(net(self.feats[idx]).squeeze(-1)), self.targets[idx])
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
        stats["value/loss"] = float(loss.detach())
        return stats

    def add(self, feats: torch.Tensor, targets: torch.Tensor) -> None:
        """Append one step's rows to the buffer; keep only the last ``buffer_steps`` steps, and of
        those at most ``buffer`` rows (the newest)."""
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

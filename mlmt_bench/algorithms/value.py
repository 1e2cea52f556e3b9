"""The lower-level value function V_L(x, z, g) ≈ E[R(ŷ) | x, z, g] (``value: learned``).

A linear head on the solver's last hidden state at the final token of the refinement
context (x, z, g). The solver's features are read without gradient (stop-gradient: the head
is trained only by its own MSE loss on r2, and never moves the solver).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from mlmt_bench import memory
from mlmt_bench.models.forward import last_hidden_states


class ValueHead:
    def __init__(self, hidden_size: int, lr: float, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.linear = torch.nn.Linear(hidden_size, 1)
        with torch.no_grad():
            self.linear.weight.copy_(torch.randn(1, hidden_size, generator=gen) * 0.01)
            self.linear.bias.fill_(0.5)
        self.opt = torch.optim.Adam(self.linear.parameters(), lr=lr)

    @staticmethod
    def features(model: Any, pad_id: int, contexts: Sequence[list[int]], max_tokens: int | None = None) -> torch.Tensor:
        """``[F, H]`` last-layer hidden state at the last token of each context (memory phase
        ``value``; micro-batches of at most ``max_tokens`` padded tokens)."""
        with memory.phase("value"):
            return last_hidden_states(model, pad_id, contexts, max_tokens)

    @torch.no_grad()
    def predict(self, feats: torch.Tensor) -> torch.Tensor:
        """``[F]`` value estimates, clamped to the reward range [0, 1]."""
        return self.linear(feats).squeeze(-1).clamp(0.0, 1.0).double()

    def fit(self, feats: torch.Tensor, targets: torch.Tensor, steps: int = 4) -> float:
        """A few Adam steps of MSE on ``targets [F]``; returns the final loss."""
        loss = torch.tensor(0.0)
        for _ in range(steps):
            self.opt.zero_grad()
            loss = torch.nn.functional.mse_loss(self.linear(feats).squeeze(-1), targets.float())
            loss.backward()
            self.opt.step()
        return float(loss)

    def state_dict(self) -> dict[str, Any]:
        return {"linear": self.linear.state_dict(), "opt": self.opt.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.linear.load_state_dict(state["linear"])
        self.opt.load_state_dict(state["opt"])

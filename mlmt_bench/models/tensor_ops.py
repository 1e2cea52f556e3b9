"""Tensor operations on model outputs: per-token log-probabilities
and entropies from logits. Models (:mod:`mlmt_bench.models.forward`) and the losses
(:mod:`mlmt_bench.algorithms.core`, a floor above the models) both use them.

Shapes: B sequences, T token positions, V vocabulary; log-probabilities in nats.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor


def _rows_in_float(logits: Tensor) -> Iterator[Tensor]:
    """Yield one sequence [T, V] at a time, upcast to float32 when stored in half precision."""
    for row in logits:
        yield row.float() if row.dtype in (torch.float16, torch.bfloat16) else row


def token_logprobs(logits: Tensor, ids: Tensor) -> Tensor:
    """log softmax(logits)[ids] per position.

    logits:  [B, T, V] next-token logits aligned with ids (logits[:, t] scores ids[:, t]).
    ids:     [B, T] long token ids.
    returns: [B, T] log-probs (nats), float32 for half-precision logits, else logits' dtype.

    Memory: processes one sequence at a time, so the float [T, V] log-softmax is the
    largest temporary (never a second [B, T, V]).
    """
    if logits.dim() != 3 or ids.shape != logits.shape[:2]:
        raise ValueError(
            f"need logits [B,T,V] and ids [B,T]; got {tuple(logits.shape)}, {tuple(ids.shape)}"
        )
    out = [
        torch.log_softmax(row, dim=-1).gather(-1, row_ids.unsqueeze(-1)).squeeze(-1)
        for row, row_ids in zip(_rows_in_float(logits), ids)
    ]
    return torch.stack(out) if out else logits.new_zeros(ids.shape, dtype=torch.float32)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of the next-token distribution, H = -sum_v p_v log p_v, per position.

    logits:  [B, T, V].
    returns: [B, T] entropy (nats), float32 for half-precision logits. One sequence at a
             time, like `token_logprobs`.
    """
    if logits.dim() != 3:
        raise ValueError(f"need logits [B,T,V]; got {tuple(logits.shape)}")
    out = []
    for row in _rows_in_float(logits):
        logp = torch.log_softmax(row, dim=-1)
        out.append(-(logp.exp() * logp).sum(dim=-1))
    return torch.stack(out) if out else logits.new_zeros(logits.shape[:2], dtype=torch.float32)

"""One optimisation step of a policy on generated turns: the loss every algorithm shares.

The trainers differ only in which turns they hand in, with which advantages and KL
coefficients; batching, log-probs, the clipped loss and gradient accumulation live here once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mlmt_bench import memory
from mlmt_bench.algorithms import core
from mlmt_bench.dist import Dist
from mlmt_bench.fsdp import is_sharded, scalar
from mlmt_bench.models.forward import padded_batch, seq_len, sequence_logprobs, split

__all__ = ["LossConfig", "TrainItem", "padded_batch", "sequence_logprobs", "update_policy"]


_SINGLE = Dist()


@dataclass
class TrainItem:
    """A generated turn to train on: context ``prompt_ids``, trained ``ids``, its advantage and KL weight."""

    prompt_ids: list[int]
    ids: list[int]
    advantage: float
    beta: float = 0.0


@dataclass
class LossConfig:
    clip_low: float
    clip_high: float
    loss_agg: str
    epochs: int
    grad_accum: int
    grad_clip: float
    micro_batch_tokens: int | None = None  # padded tokens per forward/backward; None: no limit


def update_policy(policy: Any, optimizer: torch.optim.Optimizer, scheduler: Any, items: list[TrainItem],
                  cfg: LossConfig, dist: Any = None, constant_norm: float = 0.0) -> dict[str, float]:
    """``cfg.epochs`` passes over ``items``, each one optimiser step.

    Each pass runs in micro-batches of at most ``cfg.micro_batch_tokens`` padded tokens (and
    at least ``cfg.grad_accum`` of them), accumulating gradients; the micro-batch losses are
    weighted so that their sum equals the loss aggregated over the whole batch (token_mean: by
    tokens; seq_mean_token_mean: by sequences; constant_norm: each micro-batch's token sum over
    the step's constant ``constant_norm``, max_new_tokens × the sequences sampled, summed over
    processes), so the update does not depend on the split. Under data parallelism (``dist``, see
    mlmt_bench/dist.py) the batch is the union of every process's items: weights use the
    global counts and gradients are summed across processes, so the update equals the
    single-process update on the whole batch.

    π_old (when epochs > 1) and π_ref (when an item has beta > 0) log-probs are computed once,
    before the first pass, over the same micro-batches (memory phase ``logprobs``).

    Besides the loss statistics it returns the token counts the cost accounting needs (summed
    over processes and epochs): ``trained_tokens`` (completions), ``sequence_tokens`` (prompt +
    completion of every sequence trained on) and ``forward_tokens`` (tokens read by the extra
    forward passes: π_old's and π_ref's log-probs).
    """
    dist = dist or _SINGLE
    total_tokens = int(dist.sum(sum(len(it.ids) for it in items)))
    total_items = int(dist.sum(len(items)))
    if total_items == 0:
        return {}
    model, pad_id = policy.model, policy.tokenizer.pad_token_id
    batches = split(items, seq_len, cfg.micro_batch_tokens, max_rows=-(-len(items) // cfg.grad_accum))
    n_real = len(batches)
    if is_sharded(model):  # FSDP: every pass is a collective, so every process runs as many (empty ones add 0)
        batches += [[TrainItem([pad_id], [pad_id], 0.0)]] * (int(dist.max(n_real)) - n_real)
    needs_ref = dist.any(any(it.beta > 0 for it in items))
    old_logps: list[torch.Tensor] | None = None
    ref_logps: list[torch.Tensor | None] = [None] * len(batches)
    if cfg.epochs > 1 or needs_ref:
        with memory.phase("logprobs"), torch.no_grad():
            if cfg.epochs > 1:  # π_old is the rollout policy: freeze its log-probs before the first update
                old_logps = [sequence_logprobs(model, mb, pad_id)[0] for mb in batches]
            if needs_ref:
                policy.ensure_reference()
                ref_logps = [sequence_logprobs(model, mb, pad_id, reference=policy.reference_logits)[0]
                             for mb in batches]
    norm = dist.sum(constant_norm) if cfg.loss_agg == "constant_norm" else None
    if norm is not None and norm <= 0:
        raise ValueError("constant_norm aggregation needs the step's constant (max_new_tokens × sequences sampled)")
    stats: dict[str, float] = {"loss": 0.0, "clip_frac": 0.0, "kl": 0.0, "entropy": 0.0}
    with memory.phase("update"):
        for _ in range(cfg.epochs):
            optimizer.zero_grad(set_to_none=True)
            for k, mb in enumerate(batches):
                logp, mask, entropy = sequence_logprobs(model, mb, pad_id, with_entropy=True)
                if k >= n_real:
                    (logp.sum() * 0.0).backward()
                    continue
                old = logp.detach() if old_logps is None else old_logps[k]
                adv = torch.tensor([it.advantage for it in mb], dtype=logp.dtype, device=logp.device)
                beta = torch.tensor([[it.beta] for it in mb], dtype=logp.dtype, device=logp.device)
                loss, s = core.grpo_loss(logp, old, ref_logps[k], adv, mask, clip_low=cfg.clip_low,
                                         clip_high=cfg.clip_high, beta=beta if needs_ref else 0.0, agg=cfg.loss_agg,
                                         norm=norm)
                n_tok = int(mask.sum())
                weight = {"token_mean": n_tok / total_tokens, "seq_mean_token_mean": len(mb) / total_items,
                          "constant_norm": 1.0}[cfg.loss_agg]
                (loss * weight).backward()
                stats["loss"] += float(loss.detach()) * weight / cfg.epochs
                stats["clip_frac"] += s["clip_frac"] * n_tok / total_tokens / cfg.epochs
                stats["kl"] += s["kl"] * n_tok / total_tokens / cfg.epochs
                stats["entropy"] += float(entropy[mask].sum()) / total_tokens / cfg.epochs
            dist.sum_grads(policy.trainable_parameters())
            stats["grad_norm"] = scalar(torch.nn.utils.clip_grad_norm_(policy.trainable_parameters(), cfg.grad_clip))
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
    stats = {k: dist.sum(v) for k, v in stats.items()}  # local shares of global means add up
    stats["grad_norm"] /= dist.world
    stats["trained_tokens"] = float(total_tokens * cfg.epochs)
    seq_tokens = dist.sum(sum(seq_len(it) for it in items))
    stats["sequence_tokens"] = float(seq_tokens * cfg.epochs)
    stats["forward_tokens"] = float(seq_tokens * ((cfg.epochs > 1) + needs_ref))
    stats["micro_batches"] = float(dist.max(n_real))
    return stats

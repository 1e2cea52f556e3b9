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
from mlmt_bench.models.forward import completion_logits, padded_batch, seq_len, sequence_logprobs, split

__all__ = ["LossConfig", "TrainItem", "padded_batch", "sequence_logprobs", "update_policy"]


_SINGLE = Dist()


@dataclass
class TrainItem:
    """A generated turn to train on: context ``prompt_ids``, trained ``ids``, its advantage (or
    weight) and KL weight, and how it is trained (``mode``, see :mod:`core`: POLICY, an off-policy
    SHAPED response, or an auxiliary SFT / DISTILL term; DISTILL's teacher reads the same ``ids``
    after ``teacher_prompt_ids``)."""

    prompt_ids: list[int]
    ids: list[int]
    advantage: float
    beta: float = 0.0
    mode: int = core.POLICY
    teacher_prompt_ids: list[int] | None = None


@dataclass
class LossConfig:
    clip_low: float
    clip_high: float
    loss_agg: str
    epochs: int
    grad_accum: int
    grad_clip: float
    micro_batch_tokens: int | None = None  # padded tokens per forward/backward; None: no limit
    ratio: str = "token"  # token | sequence (GSPO)
    loss: str = "clip"  # clip | cispo
    cispo_max: float = 5.0
    shaping_gamma: float = 0.1  # policy shaping of off-policy (SHAPED) rows: pi / (pi + gamma)


def _is_auxiliary(item: TrainItem) -> bool:
    return item.mode in (core.SFT, core.DISTILL)


def update_policy(policy: Any, optimizer: torch.optim.Optimizer, scheduler: Any, items: list[TrainItem],
                  cfg: LossConfig, dist: Any = None, constant_norm: float = 0.0) -> dict[str, float]:
    """``cfg.epochs`` passes over ``items``, each one optimiser step of policy loss + auxiliary term.

    The policy loss covers POLICY and SHAPED items, aggregated by ``cfg.loss_agg``; the auxiliary
    term is the token mean, over every SFT and DISTILL item's tokens, of ``weight × (−log π)``
    (SFT) or ``weight × KL(teacher ‖ π)`` (DISTILL), the weight being the item's ``advantage``:
    with its own normaliser, it is a separate term of the objective (self-distillation's δ·L).

    Each pass runs in micro-batches of at most ``cfg.micro_batch_tokens`` padded tokens (and
    at least ``cfg.grad_accum`` of them), accumulating gradients; the micro-batch losses are
    weighted so that their sum equals the loss aggregated over the whole batch (token_mean: by
    tokens; seq_mean_token_mean: by sequences; constant_norm: each micro-batch's token sum over
    the step's constant ``constant_norm``, max_new_tokens × the sequences sampled, summed over
    processes), so the update does not depend on the split. Under data parallelism (``dist``, see
    mlmt_bench/dist.py) the batch is the union of every process's items: weights use the
    global counts and gradients are summed across processes, so the update equals the
    single-process update on the whole batch.

    π_old (when epochs > 1), π_ref (when an item has beta > 0) log-probs and the DISTILL
    teachers' logits are computed once, before the first pass, over the same micro-batches
    (memory phase ``logprobs``).

    Besides the loss statistics it returns the token counts the cost accounting needs (summed
    over processes and epochs): ``trained_tokens`` (completions), ``sequence_tokens`` (prompt +
    completion of every sequence trained on) and ``forward_tokens`` (tokens read by the extra
    forward passes: π_old's and π_ref's log-probs, the teachers' contexts).
    """
    dist = dist or _SINGLE
    rl_items = [it for it in items if not _is_auxiliary(it)]
    aux_items = [it for it in items if _is_auxiliary(it)]
    total_tokens = int(dist.sum(sum(len(it.ids) for it in rl_items)))
    total_items = int(dist.sum(len(rl_items)))
    aux_tokens = int(dist.sum(sum(len(it.ids) for it in aux_items)))
    if total_items == 0 and aux_tokens == 0:
        return {}
    model, pad_id = policy.model, policy.tokenizer.pad_token_id
    rows = -(-max(len(items), 1) // cfg.grad_accum)
    batches = split(rl_items, seq_len, cfg.micro_batch_tokens, max_rows=rows) if rl_items else []
    aux_batches = split(aux_items, seq_len, cfg.micro_batch_tokens, max_rows=rows) if aux_items else []
    needs_ref = any(it.beta > 0 for it in rl_items)
    old_logps: list[torch.Tensor] | None = None
    ref_logps: list[torch.Tensor | None] = [None] * len(batches)
    teachers: list[torch.Tensor | None] = [None] * len(aux_batches)
    extra_tokens = 0
    if cfg.epochs > 1 or needs_ref or any(it.mode == core.DISTILL for it in aux_items):
        with memory.phase("logprobs"), torch.no_grad():
            if cfg.epochs > 1:  # π_old is the rollout policy: freeze its log-probs before the first update
                old_logps = [sequence_logprobs(model, mb, pad_id)[0] for mb in batches]
                extra_tokens += sum(seq_len(it) for it in rl_items)
            if needs_ref:
                policy.ensure_reference()
                ref_logps = [sequence_logprobs(model, mb, pad_id, reference=policy.reference_logits)[0]
                             for mb in batches]
                extra_tokens += sum(seq_len(it) for it in rl_items)
            for k, mb in enumerate(aux_batches):
                if any(it.mode == core.DISTILL for it in mb):
                    teachers[k] = completion_logits(model, mb, pad_id, [it.teacher_prompt_ids or it.prompt_ids
                                                                         for it in mb])[0]
                    extra_tokens += sum(len(it.teacher_prompt_ids or it.prompt_ids) + len(it.ids) for it in mb)
    norm = dist.sum(constant_norm) if cfg.loss_agg == "constant_norm" and rl_items else None
    if cfg.loss_agg == "constant_norm" and total_items and (norm is None or norm <= 0):
        raise ValueError("constant_norm aggregation needs the step's constant (max_new_tokens × sequences sampled)")
    variant = {"ratio": cfg.ratio, "loss": cfg.loss, "cispo_max": cfg.cispo_max, "shaping_gamma": cfg.shaping_gamma}
    stats: dict[str, float] = {"loss": 0.0, "clip_frac": 0.0, "kl": 0.0, "entropy": 0.0}
    if aux_items:
        stats["aux_loss"] = 0.0
    with memory.phase("update"):
        for _ in range(cfg.epochs):
            optimizer.zero_grad(set_to_none=True)
            for k, mb in enumerate(batches):
                logp, mask, entropy = sequence_logprobs(model, mb, pad_id, with_entropy=True)
                old = logp.detach() if old_logps is None else old_logps[k]
                adv = torch.tensor([it.advantage for it in mb], dtype=logp.dtype, device=logp.device)
                beta = torch.tensor([[it.beta] for it in mb], dtype=logp.dtype, device=logp.device)
                modes = torch.tensor([it.mode for it in mb], dtype=torch.long)
                loss, s = core.grpo_loss(logp, old, ref_logps[k], adv, mask, clip_low=cfg.clip_low,
                                         clip_high=cfg.clip_high, beta=beta if needs_ref else 0.0, agg=cfg.loss_agg,
                                         norm=norm, row_mode=modes, **variant)
                n_tok = int(mask.sum())
                weight = {"token_mean": n_tok / total_tokens, "seq_mean_token_mean": len(mb) / total_items,
                          "constant_norm": 1.0}[cfg.loss_agg]
                (loss * weight).backward()
                stats["loss"] += float(loss.detach()) * weight / cfg.epochs
                stats["clip_frac"] += s["clip_frac"] * n_tok / total_tokens / cfg.epochs
                stats["kl"] += s["kl"] * n_tok / total_tokens / cfg.epochs
                stats["entropy"] += float(entropy[mask].sum()) / total_tokens / cfg.epochs
            for k, mb in enumerate(aux_batches):
                aux = _auxiliary_sum(model, mb, pad_id, teachers[k]) / aux_tokens
                aux.backward()
                stats["aux_loss"] += float(aux.detach()) / cfg.epochs
            dist.sum_grads(policy.trainable_parameters())
            stats["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(policy.trainable_parameters(), cfg.grad_clip))
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
    stats = {k: dist.sum(v) for k, v in stats.items()}  # local shares of global means add up
    stats["grad_norm"] /= dist.world
    stats["trained_tokens"] = float((total_tokens + aux_tokens) * cfg.epochs)
    stats["sequence_tokens"] = float(dist.sum(sum(seq_len(it) for it in items)) * cfg.epochs)
    stats["forward_tokens"] = float(dist.sum(extra_tokens))
    stats["micro_batches"] = float(dist.max(len(batches) + len(aux_batches)))
    return stats


def _auxiliary_sum(model: Any, items: list[TrainItem], pad_id: int, teacher: torch.Tensor | None) -> torch.Tensor:
    """Σ over the items' tokens of weight × (−log π) (SFT) or weight × KL(teacher ‖ π) (DISTILL)."""
    logits, mask = completion_logits(model, items, pad_id)
    ids = torch.zeros(mask.shape, dtype=torch.long, device=logits.device)
    for b, it in enumerate(items):
        ids[b, :len(it.ids)] = torch.tensor(it.ids, device=logits.device)
    per_token = -core.token_logprobs(logits, ids)
    if teacher is not None:
        distill = torch.tensor([it.mode == core.DISTILL for it in items], device=logits.device).unsqueeze(1)
        per_token = torch.where(distill, core.distill_kl(logits, teacher), per_token)
    weight = torch.tensor([it.advantage for it in items], dtype=per_token.dtype, device=per_token.device)
    return (per_token * weight.unsqueeze(1) * mask).sum()

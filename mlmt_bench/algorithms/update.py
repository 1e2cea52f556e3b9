"""One optimisation step of a policy on generated turns: the loss every algorithm shares.

The trainers differ only in which turns they hand in, with which advantages and KL
coefficients; batching, log-probs, the clipped loss and gradient accumulation live here once.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from mlmt_bench.algorithms import core
from mlmt_bench.dist import Dist


_SINGLE = Dist()


@dataclass
class TrainItem:
    """A generated turn to train on: context ``prompt_ids``, trained ``ids``, its advantage and KL weight."""

    prompt_ids: list[int]
    ids: list[int]
    advantage: float
    beta: float = 0.0
    old_logp: torch.Tensor | None = None  # [len(ids)], filled before the first epoch when epochs > 1


def padded_batch(items: Sequence[TrainItem], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids [B, L]``, ``attention [B, L]`` and the trained-token mask ``[B, L-1]``.

    The mask is aligned with next-token predictions: ``mask[b, j]`` marks whether input token
    ``j + 1`` of row ``b`` was generated (and is trained on).
    """
    length = max(len(it.prompt_ids) + len(it.ids) for it in items)
    input_ids = torch.full((len(items), length), pad_id, dtype=torch.long)
    attention = torch.zeros((len(items), length), dtype=torch.long)
    mask = torch.zeros((len(items), length - 1), dtype=torch.bool)
    for b, it in enumerate(items):
        seq = it.prompt_ids + it.ids
        input_ids[b, :len(seq)] = torch.tensor(seq, dtype=torch.long)
        attention[b, :len(seq)] = 1
        mask[b, len(it.prompt_ids) - 1:len(seq) - 1] = True
    return input_ids, attention, mask


def sequence_logprobs(model: Any, items: Sequence[TrainItem], pad_id: int, *, with_entropy: bool = False,
                      reference: Any = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs ``[B, L-1-s]`` of the trained ids, the matching slice of the mask from
    :func:`padded_batch` (and the entropy if asked), where ``s + 1`` is the shortest prompt:
    positions before it predict only prompt tokens in every row.

    The LM head runs only on the positions kept (``logits_to_keep``, as TRL does), which saves
    ``[B, s, vocab]`` of logits: a long shared context times a 150k vocabulary is most of the
    activation memory of a real model's update. A model that ignores the argument gives the
    same result, sliced afterwards.

    ``reference``: a callable ``(**inputs) -> logits`` used instead of ``model`` (π_ref).
    """
    input_ids, attention, mask = padded_batch(items, pad_id)
    start = min(len(it.prompt_ids) for it in items) - 1  # first position whose prediction is trained
    keep = input_ids.shape[1] - start
    device = next(model.parameters()).device
    inputs = dict(input_ids=input_ids.to(device), attention_mask=attention.to(device))
    if takes_logits_to_keep(model):
        inputs["logits_to_keep"] = keep
    logits = reference(**inputs) if reference is not None else model(**inputs).logits
    logits = logits[:, -keep:-1]  # [B, keep-1]: predictions of tokens start+1 .. L-1
    logp = core.token_logprobs(logits, inputs["input_ids"][:, start + 1:])
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = core.entropy_from_logits(logits.detach())
    return logp, mask[:, start:].to(device), entropy


def takes_logits_to_keep(model: Any) -> bool:
    """Whether ``model.forward`` names ``logits_to_keep`` (transformers' causal LMs; a peft
    wrapper passes it through to its base model)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return _forward_names_logits_to_keep(type(base))


@functools.lru_cache(maxsize=None)
def _forward_names_logits_to_keep(cls: type) -> bool:
    """Per model class, once: this runs on every micro-batch."""
    try:
        return "logits_to_keep" in inspect.signature(cls.forward).parameters
    except (TypeError, ValueError, AttributeError):
        return False


def _scatter_old(items: Sequence[TrainItem], mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    old = torch.zeros_like(like)
    for b, it in enumerate(items):
        old[b, mask[b]] = it.old_logp.to(like)
    return old


@dataclass
class LossConfig:
    clip_low: float
    clip_high: float
    loss_agg: str
    epochs: int
    grad_accum: int
    grad_clip: float


def update_policy(policy: Any, optimizer: torch.optim.Optimizer, scheduler: Any, items: list[TrainItem],
                  cfg: LossConfig, dist: Any = None, constant_norm: float = 0.0) -> dict[str, float]:
    """``cfg.epochs`` passes over ``items``, each one optimiser step (with ``grad_accum`` micro-batches).

    The micro-batch losses are weighted so that the sum equals the loss aggregated over the
    whole batch (token_mean: by tokens; seq_mean_token_mean: by sequences; constant_norm: each
    micro-batch's token sum over the step's constant ``constant_norm``, max_new_tokens × the
    sequences sampled, summed over processes). Under data parallelism (``dist``, see
    mlmt_bench/dist.py) the batch is the union of every process's items: weights use the global
    counts and gradients are summed across processes, so the update equals the single-process
    update on the whole batch.

    Besides the loss statistics it returns the token counts the cost accounting needs (summed
    over processes and epochs): ``trained_tokens`` (completions), ``sequence_tokens`` (prompt +
    completion of every sequence trained on) and ``forward_tokens`` (tokens read by the extra
    forward passes: π_old's log-probs when epochs > 1, π_ref's when a KL term is on).
    """
    dist = dist or _SINGLE
    total_tokens = int(dist.sum(sum(len(it.ids) for it in items)))
    total_items = int(dist.sum(len(items)))
    if total_items == 0:
        return {}
    model, pad_id = policy.model, policy.tokenizer.pad_token_id
    needs_ref = any(it.beta > 0 for it in items)
    if needs_ref:
        policy.ensure_reference()
    if cfg.epochs > 1:  # π_old is the rollout policy: freeze its log-probs before the first update
        with torch.no_grad():
            for chunk in _chunks(items, cfg.grad_accum):
                logp, mask, _ = sequence_logprobs(model, chunk, pad_id)
                for b, it in enumerate(chunk):
                    it.old_logp = logp[b, mask[b]].detach().cpu()
    norm = dist.sum(constant_norm) if cfg.loss_agg == "constant_norm" else None
    if norm is not None and norm <= 0:
        raise ValueError("constant_norm aggregation needs the step's constant (max_new_tokens × sequences sampled)")
    seq_tokens = sum(len(it.prompt_ids) + len(it.ids) for it in items)
    stats: dict[str, float] = {"loss": 0.0, "clip_frac": 0.0, "kl": 0.0, "entropy": 0.0}
    for _ in range(cfg.epochs):
        optimizer.zero_grad(set_to_none=True)
        for chunk in _chunks(items, cfg.grad_accum):
            logp, mask, entropy = sequence_logprobs(model, chunk, pad_id, with_entropy=True)
            old = logp.detach() if cfg.epochs == 1 else _scatter_old(chunk, mask, logp)
            ref = None
            if needs_ref:
                ref, _, _ = sequence_logprobs(model, chunk, pad_id, reference=policy.reference_logits)
            adv = torch.tensor([it.advantage for it in chunk], dtype=logp.dtype, device=logp.device)
            beta = torch.tensor([[it.beta] for it in chunk], dtype=logp.dtype, device=logp.device)
            loss, s = core.grpo_loss(logp, old, ref, adv, mask, clip_low=cfg.clip_low, clip_high=cfg.clip_high,
                                     beta=beta if needs_ref else 0.0, agg=cfg.loss_agg,
                                     norm=norm)
            n_tok = int(mask.sum())
            weight = {"token_mean": n_tok / total_tokens, "seq_mean_token_mean": len(chunk) / total_items,
                      "constant_norm": 1.0}[cfg.loss_agg]
            (loss * weight).backward()
            stats["loss"] += float(loss.detach()) * weight / cfg.epochs
            stats["clip_frac"] += s["clip_frac"] * n_tok / total_tokens / cfg.epochs
            stats["kl"] += s["kl"] * n_tok / total_tokens / cfg.epochs
            stats["entropy"] += float(entropy[mask].sum()) / total_tokens / cfg.epochs
        dist.sum_grads(policy.trainable_parameters())
        stats["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(policy.trainable_parameters(), cfg.grad_clip))
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
    stats = {k: dist.sum(v) for k, v in stats.items()}  # local shares of global means add up
    stats["grad_norm"] /= dist.world
    stats["trained_tokens"] = float(total_tokens * cfg.epochs)
    all_seq_tokens = dist.sum(seq_tokens)
    stats["sequence_tokens"] = float(all_seq_tokens * cfg.epochs)
    stats["forward_tokens"] = float(all_seq_tokens * ((cfg.epochs > 1) + (cfg.epochs if needs_ref else 0)))
    return stats


def _chunks(items: Sequence[TrainItem], n: int) -> list[Sequence[TrainItem]]:
    size = max(1, -(-len(items) // n))
    return [items[i:i + size] for i in range(0, len(items), size)]

"""One optimisation step of a policy on generated turns: the loss every algorithm shares.

The trainers differ only in which turns they hand in, with which advantages and KL
coefficients; batching, log-probs, the clipped loss and gradient accumulation live here once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from mlmt_bench.algorithms import core, losses
from mlmt_bench.algorithms.step_plan import AUXILIARY_KINDS, TrainKind
from mlmt_bench.fsdp import gathered, is_sharded, scalar
from mlmt_bench.machine import memory
from mlmt_bench.machine.dist import Dist
from mlmt_bench.models.forward import completion_logits, padded_batch, seq_len, sequence_logprobs, split
from mlmt_bench.models.frozen_cast import drop_cached_casts
from mlmt_bench.models.shared_prompts import prompt_group_batches, reads_prompts_once, shared_prompt_logprobs

__all__ = ["LossConfig", "TrainItem", "padded_batch", "sequence_logprobs", "update_policy"]


@dataclass
class TrainItem:
    """A generated turn to train on: context ``prompt_ids``, trained ``ids``, its advantage (or
    weight) and KL weight, and how it is trained (``kind``, the step plan's training kind,
    :mod:`mlmt_bench.algorithms.step_plan`: "policy", an off-policy "shaped" response, or an
    auxiliary "sft" / "distill" term; a "distill" item's teacher reads the same ``ids`` after
    ``teacher_prompt_ids``)."""

    prompt_ids: list[int]
    ids: list[int]
    advantage: float
    beta: float = 0.0
    kind: TrainKind = "policy"
    teacher_prompt_ids: list[int] | None = None


@dataclass
class LossConfig:
    clip_low: float
    clip_high: float
    loss_agg: core.AggMode
    epochs: int
    grad_accum: int
    grad_clip: float
    micro_batch_tokens: int | None = None  # padded tokens per forward/backward; None: no limit
    ratio: str = "token"  # token | sequence (GSPO)
    loss: str = "clip"  # a policy loss of algorithms/losses.py: clip | cispo | ...
    cispo_max: float = losses.CISPO_MAX
    shaping_gamma: float = losses.SHAPING_GAMMA  # policy shaping of off-policy ("shaped") rows: pi / (pi + gamma)
    loss_options: dict[str, float] = field(default_factory=dict)  # the loss's own options
    share_prompts: bool = False  # read each distinct prompt of a micro-batch once (models/shared_prompts.py)

    def shares(self, model: Any) -> bool:
        """Whether ``model``'s update reads each distinct prompt of a micro-batch once: asked for, and
        not under FSDP (every forward of a sharded model is a collective, and the shared path runs
        one or two of them depending on the micro-batch: its processes' counts would differ) or
        gradient checkpointing (:func:`reads_prompts_once`). It decides the forward and, so that a
        micro-batch holds what ``micro_batch_tokens`` allows of the tokens actually read, the split."""
        return self.share_prompts and not is_sharded(model) and reads_prompts_once(model)

    def logprobs(self, model: Any, items: list[TrainItem], pad_id: int, **kw: Any) -> Any:
        """Per-token log-probs, mask (and entropy) of ``items``: the shared-prompt forward in its
        completion layout where :meth:`shares`, else the plain one; one of the two for every pass of
        an update."""
        return (shared_prompt_logprobs if self.shares(model) else sequence_logprobs)(model, items, pad_id, **kw)


def _is_auxiliary(item: TrainItem) -> bool:
    return item.kind in AUXILIARY_KINDS


def update_policy(policy: Any, optimizer: torch.optim.Optimizer, scheduler: Any, items: list[TrainItem],
                  cfg: LossConfig, dist: Any = None, constant_norm: float = 0.0) -> dict[str, float]:
    """``cfg.epochs`` passes over ``items``, each one optimiser step of policy loss + auxiliary term.

    The policy loss covers "policy" and "shaped" items, aggregated by ``cfg.loss_agg``; the auxiliary
    term is the token mean, over every "sft" and "distill" item's tokens, of ``weight × (−log π)``
    ("sft") or ``weight × KL(teacher ‖ π)`` ("distill"), the weight being the item's ``advantage``:
    with its own normaliser, it is a separate term of the objective (self-distillation's δ·L).

    Each pass runs in micro-batches of at most ``cfg.micro_batch_tokens`` padded tokens (and
    at least ``cfg.grad_accum`` of them), accumulating gradients; the micro-batch losses are
    weighted so that their sum equals the loss aggregated over the whole batch (token_mean: by
    tokens; seq_mean_token_mean: by sequences; constant_norm: each micro-batch's token sum over
    the step's constant ``constant_norm``, max_new_tokens × the sequences sampled, summed over
    processes), so the update does not depend on the split. Under data parallelism (``dist``, see
    mlmt_bench/machine/dist.py) the batch is the union of every process's items: weights use the
    global counts and gradients are summed across processes, so the update equals the
    single-process update on the whole batch.

    π_old (when epochs > 1), π_ref (when an item has beta > 0) log-probs and the "distill"
    teachers' logits are computed once, before the first pass, over the same micro-batches
    (memory phase ``logprobs``).

    The loss statistics: ``loss``, ``clip_frac``, ``entropy`` (nats), ``grad_norm``, ``aux_loss`` when
    an item is auxiliary, and ``kl`` (token-mean k3 KL to π_ref, nats) only when an item has beta > 0:
    with no reference there is no KL to report. Besides them it returns the token counts the cost
    accounting needs (summed over processes and epochs): ``trained_tokens`` (completions), ``sequence_tokens`` (prompt +
    completion of every sequence trained on) and ``forward_tokens`` (tokens read by the extra
    forward passes: π_old's and π_ref's log-probs, the teachers' contexts).
    """
    dist = dist if dist is not None else Dist(from_env=False)  # no Dist handed in: one process
    plan = _plan_batches(policy.model, items, cfg, dist)
    if plan.total_items == 0 and plan.aux_tokens == 0:
        return {}
    fixed = _precompute(policy, plan, cfg, dist)
    norm = dist.sum(constant_norm) if cfg.loss_agg == "constant_norm" and plan.rl_items else None
    if cfg.loss_agg == "constant_norm" and plan.total_items and (norm is None or norm <= 0):
        raise ValueError("constant_norm aggregation needs the step's constant (max_new_tokens × sequences sampled)")
    stats: dict[str, float] = {"loss": 0.0, "clip_frac": 0.0, "entropy": 0.0}
    if plan.needs_ref:  # no reference, no KL: a logged 0 would read as "the policy has not moved"
        stats["kl"] = 0.0
    if plan.aux_items:
        stats["aux_loss"] = 0.0
    with memory.phase("update"):
        for _ in range(cfg.epochs):
            _optimizer_step(policy, optimizer, scheduler, plan, fixed, cfg, norm, stats, dist)
    return _totals(stats, plan, fixed, items, cfg, dist)


@dataclass
class _Plan:
    """How one update splits its items: policy-loss (RL) and auxiliary items, their micro-batches,
    the global counts that weight them, and the empty passes FSDP needs."""

    rl_items: list[TrainItem]
    aux_items: list[TrainItem]
    batches: list[list[TrainItem]]
    aux_batches: list[list[TrainItem]]
    total_tokens: int  # completion tokens of the RL items, summed over processes
    total_items: int
    aux_tokens: int
    needs_ref: bool  # some item (on some process) has beta > 0
    empty_passes: int  # FSDP: this process's passes short of the busiest process's


@dataclass
class _Fixed:
    """What stays fixed over the epochs: π_old's and π_ref's log-probs per RL micro-batch, each
    auxiliary micro-batch's teacher logits, and the tokens those extra forwards read."""

    old_logps: list[torch.Tensor] | None
    ref_logps: list[torch.Tensor | None]
    teachers: list[torch.Tensor | None]
    extra_tokens: int


def _plan_batches(model: Any, items: list[TrainItem], cfg: LossConfig, dist: Any) -> _Plan:
    rl_items = [it for it in items if not _is_auxiliary(it)]
    aux_items = [it for it in items if _is_auxiliary(it)]
    rows = -(-max(len(items), 1) // cfg.grad_accum)
    if cfg.shares(model):
        batches = [[rl_items[i] for i in mb] for mb in prompt_group_batches(rl_items, cfg.micro_batch_tokens, rows)]
    else:
        batches = split(rl_items, seq_len, cfg.micro_batch_tokens, max_rows=rows) if rl_items else []
    aux_batches = split(aux_items, seq_len, cfg.micro_batch_tokens, max_rows=rows) if aux_items else []
    # FSDP: every forward/backward of a sharded model is a collective, so every process runs as many
    n_passes = len(batches) + len(aux_batches)
    return _Plan(rl_items, aux_items, batches, aux_batches,
                 total_tokens=int(dist.sum(sum(len(it.ids) for it in rl_items))),
                 total_items=int(dist.sum(len(rl_items))),
                 aux_tokens=int(dist.sum(sum(len(it.ids) for it in aux_items))),
                 needs_ref=dist.any(any(it.beta > 0 for it in rl_items)),
                 empty_passes=int(dist.max(n_passes)) - n_passes if is_sharded(model) else 0)


def _precompute(policy: Any, plan: _Plan, cfg: LossConfig, dist: Any) -> _Fixed:
    """π_old (epochs > 1), π_ref (beta > 0) and the "distill" teachers, before the first update."""
    model, pad_id = policy.model, policy.tokenizer.pad_token_id
    fixed = _Fixed(None, [None] * len(plan.batches), [None] * len(plan.aux_batches), 0)
    if not dist.any(cfg.epochs > 1 or plan.needs_ref or any(it.kind == "distill" for it in plan.aux_items)):
        return fixed
    # FSDP: the weights gathered, so that these passes need no communication
    with memory.phase("logprobs"), torch.no_grad(), gathered(model):
        if cfg.epochs > 1:  # π_old is the rollout policy: freeze its log-probs before the first update
            fixed.old_logps = [cfg.logprobs(model, mb, pad_id)[0] for mb in plan.batches]
            fixed.extra_tokens += sum(seq_len(it) for it in plan.rl_items)
        if plan.needs_ref:
            policy.ensure_reference()
            fixed.ref_logps = [cfg.logprobs(model, mb, pad_id, reference=policy.reference_logits)[0]
                               for mb in plan.batches]
            fixed.extra_tokens += sum(seq_len(it) for it in plan.rl_items)
        for k, mb in enumerate(plan.aux_batches):
            if any(it.kind == "distill" for it in mb):
                fixed.teachers[k] = completion_logits(model, mb, pad_id, [it.teacher_prompt_ids or it.prompt_ids
                                                                           for it in mb])[0]
                fixed.extra_tokens += sum(len(it.teacher_prompt_ids or it.prompt_ids) + len(it.ids) for it in mb)
    return fixed


def _optimizer_step(policy: Any, optimizer: torch.optim.Optimizer, scheduler: Any, plan: _Plan, fixed: _Fixed,
                    cfg: LossConfig, norm: float | None, stats: dict[str, float], dist: Any) -> None:
    """One epoch: every micro-batch's loss backward (gradients accumulate), then one clipped step.
    Adds this epoch's share of the statistics to ``stats``."""
    model, pad_id = policy.model, policy.tokenizer.pad_token_id
    optimizer.zero_grad(set_to_none=True)
    for k, mb in enumerate(plan.batches):
        _policy_micro_step(model, mb, pad_id, fixed.old_logps[k] if fixed.old_logps is not None else None,
                           fixed.ref_logps[k], plan, cfg, norm, stats)
    for k, mb in enumerate(plan.aux_batches):
        aux = _auxiliary_sum(model, mb, pad_id, fixed.teachers[k]) / plan.aux_tokens
        aux.backward()
        stats["aux_loss"] += float(aux.detach()) / cfg.epochs
    for _ in range(plan.empty_passes):  # adds 0 to the gradients
        (cfg.logprobs(model, [TrainItem([pad_id], [pad_id], 0.0)], pad_id)[0].sum() * 0.0).backward()
    dist.sum_grads(policy.trainable_parameters())
    stats["grad_norm"] = scalar(torch.nn.utils.clip_grad_norm_(policy.trainable_parameters(), cfg.grad_clip))
    optimizer.step()
    drop_cached_casts()  # the next forward must see the new weights, also inside one autocast region
    if scheduler is not None:
        scheduler.step()


def _policy_micro_step(model: Any, mb: list[TrainItem], pad_id: int, old_logp: torch.Tensor | None,
                       ref_logp: torch.Tensor | None, plan: _Plan, cfg: LossConfig, norm: float | None,
                       stats: dict[str, float]) -> None:
    """The policy loss of one micro-batch, weighted to its share of the whole batch's
    aggregate, backward; its share of loss, clip fraction, KL and entropy added to ``stats``."""
    logp, mask, entropy = cfg.logprobs(model, mb, pad_id, with_entropy=True)
    assert entropy is not None  # with_entropy=True
    old = logp.detach() if old_logp is None else old_logp
    adv = torch.tensor([it.advantage for it in mb], dtype=logp.dtype, device=logp.device)
    beta = torch.tensor([[it.beta] for it in mb], dtype=logp.dtype, device=logp.device)
    loss, s = core.grpo_loss(logp, old, ref_logp, adv, mask, clip_low=cfg.clip_low, clip_high=cfg.clip_high,
                             beta=beta if plan.needs_ref else 0.0, agg=cfg.loss_agg, norm=norm,
                             row_kinds=[it.kind for it in mb],
                             ratio=cfg.ratio, loss=cfg.loss, cispo_max=cfg.cispo_max, shaping_gamma=cfg.shaping_gamma,
                             loss_options=cfg.loss_options)
    n_tok = int(mask.sum())
    weight = {"token_mean": n_tok / plan.total_tokens, "seq_mean_token_mean": len(mb) / plan.total_items,
              "constant_norm": 1.0}[cfg.loss_agg]
    (loss * weight).backward()
    stats["loss"] += float(loss.detach()) * weight / cfg.epochs
    stats["clip_frac"] += s["clip_frac"] * n_tok / plan.total_tokens / cfg.epochs
    if plan.needs_ref:
        stats["kl"] += s["kl"] * n_tok / plan.total_tokens / cfg.epochs
    stats["entropy"] += float(entropy[mask].sum()) / plan.total_tokens / cfg.epochs


def _totals(stats: dict[str, float], plan: _Plan, fixed: _Fixed, items: list[TrainItem], cfg: LossConfig,
            dist: Any) -> dict[str, float]:
    """The statistics summed over processes, with the token counts of the cost accounting."""
    stats = {k: dist.sum(v) for k, v in stats.items()}  # local shares of global means add up
    stats["grad_norm"] /= dist.world
    stats["trained_tokens"] = float((plan.total_tokens + plan.aux_tokens) * cfg.epochs)
    stats["sequence_tokens"] = float(dist.sum(sum(seq_len(it) for it in items)) * cfg.epochs)
    stats["forward_tokens"] = float(dist.sum(fixed.extra_tokens))
    stats["micro_batches"] = float(dist.max(len(plan.batches) + len(plan.aux_batches)))
    return stats


def _auxiliary_sum(model: Any, items: list[TrainItem], pad_id: int, teacher: torch.Tensor | None) -> torch.Tensor:
    """Σ over the items' tokens of weight × (−log π) ("sft") or weight × KL(teacher ‖ π) ("distill")."""
    logits, mask = completion_logits(model, items, pad_id)
    ids = torch.zeros(mask.shape, dtype=torch.long, device=logits.device)
    for b, it in enumerate(items):
        ids[b, :len(it.ids)] = torch.tensor(it.ids, device=logits.device)
    per_token = -core.token_logprobs(logits, ids)
    if teacher is not None:
        distill = torch.tensor([it.kind == "distill" for it in items], device=logits.device).unsqueeze(1)
        per_token = torch.where(distill, core.distill_kl(logits, teacher), per_token)
    weight = torch.tensor([it.advantage for it in items], dtype=per_token.dtype, device=per_token.device)
    return (per_token * weight.unsqueeze(1) * mask).sum()

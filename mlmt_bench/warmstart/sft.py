"""A plain supervised fine-tuning loop (the shared base's training): AdamW, warmup + cosine, clip 1.

Examples are :data:`mlmt_bench.benchmarks.synthetic_curriculum.Example` s: token ids and
``[start, end)`` spans of trained positions with loss weights. The loss is the weighted mean
next-token cross-entropy over the trained positions.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from typing import Any

from mlmt_bench.models.frozen_cast import drop_cached_casts

Example = tuple[list[int], list[tuple[int, int, float]]]


def collate(batch: list[Example], pad_id: int) -> tuple[Any, Any, Any]:
    """Right-padded ``input_ids [B, L]``, next-token targets ``[B, L-1]`` and their loss weights
    ``[B, L-1]`` (0 = not trained).

    No attention mask is needed: with right padding and causal attention, padding only follows
    the real tokens, so it never influences them.
    """
    import torch

    width = max(len(ids) for ids, _ in batch)
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    weights = torch.zeros((len(batch), width), dtype=torch.float32)
    for row, (ids, spans) in enumerate(batch):
        input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        for start, end, w in spans:
            weights[row, start:end] = w
    # Position t predicts token t+1.
    return input_ids, input_ids[:, 1:], weights[:, 1:]


def weighted_loss(model: Any, input_ids: Any, targets: Any, weights: Any) -> Any:
    """Weighted mean next-token cross-entropy (nats) over the trained positions."""
    import torch.nn.functional as F

    logits = model(input_ids=input_ids).logits[:, :-1].float()
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
    w = weights.reshape(-1)
    return (ce * w).sum() / w.sum().clamp_min(1e-8)


def lr_at(step: int, steps: int, peak: float, warmup_frac: float) -> float:
    """Linear warmup over ``warmup_frac`` of the steps, then cosine from ``peak`` down to 10% of it."""
    warm = max(1, int(round(warmup_frac * steps)))
    if step < warm:
        return peak * (step + 1) / warm
    frac = (step - warm) / max(1, steps - warm)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def sft(model: Any, make_example: Callable[[random.Random, int], Example], *, steps: int, batch: int, lr: float,
        warmup_frac: float, rng: random.Random, pad_id: int,
        on_step: Callable[[int, float], None] | None = None) -> dict[str, Any]:
    """``steps`` optimiser steps of ``batch`` examples ``make_example(rng, step)``; returns a summary:
    losses (first, mean of the last 10%), tokens processed (padded ``input_ids`` elements),
    trained tokens (positions with a non-zero weight), seconds."""
    import torch

    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.0)
    losses: list[float] = []
    tokens = trained = 0
    t0, c0 = time.perf_counter(), time.process_time()
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, lr, warmup_frac)
        input_ids, targets, weights = collate([make_example(rng, step) for _ in range(batch)], pad_id)
        loss = weighted_loss(model, input_ids, targets, weights)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        drop_cached_casts()  # under autocast, the next step's forward must see the new weights
        losses.append(float(loss.detach()))
        tokens += int(input_ids.numel())
        trained += int((weights > 0).sum())
        if on_step is not None:
            on_step(step, losses[-1])
    tail = losses[-max(1, len(losses) // 10):] if losses else [float("nan")]
    return {"steps": steps, "batch": batch, "lr": lr, "first_loss": losses[0] if losses else None,
            "final_loss": sum(tail) / len(tail), "tokens": tokens, "trained_tokens": trained,
            "seconds": round(time.perf_counter() - t0, 2), "cpu_seconds": round(time.process_time() - c0, 2)}


def sft_bar() -> Any:
    """A rich progress bar of SFT steps with the step's loss (``task.fields["loss"]``)."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("loss {task.fields[loss]:.3f}"), TimeElapsedColumn(), TimeRemainingColumn())

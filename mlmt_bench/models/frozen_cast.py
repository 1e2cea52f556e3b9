"""Frozen linear weights stored in the dtype CPU autocast computes in, cast once instead of per call.

Under ``torch.autocast("cpu", dtype=torch.bfloat16)`` every ``F.linear`` casts its float32 weight to
bfloat16 on each call. A frozen weight (a LoRA adapter's base layer, a frozen critic, the base
critic) never changes, so casting it once gives the same bfloat16 operand, hence bit-identical
outputs, without the per-call cast: measured with ``perf/grpo_step_time.py`` on SmolLM2-135M
with LoRA (see the README's performance section). Only layers inside the autocast region see the
change, so :func:`cast_frozen_linears` is for models whose every forward runs under that autocast
(the trainer's, :func:`mlmt_bench.runner.cpu_autocast`).
"""

from __future__ import annotations

from typing import Any


def cast_frozen_linears(model: Any, dtype: Any) -> int:
    """Cast, in place, the weight and bias of every ``torch.nn.Linear`` of ``model`` whose weight is
    frozen (``requires_grad`` false) and shared with no ``torch.nn.Embedding`` (a tied ``lm_head``
    stays: casting it would change the embedding's output, which autocast does not touch) to
    ``dtype``. Returns the number of weight elements cast (0 when there was nothing to cast)."""
    import torch

    embedding_weights = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    cast = 0
    for module in model.modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        weight = module.weight
        if weight.requires_grad or id(weight) in embedding_weights or weight.dtype == dtype:
            continue
        weight.data = weight.data.to(dtype)
        if module.bias is not None and not module.bias.requires_grad:
            module.bias.data = module.bias.data.to(dtype)
        cast += weight.numel()
    return cast


def drop_cached_casts() -> None:
    """Forget autocast's cached low-precision copies of trainable weights. Call after every change
    of weights that may happen inside an autocast region: an optimiser step, a checkpoint load.

    Inside one ``torch.autocast`` region a leaf tensor that requires grad (a LoRA matrix, a fully
    trained weight, the value head) is cast once, at its first use, and that copy is reused until
    the outermost region ends. The trainer runs a whole run in one region
    (:func:`mlmt_bench.runner.cpu_autocast`), so without this every forward after the first
    optimiser step computed with the weights as they were at the first step: on a CPU with
    bfloat16 autocast (SmolLM2 on an AVX512-BF16 or AMX machine) the policies never moved in
    their own rollouts and log-probs. Within a step the cache is still used."""
    import torch

    torch.clear_autocast_cache()


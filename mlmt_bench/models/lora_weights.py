"""A peft LoRA layer's weight as it computes: ``W + ΔW`` of its active adapters, without merging in place.

Two backends need it: the vLLM backend pushes every adapted weight merged into its engine
(:func:`mlmt_bench.rollout.vllm_backend.iter_merged_weights`), and the static decoder with
``merge_lora`` runs each adapted linear layer as one matrix product with its merged weight
(:class:`mlmt_bench.rollout.static_decode.MergedLinears`). Neither modifies the model: peft's own
``merge_adapter`` adds ``ΔW`` to the frozen weight in place and subtracts it again, which rounds
the frozen weight (shared by every role of a shared base, and hashed by the evaluation memo) a
little differently each time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where a weight is merged: asking a backend's traits stays torch-free
    import torch


def is_peft(model: Any) -> bool:
    """Whether ``model`` is a peft model (has adapters and a base model under them)."""
    return callable(getattr(model, "get_base_model", None)) and hasattr(model, "peft_config")


def lora_layers(base: Any) -> dict[str, Any]:
    """``{module name: peft LoRA layer}`` of ``base`` (a peft model's base model), in module order."""
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:  # pragma: no cover - peft is a dependency
        return {}
    return {name: m for name, m in base.named_modules() if isinstance(m, LoraLayer)}


def active_adapters(layer: Any) -> list[str]:
    """The names of ``layer``'s active adapters (peft keeps one name or a list)."""
    names = getattr(layer, "active_adapters", None)
    if names is None:
        names = [getattr(layer, "active_adapter", "default")]
    if isinstance(names, str):
        names = [names]
    return list(names)


def uses_dora(layer: Any) -> bool:
    """Whether an active adapter of ``layer`` is DoRA (its merged weight is not ``W + BA``)."""
    use = getattr(layer, "use_dora", {}) or {}
    return any(bool(use.get(a)) for a in active_adapters(layer))


def applies_adapters(layer: Any) -> bool:
    """Whether ``layer``'s forward adds adapter outputs to its base layer's: adapters on and not
    already merged into the base weight."""
    return not (getattr(layer, "merged", False) or getattr(layer, "disable_adapters", False))


def merged_weight(layer: Any, weight: Any) -> Any:
    """``weight`` (``layer``'s base weight, ``[out, in]``) plus the ``ΔW = s·B·A`` of each active
    adapter (peft's ``get_delta_weight``), in ``weight``'s device and dtype; ``weight`` itself when
    the layer applies no adapter. A new tensor: the model is not modified."""
    if not applies_adapters(layer):
        return weight
    out = weight.detach()
    adapters = set(getattr(layer, "lora_A", {}) or {}) | set(getattr(layer, "lora_embedding_A", {}) or {})
    for name in active_adapters(layer):
        if name in adapters:
            out = out + layer.get_delta_weight(name).to(device=out.device, dtype=out.dtype)
    return out.to(weight.dtype)


def merge_into(layer: Any, out: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`merged_weight` of ``layer``'s base weight, written into ``out`` when it has the
    weight's shape, dtype and device (else into a new tensor, returned). A plain LoRA layer
    (``[out, in]`` weights, no ``fan_in_fan_out``, adapters in the weight's dtype) takes one fused
    ``addmm`` per adapter, ``W + s·(B @ A)`` in a single pass, where ``merged_weight`` writes the
    product, scales it, adds it and copies the sum (SmolLM2-135M with an all-linear adapter: 0.11–0.12
    s against 0.16–0.17 s of one CPU core for all layers, ``perf/static_prefill_profile.py``). The base
    weight itself when the layer applies no adapter."""
    import torch

    weight = layer.base_layer.weight
    if not applies_adapters(layer):
        return weight
    names = [n for n in active_adapters(layer) if n in (getattr(layer, "lora_A", {}) or {})]
    pairs = [(layer.lora_B[n].weight, layer.lora_A[n].weight, float(layer.scaling[n])) for n in names]
    fits = out is not None and (out.shape, out.dtype, out.device) == (weight.shape, weight.dtype, weight.device)
    target = out if out is not None and fits else torch.empty_like(weight)
    plain = not getattr(layer, "fan_in_fan_out", False) and all(
        b.dim() == a.dim() == 2 and b.dtype == a.dtype == weight.dtype and b.shape[0] == weight.shape[0]
        and a.shape[1] == weight.shape[1] for b, a, _ in pairs)
    with torch.no_grad():
        if not plain:
            target.copy_(merged_weight(layer, weight))
        elif not pairs:
            target.copy_(weight)
        else:
            b, a, scale = pairs[0]
            torch.addmm(weight, b, a, alpha=scale, out=target)
            for b, a, scale in pairs[1:]:
                target.addmm_(b, a, alpha=scale)
    return target

"""A LoRA adapter taken out of a trained model, saved on its own, and merged into the pretrained
weights the same way, bit for bit, on any machine.

Why not ``peft``'s ``merge_and_unload``: it computes ``B @ A`` with the CPU's matrix kernels, whose
summation order differs between CPU vendors, so the merged weights (and their sha256) of one
adapter differ in the last bits between an Intel and an AMD machine. Here each weight is
``W + s · Σ_k B[:, k] ⊗ A[k, :]``, summed over ``k = 0 .. r-1`` in that order in float64 by
elementwise operations (each rounded as IEEE 754 prescribes, whatever the machine) and rounded once
to the weight's dtype. So an adapter shipped from one machine (:mod:`mlmt_bench.warmstart.shipped_warm_starts`)
gives the same checkpoint on every other.

The adapter file: ``adapter.safetensors`` with ``<module>.lora_A`` (r × in) and ``<module>.lora_B``
(out × r) in float32 for each adapted linear module of the base model (names as in the base
model's ``named_modules``), and ``adapter.json`` with each module's scaling ``s`` (alpha / r).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ADAPTER_TENSORS = "adapter.safetensors"
ADAPTER_SCALES = "adapter.json"
_PEFT_PREFIX = "base_model.model."


def lora_pairs(peft_model: Any) -> dict[str, tuple[Any, Any, float]]:
    """``{module name in the base model: (A (r × in), B (out × r), scaling)}`` of a peft LoRA model's
    active adapter, as float32 CPU copies."""
    from peft.tuners.lora import LoraLayer

    pairs: dict[str, tuple[Any, Any, float]] = {}
    for name, module in peft_model.named_modules():
        if not isinstance(module, LoraLayer):
            continue
        layer: Any = module  # peft's attribute types are too loose for mypy
        (adapter,) = layer.active_adapters
        a = layer.lora_A[adapter].weight.detach().float().cpu().clone()
        b = layer.lora_B[adapter].weight.detach().float().cpu().clone()
        pairs[name.removeprefix(_PEFT_PREFIX)] = (a, b, float(layer.scaling[adapter]))
    if not pairs:
        raise ValueError("the model has no LoRA layer")
    return pairs


def save_adapter(pairs: dict[str, tuple[Any, Any, float]], directory: Path) -> None:
    """Write ``pairs`` as ``adapter.safetensors`` and ``adapter.json`` under ``directory``."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, (a, b, _) in pairs.items():
        tensors[f"{name}.lora_A"] = a.contiguous()
        tensors[f"{name}.lora_B"] = b.contiguous()
    save_file(tensors, str(directory / ADAPTER_TENSORS))
    scales = {name: s for name, (_, _, s) in sorted(pairs.items())}
    (directory / ADAPTER_SCALES).write_text(json.dumps(scales, indent=1, sort_keys=True) + "\n")


def load_adapter(directory: Path) -> dict[str, tuple[Any, Any, float]]:
    """The pairs :func:`save_adapter` wrote under ``directory``."""
    from safetensors.torch import load_file

    tensors = load_file(str(directory / ADAPTER_TENSORS))
    scales = json.loads((directory / ADAPTER_SCALES).read_text())
    return {name: (tensors[f"{name}.lora_A"], tensors[f"{name}.lora_B"], float(s)) for name, s in scales.items()}


def merge_exact(model: Any, pairs: dict[str, tuple[Any, Any, float]]) -> None:
    """Add each pair's ``s · B A`` to its module's weight in place (float64, fixed order, one rounding)."""
    import torch

    modules = dict(model.named_modules())
    missing = sorted(set(pairs) - set(modules))
    if missing:
        raise ValueError(f"the adapter names modules the model lacks: {missing[:3]}")
    with torch.no_grad():
        for name, (a, b, scale) in pairs.items():
            weight = modules[name].weight
            if tuple(weight.shape) != (b.shape[0], a.shape[1]):
                raise ValueError(f"{name}: weight {tuple(weight.shape)} does not match B {tuple(b.shape)} · "
                                 f"A {tuple(a.shape)}")
            a64, b64 = a.double(), b.double()
            delta = torch.zeros(weight.shape, dtype=torch.float64)
            for k in range(a64.shape[0]):
                delta += b64[:, k, None] * a64[None, k, :]
            weight.copy_((weight.detach().double().cpu() + scale * delta).to(weight.dtype))

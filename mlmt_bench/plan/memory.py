"""Estimated peak memory per GPU of a planned run (see :mod:`mlmt_bench.plan` for what it includes).

Bytes; GB = 1e9 bytes. The activation model is calibrated against the storages autograd keeps
for the trainer's forward (tests/test_plan.py).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from mlmt_bench.plan.throughput import GB, Device
from mlmt_bench.plan.work import PlannedPolicy, Turn

if TYPE_CHECKING:
    from mlmt_bench.algorithms.params import LossParams
    from mlmt_bench.spec import RunSpec

#: CUDA context, cuBLAS workspaces, allocator slack (GPU); Python + torch (CPU)
RUNTIME_OVERHEAD = {"gpu": 1.0 * GB, "cpu": 0.5 * GB}


def act_bytes_per_token(shape: Any, b: int, checkpointing: bool) -> float:
    """Bytes autograd keeps per token for backward, all layers, for a Llama-style layer in dtype
    ``b``: the four SwiGLU tensors (4·I), the hidden-size tensors around attention and the norms
    (about 7·h in dtype and 2.5·h in float32), rotated queries and keys and the values (h + 2·kv).
    Calibrated against the storages autograd saves (tests/test_plan.py)."""
    per_layer = b * (4 * shape.intermediate + 7 * shape.hidden + 2 * shape.kv_dim) + 10 * shape.hidden
    if checkpointing:  # only each layer's input, plus one layer recomputed in backward
        return shape.layers * b * shape.hidden + per_layer
    return shape.layers * per_layer + 2 * b * shape.hidden + 8 * shape.hidden


def logit_bytes_per_token(shape: Any, b: int) -> float:
    """Per trained position: the float32 log-softmax kept for backward (4·V) plus what is alive
    around it, the logits in dtype and the float32 temporaries of the entropy (2 × 4·V)."""
    return shape.vocab * (4 + b + 8)


def micro_batch_shapes(trained: list[Turn], roles: list[str], grad_accum: int,
                   mb_tokens: int | None) -> list[tuple[int, float, float]]:
    """(rows, padded length, logit positions per row) of each micro-batch of an update over the
    trained sequences of ``roles``, split as the update splits them (models/forward.py:
    at most ``train.micro_batch_tokens`` padded tokens and at least ``grad_accum`` micro-batches)."""
    from mlmt_bench.models.forward import micro_batches

    seqs = [(t.prompt, t.new) for t in trained if t.role in roles for _ in range(t.count)]
    if not seqs:
        return []
    lengths = [int(math.ceil(p + n)) for p, n in seqs]
    out: list[tuple[int, float, float]] = []
    for mb in micro_batches(lengths, mb_tokens, max_rows=-(-len(seqs) // grad_accum)):
        length = max(lengths[i] for i in mb)
        out.append((len(mb), length, length - min(seqs[i][0] for i in mb)))
    return out


def estimate_memory(spec: RunSpec, params: LossParams, policies: dict[str, PlannedPolicy], turns: list[Turn],
                    trained: list[Turn], eval_turns: list[Turn], device: Device) -> dict[str, Any]:
    """Bytes per phase (held throughout, generation, log-probs, update) and the peak, per GPU;
    ``params`` are the algorithm's (they say whether π_ref is kept and how many epochs update)."""
    items: dict[str, dict[str, float]] = {"persistent": {}, "generation": {}, "logprobs": {}, "training": {}}

    def add(phase: str, what: str, nbytes: float) -> None:
        if nbytes:
            items[phase][what] = items[phase].get(what, 0.0) + nbytes

    distinct = [p for p in policies.values() if not p.shared]
    needs_ref = params.needs_reference()
    for p in distinct:
        on_it = [q.role for q in distinct if q.base_of == p.role]  # share_base: the adapters on p's base
        if p.base_of is None:
            add("persistent", f"weights ({', '.join([p.role, *on_it])}{', one frozen base' if on_it else ''})",
                p.shape.params * p.bytes)
        trains = p.trains or any(q.trains for q in policies.values() if q.shared)
        if p.spec.lora is not None:
            add("persistent", f"LoRA adapter ({p.role}, float32)", p.lora_params * 4)
        if trains:
            t = p.lora_params if p.spec.lora is not None else p.shape.params
            tb = 4 if p.spec.lora is not None else p.bytes
            add("persistent", f"gradients ({p.role})", t * tb)
            add("persistent", f"AdamW states ({p.role})", 2 * t * tb)
            if needs_ref and p.spec.lora is None:
                add("persistent", f"reference copy ({p.role})", p.shape.params * p.bytes)

    # generation engines and caches, per model that generates: the backend class's own estimate
    from mlmt_bench.rollout.backend import GenerationLoad, backend_class

    backend = backend_class(spec.backend.name)
    all_turns = turns + eval_turns
    one_engine = backend.traits.holds_weights  # an engine holds the weights: one per base, whatever its adapters
    for p in distinct:
        if one_engine and p.base_of is not None:
            continue  # share_base: the engine of its base serves it
        generating = {p.role} | {q.role for q in policies.values() if q.shared or (one_engine and q.base_of == p.role)}
        gen = [t for t in all_turns if t.role in generating]
        if not gen:
            continue
        load = GenerationLoad(p.role, p.shape, p.bytes, sequences=max(t.count for t in gen),
                              length=max(t.prompt + t.new for t in gen), prompt=max(t.prompt for t in gen),
                              device_memory=device.memory, gpu=device.gpu)
        for phase, what, nbytes in backend.generation_memory(load, spec.backend.options):
            add(phase, what, nbytes)

    # the update: the largest micro-batch of each model's update (policies update one after
    # another); before it, the no-grad log-prob passes (π_ref, π_old) over the same micro-batches
    mb_tokens = spec.train.micro_batch_tokens
    epochs = params.loss_terms().epochs
    worst: dict[str, tuple[float, dict[str, float]]] = {"training": (0.0, {}), "logprobs": (0.0, {})}
    for p in distinct:
        roles = [r for r, q in policies.items() if (q is p or (q.shared and p.role == "solver")) and q.trains]
        ckpt = p.spec.gradient_checkpointing
        for rows, length, logit_pos in micro_batch_shapes(trained, roles, spec.train.grad_accum, mb_tokens):
            act = rows * length * act_bytes_per_token(p.shape, p.bytes, ckpt)
            logits = rows * logit_pos * logit_bytes_per_token(p.shape, p.bytes)
            if act + logits > worst["training"][0]:
                worst["training"] = (act + logits, {
                    f"activations ({p.role}, {rows} sequences x {int(length)} tokens"
                    f"{', checkpointed' if ckpt else ''})": act,
                    f"logits + float32 log-softmax ({p.role})": logits})
            if needs_ref or epochs > 1:  # no graph kept: the logits, and one row's float32 log-softmax
                lp = rows * logit_pos * p.shape.vocab * p.bytes + logit_pos * p.shape.vocab * 8
                if lp > worst["logprobs"][0]:
                    worst["logprobs"] = (lp, {f"reference / old log-prob logits ({p.role})": lp})
    for phase, (_, parts) in worst.items():
        for what, nbytes in parts.items():
            add(phase, what, nbytes)
    add("persistent", "runtime (CUDA context, workspaces)" if device.gpu else "runtime (Python, torch)",
        RUNTIME_OVERHEAD["gpu" if device.gpu else "cpu"])
    persistent = sum(items["persistent"].values())
    phases = {k: sum(items[k].values()) for k in ("generation", "logprobs", "training")}
    peak = persistent + max(phases.values())
    return {"items": items, "persistent": persistent, "generation_phase": phases["generation"],
            "logprobs_phase": phases["logprobs"], "training_phase": phases["training"], "peak": peak,
            "device": device.memory, "fits": device.memory is None or peak <= device.memory}

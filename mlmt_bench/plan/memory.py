"""Estimated peak memory per GPU of a planned run (see :mod:`mlmt_bench.plan` for what it includes).

Bytes; GB = 1e9 bytes. The activation model is calibrated against the storages autograd keeps
for the trainer's forward (tests/test_plan.py).

:func:`estimate_memory` adds up lines ``(phase, what, bytes)`` (a backend's ``MemoryItem``) that
one function per job lists: :func:`model_state_items` (weights, adapters, gradients, AdamW states,
the reference copy), :func:`generation_items` (the backend's engines and caches),
:func:`update_items` (the largest micro-batch's activations and logits, and the log-prob pass
before it) and :func:`runtime_item`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from mlmt_bench.plan.throughput import GB, Device
from mlmt_bench.plan.work import PlannedPolicy, Turn, sharing_roles

if TYPE_CHECKING:
    from mlmt_bench.algorithms.params import LossParams
    from mlmt_bench.rollout.backend import GenerationLoad, MemoryItem
    from mlmt_bench.spec import RunSpec

#: CUDA context, cuBLAS workspaces, allocator slack (GPU); Python + torch (CPU)
RUNTIME_OVERHEAD = {"gpu": 1.0 * GB, "cpu": 0.5 * GB}

#: the phases of a step, in the order the plan lists them: held throughout, then the three that alternate
PHASES = ("persistent", "generation", "logprobs", "training")

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


@dataclass(frozen=True)
class MicroBatch:
    """One micro-batch of an update: ``rows`` sequences padded to ``length`` tokens, ``logit_pos``
    trained positions a row; read with each prompt once (``prompts`` > 0: that many distinct prompts
    padded to ``prompt_len``, the completions after them, ``length`` the longest completion)."""

    rows: int
    length: float
    logit_pos: float
    prompts: int = 0
    prompt_len: float = 0.0


def micro_batch_shapes(trained: list[Turn], roles: list[str], grad_accum: int,
                       mb_tokens: int | None, shared: bool = False) -> list[MicroBatch]:
    """Each micro-batch of an update over the trained sequences of ``roles``, split as the update
    splits them: at most ``train.micro_batch_tokens`` padded tokens and at least ``grad_accum``
    micro-batches, the tokens counted as the forward reads them (``shared``: each distinct prompt once,
    ``models/shared_prompts.prompt_group_batches``, a turn's ``siblings`` sharing one; else whole rows,
    ``models/forward.micro_batches``). The auxiliary turns ("sft", "distill") are read whole."""
    from mlmt_bench.models.forward import micro_batches
    from mlmt_bench.models.shared_prompts import prompt_group_batches

    rows = [t for t in trained if t.role in roles for _ in range(t.count)]
    if not rows:
        return []
    cap = -(-len(rows) // grad_accum)
    out = []
    # the auxiliary rows in micro-batches of their own, as the update splits them; with them the policy-loss
    # rows when read whole
    for whole in ([t for t in rows if t.auxiliary], [t for t in rows if not (shared or t.auxiliary)]):
        lengths = [int(math.ceil(t.prompt + t.new)) for t in whole]
        for mb in micro_batches(lengths, mb_tokens, max_rows=cap):
            length = max(lengths[i] for i in mb)
            out.append(MicroBatch(len(mb), length, length - min(whole[i].prompt for i in mb)))
    items: list[SimpleNamespace] = []
    for k, t in enumerate(t for t in trained if t.role in roles and shared and not t.auxiliary):
        pad = [0] * max(0, int(math.ceil(t.prompt)) - 2)
        for row in range(t.count):  # rows of one group share a prompt: its first two tokens say which
            items.append(SimpleNamespace(prompt_ids=[k, row // max(1, t.siblings), *pad], ids=[0] * max(1, t.new)))
    for mb in prompt_group_batches(items, mb_tokens, cap) if items else []:
        prompt_len = max(len(items[i].prompt_ids) for i in mb)
        width = max(len(items[i].ids) for i in mb)
        out.append(MicroBatch(len(mb), width, width, len({tuple(items[i].prompt_ids) for i in mb}), prompt_len))
    return out


# --- weights, adapters, optimiser states, reference copy (held throughout) ---

def distinct_models(policies: dict[str, PlannedPolicy]) -> list[PlannedPolicy]:
    """The policies with a model of their own (a critic shared with the solver has none)."""
    return [p for p in policies.values() if not p.shared]


def weights_items(p: PlannedPolicy, distinct: list[PlannedPolicy]) -> list[MemoryItem]:
    """The frozen or trained weights of ``p``'s base, once per base: an adapter on another role's
    base (``policies.share_base``) holds none, and its base's line names it."""
    if p.base_of is not None:
        return []
    on_it = [q.role for q in distinct if q.base_of == p.role]
    label = f"weights ({', '.join([p.role, *on_it])}{', one frozen base' if on_it else ''})"
    return [("persistent", label, p.shape.params * p.bytes)]


def updated(p: PlannedPolicy, policies: dict[str, PlannedPolicy]) -> bool:
    """Whether ``p``'s model is updated: by its own role, or by a critic that shares it."""
    return p.trains or any(q.trains for q in policies.values() if q.shared)


def optimizer_items(p: PlannedPolicy, needs_ref: bool) -> list[MemoryItem]:
    """Gradients and the two AdamW moments of what ``p`` trains (a float32 LoRA adapter, or all
    weights in their dtype), and under full fine-tuning with a KL term the frozen π_ref copy."""
    lora = p.spec.lora is not None
    n, nbytes = (p.lora_params, 4) if lora else (p.shape.params, p.bytes)
    items: list[MemoryItem] = [("persistent", f"gradients ({p.role})", n * nbytes),
                         ("persistent", f"AdamW states ({p.role})", 2 * n * nbytes)]
    if needs_ref and not lora:  # LoRA's π_ref is its base with the adapter off: no copy
        items.append(("persistent", f"reference copy ({p.role})", p.shape.params * p.bytes))
    return items


def model_state_items(policies: dict[str, PlannedPolicy], needs_ref: bool) -> list[MemoryItem]:
    """What each distinct model holds for the whole run: weights, LoRA adapter, and if updated
    its gradients, optimiser states and reference copy."""
    distinct = distinct_models(policies)
    items: list[MemoryItem] = []
    for p in distinct:
        items += weights_items(p, distinct)
        if p.spec.lora is not None:
            items.append(("persistent", f"LoRA adapter ({p.role}, float32)", p.lora_params * 4))
        if updated(p, policies):
            items += optimizer_items(p, needs_ref)
    return items


# --- generation: the backend's engines and caches ---

def generating_roles(p: PlannedPolicy, policies: dict[str, PlannedPolicy], one_engine: bool) -> set[str]:
    """The roles whose turns ``p``'s model generates: its own, a critic that shares it and, when an
    engine holds the weights (one per base), the adapters on its base."""
    return {p.role} | {q.role for q in policies.values() if q.shared or (one_engine and q.base_of == p.role)}


def generation_load(p: PlannedPolicy, turns: list[Turn], device: Device) -> GenerationLoad:
    """The largest generate call of ``turns`` (all generated by ``p``'s model), as a backend sizes it."""
    from mlmt_bench.rollout.backend import GenerationLoad

    return GenerationLoad(p.role, p.shape, p.bytes, sequences=max(t.count for t in turns),
                          length=max(t.prompt + t.new for t in turns), prompt=max(t.prompt for t in turns),
                          device_memory=device.memory, gpu=device.gpu, adapted=p.shape.adapted_params(p.spec.lora))


def generation_items(spec: RunSpec, policies: dict[str, PlannedPolicy], turns: list[Turn],
                     device: Device) -> list[MemoryItem]:
    """Generation engines and caches, per model that generates some of ``turns`` (training and
    evaluation): the backend class's own estimate."""
    from mlmt_bench.rollout.backend import backend_class

    backend = backend_class(spec.backend.name)
    one_engine = backend.traits.holds_weights  # an engine holds the weights: one per base, whatever its adapters
    items: list[MemoryItem] = []
    for p in distinct_models(policies):
        if one_engine and p.base_of is not None:
            continue  # share_base: the engine of its base serves it
        roles = generating_roles(p, policies, one_engine)
        gen = [t for t in turns if t.role in roles]
        if gen:
            items += backend.generation_memory(generation_load(p, gen, device), spec.backend.options)
    return items


# --- the update: training micro-batches and the log-prob passes before them ---

def update_roles(p: PlannedPolicy, policies: dict[str, PlannedPolicy]) -> list[str]:
    """The updated roles whose sequences ``p``'s model trains on (the solver's model also trains
    a critic that shares it)."""
    return [r for r, q in policies.items() if (q is p or (q.shared and p.role == "solver")) and q.trains]


def training_candidate(p: PlannedPolicy, mb: MicroBatch) -> tuple[float, dict[str, float]]:
    """Bytes of one micro-batch's forward and backward: the activations autograd keeps and the logits
    with their float32 log-softmax. Read with each prompt once, the activations are those of the
    distinct prompts and of the completions, plus the prompts' keys and values gathered to every row
    (its KV cache, kept for the completions' attention). (total, its lines)."""
    ckpt = p.spec.gradient_checkpointing
    per_token = act_bytes_per_token(p.shape, p.bytes, ckpt)
    logits = mb.rows * mb.logit_pos * logit_bytes_per_token(p.shape, p.bytes)
    if not mb.prompts:
        act = mb.rows * mb.length * per_token
        what = f"{mb.rows} sequences x {int(mb.length)} tokens{', checkpointed' if ckpt else ''}"
    else:
        cache = mb.rows * mb.prompt_len * 2 * p.shape.kv_dim * p.shape.layers * p.bytes
        act = (mb.prompts * mb.prompt_len + mb.rows * mb.length) * per_token + cache
        what = (f"{mb.prompts} prompts x {int(mb.prompt_len)} tokens read once, {mb.rows} completions x "
                f"{int(mb.length)} tokens after them")
    return act + logits, {f"activations ({p.role}, {what})": act, f"logits + float32 log-softmax ({p.role})": logits}


def logprob_candidate(p: PlannedPolicy, rows: int, logit_pos: float) -> tuple[float, dict[str, float]]:
    """Bytes of one micro-batch's no-grad π_ref / π_old pass: no graph is kept, only the logits in
    dtype and one row's float32 log-softmax. (total, its line)."""
    lp = rows * logit_pos * p.shape.vocab * p.bytes + logit_pos * p.shape.vocab * 8
    return lp, {f"reference / old log-prob logits ({p.role})": lp}


def largest(candidates: list[tuple[float, dict[str, float]]]) -> dict[str, float]:
    """The lines of the first candidate with the largest positive total ({} if none)."""
    best: tuple[float, dict[str, float]] = (0.0, {})
    for c in candidates:
        if c[0] > best[0]:
            best = c
    return best[1]


def update_items(spec: RunSpec, params: LossParams, policies: dict[str, PlannedPolicy],
                 trained: list[Turn]) -> list[MemoryItem]:
    """The largest micro-batch of any model's update (policies update one after another) and,
    when there is one (β > 0 or several epochs), the largest log-prob pass before it."""
    extra_pass = params.needs_reference() or params.loss_terms().epochs > 1
    train: list[tuple[float, dict[str, float]]] = []
    logprobs: list[tuple[float, dict[str, float]]] = []
    shared = sharing_roles(spec, policies)
    for p in distinct_models(policies):
        shapes = micro_batch_shapes(trained, update_roles(p, policies), spec.train.grad_accum,
                                    spec.train.micro_batch_tokens, p.role in shared)
        train += [training_candidate(p, mb) for mb in shapes]
        if extra_pass:
            logprobs += [logprob_candidate(p, mb.rows, mb.logit_pos) for mb in shapes]
    return [*(("training", what, nbytes) for what, nbytes in largest(train).items()),
            *(("logprobs", what, nbytes) for what, nbytes in largest(logprobs).items())]


def runtime_item(device: Device) -> MemoryItem:
    """The fixed overhead of the process (:data:`RUNTIME_OVERHEAD`)."""
    if device.gpu:
        return ("persistent", "runtime (CUDA context, workspaces)", RUNTIME_OVERHEAD["gpu"])
    return ("persistent", "runtime (Python, torch)", RUNTIME_OVERHEAD["cpu"])


# --- the sum ---

def tally(items: list[MemoryItem]) -> dict[str, dict[str, float]]:
    """Bytes per phase and line: lines with the same name add up, zero lines are left out."""
    out: dict[str, dict[str, float]] = {phase: {} for phase in PHASES}
    for phase, what, nbytes in items:
        if nbytes:
            out[phase][what] = out[phase].get(what, 0.0) + nbytes
    return out


def summary(items: dict[str, dict[str, float]], device: Device) -> dict[str, Any]:
    """Totals of :func:`tally`'s lines: what is held throughout plus the largest phase is the peak."""
    persistent = sum(items["persistent"].values())
    phases = {k: sum(items[k].values()) for k in PHASES[1:]}
    peak = persistent + max(phases.values())
    return {"items": items, "persistent": persistent, "generation_phase": phases["generation"],
            "logprobs_phase": phases["logprobs"], "training_phase": phases["training"], "peak": peak,
            "device": device.memory, "fits": device.memory is None or peak <= device.memory}


def estimate_memory(spec: RunSpec, params: LossParams, policies: dict[str, PlannedPolicy], turns: list[Turn],
                    trained: list[Turn], eval_turns: list[Turn], device: Device) -> dict[str, Any]:
    """Bytes per phase (held throughout, generation, log-probs, update) and the peak, per GPU;
    ``params`` are the algorithm's (they say whether π_ref is kept and how many epochs update)."""
    items = [*model_state_items(policies, params.needs_reference()),
             *generation_items(spec, policies, turns + eval_turns, device),
             *update_items(spec, params, policies, trained),
             runtime_item(device)]
    return summary(tally(items), device)

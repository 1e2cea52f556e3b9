"""Log-probs of completions whose prompts repeat, each distinct prompt read once (``train.share_prompts``).

A GRPO-family update trains G completions of one prompt. The plain forward
(:func:`mlmt_bench.models.forward.sequence_logprobs`) reads prompt + completion for every row:
B × (Lp + Lc) tokens. Here the P distinct prompts of a micro-batch are read once, right-padded
``[P, Wp]``, keeping their KV cache (with its autograd graph: a LoRA acts on the prompt's keys and
values too, so their gradient flows back through the cache); the cache is gathered to the rows
(``[B, ...]``) and the completions are read after it, ``[B, Wc − 1]``: P × Wp + B × (Wc − 1) tokens.
A shorter prompt's cache has padding between its last token and its
completion, masked, with the completion's positions continuing the prompt's (left padding would leave
pad query rows with nothing to attend to, whose NaNs eager attention carries into the gradients).
The log-probs and gradients are the plain forward's up to float rounding (same positions, same
attention, the G rows' prompt gradients summed by the gather's backward); tested against it.

Layout. Everything here is in *completion layout*: ``[B, Wc]``, column j the j-th completion token
of the row (Wc the longest completion, the rest masked), whatever the prompt lengths. An update
that shares prompts reads π_old, π_ref and the policy in this layout, so the loss sees aligned
tokens; :func:`completion_layout` converts the plain forward's ``[B, L−1−s]`` output.

Not shared (the plain forward, converted): π_ref's log-probs (a reference is a separate callable)
and a model with gradient checkpointing on (transformers drops the cache of a checkpointed layer
in training). An FSDP-sharded model is not handed here at all (``update.LossConfig.logprobs``).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from typing import Any

import torch

from mlmt_bench.models.forward import Tokens, model_device, pad_right, sequence_logprobs, takes_logits_to_keep
from mlmt_bench.models.tensor_ops import entropy_from_logits, token_logprobs


def completion_layout(values: torch.Tensor, items: Sequence[Tokens]) -> torch.Tensor:
    """The plain forward's per-position values ``[B, L−1−s]`` (s + 1 the shortest prompt, as
    :func:`~mlmt_bench.models.forward.sequence_logprobs` returns them) as ``[B, Wc]``: row b's
    completion tokens first, zeros after (a differentiable gather)."""
    start = min(len(it.prompt_ids) for it in items) - 1
    width = max(1, max(len(it.ids) for it in items))
    out = values.new_zeros((len(items), width))
    for b, it in enumerate(items):
        offset = len(it.prompt_ids) - 1 - start
        out[b, :len(it.ids)] = values[b, offset:offset + len(it.ids)]
    return out


def completion_mask(items: Sequence[Tokens], device: Any = None) -> torch.Tensor:
    """``[B, Wc]`` bool: True on each row's completion tokens (completion layout)."""
    mask = torch.zeros((len(items), max(1, max(len(it.ids) for it in items))), dtype=torch.bool)
    for b, it in enumerate(items):
        mask[b, :len(it.ids)] = True
    return mask.to(device) if device is not None else mask


def shared_prompt_logprobs(model: Any, items: Sequence[Tokens], pad_id: int, *, with_entropy: bool = False,
                           reference: Any = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs ``[B, Wc]`` of each item's ids given its prompt, their mask ``[B, Wc]``
    and (if asked) the entropy ``[B, Wc]`` (nats, no gradient), in completion layout, reading each
    distinct prompt once. ``reference``: π_ref's ``(**inputs) -> logits``, read the plain way."""
    device = model_device(model)
    mask = completion_mask(items, device)
    if reference is not None or _checkpointed(model):
        logp, _, entropy = sequence_logprobs(model, items, pad_id, with_entropy=with_entropy, reference=reference)
        return (completion_layout(logp, items), mask,
                completion_layout(entropy, items) if entropy is not None else None)
    prompts, owner = _distinct_prompts(items)
    width = mask.shape[1]
    # right-padded, so that no query row is fully masked (a left pad's would be: NaN gradients in eager attention)
    prompt_ids, prompt_att = pad_right(prompts, pad_id)  # [P, Wp]
    prompt_att = prompt_att.to(device)
    rows = torch.tensor(owner, device=device)
    last = torch.tensor([len(p) - 1 for p in prompts], device=device)  # each prompt's position predicting token 0
    kept = torch.unique(last)  # sorted
    keeps = takes_logits_to_keep(model)
    first = model(input_ids=prompt_ids.to(device), attention_mask=prompt_att, use_cache=True,
                  **({"logits_to_keep": kept} if keeps else {}))
    column = torch.searchsorted(kept, last) if keeps else last
    logits = first.logits[rows, column[rows]].unsqueeze(1)  # [B, 1, V]
    ids = torch.full((len(items), width), pad_id, dtype=torch.long)
    for b, it in enumerate(items):
        ids[b, :len(it.ids)] = torch.tensor(it.ids, dtype=torch.long)
    ids = ids.to(device)
    if width > 1:  # tokens 0 .. Wc−2 predict tokens 1 .. Wc−1, after the prompt's cache
        cache = _output_cache(first)
        cache.batch_select_indices(rows)
        rest = model(input_ids=ids[:, :-1], attention_mask=torch.cat([prompt_att[rows], mask[:, :-1].long()], 1),
                     position_ids=(last + 1)[rows, None] + torch.arange(width - 1, device=device)[None],
                     use_cache=True, **{_cache_keyword(model): cache})
        if cache.get_seq_length() != prompt_ids.shape[1] + width - 1:  # a model that ignored the cache
            raise RuntimeError(f"train.share_prompts: {type(model).__name__} did not extend the prompts' KV cache; "
                               "set train.share_prompts: false")
        logits = torch.cat([logits, rest.logits], 1)  # [B, Wc, V]
    logp = token_logprobs(logits, ids) * mask
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = entropy_from_logits(logits.detach()) * mask
    return logp, mask, entropy


def prompt_group_batches(items: Sequence[Tokens], max_tokens: int | None,
                         max_rows: int | None = None) -> list[list[int]]:
    """Indices into ``items`` in micro-batches that keep rows of one prompt together, each at most
    ``max_tokens`` of this module's padded tokens (distinct prompts × longest prompt + rows ×
    longest completion) and ``max_rows`` rows; every index exactly once. Everything in one
    micro-batch when it fits (in order); otherwise prompt groups longest first, a group split only
    where it alone exceeds a limit (a row over the budget alone is a micro-batch of one). ``None``: no limit."""
    n = len(items)
    if n == 0:
        return []
    cap = max_rows if max_rows is not None else n
    _, key = _distinct_prompts(items)
    prompt_len = [len(it.prompt_ids) for it in items]
    completion_len = [max(1, len(it.ids)) for it in items]
    groups: dict[int, list[int]] = {}
    for i, k in enumerate(key):
        groups.setdefault(k, []).append(i)
    order = sorted(groups.values(), key=lambda g: -max(prompt_len[i] + completion_len[i] for i in g))

    def fits(rows: list[int]) -> bool:
        if len(rows) > cap:
            return False
        prompts = {key[i] for i in rows}
        padded = len(prompts) * max(prompt_len[i] for i in rows) + len(rows) * max(completion_len[i] for i in rows)
        return max_tokens is None or padded <= max_tokens

    if fits(list(range(n))):
        return [list(range(n))]
    out: list[list[int]] = []
    current: list[int] = []
    for group in order:
        if current and not fits(current + group) and fits(group):
            out.append(current)  # the group fits a micro-batch of its own: do not split it
            current = []
        for i in group:
            if current and not fits(current + [i]):
                out.append(current)
                current = []
            current.append(i)
    out.append(current)
    return out


def _distinct_prompts(items: Sequence[Tokens]) -> tuple[list[list[int]], list[int]]:
    """The distinct prompts in order of first appearance, and each item's index into them."""
    index: dict[tuple[int, ...], int] = {}
    owner = [index.setdefault(tuple(it.prompt_ids), len(index)) for it in items]
    return [list(p) for p in index], owner


def _base(model: Any) -> Any:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _checkpointed(model: Any) -> bool:
    """Gradient checkpointing on, in training: transformers then drops the layers' cache."""
    return any(getattr(m, "gradient_checkpointing", False) is True for m in _base(model).modules())


def reads_prompts_once(model: Any) -> bool:
    """Whether :func:`shared_prompt_logprobs` reads ``model``'s policy log-probs with each prompt once
    (False: gradient checkpointing is on, and it reads every row whole, the plain way); micro-batches
    must then be counted the way it reads them (:func:`prompt_group_batches`, else the plain split)."""
    return not _checkpointed(model)


def _cache_keyword(model: Any) -> str:
    """``cache`` where the model's forward names it (transformers ≥ 5.25), else ``past_key_values``."""
    return _forward_cache_keyword(type(_base(model)))  # type: ignore[arg-type]


@functools.cache
def _forward_cache_keyword(cls: type[Any]) -> str:
    try:
        return "cache" if "cache" in inspect.signature(cls.forward).parameters else "past_key_values"
    except (TypeError, ValueError, AttributeError):
        return "past_key_values"


def _output_cache(output: Any) -> Any:
    cache = getattr(output, "cache", None)
    if cache is None:
        cache = getattr(output, "past_key_values", None)
    if cache is None:
        raise RuntimeError("train.share_prompts: the model returned no KV cache for the prompts; "
                           "set train.share_prompts: false")
    return cache

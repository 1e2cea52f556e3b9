"""Forward passes of a causal LM over right-padded batches, in bounded-memory micro-batches.

The update (algorithms/update.py), evaluation's feedback sensitivity (evaluate.py) and the
learned value's features (algorithms/value.py) all read a model the same way: token-id
sequences are right-padded into ``[B, L]`` batches, and a step's sequences are split into
micro-batches of at most ``max_tokens`` padded tokens (rows × longest row) so that activation
memory is bounded by the budget, not by the step's batch size.

Shape letters: B rows in a batch, L padded length, H hidden size, V vocabulary.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar, cast

import torch

from mlmt_bench.models.tensor_ops import entropy_from_logits, token_logprobs


class Tokens(Protocol):
    """A conversation to read: context ``prompt_ids`` followed by the scored ``ids``."""

    prompt_ids: list[int]
    ids: list[int]


_T = TypeVar("_T")


def model_device(model: Any) -> torch.device:
    return next(model.parameters()).device


def micro_batches(lengths: Sequence[int], max_tokens: int | None, max_rows: int | None = None) -> list[list[int]]:
    """Indices into ``lengths`` grouped into micro-batches, each at most ``max_tokens`` padded
    tokens (rows × its longest row) and at most ``max_rows`` rows; every index exactly once.

    When everything fits in one micro-batch it is ``[0, 1, ..., n-1]`` (today's one-shot
    batch, in order). Otherwise rows are taken longest first, so each micro-batch pads to
    rows of similar length (less padding, fewer wasted tokens); a row longer than
    ``max_tokens`` on its own is a micro-batch of one. ``None`` means no limit.
    """
    n = len(lengths)
    if n == 0:
        return []
    rows_cap = max_rows if max_rows is not None else n
    if n <= rows_cap and (max_tokens is None or n * max(lengths) <= max_tokens):
        return [list(range(n))]
    out: list[list[int]] = []
    current: list[int] = []
    for i in sorted(range(n), key=lambda j: -lengths[j]):  # stable: ties keep their order
        # descending order: the first row of a micro-batch is its longest
        fits = max_tokens is None or (len(current) + 1) * lengths[current[0] if current else i] <= max_tokens
        if current and (not fits or len(current) >= rows_cap):
            out.append(current)
            current = []
        current.append(i)
    out.append(current)
    return out


def split(items: Sequence[_T], length: Callable[[_T], int], max_tokens: int | None,
          max_rows: int | None = None) -> list[list[_T]]:
    """:func:`micro_batches` applied to ``items`` (``length(item)`` tokens each)."""
    return [[items[i] for i in mb] for mb in micro_batches([length(it) for it in items], max_tokens, max_rows)]


def seq_len(item: Tokens) -> int:
    return len(item.prompt_ids) + len(item.ids)


def pad_right(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``input_ids [B, L]`` (``pad_id`` after each sequence) and ``attention [B, L]`` (1 on real tokens)."""
    length = max(len(s) for s in seqs)
    input_ids = torch.full((len(seqs), length), pad_id, dtype=torch.long)
    attention = torch.zeros((len(seqs), length), dtype=torch.long)
    for b, s in enumerate(seqs):
        input_ids[b, :len(s)] = torch.tensor(list(s), dtype=torch.long)
        attention[b, :len(s)] = 1
    return input_ids, attention


def padded_batch(items: Sequence[Tokens], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids [B, L]``, ``attention [B, L]`` and the trained-token mask ``[B, L-1]``.

    The mask is aligned with next-token predictions: ``mask[b, j]`` marks whether input token
    ``j + 1`` of row ``b`` was generated (and is trained on).
    """
    input_ids, attention = pad_right([it.prompt_ids + it.ids for it in items], pad_id)
    mask = torch.zeros((len(items), input_ids.shape[1] - 1), dtype=torch.bool)
    for b, it in enumerate(items):
        mask[b, len(it.prompt_ids) - 1:seq_len(it) - 1] = True
    return input_ids, attention, mask


def sequence_logprobs(model: Any, items: Sequence[Tokens], pad_id: int, *, with_entropy: bool = False,
                      reference: Any = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs ``[B, L-1-s]`` of the trained ids, the matching slice of the mask from
    :func:`padded_batch` (and the entropy if asked), where ``s + 1`` is the shortest prompt:
    positions before it predict only prompt tokens in every row.

    The LM head runs only on the positions kept (``logits_to_keep``, as TRL does), which saves
    ``[B, s, V]`` of logits: a long shared context times a 150k vocabulary is most of the
    activation memory of a real model's update. A model that ignores the argument gives the
    same result, sliced afterwards.

    ``reference``: a callable ``(**inputs) -> logits`` used instead of ``model`` (π_ref).
    """
    input_ids, attention, mask = padded_batch(items, pad_id)
    start = min(len(it.prompt_ids) for it in items) - 1  # first position whose prediction is trained
    keep = input_ids.shape[1] - start
    device = model_device(model)
    inputs: dict[str, Any] = dict(input_ids=input_ids.to(device), attention_mask=attention.to(device))
    if takes_logits_to_keep(model):
        inputs["logits_to_keep"] = keep
    logits = reference(**inputs) if reference is not None else model(**inputs).logits
    logits = logits[:, -keep:-1]  # [B, keep-1]: predictions of tokens start+1 .. L-1
    logp = token_logprobs(logits, inputs["input_ids"][:, start + 1:])
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = entropy_from_logits(logits.detach())
    return logp, mask[:, start:].to(device), entropy


def completion_logits(model: Any, items: Sequence[Tokens], pad_id: int,
                      prompts: Sequence[list[int]] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Next-token logits at the positions that predict each item's ``ids``, aligned at the start
    of the completion: ``[B, Tc, V]`` and its mask ``[B, Tc]`` (Tc the longest completion).

    ``prompts`` replaces each item's ``prompt_ids`` as context (a teacher's context for the same
    completion tokens); the logits then describe the same tokens under another conditioning.
    """
    contexts = [list(p) for p in (prompts if prompts is not None else [it.prompt_ids for it in items])]
    input_ids, attention = pad_right([c + it.ids for c, it in zip(contexts, items)], pad_id)
    device = model_device(model)
    logits = model(input_ids=input_ids.to(device), attention_mask=attention.to(device)).logits
    width = max(len(it.ids) for it in items)
    out = logits.new_zeros((len(items), width, logits.shape[-1]))
    mask = torch.zeros((len(items), width), dtype=torch.bool, device=device)
    for b, (c, it) in enumerate(zip(contexts, items)):
        n = len(it.ids)
        out[b, :n] = logits[b, len(c) - 1:len(c) - 1 + n]
        mask[b, :n] = True
    return out, mask


@torch.no_grad()
def sequence_logprob_sums(model: Any, items: Sequence[Tokens], pad_id: int, max_tokens: int | None) -> list[float]:
    """``log π(ids | prompt_ids)`` summed over each item's ids, in the order of ``items``
    (micro-batched by ``max_tokens``)."""
    out = [0.0] * len(items)
    for mb in micro_batches([seq_len(it) for it in items], max_tokens):
        logp, mask, _ = sequence_logprobs(model, [items[i] for i in mb], pad_id)
        for i, s in zip(mb, (logp * mask).sum(dim=1).tolist()):
            out[i] = s
    return out


@torch.no_grad()
def last_hidden_states(model: Any, pad_id: int, contexts: Sequence[list[int]],
                       max_tokens: int | None = None, spans: Sequence[tuple[int, int]] | None = None) -> torch.Tensor:
    """``[F, H]`` float32 (CPU) last-layer hidden state at the last token of each context, in
    the order of ``contexts`` (micro-batched by ``max_tokens``).

    ``spans``: one ``(start, end)`` token range per context (``0 <= start < end <= len``); then
    ``[F, 2H]``: the last token's state followed by the mean of the states over the span (the
    learned value's ``feedback_pool`` features: the span is the feedback message)."""
    if spans is not None and len(spans) != len(contexts):
        raise ValueError(f"need one span per context, got {len(spans)} for {len(contexts)}")
    device = model_device(model)
    rows: list[torch.Tensor | None] = [None] * len(contexts)
    for mb in micro_batches([len(c) for c in contexts], max_tokens):
        ids, att = pad_right([contexts[i] for i in mb], pad_id)
        inputs = dict(input_ids=ids.to(device), attention_mask=att.to(device), output_hidden_states=True)
        if takes_logits_to_keep(model):
            inputs["logits_to_keep"] = 1  # the logits are not used: skip the [B, L, V] LM head
        out = model(**inputs)
        states = out.hidden_states[-1]  # [B, L, H]
        last = torch.tensor([len(contexts[i]) - 1 for i in mb], device=device)
        h = states[torch.arange(len(mb), device=device), last].float()
        if spans is not None:
            pos = torch.arange(states.shape[1], device=device)
            lo = torch.tensor([spans[i][0] for i in mb], device=device)
            hi = torch.tensor([spans[i][1] for i in mb], device=device)
            if bool(((lo < 0) | (hi <= lo) | (hi > last + 1)).any()):
                raise ValueError(f"a span is empty or outside its context: {[spans[i] for i in mb]}")
            inside = ((pos[None, :] >= lo[:, None]) & (pos[None, :] < hi[:, None])).to(states.dtype)  # [B, L]
            pooled = (states * inside[:, :, None]).sum(1) / inside.sum(1, keepdim=True)
            h = torch.cat([h, pooled.float()], dim=1)
        h = h.cpu()
        for k, i in enumerate(mb):
            rows[i] = h[k]
    return torch.stack(cast(list[torch.Tensor], rows))  # every row set: the micro-batches cover all contexts


def takes_logits_to_keep(model: Any) -> bool:
    """Whether ``model.forward`` names ``logits_to_keep`` (transformers' causal LMs; a peft
    wrapper passes it through to its base model)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    # mypy checks a class object against Hashable with the unbound object.__hash__ and refuses it; classes hash
    return _forward_names_logits_to_keep(type(base))  # type: ignore[arg-type]


@functools.cache
def _forward_names_logits_to_keep(cls: type[Any]) -> bool:
    """Per model class, once: this runs on every micro-batch."""
    try:
        return "logits_to_keep" in inspect.signature(cls.forward).parameters
    except (TypeError, ValueError, AttributeError):
        return False

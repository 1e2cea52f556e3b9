"""Compute accounting in FLOPs (METHOD.md v2, "Metrics": cost).

Every token every model processes is counted, with ``P`` the parameters of the model that ran
(attention's sequence-length term is ignored, as in the usual 2·P / 6·P estimates):

- a generated sequence costs ``2·P·(prompt + generated)``: the prompt once, as prefill, and one
  forward pass per generated token;
- a trained sequence costs ``6·P·(prompt + completion)``: forward and backward over the whole
  sequence, prompt included;
- every extra forward pass (old or reference log-probs, value-model features) costs
  ``2·P·tokens`` over the tokens it reads.

Token counts are integers ≥ 0; results are FLOPs as floats.
"""

from __future__ import annotations


def _check(params: int, *tokens: int) -> None:
    if params < 0 or any(t < 0 for t in tokens):
        raise ValueError(f"params and token counts must be non-negative, got {params}, {tokens}")


def generation_flops(params: int, prompt_tokens: int, generated_tokens: int) -> float:
    """FLOPs of sampling: ``2·P·(prompt + generated)`` (token counts summed over sequences)."""
    _check(params, prompt_tokens, generated_tokens)
    return 2.0 * params * (prompt_tokens + generated_tokens)


def training_flops(params: int, sequence_tokens: int) -> float:
    """FLOPs of a forward + backward over ``sequence_tokens`` (prompt + completion): ``6·P·tokens``."""
    _check(params, sequence_tokens)
    return 6.0 * params * sequence_tokens


def forward_flops(params: int, tokens: int) -> float:
    """FLOPs of one extra forward pass over ``tokens`` (old / reference log-probs, value features)."""
    _check(params, tokens)
    return 2.0 * params * tokens

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

The same count prices test time (METHOD v4, "Budgets that are budgets"): an evaluation's turns
(attempt, feedback, refinement) cost :func:`rollout_flops` of its tokens per role, reported per
problem beside the training FLOPs.
"""

from __future__ import annotations

from collections.abc import Mapping


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


def rollout_flops(params: Mapping[str, int], prompt_tokens: Mapping[str, int],
                  generated_tokens: Mapping[str, int]) -> float:
    """FLOPs of a rollout's generation: ``Σ_role 2·P_role·(prompt_role + generated_role)``.

    params: role ("solver", "critic") -> parameters of the model that played it; prompt_tokens,
    generated_tokens: role -> tokens over all its sequences (``Rollout.prompt_tokens`` /
    ``gen_tokens``). A role that generated nothing (rule-written feedback) costs nothing, whatever
    its prompt count; a role that generated tokens needs its ``params``."""
    total = 0.0
    for role, n in sorted(generated_tokens.items()):
        if n:
            if role not in params:
                raise ValueError(f"no parameter count for role {role!r}, which generated {n} tokens")
            total += generation_flops(params[role], prompt_tokens.get(role, 0), n)
    return total

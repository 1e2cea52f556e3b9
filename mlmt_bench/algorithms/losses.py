"""Policy-loss variants and importance ratios as small registered pure functions (verl style).

:func:`mlmt_bench.algorithms.core.policy_loss_terms` computes the masked log-ratio, reduces it by
the ratio registered under the params' ``ratio`` (:data:`RATIOS`), and hands ``ρ = exp(·)`` to
the loss registered under the params' ``loss`` (:data:`POLICY_LOSSES`); ``LossParams`` validates
both names against these tables (with a did-you-mean). A new variant is therefore its function
here, its ``@register_policy_loss("name")`` line and its test: the params, ``LossTerms``, the
update's ``LossConfig`` and its call pass the name, and the variant's own options
(``algorithm.params.loss_options``), through unchanged. A test or a plugin can register one from
outside the package the same way.

A policy loss is ``fn(logp, ratio, advantages, mask, *, <its options, each with a default>)``:

    logp:       [B, T] log π_θ of the sampled tokens (nats), carries the gradient.
    ratio:      [B, T] the importance ratio ρ (from :data:`RATIOS`), 1 outside the mask; carries
                the gradient through logp (detach it where the variant stops it).
    advantages: [B, 1] one advantage per sequence (detached, logp's dtype), broadcast over tokens.
    mask:       [B, T] bool, True on trained tokens.
    returns:    (per_token [B, T], anything outside the mask is ignored (the caller zeroes it);
                 clipped [B, T] bool: tokens whose gradient the variant's clip removed, for
                 ``clip_frac``).

Its options are keyword-only with defaults; the shared ones (``clip_low``, ``clip_high``,
``cispo_max``, the params' own fields) are passed to the variants that declare them, any other
comes from ``loss_options``. A ratio is ``fn(log_ratio, mask) -> log_ratio``, both [B, T] float
(``mask`` 0/1 in log_ratio's dtype; log_ratio is 0 outside it).

Light module: no torch import (the functions use tensor methods only), so that ``params.py``,
pydantic only, can read the names.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from mlmt_bench.io.bounded_input import did_you_mean
from mlmt_bench.registry import unknown_message

if TYPE_CHECKING:
    from torch import Tensor

PolicyLoss = Callable[..., "tuple[Tensor, Tensor]"]
Ratio = Callable[["Tensor", "Tensor"], "Tensor"]
LossT = TypeVar("LossT", bound=PolicyLoss)
RatioT = TypeVar("RatioT", bound=Ratio)
V = TypeVar("V")

#: name -> policy loss (see the module docstring for the signature)
POLICY_LOSSES: dict[str, PolicyLoss] = {}
#: name -> ratio reduction of the per-token log-ratio
RATIOS: dict[str, Ratio] = {}
#: options every variant may declare, set by the params' own fields rather than ``loss_options``
SHARED_OPTIONS = ("clip_low", "clip_high", "cispo_max")
#: CISPO's cap on the importance weight, ε_max (unitless): the default of ``cispo_max``, written here once
CISPO_MAX = 5.0
#: γ of policy shaping, π / (π + γ), of off-policy (SHAPED) rows (Critique-GRPO's; unitless): the
#: default of ``shaping_gamma``, written here once
SHAPING_GAMMA = 0.1

_INPUTS = ("logp", "ratio", "advantages", "mask")


def register_policy_loss(name: str, *, overwrite: bool = False) -> Callable[[LossT], LossT]:
    """Decorator: register ``fn`` as the policy loss ``name`` (``loss: name`` in the params).

    The function must take the four tensors positionally and every option keyword-only with a
    default (so that the params can check ``loss_options`` against them); TypeError otherwise."""

    def decorate(fn: LossT) -> LossT:
        _check_signature(name, fn)
        if name in POLICY_LOSSES and not overwrite:
            raise ValueError(f"policy loss {name!r} is already registered")
        POLICY_LOSSES[name] = fn
        return fn

    return decorate


def register_ratio(name: str, *, overwrite: bool = False) -> Callable[[RatioT], RatioT]:
    """Decorator: register ``fn(log_ratio, mask) -> log_ratio`` as the ratio ``name``."""

    def decorate(fn: RatioT) -> RatioT:
        if name in RATIOS and not overwrite:
            raise ValueError(f"ratio {name!r} is already registered")
        RATIOS[name] = fn
        return fn

    return decorate


def _check_signature(name: str, fn: Callable[..., object]) -> None:
    params = list(inspect.signature(fn).parameters.values())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    bad = [p.name for p in params if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
           or (p.kind == p.KEYWORD_ONLY and p.default is p.empty)]
    if len(positional) != len(_INPUTS) or bad:
        raise TypeError(f"policy loss {name!r}: expected fn({', '.join(_INPUTS)}, *, option=default, ...), "
                        f"got {fn.__name__}{inspect.signature(fn)}")


def options_of(name: str) -> tuple[str, ...]:
    """The keyword-only options of the policy loss ``name``."""
    return tuple(p.name for p in inspect.signature(policy_loss(name)).parameters.values()
                 if p.kind == p.KEYWORD_ONLY)


def _lookup(table: dict[str, V], what: str, name: str) -> V:
    if name not in table:
        raise ValueError(unknown_message(what, name, list(table)))
    return table[name]


def policy_loss(name: str) -> PolicyLoss:
    """The policy loss registered as ``name``; ValueError with a did-you-mean otherwise."""
    return _lookup(POLICY_LOSSES, "loss", name)


def ratio_of(name: str) -> Ratio:
    """The ratio registered as ``name``; ValueError with a did-you-mean otherwise."""
    return _lookup(RATIOS, "ratio", name)


def check_options(name: str, options: dict[str, float]) -> None:
    """ValueError unless every key of ``options`` is an option of the policy loss ``name`` that is
    not one of the params' own fields (:data:`SHARED_OPTIONS`)."""
    declared = options_of(name)
    own = [o for o in declared if o not in SHARED_OPTIONS]
    for key in options:
        if key in SHARED_OPTIONS:
            raise ValueError(f"{key!r} is a parameter of its own: set {key}, not loss_options.{key}")
        if key not in own:
            shared = did_you_mean(key, SHARED_OPTIONS)
            hint = did_you_mean(key, own) or (shared and shared[:-1] + " (a parameter of its own)?")
            raise ValueError(f"{key!r} is not an option of loss {name!r}{hint} "
                             f"(its options: {', '.join(own) or 'none'})")


# --------------------------------------------------------------------------- ratios


@register_ratio("token")
def token_ratio(log_ratio: Tensor, mask: Tensor) -> Tensor:
    """ρ_t = π_θ / π_old per token: the log-ratio as it is."""
    return log_ratio


@register_ratio("sequence")
def sequence_ratio(log_ratio: Tensor, mask: Tensor) -> Tensor:
    """GSPO: one length-normalised ratio per sequence, exp(mean_t log ρ_t), on each of its tokens."""
    seq = (log_ratio * mask).sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1.0)
    return seq.expand_as(log_ratio)


# --------------------------------------------------------------------------- policy losses


@register_policy_loss("clip")
def clip_loss(logp: Tensor, ratio: Tensor, advantages: Tensor, mask: Tensor, *, clip_low: float = 0.2,
              clip_high: float = 0.2) -> tuple[Tensor, Tensor]:
    """PPO / GRPO: −min(ρ·A, clip(ρ, 1 − ε_low, 1 + ε_high)·A); asymmetric ε is DAPO's clip-higher.
    Clipped: ρ < 1 − ε_low with A < 0, or ρ > 1 + ε_high with A > 0."""
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * advantages
    return -unclipped.minimum(clipped), clipped < unclipped


@register_policy_loss("cispo")
def cispo_loss(logp: Tensor, ratio: Tensor, advantages: Tensor, mask: Tensor, *,
               cispo_max: float = CISPO_MAX) -> tuple[Tensor, Tensor]:
    """CISPO: −sg[min(ρ, ε_max)]·A·log π_θ; the weight is capped and stop-gradiented, so no token
    leaves the gradient. Clipped: the weight capped with A > 0."""
    return -ratio.clamp(max=cispo_max).detach() * advantages * logp, (ratio > cispo_max) & (advantages > 0)

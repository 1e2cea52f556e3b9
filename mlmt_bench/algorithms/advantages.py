"""Advantage estimators as small registered pure functions (verl style), as :mod:`losses` does for
the policy losses.

An algorithm's credit computes the rewards of one kind of turn and asks the estimator that the
params name for the role (``advantage``, :meth:`LossParams.advantage_of`) for their advantages;
``LossParams`` checks the names against :data:`ADVANTAGES` (with a did-you-mean). A new estimator is
its function here, its ``@register_advantage("name")`` line and its test; a test or a plugin can
register one from outside the package the same way.

An estimator is ``fn(rewards, group_ids, *, eps=...)``:

    rewards:   [N] float rewards of one kind of turn (reward units), e.g. the G attempts of every
               problem of a step.
    group_ids: [N] long; siblings (turns that share a parent context) share an id; ids need not be
               contiguous.
    eps:       added to a standard deviation before dividing by it (reward units; ignored by the
               estimators that divide by none).
    returns:   [N] float advantages in ``rewards``' dtype, treated as constants by the loss.

The group-relative estimators give exactly 0 to a sibling group whose rewards are all equal
(singletons included): its relative signal is nil, and float rounding in a mean must not leave a
1e-17 that a flat group would train on (METHOD.md: zero-variance groups contribute no gradient).
``reinforce_plus_plus`` normalises over the whole batch instead, so a flat group there still
carries the batch's signal, as in REINFORCE++.

Light module: no torch import (tensor methods only), so that ``params.py``, pydantic only, can read
the names without loading torch.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from mlmt_bench.registry import unknown_message

if TYPE_CHECKING:
    from torch import Tensor

Estimator = Callable[..., "Tensor"]
EstimatorT = TypeVar("EstimatorT", bound=Estimator)

#: name -> advantage estimator (see the module docstring for the signature)
ADVANTAGES: dict[str, Estimator] = {}
#: the estimator of each legacy ``scale`` (METHOD.md "Shared pieces": ``scale: none`` is Dr.GRPO)
SCALE_ESTIMATORS = {"std": "grpo", "none": "dr_grpo"}
#: ε added to a standard deviation before dividing by it (reward units)
EPS = 1e-6

_INPUTS = ("rewards", "group_ids")


def register_advantage(name: str, *, overwrite: bool = False) -> Callable[[EstimatorT], EstimatorT]:
    """Decorator: register ``fn`` as the advantage estimator ``name`` (``advantage: name`` in the
    params). It must take the two tensors positionally and ``eps`` keyword-only with a default;
    TypeError otherwise."""

    def decorate(fn: EstimatorT) -> EstimatorT:
        kinds = [(p.kind, p.name, p.default is p.empty) for p in inspect.signature(fn).parameters.values()]
        positional = [k for k in kinds if k[0] in (inspect.Parameter.POSITIONAL_ONLY,
                                                   inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        if len(positional) != len(_INPUTS) or kinds[len(_INPUTS):] != [(inspect.Parameter.KEYWORD_ONLY, "eps", False)]:
            raise TypeError(f"advantage {name!r}: expected fn(rewards, group_ids, *, eps=...), "
                            f"got {fn.__name__}{inspect.signature(fn)}")
        if name in ADVANTAGES and not overwrite:
            raise ValueError(f"advantage {name!r} is already registered")
        ADVANTAGES[name] = fn
        return fn

    return decorate


def estimator(name: str) -> Estimator:
    """The estimator registered as ``name``; ValueError with a did-you-mean otherwise."""
    if name not in ADVANTAGES:
        raise ValueError(unknown_message("advantage", name, list(ADVANTAGES)))
    return ADVANTAGES[name]


# --------------------------------------------------------------------------- groups


def check_same_length(rewards: Tensor, group_ids: Tensor) -> None:
    """ValueError unless ``rewards`` and ``group_ids`` are both 1-D [N] of the same length."""
    if rewards.dim() != 1 or rewards.shape != group_ids.shape:
        raise ValueError(
            f"rewards and group_ids must both be 1-D of the same length, "
            f"got {tuple(rewards.shape)} and {tuple(group_ids.shape)}"
        )


def dense_groups(group_ids: Tensor) -> tuple[Tensor, int]:
    """Map arbitrary integer group ids [N] to dense indices [N] in [0, G) and return G."""
    if group_ids.dim() != 1:
        raise ValueError(f"group_ids must be 1-D [N], got shape {tuple(group_ids.shape)}")
    _, inverse = group_ids.unique(return_inverse=True)
    num_groups = int(inverse.max().item()) + 1 if inverse.numel() else 0
    return inverse, num_groups


def zero_std_mask(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """Which samples sit in a group whose rewards are all equal (no gradient signal).

    rewards: [N] float; group_ids: [N] long.
    returns: [N] bool, True where the sample's group has max == min (singletons included).
    """
    check_same_length(rewards, group_ids)
    idx, g = dense_groups(group_ids)
    hi = rewards.new_full((g,), float("-inf")).scatter_reduce(0, idx, rewards, reduce="amax", include_self=True)
    lo = rewards.new_full((g,), float("inf")).scatter_reduce(0, idx, rewards, reduce="amin", include_self=True)
    return (hi == lo)[idx]


def _group_sums(rewards: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dense ids [N], per-group zeros [G], member counts [G], reward sums [G])."""
    check_same_length(rewards, group_ids)
    idx, g = dense_groups(group_ids)
    zeros = rewards.new_zeros(g)
    counts = zeros.index_add(0, idx, rewards.new_ones(rewards.shape))
    return idx, zeros, counts, zeros.index_add(0, idx, rewards)


def _no_group_signal(adv: Tensor, rewards: Tensor, group_ids: Tensor, counts: Tensor) -> Tensor:
    """``adv`` [N] with exactly 0 for the members of singleton and zero-variance groups (``counts``
    [N]: the size of each sample's group)."""
    return adv.masked_fill((counts < 2) | zero_std_mask(rewards, group_ids), 0.0)


# --------------------------------------------------------------------------- estimators


@register_advantage("grpo")
def grpo(rewards: Tensor, group_ids: Tensor, *, eps: float = EPS) -> Tensor:
    """GRPO's group-standardised advantage A_i = (r_i − mean_g) / (std_g + ε) (METHOD.md "Shared
    pieces"; the default). std_g is the group's *sample* standard deviation (ddof = 1, as
    ``torch.std`` in TRL and verl). Unitless."""
    idx, zeros, counts, sums = _group_sums(rewards, group_ids)
    centred = rewards - (sums / counts)[idx]
    std = (zeros.index_add(0, idx, centred * centred) / (counts - 1).clamp(min=1)).sqrt()
    return _no_group_signal(centred / (std[idx] + eps), rewards, group_ids, counts[idx])


@register_advantage("dr_grpo")
def dr_grpo(rewards: Tensor, group_ids: Tensor, *, eps: float = EPS) -> Tensor:
    """Dr.GRPO (arXiv 2503.20783): the group mean alone is subtracted, A_i = r_i − mean_g, without
    GRPO's division by the std (which weighs near-flat groups up). Reward units."""
    idx, _, counts, sums = _group_sums(rewards, group_ids)
    return _no_group_signal(rewards - (sums / counts)[idx], rewards, group_ids, counts[idx])


@register_advantage("rloo")
def rloo(rewards: Tensor, group_ids: Tensor, *, eps: float = EPS) -> Tensor:
    """RLOO (Kool et al. 2019; Ahmadian et al., arXiv 2402.14740): each sample's baseline is the mean
    of its n − 1 siblings, A_i = r_i − (S_g − r_i) / (n_g − 1) = n_g / (n_g − 1) · (r_i − mean_g),
    an unbiased baseline (it does not depend on r_i). Reward units. A singleton gets 0 (verl gives
    it its raw reward: no baseline exists; here it carries no relative signal, as in ``grpo``)."""
    idx, _, counts, sums = _group_sums(rewards, group_ids)
    n = counts[idx]
    return _no_group_signal(rewards - (sums[idx] - rewards) / (n - 1).clamp(min=1), rewards, group_ids, n)


@register_advantage("reinforce_plus_plus")
def reinforce_plus_plus(rewards: Tensor, group_ids: Tensor, *, eps: float = EPS) -> Tensor:
    """REINFORCE++ (arXiv 2501.03262): no group baseline; the rewards are normalised over the whole
    batch, A_i = (r_i − mean) / (std + ε), mean and sample std (ddof = 1) over all N samples;
    ``group_ids`` are not read (beyond their shape). Unitless; 0 for N < 2 or a flat batch.

    verl whitens per token (a sequence weighs by its length) with rsqrt(var + 1e-8) and puts the KL
    into the reward; here the advantage is per sequence, each counts once, the ε is the one ``grpo``
    adds to its std, and the KL stays in the loss (``beta``)."""
    check_same_length(rewards, group_ids)
    if rewards.numel() < 2:
        return rewards.new_zeros(rewards.shape)
    adv = (rewards - rewards.mean()) / (rewards.std() + eps)
    return adv.masked_fill(rewards.amax() == rewards.amin(), 0.0)

"""Statistics for comparing methods on the same problems (METHOD.md "Metrics").

Numpy only and seeded: the same inputs and seed give the same intervals on every
machine. Values are per-problem scores (e.g. 0/1 correctness) unless said otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

_MAX_BOOT_CHUNK = 4_000_000  # resampled indices held in memory at once (~32 MB of int64)


def _as_1d(values, name: str) -> np.ndarray:
    arr = np.asarray(values, dtype=float)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} is empty")
    return arr


def bootstrap_ci(
    values: Sequence[float] | np.ndarray,
    n_boot: int = 2000,
    alpha: float = 0.05,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Percentile bootstrap confidence interval of the mean over problems.

    values: [N] per-problem scores. n_boot: bootstrap resamples (each draws N problems
    with replacement). alpha: 0.05 gives a 95% interval. seed: numpy Generator seed.
    returns: (mean of values, lo, hi) with lo/hi the alpha/2 and 1 - alpha/2 quantiles
             (numpy's default linear interpolation) of the resampled means, same units
             as values.
    """
    x = _as_1d(values, "values")
    if n_boot < 1 or not 0 < alpha < 1:
        raise ValueError(f"need n_boot >= 1 and 0 < alpha < 1, got {n_boot}, {alpha}")
    rng = np.random.default_rng(seed)
    n = x.size
    rows = max(1, _MAX_BOOT_CHUNK // n)
    means = np.empty(n_boot)
    for start in range(0, n_boot, rows):
        stop = min(n_boot, start + rows)
        idx = rng.integers(0, n, size=(stop - start, n))
        means[start:stop] = x[idx].mean(axis=1)
    lo, hi = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return float(x.mean()), float(lo), float(hi)


def paired_bootstrap_diff(
    a: Sequence[float] | np.ndarray,
    b: Sequence[float] | np.ndarray,
    n_boot: int = 2000,
    alpha: float = 0.05,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Bootstrap CI of mean(a - b) where a[i], b[i] are two methods' scores on problem i.

    Resampling problems (pairs kept together) is the same as bootstrapping the per-problem
    differences, which is what this does. returns: (mean diff, lo, hi).
    """
    x, y = _as_1d(a, "a"), _as_1d(b, "b")
    if x.shape != y.shape:
        raise ValueError(f"a and b differ in length: {x.size} vs {y.size}")
    return bootstrap_ci(x - y, n_boot=n_boot, alpha=alpha, seed=seed)


def _as_bool(values, name: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.dtype != bool:
        if arr.size and not np.isin(arr, (0, 1)).all():
            raise ValueError(f"{name} must hold bools or 0/1")
        arr = arr.astype(bool)
    return arr


def mcnemar_exact(
    a_correct: Sequence[bool] | np.ndarray, b_correct: Sequence[bool] | np.ndarray
) -> dict[str, float | int]:
    """Exact McNemar test on paired per-problem correctness of methods a and b.

    returns: {"b": problems a got right and b got wrong,
              "c": problems a got wrong and b got right,
              "p_value": two-sided exact binomial p-value of min(b, c) under
                         Binomial(b + c, 1/2): min(1, 2 * P[X <= min(b, c)]); 1.0 when
                         there are no discordant pairs}.
    """
    x, y = _as_bool(a_correct, "a_correct"), _as_bool(b_correct, "b_correct")
    if x.shape != y.shape:
        raise ValueError(f"a_correct and b_correct differ in length: {x.size} vs {y.size}")
    b = int((x & ~y).sum())
    c = int((~x & y).sum())
    n = b + c
    if n == 0:
        return {"b": 0, "c": 0, "p_value": 1.0}
    k = min(b, c)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n  # exact integers, then one division
    return {"b": b, "c": c, "p_value": min(1.0, 2.0 * tail)}


def mean_std(values: Sequence[float] | np.ndarray) -> tuple[float, float | None]:
    """Mean and sample standard deviation (ddof=1) of one metric over seeds.

    returns: (mean, std); std is None for a single seed (undefined, not 0).
    """
    x = _as_1d(values, "values")
    if x.size == 1:
        return float(x[0]), None
    return float(x.mean()), float(x.std(ddof=1))


def tokens_to_reach(
    curve_tokens: Sequence[int] | np.ndarray,
    curve_acc: Sequence[float] | np.ndarray,
    target: float,
) -> int | None:
    """First generated-token count at which an eval curve reaches accuracy >= target.

    curve_tokens: [K] cumulative generated tokens at each evaluation, non-decreasing.
    curve_acc:    [K] accuracy at each evaluation.
    returns: curve_tokens[k] for the first k with curve_acc[k] >= target (no
             interpolation between points), or None if the curve never reaches it.
    """
    if len(curve_tokens) != len(curve_acc):
        raise ValueError(f"{len(curve_tokens)} token counts but {len(curve_acc)} accuracies")
    if any(b < a for a, b in zip(curve_tokens, curve_tokens[1:])):
        raise ValueError("curve_tokens must be non-decreasing (sort the curve by tokens)")
    for tokens, acc in zip(curve_tokens, curve_acc):
        if acc >= target:
            return int(tokens)
    return None

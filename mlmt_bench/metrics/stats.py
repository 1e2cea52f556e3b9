"""Statistics for comparing methods on the same problems (METHOD.md v2, "Statistics: the problem
is the unit").

Seeds repeat the same problems, so per-problem outcomes of different seeds are not independent
samples. Every interval and test here resamples or permutes *problems*: a method's per-problem
score is its mean over seeds (:func:`per_problem_means`), the 95% CI is a bootstrap over problems
(a problem keeps all its seeds: :func:`cluster_bootstrap_ci`), a paired comparison is the
per-problem difference of seed-averaged correctness with a sign-flip permutation test over
problems (:func:`sign_flip_test`), and McNemar is exact and per seed, never pooled over seeds.
"Tokens (or FLOPs) to reach" is per seed, interpolated (:func:`reach_point`).

Numpy only and seeded: the same inputs and seed give the same intervals on every machine. Not
scipy.stats: scipy is not a dependency of the core install (113 MB installed, only the tests use it,
as the reference these functions are checked against: tests/test_stats.py), and the reports need
nothing beyond the core; each function says what scipy's own would cost besides.
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

    ``scipy.stats.bootstrap(..., batch=same chunks, method="percentile")`` draws the same resamples
    (checked bit for bit), but its quantile level ``(1 - confidence_level) / 2`` is one ulp off
    ``alpha / 2``, which moves lo and hi in their last bits; kept so that a one-seed two-way interval
    (:func:`mlmt_bench.metrics.twoway.twoway_replicates`) stays this one bit for bit.
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

    The tail is summed in exact integers and divided once: ``scipy.stats.binomtest`` gives the same
    test in floating point, within 6e-14 relative but not bit for bit for 80,083 of the 90,600 pairs
    (b + c, min(b, c)) with b + c <= 600 (measured), and is a test-only dependency here.
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


def per_problem_means(rows: Sequence[dict[str, float]]) -> dict[str, float]:
    """``{problem: mean over seeds}`` from one ``{problem: score}`` mapping per seed; a problem
    missing from some seeds is averaged over the seeds that have it."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for row in rows:
        for pid, v in row.items():
            sums[pid] = sums.get(pid, 0.0) + float(v)
            counts[pid] = counts.get(pid, 0) + 1
    return {pid: sums[pid] / counts[pid] for pid in sums}


def cluster_bootstrap_ci(rows: Sequence[dict[str, float]], n_boot: int = 2000, alpha: float = 0.05,
                         seed: int = 0) -> tuple[float, float, float]:
    """95% CI of a method's accuracy by a bootstrap that resamples problems, each keeping all its seeds.

    rows: one ``{problem id: score}`` per seed (the same problems repeated). Resampling clusters
    of equal size (one per problem, every seed's outcome inside) gives the same resampled mean as
    resampling the per-problem seed means, which is what is computed.
    returns: (mean over seeds and problems, lo, hi).
    """
    return bootstrap_ci(list(per_problem_means(rows).values()), n_boot=n_boot, alpha=alpha, seed=seed)


def paired_problem_diff(a_rows: Sequence[dict[str, float]], b_rows: Sequence[dict[str, float]]) -> np.ndarray:
    """``[N]`` per-problem differences of seed-averaged scores, a − b, over the problems both have."""
    a, b = per_problem_means(a_rows), per_problem_means(b_rows)
    common = sorted(set(a) & set(b))
    return np.array([a[p] - b[p] for p in common], dtype=float)


def sign_flip_test(diffs: Sequence[float] | np.ndarray, n_perm: int = 20000, seed: int = 0,
                   exact_up_to: int = 16) -> float:
    """Two-sided p-value of a paired permutation (sign-flip) test of mean(diffs) = 0.

    Under the null the two methods are exchangeable on each problem, so each difference is as
    likely to carry either sign. With ``m`` non-zero differences (zeros flip to themselves), all
    ``2**m`` sign patterns are enumerated when ``m <= exact_up_to``; otherwise ``n_perm`` random
    ones are drawn and the p-value is ``(1 + #{|mean*| >= |mean|}) / (1 + n_perm)``.
    returns: p in (0, 1]; 1.0 when every difference is 0.

    ``scipy.stats.permutation_test(permutation_type="samples")`` enumerates the same exact p-values
    (tests/test_stats.py), but it draws its random sign patterns from another stream, so the
    committed reports' p-values (20,000 random flips over 500 problems) would change.
    """
    d = _as_1d(diffs, "diffs")
    nz = d[d != 0.0]
    if nz.size == 0:
        return 1.0
    observed = abs(d.sum())
    tol = 1e-12 * max(1.0, observed)
    if nz.size <= exact_up_to:
        signs = ((np.arange(2 ** nz.size)[:, None] >> np.arange(nz.size)) & 1) * 2 - 1
        stats = np.abs(signs @ nz)
        return float(np.mean(stats >= observed - tol))
    rng = np.random.default_rng(seed)
    hits = 0
    rows = max(1, _MAX_BOOT_CHUNK // nz.size)
    for start in range(0, n_perm, rows):
        k = min(rows, n_perm - start)
        signs = rng.integers(0, 2, size=(k, nz.size)) * 2 - 1
        hits += int((np.abs(signs @ nz) >= observed - tol).sum())
    return (1 + hits) / (1 + n_perm)


def reach_point(curve_x: Sequence[float] | np.ndarray, curve_y: Sequence[float] | np.ndarray,
                target: float) -> float | None:
    """Where an eval curve first reaches ``target``, linearly interpolated between evaluations.

    curve_x: [K] cumulative generated tokens (or FLOPs) at each evaluation, non-decreasing.
    curve_y: [K] accuracy at each evaluation.
    returns: ``curve_x[0]`` if the first evaluation is already at the target (the caller reports
    "at step 0", never "0 tokens"); else the interpolated x between the last evaluation below
    the target and the first at or above it; None if the curve never reaches it.
    """
    if len(curve_x) != len(curve_y):
        raise ValueError(f"{len(curve_x)} x values but {len(curve_y)} accuracies")
    if any(b < a for a, b in zip(curve_x, curve_x[1:])):
        raise ValueError("curve_x must be non-decreasing (sort the curve)")
    for k, (x, y) in enumerate(zip(curve_x, curve_y)):
        if y >= target:
            if k == 0:
                return float(x)
            x0, y0 = float(curve_x[k - 1]), float(curve_y[k - 1])
            return x0 + (target - y0) / (float(y) - y0) * (float(x) - x0)
    return None


def holm_adjust(p_values: Sequence[float] | np.ndarray) -> list[float]:
    """Holm (1979) step-down adjustment of the p-values of one family of tests (METHOD.md v3: the
    methods compared with one baseline).

    With the ``m`` p-values sorted ascending, ``p_(1) <= ... <= p_(m)``, the adjusted value of the
    ``i``-th is ``max_{j <= i} min(1, (m - j + 1) * p_(j))`` (the running maximum keeps the order);
    rejecting the tests whose adjusted p is below alpha controls the family-wise error rate at
    alpha under any dependence between the tests. Ties keep their input order.
    returns: the adjusted p-values in the input order; [] for no tests.

    Written here: scipy has no Holm adjustment (``false_discovery_control`` is Benjamini-Hochberg),
    and statsmodels' ``multipletests`` would be a heavy dependency for these few lines.
    """
    p = np.asarray(p_values, dtype=float)
    if p.ndim != 1:
        raise ValueError(f"p_values must be 1-D, got shape {p.shape}")
    if p.size == 0:
        return []
    if not np.isfinite(p).all() or (p < 0).any() or (p > 1).any():
        raise ValueError(f"p-values must lie in [0, 1], got {p.tolist()}")
    m = p.size
    order = np.argsort(p, kind="stable")
    scaled = np.minimum(1.0, (m - np.arange(m)) * p[order])
    adjusted = np.empty(m)
    adjusted[order] = np.maximum.accumulate(scaled)
    return [float(v) for v in adjusted]

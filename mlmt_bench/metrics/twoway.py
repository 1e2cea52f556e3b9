"""Statistics v3 (METHOD.md, "(v3) Statistics: seeds and problems are both random").

Seeds (bases, training noise) and problems are crossed random factors: an experiment's outcomes
are an ``[S seeds, N problems]`` array per method, row ``s`` of every method coming from the same
seed (the same base), column ``p`` from the same problem. The primary interval of a method's mean
and of a paired difference is the two-way *pigeonhole* bootstrap (Owen 2007, "The pigeonhole
bootstrap", Ann. Appl. Stat. 1(2)): each replicate draws ``S`` seeds with replacement and,
independently, ``N`` problems with replacement, and takes the mean of the ``S x N`` sub-array
(:func:`twoway_replicates`). Given the data, its variance is exactly

    Var* = v_seed / S + v_problem / N + v_residual / (S N)

with ``v_seed`` the variance (ddof 0) of the seed means, ``v_problem`` that of the problem means
and ``v_residual`` the mean square of the doubly centred array (:func:`pigeonhole_variance`). In
the crossed random-effects model ``y = mu + a_s + b_p + e_sp`` the true variance of the grand mean
is ``s_a^2 / S + s_b^2 / N + s_e^2 / (S N)``: the bootstrap captures both factors, shrinks the seed
term by ``(S - 1) / S`` and counts the interaction about three times (so it errs on the wide side
unless the seed term dominates and S is small). A bootstrap over problems alone has no seed term.

How it behaves, measured with the simulation model of ``tests/test_stats_twoway.py`` (1000
experiments per setting, N = 100 problems, n_boot = 500, S varied): with a large seed effect \
(latent sds: seed 0.1, problem
0.15, cell 0.3) the 95% interval covered the true mean in 94.0% of experiments with S = 10 seeds
and 94.5% with 20, but 88.9% with 5 and 85.3% with 3 (the seed variance is then estimated from
a few seed means; a bootstrap over problems covered 51-77%); with no seed effect it is
conservative (96-99%). For a paired difference whose seed and problem means are mostly cell
noise (little method x seed or method x problem variation) the interaction is counted about
three times, so the SE, the MDE and the p-values are conservative, by up to sqrt(3) in SE.

A paired difference of two methods is the bootstrap of ``y_a - y_b`` with the same seed and
problem draws applied to both; its p-value is twice the share of bootstrap differences on the far
side of 0 (:func:`bootstrap_p_value`), its minimum detectable effect ``(z_{1-alpha/2} + z_power) x
SE`` (:func:`mde`). :func:`compare_methods` does all of it for every method against one baseline,
with the Holm adjustment over that family, the per-seed differences and, as a labelled secondary,
the v2 problem-level sign-flip test (conditional on these seeds).

One seed (``S = 1``): there is no seed variation to resample, no seed is drawn, and every number
here is the problem bootstrap of that seed (:func:`mlmt_bench.metrics.stats.bootstrap_ci`, to the
rounding of the sums).

Written here because no library has it: ``scipy.stats.bootstrap`` resamples the observations of
one factor (with ``paired=True``, whole rows together), never seeds and problems independently, and
statsmodels has no crossed bootstrap either.

Numpy only and seeded: the same inputs and seed give the same draws on every machine, and for 0/1
outcomes the same numbers (every sum is an exact integer).
"""

from __future__ import annotations

from collections.abc import Mapping
from statistics import NormalDist
from typing import Any

import numpy as np

from mlmt_bench.metrics.stats import _MAX_BOOT_CHUNK, holm_adjust, sign_flip_test

ANALYSIS = "two-way (seeds x problems) pigeonhole bootstrap, Owen 2007 (METHOD.md v3)"
SECONDARY = ("sign_flip_p: the v2 problem-level sign-flip test of the seed-averaged per-problem "
             "differences; conditional on these seeds (it ignores seed-to-seed variation)")
ONE_SEED = "one seed: the two-way bootstrap is the bootstrap over problems of that seed"

_COUNT_BLOCK = 250_000  # resampled cells turned into counts and summed at once (~2 MB of float64)


def as_outcomes(y, name: str = "y") -> np.ndarray:
    """``y`` as a float ``[S seeds, N problems]`` array; a ValueError for any other shape or for
    NaN / infinite entries (a missing evaluation is not a failure, and dropping it would change
    what is estimated: evaluate it, or drop that problem from every method and seed)."""
    arr = np.asarray(y, dtype=float)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be a 2-D [seeds, problems] array, got shape {arr.shape}")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"{name} is empty: shape {arr.shape}")
    bad = ~np.isfinite(arr)
    if bad.any():
        s, p = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{name} has {int(bad.sum())} NaN or infinite outcomes (the first at seed row {s}, "
                         f"problem column {p}); evaluate them, or drop those problems from every method and seed")
    return arr


def _counts(idx: np.ndarray, n: int) -> np.ndarray:
    """[b, n] float counts of each value 0..n-1 in each row of the [b, k] draws ``idx``."""
    b = idx.shape[0]
    flat = (idx + n * np.arange(b)[:, None]).ravel()
    return np.bincount(flat, minlength=b * n).reshape(b, n).astype(float)


def twoway_replicates(y, n_boot: int = 10_000, seed: int | np.random.Generator = 0) -> np.ndarray:
    """Pigeonhole-bootstrap replicate means of one ``[S, N]`` array, or of several under the same draws.

    y: an ``[S, N]`` array, or ``[K, S, N]`` (K arrays on the same seeds and problems).
    n_boot: replicates. seed: an int for ``numpy.random.default_rng`` or a Generator.
    A replicate draws N problem indices and S seed indices with replacement (problems first, in
    the chunks :func:`mlmt_bench.metrics.stats.bootstrap_ci` uses, so one seed gives its draws
    exactly) and returns ``sum_s sum_p c_s d_p y[s, p] / (S N)``, ``c`` and ``d`` the draw counts:
    the mean of the resampled sub-array, without building it. With ``S = 1`` no seed is drawn.
    returns: ``[n_boot]`` for one array, ``[K, n_boot]`` for a stack.
    """
    arr = np.asarray(y, dtype=float)
    single = arr.ndim == 2
    stack = arr[None] if single else arr
    if stack.ndim != 3:
        raise ValueError(f"y must be [seeds, problems] or [arrays, seeds, problems], got shape {arr.shape}")
    for k in range(stack.shape[0]):
        as_outcomes(stack[k], "y" if single else f"y[{k}]")
    if n_boot < 1:
        raise ValueError(f"need n_boot >= 1, got {n_boot}")
    n_arrays, n_seeds, n_problems = stack.shape
    rng = np.random.default_rng(seed)
    flat = np.ascontiguousarray(stack.reshape(n_arrays * n_seeds, n_problems))
    out = np.empty((n_arrays, n_boot))
    rows = max(1, _MAX_BOOT_CHUNK // n_problems)
    block = max(1, _COUNT_BLOCK // n_problems)
    for start in range(0, n_boot, rows):
        stop = min(n_boot, start + rows)
        p_idx = rng.integers(0, n_problems, size=(stop - start, n_problems))
        s_idx = rng.integers(0, n_seeds, size=(stop - start, n_seeds)) if n_seeds > 1 else None
        for b0 in range(0, stop - start, block):
            b1 = min(stop - start, b0 + block)
            # [K S, b]: each seed's sum over the resampled problems. einsum, not a BLAS product: on a
            # shared 2-core machine BLAS threads made this 5-10x slower, and its sums are the same
            # on every machine
            by_seed = np.einsum("kn,bn->kb", flat, _counts(p_idx[b0:b1], n_problems))
            if s_idx is None:
                out[:, start + b0:start + b1] = by_seed
                continue
            c = _counts(s_idx[b0:b1], n_seeds).T  # [S, b]
            out[:, start + b0:start + b1] = (by_seed.reshape(n_arrays, n_seeds, -1) * c).sum(axis=1)
    out /= n_seeds * n_problems
    return out[0] if single else out


def pigeonhole_variance(y) -> float:
    """The exact variance of the pigeonhole-bootstrap mean given ``y`` (the limit of the squared
    bootstrap SE as n_boot grows): ``v_seed / S + v_problem / N + v_residual / (S N)``, the first two
    the ddof-0 variances of the seed means and problem means, the last the mean square of
    ``y - seed mean - problem mean + grand mean``. (Draw counts have covariance ``I - 11'/n``, the
    seed and problem draws are independent, and the cross terms vanish.)"""
    arr = as_outcomes(y)
    n_seeds, n_problems = arr.shape
    rows, cols = arr.mean(axis=1), arr.mean(axis=0)
    resid = arr - rows[:, None] - cols[None, :] + arr.mean()
    return float(rows.var() / n_seeds + cols.var() / n_problems + (resid**2).mean() / (n_seeds * n_problems))


def _interval(reps: np.ndarray, alpha: float) -> tuple[float, float, float]:
    """Percentile interval (numpy's default linear interpolation, as bootstrap_ci) and the SE
    (ddof 1; 0 for one replicate) of bootstrap replicates."""
    lo, hi = np.quantile(reps, [alpha / 2, 1 - alpha / 2])
    se = float(reps.std(ddof=1)) if reps.size > 1 else 0.0
    return float(lo), float(hi), se


def _check_alpha(alpha: float, power: float = 0.8) -> None:
    if not 0 < alpha < 1 or not 0 < power < 1:
        raise ValueError(f"need 0 < alpha < 1 and 0 < power < 1, got {alpha}, {power}")


def twoway_bootstrap(y, n_boot: int = 10_000, alpha: float = 0.05,
                     seed: int | np.random.Generator = 0) -> tuple[float, float, float, float]:
    """A method's mean over seeds and problems with its two-way bootstrap interval.

    y: ``[S seeds, N problems]`` outcomes (0/1 or floats). alpha: 0.05 gives a 95% interval.
    returns: (mean of y, lo, hi, se): lo/hi the alpha/2 and 1 - alpha/2 percentiles of the
    replicate means, se their standard deviation (ddof 1). One seed: the problem bootstrap.
    """
    _check_alpha(alpha)
    arr = as_outcomes(y)
    lo, hi, se = _interval(twoway_replicates(arr, n_boot, seed), alpha)
    return float(arr.mean()), lo, hi, se


def bootstrap_p_value(replicates, observed: float) -> float:
    """Two-sided bootstrap p-value of "the difference is 0": twice the share of replicates on the
    far side of 0 from ``observed``, capped at 1.

    A replicate exactly at 0 (common with 0/1 outcomes and few problems) counts half to the far
    side; like :func:`mlmt_bench.metrics.stats.sign_flip_test`, the observed data count as one
    replicate on their own side, ``p = min(1, 2 (far + zeros/2 + 1) / (B + 1))``, so p is never
    0 (the smallest is ``2 / (B + 1)``: report it as "p <= that", not as certainty). An observed
    difference of exactly 0 gives p = 1.
    """
    reps = np.asarray(replicates, dtype=float).ravel()
    if reps.size == 0:
        raise ValueError("no bootstrap replicates")
    if observed == 0:
        return 1.0
    far = int((reps < 0).sum()) if observed > 0 else int((reps > 0).sum())
    zeros = int((reps == 0).sum())
    return float(min(1.0, 2.0 * (far + 0.5 * zeros + 1) / (reps.size + 1)))


def mde(se: float, alpha: float = 0.05, power: float = 0.8) -> float:
    """Minimum detectable effect of a two-sided test at level ``alpha`` with power ``power``:
    ``(z_{1 - alpha/2} + z_power) x se`` (2.8016 x se at 0.05 and 0.8). A true difference of that
    size gives an estimate beyond ``z_{1 - alpha/2} x se`` with probability ``power`` (the far tail
    ignored), so a "no difference" is read as "smaller than this, or not seen"."""
    _check_alpha(alpha, power)
    z = NormalDist()
    return float((z.inv_cdf(1 - alpha / 2) + z.inv_cdf(power)) * se)


def _paired_record(diff: np.ndarray, reps: np.ndarray, alpha: float, power: float, n_perm: int,
                   seed: int | np.random.Generator) -> dict[str, Any]:
    observed = float(diff.mean())
    lo, hi, se = _interval(reps, alpha)
    sign_seed = seed if isinstance(seed, (int, np.integer)) else 0
    return {"diff": observed, "lo": lo, "hi": hi, "se": se,
            "p_value": bootstrap_p_value(reps, observed), "mde": mde(se, alpha, power),
            "per_seed_diff": [float(v) for v in diff.mean(axis=1)],
            "sign_flip_p": float(sign_flip_test(diff.mean(axis=0), n_perm=n_perm, seed=int(sign_seed)))}


def _check_pair(a: np.ndarray, b: np.ndarray, a_name: str, b_name: str) -> None:
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"{a_name} and {b_name} were evaluated on different problem sets "
                         f"({a.shape[1]} vs {b.shape[1]} problems); compare them on the same problems")
    if a.shape[0] != b.shape[0]:
        raise ValueError(f"{a_name} and {b_name} have different numbers of seeds ({a.shape[0]} vs "
                         f"{b.shape[0]}); a paired comparison needs the same seeds, row for row")


def twoway_paired(y_a, y_b, n_boot: int = 10_000, alpha: float = 0.05, power: float = 0.8,
                  seed: int | np.random.Generator = 0, n_perm: int = 20_000) -> dict[str, Any]:
    """Paired difference a − b of two methods on the same seeds (rows) and problems (columns).

    The two-way bootstrap of ``y_a - y_b``, which applies the same seed and problem draws to both.
    returns: {"diff": mean of y_a - y_b, "lo", "hi": its percentile interval, "se": bootstrap SE,
              "p_value": :func:`bootstrap_p_value`, "mde": :func:`mde` of se,
              "per_seed_diff": [S] mean over problems of y_a - y_b for each seed,
              "sign_flip_p": the v2 sign-flip test over problems of the seed-averaged differences
              (secondary: conditional on these seeds)}.
    """
    _check_alpha(alpha, power)
    a, b = as_outcomes(y_a, "y_a"), as_outcomes(y_b, "y_b")
    _check_pair(a, b, "y_a", "y_b")
    diff = a - b
    return _paired_record(diff, twoway_replicates(diff, n_boot, seed), alpha, power, n_perm, seed)


def align_outcomes(runs: Mapping[str, Mapping[Any, Mapping[str, float]]]
                   ) -> tuple[list[Any], list[str], dict[str, np.ndarray]]:
    """``{method: {seed: {problem id: score}}}`` as ``[S, N]`` arrays on the same seeds and problems.

    Every method must have the same seeds and every (method, seed) the same problems; otherwise a
    ValueError names the method, the seed and a few of the seeds or problems that differ
    (comparing methods on different problem sets would compare the problems, not the methods).
    returns: (seeds, problem ids, {method: array with rows in the order of seeds, columns in the
    order of problem ids}); seeds and ids sorted (by their text).
    """
    if not runs:
        raise ValueError("no methods")
    first = next(iter(runs))
    seeds = sorted(runs[first], key=str)
    if not seeds:
        raise ValueError(f"{first} has no seeds")
    pids = sorted(runs[first][seeds[0]], key=str)
    if not pids:
        raise ValueError(f"{first} seed {seeds[0]} has no problems")

    def _few(xs) -> str:
        xs = sorted(xs, key=str)
        return ", ".join(map(str, xs[:5])) + (f" and {len(xs) - 5} more" if len(xs) > 5 else "")

    out: dict[str, np.ndarray] = {}
    for method, by_seed in runs.items():
        if set(by_seed) != set(seeds):
            raise ValueError(f"{method} has seeds {_few(by_seed)} but {first} has {_few(seeds)}; "
                             "a paired comparison needs the same seeds")
        rows = []
        for s in seeds:
            row = by_seed[s]
            missing, extra = set(pids) - set(row), set(row) - set(pids)
            if missing or extra:
                raise ValueError(f"{method} seed {s} was evaluated on a different problem set than {first} "
                                 f"seed {seeds[0]}: missing {_few(missing) or 'none'}; extra {_few(extra) or 'none'}")
            rows.append([float(row[p]) for p in pids])
        out[method] = as_outcomes(rows, f"{method}")
    return seeds, pids, out


def compare_methods(outcomes: Mapping[str, Any], baseline: str, n_boot: int = 10_000, alpha: float = 0.05,
                    power: float = 0.8, seed: int | np.random.Generator = 0,
                    n_perm: int = 20_000) -> dict[str, Any]:
    """Every method's mean and every method − baseline difference, METHOD.md v3; JSON-serialisable.

    outcomes: ``{method: [S seeds, N problems]}``, rows the same seeds and columns the same problems
    for every method (:func:`align_outcomes` builds them from per-seed ``{problem: score}`` maps and
    checks that). One set of bootstrap draws serves every method and every difference.
    returns: {"analysis", "baseline", "n_seeds", "n_problems", "n_boot", "alpha", "power",
              "seed" (None for a Generator), "interval" ("two-way", or :data:`ONE_SEED`),
              "holm_family": [the methods compared with the baseline, in input order],
              "secondary": :data:`SECONDARY`,
              "methods": {method: {"mean", "lo", "hi", "se": :func:`twoway_bootstrap`,
                                   "per_seed": [S] the seed means,
                                   "vs_baseline": None for the baseline, else the
                                   :func:`twoway_paired` record plus "p_holm", the Holm-adjusted
                                   p_value over holm_family}}}.
    """
    _check_alpha(alpha, power)
    if baseline not in outcomes:
        raise ValueError(f"baseline {baseline!r} is not among the methods {list(outcomes)}")
    arrays = {m: as_outcomes(y, m) for m, y in outcomes.items()}
    base = arrays[baseline]
    for m, arr in arrays.items():
        _check_pair(arr, base, m, baseline)
    others = [m for m in arrays if m != baseline]
    stack = np.stack([arrays[m] for m in arrays] + [arrays[m] - base for m in others])
    reps = twoway_replicates(stack, n_boot, seed)
    n_seeds, n_problems = base.shape
    records: dict[str, Any] = {}
    for k, (m, arr) in enumerate(arrays.items()):
        lo, hi, se = _interval(reps[k], alpha)
        records[m] = {"mean": float(arr.mean()), "lo": lo, "hi": hi, "se": se,
                      "per_seed": [float(v) for v in arr.mean(axis=1)], "vs_baseline": None}
    for j, m in enumerate(others):
        records[m]["vs_baseline"] = _paired_record(stack[len(arrays) + j], reps[len(arrays) + j], alpha, power,
                                                   n_perm, seed)
    for m, p in zip(others, holm_adjust([records[m]["vs_baseline"]["p_value"] for m in others])):
        records[m]["vs_baseline"]["p_holm"] = p
    return {"analysis": ANALYSIS, "baseline": baseline, "n_seeds": int(n_seeds), "n_problems": int(n_problems),
            "n_boot": int(n_boot), "alpha": float(alpha), "power": float(power),
            "seed": int(seed) if isinstance(seed, (int, np.integer)) else None,
            "interval": "two-way" if n_seeds > 1 else ONE_SEED, "holm_family": others,
            "secondary": SECONDARY, "methods": records}

"""Tests for mlmt_bench.metrics.stats against hand values and scipy as a reference."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import binomtest, permutation_test

from mlmt_bench.metrics.stats import (
    bootstrap_ci,
    cluster_bootstrap_ci,
    mcnemar_exact,
    mean_std,
    paired_problem_diff,
    per_problem_means,
    reach_point,
    sign_flip_test,
)


def test_bootstrap_ci_degenerate_and_extremes():
    # constant values: every resample mean is 1 -> (1, 1, 1)
    assert bootstrap_ci([1, 1, 1]) == (1.0, 1.0, 1.0)
    # one problem: every resample is that problem
    assert bootstrap_ci([0.3]) == pytest.approx((0.3, 0.3, 0.3))
    # values [0, 1, 1]: resample mean k/3 with k ~ Bin(3, 2/3):
    #   P(0) = 1/27 = 0.037 > 0.025 -> lo = 0;  P(1) = 8/27 = 0.296 > 0.025 -> hi = 1
    mean, lo, hi = bootstrap_ci([0, 1, 1], n_boot=2000, seed=0)
    assert mean == pytest.approx(2 / 3)
    assert (lo, hi) == (0.0, 1.0)


def test_bootstrap_ci_matches_normal_approximation():
    # 400 problems, 200 correct: mean 0.5, se = sqrt(0.25/400) = 0.025,
    # 95% normal interval 0.5 ± 1.96*0.025 = [0.451, 0.549]; the percentile bootstrap is close
    values = np.array([1] * 200 + [0] * 200)
    mean, lo, hi = bootstrap_ci(values, n_boot=4000, seed=1)
    assert mean == 0.5
    assert lo == pytest.approx(0.451, abs=0.01)
    assert hi == pytest.approx(0.549, abs=0.01)


def test_bootstrap_ci_is_seeded():
    v = [0.1, 0.9, 0.4, 0.7, 0.2]
    assert bootstrap_ci(v, seed=3) == bootstrap_ci(v, seed=3)
    assert bootstrap_ci(v, seed=3) != bootstrap_ci(v, seed=4)
    with pytest.raises(ValueError):
        bootstrap_ci([])


@pytest.mark.parametrize("n, n_boot", [(2, 7), (500, 10_000), (601, 10_000)])
def test_bootstrap_ci_draws_what_scipy_draws_and_differs_only_in_its_quantile_level(n, n_boot):
    """What stats.bootstrap_ci's docstring says of scipy.stats.bootstrap: the same resamples (in the
    same chunks; 601 problems take two), the interval its quantiles at alpha / 2 and 1 - alpha / 2."""
    from scipy.stats import bootstrap

    from mlmt_bench.metrics.stats import _MAX_BOOT_CHUNK

    x = np.random.default_rng(n).random(n)
    ref = bootstrap((x,), lambda s, axis: s.mean(axis=axis), n_resamples=n_boot, vectorized=True,
                    batch=_MAX_BOOT_CHUNK // n, method="percentile", rng=np.random.default_rng(5))
    lo, hi = np.quantile(ref.bootstrap_distribution, [0.025, 0.975])
    assert bootstrap_ci(x, n_boot=n_boot, seed=5) == (float(x.mean()), float(lo), float(hi))


def test_per_problem_means_and_paired_differences_by_hand():
    seeds_a = [{"p1": 1, "p2": 0, "p3": 1}, {"p1": 1, "p2": 1, "p3": 0}]
    seeds_b = [{"p1": 0, "p2": 0, "p3": 1}, {"p1": 1, "p2": 0}]  # p3 missing from seed 1
    assert per_problem_means(seeds_a) == {"p1": 1.0, "p2": 0.5, "p3": 0.5}
    assert per_problem_means(seeds_b) == {"p1": 0.5, "p2": 0.0, "p3": 1.0}
    assert paired_problem_diff(seeds_a, seeds_b).tolist() == [0.5, 0.5, -0.5]  # p1, p2, p3


def test_cluster_bootstrap_resamples_problems_not_seed_problem_pairs():
    # Seeds that agree problem by problem carry little extra information: 200 problems x 5 seeds
    # with identical outcomes. Pooling 1000 (seed, problem) pairs as independent would give an
    # interval ~sqrt(5) too narrow; resampling problems gives the interval of 200 problems.
    rng = np.random.default_rng(0)
    outcome = {f"p{i}": float(v) for i, v in enumerate(rng.integers(0, 2, 200))}
    rows = [dict(outcome) for _ in range(5)]
    mean, lo, hi = cluster_bootstrap_ci(rows, seed=0)
    assert (mean, lo, hi) == bootstrap_ci(list(outcome.values()), seed=0)
    pooled = bootstrap_ci([v for r in rows for v in r.values()], seed=0)
    assert (hi - lo) > 2.0 * (pooled[2] - pooled[1])


@pytest.mark.parametrize("diffs", [[1, 0, 1, 1, -1, 0, 1], [0.4, -0.2, 0.6, 0.2, 0.2, -0.4, 0.8, 0.0, 0.6],
                                   [1, 1, 1, 1, 1], [-0.2, 0.2]])
def test_sign_flip_exact_matches_scipy(diffs):
    d = np.array(diffs, dtype=float)
    ref = permutation_test((d,), lambda x: np.mean(x), permutation_type="samples", n_resamples=np.inf,
                           alternative="two-sided").pvalue
    assert sign_flip_test(d) == pytest.approx(ref, abs=1e-12)


def test_sign_flip_monte_carlo_agrees_with_scipy_and_handles_zeros():
    rng = np.random.default_rng(3)
    d = rng.normal(0.08, 0.5, 120)
    ref = permutation_test((d,), lambda x: np.mean(x), permutation_type="samples", n_resamples=20000,
                           alternative="two-sided", random_state=1).pvalue
    p = sign_flip_test(d, n_perm=20000, seed=0)
    assert abs(p - ref) < 0.01 and 0 < p < 1
    assert sign_flip_test(np.zeros(50)) == 1.0
    # zeros do not change the test: they flip to themselves
    assert sign_flip_test([1, 1, 1, 0, 0, 0]) == sign_flip_test([1, 1, 1]) == pytest.approx(0.25)


def test_mcnemar_exact_by_hand():
    # a right & b wrong: problem 0 -> b = 1; a wrong & b right: problems 1-6 -> c = 6;
    # problems 7, 8 concordant. n = 7, P[X <= 1] = (C(7,0) + C(7,1)) / 2^7 = 8/128 = 0.0625
    # two-sided p = 2 * 0.0625 = 0.125
    a = [1, 0, 0, 0, 0, 0, 0, 1, 0]
    b = [0, 1, 1, 1, 1, 1, 1, 1, 0]
    res = mcnemar_exact(a, b)
    assert res == {"b": 1, "c": 6, "p_value": pytest.approx(0.125)}
    assert res["p_value"] == pytest.approx(binomtest(1, 7, 0.5).pvalue)
    # b = 0, c = 5: 2 * 1/32 = 0.0625
    assert mcnemar_exact([0] * 5, [1] * 5)["p_value"] == pytest.approx(0.0625)
    # b = c = 3: 2 * P[X <= 3 | n=6] = 2 * 42/64 > 1 -> capped at 1
    assert mcnemar_exact([1, 1, 1, 0, 0, 0], [0, 0, 0, 1, 1, 1])["p_value"] == 1.0
    # no discordant pairs
    assert mcnemar_exact([1, 0], [1, 0]) == {"b": 0, "c": 0, "p_value": 1.0}


@pytest.mark.parametrize("b, c", [(0, 1), (2, 9), (10, 3), (15, 15), (40, 22), (0, 30)])
def test_mcnemar_exact_matches_scipy(b, c):
    a_correct = np.array([True] * b + [False] * c + [True, False])
    b_correct = np.array([False] * b + [True] * c + [True, False])
    res = mcnemar_exact(a_correct, b_correct)
    assert (res["b"], res["c"]) == (b, c)
    assert res["p_value"] == pytest.approx(binomtest(min(b, c), b + c, 0.5).pvalue, rel=1e-12)


def test_mean_std_by_hand():
    # [0.5, 0.7, 0.9]: mean 0.7; deviations -0.2, 0, 0.2 -> sum sq 0.08, /(3-1) = 0.04 -> std 0.2
    m, s = mean_std([0.5, 0.7, 0.9])
    assert m == pytest.approx(0.7)
    assert s == pytest.approx(0.2)
    assert mean_std([0.42]) == (0.42, None)


def test_reach_point_interpolates_between_evaluations():
    tokens = [0, 100, 250, 400]
    acc = [0.1, 0.3, 0.5, 0.45]
    # 0.45 lies 3/4 of the way from 0.3 (at 100) to 0.5 (at 250): 100 + 0.75 * 150 = 212.5
    assert reach_point(tokens, acc, 0.45) == pytest.approx(212.5)
    assert reach_point(tokens, acc, 0.3) == pytest.approx(100.0)  # >= counts the equal point
    assert reach_point(tokens, acc, 0.05) == 0.0  # already there at step 0: the caller says so
    assert reach_point(tokens, acc, 0.6) is None
    assert reach_point(np.array(tokens, float), np.array(acc), 0.4) == pytest.approx(175.0)
    with pytest.raises(ValueError):
        reach_point([100, 50], [0.1, 0.2], 0.1)
    with pytest.raises(ValueError):
        reach_point([1, 2], [0.1], 0.1)

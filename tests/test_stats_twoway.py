"""Tests for mlmt_bench.metrics.twoway (METHOD.md v3 statistics) against exhaustive enumeration,
the analytic pigeonhole variance, a naive implementation, and simulations with known seed and
problem variance components."""

from __future__ import annotations

import itertools
import json
from statistics import NormalDist

import numpy as np
import pytest
from scipy.stats import norm

from mlmt_bench.metrics.stats import bootstrap_ci, holm_adjust, sign_flip_test
from mlmt_bench.metrics.twoway import (
    ONE_SEED,
    align_outcomes,
    bootstrap_p_value,
    compare_methods,
    mde,
    pigeonhole_variance,
    twoway_bootstrap,
    twoway_paired,
    twoway_replicates,
)


def _enumerate(y: np.ndarray) -> np.ndarray:
    """Every equally likely pigeonhole resample mean of y: S^S seed draws x N^N problem draws."""
    s, n = y.shape
    return np.array([y[np.ix_(si, pi)].mean() for si in itertools.product(range(s), repeat=s)
                     for pi in itertools.product(range(n), repeat=n)])


def test_2x2_bootstrap_distribution_matches_exact_enumeration():
    # y = [[0, 1], [2, 4]]: 4 seed draws x 4 problem draws, each of the 16 with probability 1/16.
    # Seed draws (0,0), (1,1) take row 0 or row 1 twice; (0,1), (1,0) take both rows.
    # Row means over a problem draw: problems (0,0) -> column 0, (1,1) -> column 1, else both.
    #   rows {0}: 0, 1, 0.5, 0.5     rows {1}: 2, 4, 3, 3     rows {0, 1} (two draws): 1, 2.5, 1.75, 1.75
    # -> counts out of 16: 0: 1, 0.5: 2, 1: 3, 1.75: 4, 2: 1, 2.5: 2, 3: 2, 4: 1
    y = np.array([[0.0, 1.0], [2.0, 4.0]])
    exact = _enumerate(y)
    values, counts = np.unique(exact, return_counts=True)
    assert dict(zip(values.tolist(), counts.tolist())) == {0.0: 1, 0.5: 2, 1.0: 3, 1.75: 4, 2.0: 1, 2.5: 2,
                                                           3.0: 2, 4.0: 1}
    # the analytic variance is the enumerated one, exactly
    assert pigeonhole_variance(y) == pytest.approx(exact.var(), rel=1e-12)
    # by hand: seed means 0.5, 3 -> var 1.5625, /2; problem means 1, 2.5 -> var 0.5625, /2;
    # residuals +-0.25 -> mean square 0.0625, /4. Total 0.78125 + 0.28125 + 0.015625 = 1.078125
    assert pigeonhole_variance(y) == pytest.approx(1.078125)
    reps = twoway_replicates(y, n_boot=32_000, seed=0)
    freq = {v: float(np.mean(reps == v)) for v in values}
    for v, c in zip(values, counts):  # each frequency within 5 binomial standard deviations of c/16
        p = c / 16
        assert abs(freq[v] - p) < 5 * np.sqrt(p * (1 - p) / reps.size), (v, freq[v], p)
    assert np.isin(reps, values).all()
    # atoms of at least 1/16 > 2.5% at both ends: the 95% interval is [min, max]
    mean, lo, hi, se = twoway_bootstrap(y, n_boot=4000, seed=1)
    assert (mean, lo, hi) == (1.75, 0.0, 4.0)
    assert se == pytest.approx(np.sqrt(1.078125), rel=0.03)


def test_analytic_variance_matches_exhaustive_enumeration_2x3():
    # 2^2 * 3^3 = 108 equally likely resamples; 0/1 outcomes with a seed and a problem effect
    y = np.array([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]])
    assert pigeonhole_variance(y) == pytest.approx(_enumerate(y).var(), rel=1e-12)


@pytest.mark.parametrize("binary", [False, True])
def test_bootstrap_se_matches_pigeonhole_variance(binary):
    rng = np.random.default_rng(5)
    y = rng.normal(0, 1, (6, 1)) + rng.normal(0, 0.5, (1, 40)) + rng.normal(0, 0.7, (6, 40))
    if binary:
        y = (y > 0).astype(float)
    _, _, _, se = twoway_bootstrap(y, n_boot=20_000, seed=2)
    # the relative SE of a variance from 20000 draws is about sqrt(2 / 20000) = 1%
    assert se**2 == pytest.approx(pigeonhole_variance(y), rel=0.05)


def test_replicates_equal_a_naive_resample_of_the_sub_array():
    # the same draws (problems first, then seeds, per chunk) applied by indexing the S x N sub-array
    rng = np.random.default_rng(7)
    y = rng.normal(size=(4, 9))
    reps = twoway_replicates(y, n_boot=300, seed=11)
    draw = np.random.default_rng(11)
    p_idx = draw.integers(0, 9, size=(300, 9))
    s_idx = draw.integers(0, 4, size=(300, 4))
    naive = np.array([y[np.ix_(s_idx[b], p_idx[b])].mean() for b in range(300)])
    np.testing.assert_allclose(reps, naive, rtol=0, atol=1e-12)
    # a stack of arrays gets the same draws for each
    stack = twoway_replicates(np.stack([y, 2 * y + 1]), n_boot=300, seed=11)
    np.testing.assert_allclose(stack, [naive, 2 * naive + 1], rtol=0, atol=1e-12)


def test_one_seed_is_the_problem_bootstrap():
    rng = np.random.default_rng(1)
    y01 = (rng.random((1, 60)) < 0.4).astype(float)
    # 0/1 outcomes: the same draws and integer sums, so bit-identical to bootstrap_ci
    assert twoway_bootstrap(y01, n_boot=3000, seed=4)[:3] == bootstrap_ci(y01[0], n_boot=3000, seed=4)
    yf = rng.normal(size=(1, 60))
    assert twoway_bootstrap(yf, n_boot=3000, seed=4)[:3] == pytest.approx(bootstrap_ci(yf[0], n_boot=3000, seed=4),
                                                                          abs=1e-12)
    # the paired difference with one seed: the problem bootstrap of the differences
    yb = (rng.random((1, 60)) < 0.5).astype(float)
    res = twoway_paired(y01, yb, n_boot=3000, seed=4)
    assert (res["diff"], res["lo"], res["hi"]) == bootstrap_ci(y01[0] - yb[0], n_boot=3000, seed=4)
    assert res["per_seed_diff"] == [res["diff"]]
    out = compare_methods({"base": yb, "arm": y01}, "base", n_boot=500)
    assert out["interval"] == ONE_SEED and out["n_seeds"] == 1


def test_paired_difference_by_hand_and_shared_draws():
    a = np.array([[1, 1, 0, 1], [0, 1, 0, 0], [1, 1, 1, 0]], dtype=float)
    b = np.array([[1, 0, 0, 0], [0, 1, 0, 0], [0, 1, 1, 0]], dtype=float)
    res = twoway_paired(a, b, n_boot=2000, seed=3)
    # differences: [0, 1, 0, 1], [0, 0, 0, 0], [1, 0, 0, 0] -> per seed 0.5, 0, 0.25; mean 3/12
    assert res["per_seed_diff"] == [0.5, 0.0, 0.25]
    assert res["diff"] == 0.25
    # same draws on a and b: the interval of the difference is the two-way bootstrap of a - b
    assert (res["lo"], res["hi"], res["se"]) == twoway_bootstrap(a - b, n_boot=2000, seed=3)[1:]
    assert res["mde"] == pytest.approx((norm.ppf(0.975) + norm.ppf(0.8)) * res["se"])
    # secondary: v2's sign-flip over problems of the seed-averaged differences [1/3, 1/3, 0, 1/3]
    assert res["sign_flip_p"] == sign_flip_test([1 / 3, 1 / 3, 0, 1 / 3]) == pytest.approx(0.25)
    reps = twoway_replicates(a - b, n_boot=2000, seed=3)
    assert res["p_value"] == bootstrap_p_value(reps, 0.25)


def test_bootstrap_p_value_by_hand():
    reps = np.array([-1.0, 0.0, 1.0, 2.0, 3.0])
    # observed > 0: far side is < 0 (one), the zero counts half, the observed data count once:
    # 2 * (1 + 0.5 + 1) / (5 + 1) = 5/6
    assert bootstrap_p_value(reps, 2.0) == pytest.approx(5 / 6)
    # observed < 0: far side is > 0 (three): 2 * (3 + 0.5 + 1) / 6 = 1.5 -> capped at 1
    assert bootstrap_p_value(reps, -0.5) == 1.0
    assert bootstrap_p_value(reps, 0.0) == 1.0
    # nothing on the far side: the floor 2 / (B + 1), never 0
    assert bootstrap_p_value(np.full(999, 0.3), 0.3) == pytest.approx(2 / 1000)


def test_mde_is_z_sum_times_se():
    assert mde(1.0) == pytest.approx(norm.ppf(0.975) + norm.ppf(0.8))
    assert mde(1.0) == pytest.approx(2.8016, abs=1e-4)
    assert mde(0.02, alpha=0.01, power=0.9) == pytest.approx(0.02 * (norm.ppf(0.995) + norm.ppf(0.9)))
    with pytest.raises(ValueError):
        mde(0.1, power=1.0)


def test_holm_by_hand():
    # sorted 0.005 (x4 = 0.02), 0.01 (x3 = 0.03), 0.03 (x2 = 0.06), 0.04 (x1 = 0.04 -> running max 0.06)
    assert holm_adjust([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # capped at 1, monotone: 0.5 x 2 = 1, then max(1, 0.6) = 1
    assert holm_adjust([0.6, 0.5]) == [1.0, 1.0]
    assert holm_adjust([0.2]) == [0.2]
    assert holm_adjust([]) == []
    # ties: 0.01 x 3 = 0.03 and 0.01 x 2 = 0.02 -> running max 0.03 for both
    assert holm_adjust([0.01, 0.01, 0.5]) == pytest.approx([0.03, 0.03, 0.5])
    with pytest.raises(ValueError):
        holm_adjust([0.1, 1.2])


def test_compare_methods_records_are_consistent_and_json():
    rng = np.random.default_rng(0)
    seed_eff = rng.normal(0, 0.5, (5, 1))
    prob_eff = rng.normal(0, 1.0, (1, 80))

    def arm(shift):
        return ((seed_eff + prob_eff + shift + rng.normal(0, 1, (5, 80))) > 0).astype(float)

    outs = {"grpo": arm(0.0), "mlmt": arm(0.5), "self_correct": arm(0.05)}
    res = compare_methods(outs, "grpo", n_boot=2000, seed=9)
    assert json.loads(json.dumps(res, allow_nan=False)) == res
    assert res["holm_family"] == ["mlmt", "self_correct"] and res["interval"] == "two-way"
    assert res["methods"]["grpo"]["vs_baseline"] is None
    for m in outs:  # one set of draws for everything: each record is the stand-alone function's
        rec = res["methods"][m]
        assert (rec["mean"], rec["lo"], rec["hi"], rec["se"]) == twoway_bootstrap(outs[m], n_boot=2000, seed=9)
        assert rec["per_seed"] == pytest.approx(outs[m].mean(axis=1).tolist())
    vs = {m: res["methods"][m]["vs_baseline"] for m in res["holm_family"]}
    for m, rec in vs.items():
        alone = twoway_paired(outs[m], outs["grpo"], n_boot=2000, seed=9)
        assert {k: v for k, v in rec.items() if k != "p_holm"} == alone
    assert [vs[m]["p_holm"] for m in vs] == holm_adjust([vs[m]["p_value"] for m in vs])
    # mlmt is 0.5 latent sd better: its interval excludes 0 and its p-value says the same
    assert vs["mlmt"]["lo"] > 0 and vs["mlmt"]["p_value"] < 0.05
    alone = compare_methods({"grpo": outs["grpo"]}, "grpo", n_boot=200)  # a baseline alone: no family
    assert alone["holm_family"] == [] and alone["methods"]["grpo"]["vs_baseline"] is None
    # Holm over two: the smaller p is doubled, the larger kept if it is larger still
    small, large = sorted(vs, key=lambda m: vs[m]["p_value"])
    assert vs[small]["p_holm"] == min(1.0, 2 * vs[small]["p_value"])
    assert vs[large]["p_holm"] == max(vs[small]["p_holm"], vs[large]["p_value"])


def test_refuses_mismatched_problem_sets_seeds_and_nan():
    y = np.zeros((3, 10))
    with pytest.raises(ValueError, match="different problem sets"):
        compare_methods({"a": y, "b": np.zeros((3, 9))}, "a")
    with pytest.raises(ValueError, match="different numbers of seeds"):
        compare_methods({"a": y, "b": np.zeros((2, 10))}, "a")
    with pytest.raises(ValueError, match="different problem sets"):
        twoway_paired(y, np.zeros((3, 11)))
    bad = y.copy()
    bad[1, 4] = np.nan
    with pytest.raises(ValueError, match="NaN or infinite.*seed row 1, problem column 4"):
        compare_methods({"a": y, "b": bad}, "a")
    with pytest.raises(ValueError, match="NaN"):
        twoway_bootstrap(bad)
    with pytest.raises(ValueError, match="baseline"):
        compare_methods({"a": y}, "grpo")
    with pytest.raises(ValueError, match="2-D"):
        twoway_bootstrap(np.zeros(5))


def test_align_outcomes_orders_and_refuses_missing_problems():
    runs = {"grpo": {1: {"p2": 1, "p1": 0}, 0: {"p1": 1, "p2": 1}},
            "mlmt": {0: {"p2": 0, "p1": 1}, 1: {"p1": 1, "p2": 1}}}
    seeds, pids, arrays = align_outcomes(runs)
    assert seeds == [0, 1] and pids == ["p1", "p2"]
    assert arrays["grpo"].tolist() == [[1, 1], [0, 1]] and arrays["mlmt"].tolist() == [[1, 0], [1, 1]]
    runs["mlmt"][1] = {"p1": 1, "p3": 0}
    with pytest.raises(ValueError, match=r"mlmt seed 1 .*different problem set.*missing p2; extra p3"):
        align_outcomes(runs)
    with pytest.raises(ValueError, match="same seeds"):
        align_outcomes({"grpo": {0: {"p1": 1}}, "mlmt": {0: {"p1": 1}, 1: {"p1": 0}}})
    with pytest.raises(ValueError, match="NaN"):
        align_outcomes({"grpo": {0: {"p1": float("nan")}}})


# --- simulations with known variance components: y_sp = mu + a_s + b_p + e_sp --------------------

N_EXP, S, N, B = 200, 10, 100, 500


def _coverage(sd_seed, sd_problem, sd_cell, mu, binary, seed):
    """Share of N_EXP simulated experiments whose 95% interval covers the true mean: two-way, and
    the v2 bootstrap over problems of the seed means."""
    rng = np.random.default_rng(seed)
    truth = NormalDist().cdf(mu / np.sqrt(sd_seed**2 + sd_problem**2 + sd_cell**2)) if binary else mu
    two = one = 0
    for i in range(N_EXP):
        y = (mu + rng.normal(0, sd_seed, (S, 1)) + rng.normal(0, sd_problem, (1, N))
             + rng.normal(0, sd_cell, (S, N)))
        if binary:
            y = (y > 0).astype(float)  # P(y = 1) = Phi(mu / total sd): the true mean
        _, lo, hi, _ = twoway_bootstrap(y, n_boot=B, seed=i)
        two += lo <= truth <= hi
        _, lo, hi = bootstrap_ci(y.mean(axis=0), n_boot=B, seed=i)
        one += lo <= truth <= hi
    return two / N_EXP, one / N_EXP


@pytest.mark.parametrize("binary, sds, mu", [(False, (0.1, 0.15, 0.3), 0.5), (True, (0.4, 0.6, 1.0), 0.0)])
def test_twoway_interval_covers_and_problem_bootstrap_does_not(binary, sds, mu):
    # Seed sd large against the problem term: the true SE of the mean is dominated by
    # sd_seed / sqrt(10), which a bootstrap over problems never sees.
    # 200 experiments at 95%: binomial sd 1.5 points, so 0.89-0.99 is about -4 / +2.7 sd.
    two, one = _coverage(*sds, mu, binary, seed=17 + binary)
    assert 0.89 <= two <= 0.99, two
    assert one < 0.8, one


def test_twoway_p_values_under_the_null():
    # Two methods with the same distribution on the same seeds and problems: shared seed and
    # problem effects, a method x seed effect (training noise, sd 0.35 latent) and cell noise. The
    # share of p < 0.05 should be near 0.05 (200 experiments: binomial sd 1.5 points). (With no
    # method x seed effect the test is conservative: the difference's seed and problem means are
    # then pure cell noise, which the pigeonhole variance counts about three times.)
    rng = np.random.default_rng(23)
    hits = 0
    for i in range(N_EXP):
        common = rng.normal(0, 0.4, (S, 1)) + rng.normal(0, 0.8, (1, N))
        ya = (common + rng.normal(0, 0.35, (S, 1)) + rng.normal(0, 1, (S, N)) > 0).astype(float)
        yb = (common + rng.normal(0, 0.35, (S, 1)) + rng.normal(0, 1, (S, N)) > 0).astype(float)
        d = ya - yb
        hits += bootstrap_p_value(twoway_replicates(d, n_boot=B, seed=i), float(d.mean())) < 0.05
    assert 0.02 <= hits / N_EXP <= 0.11, hits / N_EXP

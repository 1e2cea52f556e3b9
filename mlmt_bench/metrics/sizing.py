"""Sizing an experiment from a pilot (METHOD.md v3/v4: seeds and problems are both random; every
comparison reports its minimum detectable effect).

A paired difference of two methods on ``S`` seeds and ``N`` problems is an ``[S, N]`` array ``d``
modelled as crossed random effects ``d = mu + a_s + b_p + e_sp`` with variances ``s_a^2`` (seed),
``s_b^2`` (problem) and ``s_e^2`` (the seed x problem cell, which also holds the outcome noise).
:func:`variance_components` estimates them from a pilot by the method of moments of the two-way
ANOVA without replication (unbiased; a negative estimate, possible by chance, is reported and
clipped to 0 for projection). :func:`expected_bootstrap_variance` projects what the report's
interval will see at another ``(S, N)``: the expectation of the pigeonhole bootstrap variance
(:func:`mlmt_bench.metrics.twoway.pigeonhole_variance`) under that model,

    E Var* = (S-1)/S^2 (s_a^2 + s_e^2/N) + (N-1)/N^2 (s_b^2 + s_e^2/S) + (S-1)(N-1)/(S N)^2 s_e^2,

because the ddof-0 variance of ``S`` seed means has expectation ``(S-1)/S (s_a^2 + s_e^2/N)``, that
of the problem means ``(N-1)/N (s_b^2 + s_e^2/S)`` and the doubly centred mean square
``(S-1)(N-1)/(S N) s_e^2``. The projected MDE is ``(z_{1-alpha/2} + z_power) sqrt(E Var*)``, the
report's MDE (:func:`mlmt_bench.metrics.twoway.mde`) at its expected SE. :func:`model_variance`
is the model's own variance of the grand mean, ``s_a^2/S + s_b^2/N + s_e^2/(S N)``, for reference
(the bootstrap counts the cell term about three times: twoway's docstring).

A pilot with few seeds estimates ``s_a^2`` from few seed means, so a projection is a point
estimate, not a guarantee: say so where it is used.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mlmt_bench.metrics.twoway import as_outcomes, mde


def variance_components(d) -> dict[str, Any]:
    """Method-of-moments estimates of the seed, problem and cell variances of an ``[S, N]`` array
    (``S, N >= 2``; outcomes or paired differences, in the array's units).

    returns: {"seed", "problem", "residual": the estimates clipped at 0,
              "raw": {same keys: unclipped}, "mean": the grand mean,
              "n_seeds": S, "n_problems": N}
    Mean squares: ``MS_seed = N var(seed means)``, ``MS_problem = S var(problem means)`` (ddof 1),
    ``MS_e`` the doubly centred sum of squares over ``(S-1)(N-1)``; then ``s_a^2 = (MS_seed - MS_e)/N``,
    ``s_b^2 = (MS_problem - MS_e)/S``, ``s_e^2 = MS_e``.
    """
    arr = as_outcomes(d, "d")
    n_seeds, n_problems = arr.shape
    if n_seeds < 2 or n_problems < 2:
        raise ValueError(f"variance components need at least 2 seeds and 2 problems, got {n_seeds} x {n_problems}")
    rows, cols, grand = arr.mean(axis=1), arr.mean(axis=0), arr.mean()
    ms_seed = n_problems * rows.var(ddof=1)
    ms_problem = n_seeds * cols.var(ddof=1)
    resid = arr - rows[:, None] - cols[None, :] + grand
    ms_e = float((resid**2).sum() / ((n_seeds - 1) * (n_problems - 1)))
    raw = {"seed": float((ms_seed - ms_e) / n_problems), "problem": float((ms_problem - ms_e) / n_seeds),
           "residual": ms_e}
    return {**{k: max(v, 0.0) for k, v in raw.items()}, "raw": raw, "mean": float(grand),
            "n_seeds": int(n_seeds), "n_problems": int(n_problems)}


def _check_design(n_seeds: int, n_problems: int) -> None:
    if n_seeds < 1 or n_problems < 1:
        raise ValueError(f"a design needs at least 1 seed and 1 problem, got {n_seeds} x {n_problems}")


def expected_bootstrap_variance(components: dict[str, Any], n_seeds: int, n_problems: int) -> float:
    """The expected pigeonhole-bootstrap variance of the grand mean at ``n_seeds x n_problems``
    under the crossed model with ``components`` (:func:`variance_components`; the clipped ones)."""
    _check_design(n_seeds, n_problems)
    s, n = n_seeds, n_problems
    va, vb, ve = components["seed"], components["problem"], components["residual"]
    return float((s - 1) / s**2 * (va + ve / n) + (n - 1) / n**2 * (vb + ve / s)
                 + (s - 1) * (n - 1) / (s * n) ** 2 * ve)


def model_variance(components: dict[str, Any], n_seeds: int, n_problems: int) -> float:
    """The crossed model's variance of the grand mean: ``s_a^2/S + s_b^2/N + s_e^2/(S N)``."""
    _check_design(n_seeds, n_problems)
    return float(components["seed"] / n_seeds + components["problem"] / n_problems
                 + components["residual"] / (n_seeds * n_problems))


def mde_of_variance(variance: float, alpha: float = 0.05, power: float = 0.8) -> float:
    """The MDE of an estimate with that variance (:func:`mlmt_bench.metrics.twoway.mde` of its SE)."""
    return mde(float(np.sqrt(variance)), alpha, power)


def projected_mde(components: dict[str, Any], n_seeds: int, n_problems: int, alpha: float = 0.05,
                  power: float = 0.8) -> float:
    """The report's MDE (80% power, alpha 0.05 by default) at the expected bootstrap SE of that design."""
    return mde_of_variance(expected_bootstrap_variance(components, n_seeds, n_problems), alpha, power)


def seeds_needed(components: dict[str, Any], n_problems: int, target: float, max_seeds: int = 200,
                 alpha: float = 0.05, power: float = 0.8) -> int | None:
    """The fewest seeds (2 or more: one seed has no seed term to estimate) whose projected MDE at
    ``n_problems`` is at most ``target`` (the array's units); None if not within ``max_seeds``
    (the problem term alone may keep it above the target: more seeds cannot help then)."""
    if target <= 0:
        raise ValueError(f"target must be > 0, got {target}")
    for s in range(2, max_seeds + 1):
        if projected_mde(components, s, n_problems, alpha, power) <= target:
            return s
    return None


def design_seconds(phases: dict[str, float], n_seeds: int, scale: float) -> dict[str, float]:
    """Projected wall seconds of one program (an arm) run on ``n_seeds`` seeds when every
    evaluation reads ``scale`` times the pilot's problems.

    phases: the pilot's mean wall seconds of a run of that arm, by phase: ``train_s`` (the steps,
        with any evaluation between them; does not depend on the problem count), ``final_eval_s``
        (the last evaluation), ``start_s`` and ``start_memo_s`` (model loading and the step-0
        evaluation: computed, and with what the memo of step-0 evaluations holds read instead).
    returns: ``{"run_s": a run that reads its start from the memo, "first_run_s": the first run
        (it computes the start), "total_s": first_run_s + (n_seeds - 1) * run_s}``. Evaluation
        time is taken as proportional to the problem count (the same rows per problem, batched).
    """
    if n_seeds < 1 or not scale > 0:
        raise ValueError(f"need n_seeds >= 1 and scale > 0, got {n_seeds}, {scale}")
    run_s = phases["train_s"] + scale * (phases["final_eval_s"] + phases["start_memo_s"])
    first_run_s = phases["train_s"] + scale * (phases["final_eval_s"] + phases["start_s"])
    return {"run_s": run_s, "first_run_s": first_run_s, "total_s": first_run_s + (n_seeds - 1) * run_s}

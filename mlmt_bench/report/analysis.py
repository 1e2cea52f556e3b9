"""The statistics of a comparison (METHOD.md v3, "Statistics: seeds and problems are both random")
from loaded runs, with :mod:`mlmt_bench.metrics.twoway` doing the arithmetic.

- An arm's accuracy (acc@t1, acc@t2, acc@t2 after g∅): its ``[seeds, problems]`` outcomes of the
  final evaluation with the two-way (pigeonhole) bootstrap interval and SE (:func:`arm_interval`).
- A gain over the arm's own step 0 and a difference from the baseline: the two-way bootstrap of the
  paired ``[seeds, problems]`` differences, its p-value, the minimum detectable effect (80% power,
  alpha 0.05), the per-seed differences and, labelled secondary, the v2 sign-flip test over
  problems (:func:`paired`); the differences from the baseline of every arm at once, Holm-adjusted
  over the arms compared with it (:func:`versus_baseline`, through
  :func:`~mlmt_bench.metrics.twoway.compare_methods`).

One seed: the two-way bootstrap is the bootstrap over that seed's problems (``interval: "one
seed"``). Arms (or an arm's seeds) evaluated on different seeds or problems cannot be crossed:
:func:`~mlmt_bench.metrics.twoway.align_outcomes` says why, and the interval falls back to the v2
bootstrap over problems of seed-averaged outcomes (``interval: "problems"``, ``why``: the reason),
which ignores seed-to-seed variation; the report says so in a note.

Every interval uses the same draws (``N_BOOT`` replicates, seed ``BOOT_SEED``), so a report is the
same on every machine.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import numpy as np

from mlmt_bench.metrics import twoway
from mlmt_bench.metrics.stats import holm_adjust, per_problem_means
from mlmt_bench.report.formatting import ALPHA, ONE_SEED, PROBLEMS, TWO_WAY
from mlmt_bench.report.runs import RunRecord

#: bootstrap replicates and their seed; the power of the minimum detectable effect
N_BOOT = 10_000
BOOT_SEED = 0
POWER = 0.8

Rows = list[tuple[Any, dict[str, float]]]  # (seed, {problem id: 0/1}) per run


def seed_rows(results: list[RunRecord], turn: str = "t2", at: str = "final") -> Rows:
    """(seed, ``{problem id: outcome}``) of each run that recorded ``turn`` at that evaluation."""
    return [(r.seed, o) for r in results if (o := r.outcomes(turn, at=at))]


def align_rows(named: dict[str, Rows]) -> tuple[list[Any], list[str], dict[str, np.ndarray]]:
    """:func:`~mlmt_bench.metrics.twoway.align_outcomes` of ``{name: rows}``; a ValueError too for
    a run without a seed or two runs of one name with the same seed (they cannot be rows)."""
    maps: dict[str, dict[Any, dict[str, float]]] = {}
    for name, rows in named.items():
        seeds = [s for s, _ in rows]
        if None in seeds:
            raise ValueError(f"{name} has a run without a recorded seed")
        dup = sorted({s for s in seeds if seeds.count(s) > 1}, key=str)
        if dup:
            raise ValueError(f"{name} has several runs with seed {dup[0]}")
        maps[name] = dict(rows)
    return twoway.align_outcomes(maps)


def _kind(n_seeds: int) -> str:
    return TWO_WAY if n_seeds > 1 else ONE_SEED


def arm_interval(rows: Rows, name: str = "the arm", n_boot: int = N_BOOT) -> dict[str, Any] | None:
    """An arm's accuracy over seeds and problems with its 95% interval; None without outcomes.

    returns: {"mean", "lo", "hi", "se", "n_seeds", "n_problems", "interval": TWO_WAY | ONE_SEED |
    PROBLEMS, "why": None, or why its seeds could not be crossed with its problems}.
    """
    if not rows:
        return None
    try:
        seeds, _, arrays = align_rows({name: rows})
        arr, kind, why = arrays[name], _kind(len(seeds)), None
    except ValueError as exc:
        means = per_problem_means([o for _, o in rows])
        arr, kind, why = np.array([[means[p] for p in sorted(means)]]), PROBLEMS, str(exc)
    mean, lo, hi, se = twoway.twoway_bootstrap(arr, n_boot, ALPHA, BOOT_SEED)
    return {"mean": mean, "lo": lo, "hi": hi, "se": se, "n_seeds": len(rows), "n_problems": int(arr.shape[1]),
            "interval": kind, "why": why}


def _per_seed_common(a_rows: Rows, b_rows: Rows) -> dict[Any, float]:
    """Per seed both have (their first run of it): the mean of a − b over the problems both evaluated."""
    b_by_seed: dict[Any, dict[str, float]] = {}
    for s, o in b_rows:
        b_by_seed.setdefault(s, o)
    out: dict[Any, float] = {}
    for s, a in a_rows:
        b = b_by_seed.get(s) if s is not None else None
        common = sorted(set(a) & set(b)) if b is not None else []
        if common and s not in out:
            assert b is not None  # else common is empty
            out[s] = float(np.mean([a[p] - b[p] for p in common]))
    return dict(sorted(out.items(), key=lambda kv: _seed_order(kv[0])))


def paired(a_rows: Rows, b_rows: Rows, a_name: str = "a", b_name: str = "b") -> dict[str, Any]:
    """a − b on the same seeds and problems: the two-way record of
    :func:`~mlmt_bench.metrics.twoway.twoway_paired` (``diff``, ``lo``, ``hi``, ``se``, ``p_value``,
    ``mde``, ``sign_flip_p``) with ``per_seed_diff`` as ``{seed: difference}``, ``n_seeds``,
    ``n_problems``, ``interval`` and ``why``. When they cannot be crossed: the bootstrap over the
    problems both evaluated of the seed-averaged differences (``n_seeds`` None; ``per_seed_diff``
    over the seeds both have); ``{"n_problems": 0, "why"}`` when they share no problem."""
    try:
        seeds, pids, arrays = align_rows({b_name: b_rows, a_name: a_rows})
    except ValueError as exc:
        return _fallback(a_rows, b_rows, str(exc))
    rec = twoway.twoway_paired(arrays[a_name], arrays[b_name], N_BOOT, ALPHA, POWER, BOOT_SEED)
    return _two_way_record(rec, seeds, len(pids))


def _seed_order(seed: Any) -> tuple[int, Any]:
    """Seeds in numeric order (align_outcomes sorts them as text: 0, 1, 10, 2)."""
    return (0, seed) if isinstance(seed, int) else (1, str(seed))


def _two_way_record(rec: dict[str, Any], seeds: list[Any], n_problems: int) -> dict[str, Any]:
    rec = {k: v for k, v in rec.items() if k != "p_holm"}
    per_seed = dict(sorted(zip(seeds, rec["per_seed_diff"]), key=lambda kv: _seed_order(kv[0])))
    return {**rec, "per_seed_diff": per_seed, "n_seeds": len(seeds), "n_problems": n_problems,
            "interval": _kind(len(seeds)), "why": None}


def _fallback(a_rows: Rows, b_rows: Rows, why: str) -> dict[str, Any]:
    a, b = per_problem_means([o for _, o in a_rows]), per_problem_means([o for _, o in b_rows])
    common = sorted(set(a) & set(b))
    if not common:
        return {"n_problems": 0, "why": why}
    d = np.array([[a[p] - b[p] for p in common]])
    rec = twoway.twoway_paired(d, np.zeros_like(d), N_BOOT, ALPHA, POWER, BOOT_SEED)
    return {**rec, "per_seed_diff": _per_seed_common(a_rows, b_rows), "n_seeds": None,
            "n_problems": len(common), "interval": PROBLEMS, "why": why}


def gain(results: list[RunRecord]) -> dict[str, Any] | None:
    """Final acc@t2 − the arm's own step-0 acc@t2 (:func:`paired`), with ``mean`` (the difference),
    ``per_seed`` (a list) and ``std`` (sample std over seeds; None for one); None without outcomes."""
    pairs = [(r.seed, r.outcomes("t2"), r.outcomes("t2", at="first")) for r in results]
    pairs = [(s, f, z) for s, f, z in pairs if f and z]
    if not pairs:
        return None
    rec = paired([(s, f) for s, f, _ in pairs], [(s, z) for s, _, z in pairs], "the final evaluation", "step 0")
    if not rec.get("n_problems"):
        return None
    per_seed = [float(np.mean(list(f.values())) - np.mean(list(z.values()))) for _, f, z in pairs]
    std = float(np.std(per_seed, ddof=1)) if len(per_seed) > 1 else None
    return {**rec, "mean": rec["diff"], "std": std, "per_seed": per_seed}


def versus_baseline(loaded: dict[str, list[RunRecord]], baseline: str,
                    family: Collection[str] | None = None) -> dict[str, dict[str, Any]]:
    """Every other arm − ``baseline`` in final acc@t2: :func:`paired` records plus ``p_holm``, the
    Holm-adjusted ``p_value`` over the arms of ``family`` with a difference (their order in ``loaded``;
    None: every arm), None for an arm outside it (METHOD v3: Holm over the methods compared with one
    baseline, not over its controls and bounds). The arms on the baseline's seeds and problems share one
    set of draws (``compare_methods``); the others fall back as :func:`paired` says."""
    base = seed_rows(loaded[baseline])
    out: dict[str, dict[str, Any]] = {}
    crossed: dict[str, np.ndarray] = {}
    seeds: list[Any] = []
    base_arr = None
    for arm, results in loaded.items():
        if arm == baseline:
            continue
        rows = seed_rows(results)
        if not rows or not base:
            out[arm] = {"n_problems": 0, "why": f"{arm if not rows else baseline} has no per-problem outcomes"}
            continue
        try:
            seeds, _, arrays = align_rows({baseline: base, arm: rows})
        except ValueError as exc:
            out[arm] = _fallback(rows, base, str(exc))
            continue
        crossed[arm], base_arr = arrays[arm], arrays[baseline]
        out[arm] = {}
    if crossed:
        cm = twoway.compare_methods({baseline: base_arr, **crossed}, baseline, N_BOOT, ALPHA, POWER, BOOT_SEED)
        for arm in crossed:
            out[arm] = _two_way_record(cm["methods"][arm]["vs_baseline"], seeds, int(cm["n_problems"]))
    adjusted = [a for a, rec in out.items() if rec.get("n_problems") and (family is None or a in family)]
    for rec in out.values():
        if rec.get("n_problems"):
            rec["p_holm"] = None
    for arm, p in zip(adjusted, holm_adjust([out[a]["p_value"] for a in adjusted])):
        out[arm]["p_holm"] = p
    return out


def statistics_text(summary: dict[str, Any]) -> str:
    """The paragraph (Markdown) that says how the report's statistics are computed (METHOD v3)."""
    st, baseline, help_ = summary["statistics"], summary["baseline"], summary.get("equal_help")
    holm = (f"; for a difference from {baseline}, the Holm-adjusted p over the {len(st['holm_family'])} methods "
            "compared with it" if baseline is not None else "")
    if help_:
        holm += (f" (and, a separate family, over the {len(help_['holm_family'])} methods compared with "
                 f"{help_['baseline']})")
    if baseline is not None:
        holm += ("; the other rows (an arm's test-time variants and controls, upper bounds) have no Holm p: they "
                 "are not methods (METHOD v3: Holm over the methods compared with one baseline)")
    spread = ("the seeds of the runs listed above share one base, so there it is RL sampling, data order and the "
              "value model's initialisation only" if summary.get("shared_bases")
              else "each seed has its own base, so it includes initialisation")
    return ("Statistics (METHOD.md v3): seeds and problems are both random. `mean ± std` is over seeds (sample std; "
            f"{spread}). A 95% CI is the two-way bootstrap that "
            "resamples seeds and problems independently (Owen's pigeonhole bootstrap; "
            f"{st['n_boot']} resamples, seed {st['seed']}); with one seed it is the bootstrap over that seed's "
            "problems, and says so. A gain over step 0 or a difference is the two-way bootstrap of the paired "
            "differences (seed s against seed s, problem against problem), with its p-value (twice the share of "
            "resamples on the far side of 0) and its minimum detectable effect (MDE: 80% power at α = 0.05, 2.8 × "
            "the bootstrap SE): a difference that is not significant was smaller than its MDE, or not seen. "
            f"* marks p < {ALPHA}{holm}.")


def against_text(summary: dict[str, Any]) -> str:
    """The paragraph (Markdown) above the table of differences from the baseline."""
    return _against_text(summary["baseline"], len(summary["statistics"]["holm_family"]))


def equal_help_text(help_: dict[str, Any]) -> str:
    """The paragraph (Markdown) above the table of differences from ``<baseline> + base critic``
    (a summary's ``equal_help``)."""
    return (f"The like-for-like comparison (METHOD v3, equal test-time help): {help_['baseline']} gets a critique "
            "and a refinement at test time, from the frozen starting checkpoint as its critic, so it is compared "
            "here with each arm that answers with a refinement (a second turn, after its own critic's feedback, "
            "an oracle's or g∅). "
            + _against_text(help_["baseline"], len(help_["holm_family"])))


def _against_text(baseline: str, k: int) -> str:
    return (f"Difference = arm − {baseline} in final acc@t2 on the same seeds and problems (the arm's seed-s run "
            f"against {baseline}'s, problem by problem): its two-way bootstrap 95% CI and p-value, the p "
            f"Holm-adjusted over the {k} methods compared with {baseline} (* marks p (Holm) < {ALPHA}; – for a row "
            "that is not a method), and the MDE "
            f"(80% power, α = 0.05). Per-seed differences: the arm's acc@t2 − {baseline}'s on each seed, in "
            "points. Secondary, conditional on these seeds: the v2 sign-flip permutation test over problems of "
            "the seed-averaged differences (it leaves out seed-to-seed variation). McNemar: exact, per seed "
            f"(b = arm right and {baseline} wrong, c = the reverse), never pooled over seeds.")


def description() -> dict[str, Any]:
    """The settings of these statistics, for the report's JSON summary."""
    return {"analysis": twoway.ANALYSIS, "n_boot": N_BOOT, "seed": BOOT_SEED, "alpha": ALPHA, "power": POWER,
            "one_seed": twoway.ONE_SEED, "secondary": twoway.SECONDARY,
            "fallback": "arms evaluated on different seeds or problems: the v2 bootstrap over problems of "
                        "seed-averaged outcomes (ignores seed-to-seed variation)"}

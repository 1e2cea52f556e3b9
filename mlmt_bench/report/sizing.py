"""``mlmt-bench size``: size a headline from a pilot's runs (issue 33: "measure the seed and problem
variance and size the headline for MDE <= 3 points").

Reads the final acc@t2 outcomes of one arm and a baseline (any row a report shows, e.g.
``grpo + base critic``) on the seeds and problems both have, estimates the variance components of
their paired difference (:func:`mlmt_bench.metrics.sizing.variance_components`, in points) and
projects the report's MDE to other numbers of seeds and problems
(:func:`mlmt_bench.metrics.sizing.projected_mde`), with the fewest seeds that reach the target at
each problem count. Beside it: the pilot's own two-way record (its MDE is what the projection at
the pilot's design estimates) and the wall seconds of every arm's runs, to price a design.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from mlmt_bench.errors import UserError
from mlmt_bench.metrics import sizing
from mlmt_bench.report import analysis
from mlmt_bench.report.runs import group_runs, is_num, load_run, with_base_critic_arms

#: seed counts of the projection table (plus the pilot's own and each one needed)
SEED_GRID = (3, 5, 10, 15, 20, 30)
MAX_SEEDS = 200


def _wall(results: list[Any]) -> dict[str, Any]:
    walls = [float(r.final["wall_s"]) for r in results if is_num(r.final.get("wall_s"))]
    return {"runs": len(results), "mean_wall_s": float(np.mean(walls)) if walls else None,
            "per_run_wall_s": walls}


def size_from_dirs(paths: list[Path], arm: str, baseline: str, target_points: float,
                   problems: list[int] | None = None) -> dict[str, Any]:
    """The sizing record of ``arm − baseline`` in final acc@t2 (points) from run / experiment dirs.

    problems: problem counts to project to (default: the pilot's own).
    returns: {"arm", "baseline", "target_points", "pilot": {"n_seeds", "n_problems", "seeds",
              "diff", "lo", "hi", "se", "mde", "per_seed_diff"} (points; the report's two-way record),
              "components": variance_components of the differences in points,
              "projection": [{"n_seeds", "n_problems", "mde", "model_mde"}],
              "seeds_needed": {N: fewest seeds with projected MDE <= target, or None},
              "wall": {row: {"runs", "mean_wall_s", "per_run_wall_s"}} (rows with their own runs)}
    """
    if not target_points > 0:
        raise UserError(f"--target must be a positive number of points, got {target_points:g}")
    grouped = group_runs(paths)
    loaded = with_base_critic_arms({a: [load_run(p) for p in dirs] for a, dirs in grouped.items() if dirs})
    for name in (arm, baseline):
        if name not in loaded:
            raise UserError(f"no row {name!r} in these runs (rows: {', '.join(loaded)})")
    a_rows, b_rows = analysis.seed_rows(loaded[arm]), analysis.seed_rows(loaded[baseline])
    try:
        seeds, pids, arrays = analysis.align_rows({baseline: b_rows, arm: a_rows})
    except ValueError as exc:
        raise UserError(f"{arm} and {baseline} cannot be crossed as seeds × problems: {exc}") from exc
    if len(seeds) < 2:
        raise UserError(f"{arm} and {baseline} share {len(seeds)} seed(s): the seed variance needs at least 2")
    d = 100.0 * (arrays[arm] - arrays[baseline])
    comp = sizing.variance_components(d)
    rec = analysis.paired(a_rows, b_rows, arm, baseline)
    pilot = {"n_seeds": len(seeds), "n_problems": len(pids), "seeds": seeds,
             **{k: 100.0 * float(rec[k]) for k in ("diff", "lo", "hi", "se", "mde")},
             "per_seed_diff": {str(s): 100.0 * float(v) for s, v in rec["per_seed_diff"].items()}}
    sizes = sorted(set(problems or [len(pids)]))
    if any(n < 1 for n in sizes):
        raise UserError(f"--problems must be positive counts, got {sizes}")
    needed = {n: sizing.seeds_needed(comp, n, target_points, MAX_SEEDS) for n in sizes}
    grid = sorted({len(seeds), *SEED_GRID, *(s for s in needed.values() if s is not None)})
    projection = [{"n_seeds": s, "n_problems": n, "mde": sizing.projected_mde(comp, s, n),
                   "model_mde": sizing.mde_of_variance(sizing.model_variance(comp, s, n))}
                  for n in sizes for s in grid]
    return {"arm": arm, "baseline": baseline, "target_points": float(target_points), "pilot": pilot,
            "components": comp, "projection": projection, "seeds_needed": needed,
            "wall": {row: _wall(results) for row, results in loaded.items() if row in grouped}}


def render_markdown(rec: dict[str, Any]) -> str:
    """The sizing record as Markdown (numbers in points, wall in minutes)."""
    p, c = rec["pilot"], rec["components"]
    raw = c["raw"]
    lines = [f"# Sizing: {rec['arm']} − {rec['baseline']} (final acc@t2, points)", "",
             f"Pilot: {p['n_seeds']} seeds × {p['n_problems']} problems; difference {p['diff']:+.2f} "
             f"[{p['lo']:+.2f}, {p['hi']:+.2f}] (two-way bootstrap 95% CI), SE {p['se']:.2f}, MDE {p['mde']:.2f}; "
             "per seed " + ", ".join(f"{s}: {v:+.2f}" for s, v in p["per_seed_diff"].items()) + ".", "",
             "Variance components of the paired difference (method of moments, points²; a negative estimate is "
             "clipped to 0 for the projection):", "",
             "| component | estimate | unclipped |", "|---|---|---|"]
    lines += [f"| {k} | {c[k]:.2f} | {raw[k]:.2f} |" for k in ("seed", "problem", "residual")]
    lines += ["", "Projected MDE (80% power, α = 0.05): the report's MDE at the expected two-way bootstrap SE of "
                  "that design; model MDE: at the crossed model's own SE (the bootstrap counts the cell term about "
                  f"three times). Target: ≤ {rec['target_points']:g}.", "",
              "| seeds | problems | MDE | model MDE |", "|---|---|---|---|"]
    lines += [f"| {r['n_seeds']} | {r['n_problems']} | {r['mde']:.2f} | {r['model_mde']:.2f} |"
              for r in rec["projection"]]
    lines += ["", "Fewest seeds for MDE ≤ target: " + "; ".join(
        f"{n} problems: {s if s is not None else f'none within {MAX_SEEDS}'}" for n, s in rec["seeds_needed"].items())
        + f". With {p['n_seeds']} pilot seeds the seed component is estimated from {p['n_seeds']} seed means: "
          "a point estimate, not a guarantee.", "", "| row | runs | mean wall (min) |", "|---|---|---|"]
    lines += [f"| {row} | {w['runs']} | " + (f"{w['mean_wall_s'] / 60:.1f}" if w["mean_wall_s"] is not None else "—")
              + " |" for row, w in rec["wall"].items()]
    return "\n".join(lines) + "\n"

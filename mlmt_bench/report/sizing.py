"""``mlmt-bench size``: size a headline from a pilot's runs (issue 33: "measure the seed and problem
variance and size the headline for MDE <= 3 points").

Reads the final acc@t2 outcomes of one arm and a baseline (any row a report shows, e.g.
``grpo + base critic``) on the seeds and problems both have, estimates the variance components of
their paired difference (:func:`mlmt_bench.metrics.sizing.variance_components`, in points) and
projects the report's MDE to other numbers of seeds and problems
(:func:`mlmt_bench.metrics.sizing.projected_mde`), with the fewest seeds that reach the target at
each problem count. Beside it: the pilot's own two-way record (its MDE is what the projection at
the pilot's design estimates) and the wall seconds of every arm's runs by phase, which price each
design of the projection in hours (``--hours``: the best design within a budget).
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
#: the fewest seeds a design chosen within --hours has: two seed means give the seed variance one
#: degree of freedom
MIN_SEEDS = 3


def _wall(results: list[Any]) -> dict[str, Any]:
    walls = [float(r.final["wall_s"]) for r in results if is_num(r.final.get("wall_s"))]
    return {"runs": len(results), "mean_wall_s": float(np.mean(walls)) if walls else None,
            "per_run_wall_s": walls, "phases": _phases(results), "training": _training_rate(results)}


def _training_rate(results: list[Any]) -> dict[str, float] | None:
    """An arm's training pace, means over its finished runs whose logs time it: ``steps`` (the
    last step), ``step_s`` (each run's median wall seconds between consecutive step records, the
    first from the step-0 evaluation's), ``gen_tok_s`` and ``trained_tok_s`` (the last step's
    cumulative generated and trained tokens over the training phase's wall seconds). None when no
    run times it."""
    rows = []
    for r in results:
        first = r.curve[0] if r.curve else {}
        steps = [t for t in r.train if t.get("step", 0) > 0 and is_num(t.get("wall_s"))]
        if not (r.has_final and steps and first.get("step") == 0 and is_num(first.get("wall_s"))):
            continue
        walls = [float(first["wall_s"])] + [float(t["wall_s"]) for t in steps]
        span = walls[-1] - walls[0]
        last = steps[-1]
        if span <= 0 or not (is_num(last.get("gen_tokens")) and is_num(last.get("trained_tokens"))):
            continue
        rows.append([float(last["step"]), float(np.median(np.diff(walls))), float(last["gen_tokens"]) / span,
                     float(last["trained_tokens"]) / span])
    if not rows:
        return None
    mean = np.mean(np.array(rows), axis=0)
    return {"steps": float(mean[0]), "step_s": float(mean[1]), "gen_tok_s": float(mean[2]),
            "trained_tok_s": float(mean[3])}


def _phases(results: list[Any]) -> dict[str, float] | None:
    """An arm's mean wall seconds by phase (:func:`mlmt_bench.metrics.sizing.design_seconds`) over
    its finished runs whose logs time them: start = the step-0 evaluation's ``wall_s`` (its runs'
    largest: computed; smallest: with what the memo held read), train = the last step's minus that,
    final evaluation = the final record's minus the last step's. None when no run times them. A
    pause of the machine (a run stopped for a measurement) counts as the phase it fell in."""
    rows = []
    for r in results:
        first, last = (r.curve[0] if r.curve else {}), (r.train[-1] if r.train else {})
        walls = [first.get("wall_s"), last.get("wall_s"), r.final.get("wall_s")]
        if r.has_final and first.get("step") == 0 and all(is_num(w) for w in walls):
            rows.append([float(w) for w in walls])
    if not rows:
        return None
    starts = [w[0] for w in rows]
    return {"train_s": float(np.mean([w[1] - w[0] for w in rows])), "final_eval_s": float(np.mean(
        [w[2] - w[1] for w in rows])), "start_s": max(starts), "start_memo_s": min(starts)}


def _cost(rec_wall: dict[str, Any], programs: list[str], n_seeds: int, scale: float) -> float | None:
    """Projected wall hours of ``programs`` (arms) on ``n_seeds`` seeds at ``scale`` × the pilot's
    problems; None when an arm's runs do not time their phases."""
    phases = [rec_wall[p]["phases"] for p in programs]
    if any(ph is None for ph in phases):
        return None
    return sum(sizing.design_seconds(ph, n_seeds, scale)["total_s"] for ph in phases) / 3600


def size_from_dirs(paths: list[Path], arm: str, baseline: str, target_points: float,
                   problems: list[int] | None = None, hours: float | None = None) -> dict[str, Any]:
    """The sizing record of ``arm − baseline`` in final acc@t2 (points) from run / experiment dirs.

    problems: problem counts to project to (default: the pilot's own).
    hours: a budget of wall hours (on the pilot's machine) for the contrast's arms: the design of
        the projection with the smallest MDE within it and at least ``MIN_SEEDS`` seeds is
        ``affordable``.
    returns: {"arm", "baseline", "target_points", "pilot": {"n_seeds", "n_problems", "seeds",
              "diff", "lo", "hi", "se", "mde", "per_seed_diff"} (points; the report's two-way record),
              "components": variance_components of the differences in points,
              "projection": [{"n_seeds", "n_problems", "mde", "model_mde"}],
              "seeds_needed": {N: fewest seeds with projected MDE <= target, or None},
              "wall": {row: {"runs", "mean_wall_s", "per_run_wall_s", "phases", "training"}} (rows with
                      their own runs; phases: :func:`_phases`, training: :func:`_training_rate`),
              "contrast_arms": the arms whose runs the two rows read,
              "longest_run_hours": {N: the longest first run of any arm at N problems},
              "hours", "affordable": the budget and the projection row chosen within it (or None)}
        Each projection row also has ``contrast_hours`` and ``all_arms_hours``: wall hours of the
        contrast's arms / of every arm with runs, on that design, one after another on the pilot's
        machine, each arm's first run computing its start and the others reading it from the memo
        (:func:`mlmt_bench.metrics.sizing.design_seconds`).
    """
    if hours is not None and not hours > 0:
        raise UserError(f"--hours must be a positive number of hours, got {hours:g}")
    if not target_points > 0:
        raise UserError(f"--target must be a positive number of points, got {target_points:g}")
    grouped = group_runs(paths)
    loaded = with_base_critic_arms({a: [load_run(p) for p in dirs] for a, dirs in grouped.items() if dirs})
    for name in (arm, baseline):
        if name not in loaded:
            raise UserError(f"no row {name!r} in these runs (rows: {', '.join(loaded)})")
    a_rows, b_rows = analysis.seed_rows(loaded[arm]), analysis.seed_rows(loaded[baseline])
    shared = {s for s, _ in a_rows} & {s for s, _ in b_rows}  # a pilot part-way: one row has a seed more
    a_rows, b_rows = [r for r in a_rows if r[0] in shared], [r for r in b_rows if r[0] in shared]
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
    wall = {row: _wall(results) for row, results in loaded.items() if row in grouped}
    # the arms whose runs the two rows read (a `+ base critic` row reads its arm's runs)
    contrast = [a for a in grouped if {str(p) for p in grouped[a]} & {str(r.path) for n in (arm, baseline)
                                                                       for r in loaded[n]}]
    projection: list[dict[str, Any]] = [
        {"n_seeds": s, "n_problems": n, "mde": sizing.projected_mde(comp, s, n),
         "model_mde": sizing.mde_of_variance(sizing.model_variance(comp, s, n)),
         "contrast_hours": _cost(wall, contrast, s, n / len(pids)),
         "all_arms_hours": _cost(wall, list(wall), s, n / len(pids))}
        for n in sizes for s in grid]
    longest = {n: max((sizing.design_seconds(w["phases"], 1, n / len(pids))["first_run_s"] / 3600
                       for w in wall.values() if w["phases"] is not None), default=None) for n in sizes}
    affordable = None
    if hours is not None:
        within = [r for r in projection if r["n_seeds"] >= MIN_SEEDS and r["contrast_hours"] is not None
                  and r["contrast_hours"] <= hours]
        affordable = min(within, key=lambda r: (r["mde"], r["contrast_hours"])) if within else None
    return {"arm": arm, "baseline": baseline, "target_points": float(target_points), "pilot": pilot,
            "components": comp, "projection": projection, "seeds_needed": needed, "wall": wall,
            "contrast_arms": contrast, "longest_run_hours": longest, "hours": hours, "affordable": affordable}


def _hours(h: float | None) -> str:
    return "—" if h is None else f"{h:.1f}"


def _minutes(s: float | None) -> str:
    return "—" if s is None else f"{s / 60:.1f}"


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
              "| seeds | problems | MDE | model MDE | hours (contrast) | hours (all arms) |",
              "|---|---|---|---|---|---|"]
    lines += [f"| {r['n_seeds']} | {r['n_problems']} | {r['mde']:.2f} | {r['model_mde']:.2f} | "
              f"{_hours(r['contrast_hours'])} | {_hours(r['all_arms_hours'])} |" for r in rec["projection"]]
    lines += ["", f"Hours: wall hours on the pilot's machine, one run after another, of the contrast's arms "
                  f"({', '.join(rec['contrast_arms'])}) and of every arm with runs: each arm's mean training time "
                  "plus its evaluations scaled by problems from its runs' phases (below), the first run of an arm "
                  "computing its step-0 evaluation and the rest reading it from the memo. Longest single run: "
              + "; ".join(f"{n} problems {_hours(h)} h" for n, h in rec["longest_run_hours"].items()) + "."]
    if rec["hours"] is not None:
        a = rec["affordable"]
        lines += ["", f"Within {rec['hours']:g} hours for the contrast, with at least {MIN_SEEDS} seeds: " + (
            f"{a['n_seeds']} seeds × {a['n_problems']} problems, MDE {a['mde']:.2f} ({_hours(a['contrast_hours'])} h)."
            if a is not None else "no design of the table.")]
    lines += ["", "Fewest seeds for MDE ≤ target: " + "; ".join(
        f"{n} problems: {s if s is not None else f'none within {MAX_SEEDS}'}" for n, s in rec["seeds_needed"].items())
        + f". With {p['n_seeds']} pilot seeds the seed component is estimated from {p['n_seeds']} seed means: "
          "a point estimate, not a guarantee.", "",
          "| row | runs | mean wall (min) | start, computed (min) | start, memo (min) | training (min) | "
          "final evaluation (min) | steps | s a step (median) | generated tok/s | trained tok/s |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row, w in rec["wall"].items():
        ph, tr = w["phases"] or {}, w.get("training") or {}
        lines.append(f"| {row} | {w['runs']} | {_minutes(w['mean_wall_s'])} | " + " | ".join(
            _minutes(ph.get(k)) for k in ("start_s", "start_memo_s", "train_s", "final_eval_s")) + " | " + " | ".join(
            "–" if tr.get(k) is None else f"{tr[k]:.{d}f}" for k, d in (("steps", 1), ("step_s", 1), ("gen_tok_s", 1),
                                                                      ("trained_tok_s", 1))) + " |")
    lines += ["", "Steps, s a step and tok/s: training only (the step-0 evaluation to the last step), means over "
                  "each row's runs; tok/s: the run's generated and trained tokens over its training wall time."]
    return "\n".join(lines) + "\n"

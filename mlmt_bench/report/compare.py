"""Compare arms (GRPO, self-correction, MLMT-RL, ablations) from their run directories, with the
statistics of METHOD.md v2: the problem is the unit.

Output, written atomically into an output directory:

- ``comparison.md``: per arm, final metrics (mean ± std over seeds), accuracy with a 95% CI by a
  bootstrap over problems (each keeping all its seeds), the arm's starting point (step 0) and its
  gain over it, tokens and FLOPs to reach the baseline's final accuracy (per seed, interpolated;
  median and count of seeds that reached it); against the baseline, the per-problem difference of
  seed-averaged correctness with its CI and a sign-flip permutation test over problems, and an
  exact McNemar test per seed.
- ``acc_vs_tokens.png``: eval acc@t2 against generated tokens and against FLOPs.
- ``index.html``: all of it and more in one self-contained page (:mod:`mlmt_bench.report.html`).

Runs that differ in benchmark, split or evaluation protocol are never mixed in one table.
Statistics come from :mod:`mlmt_bench.metrics.stats`; run directories are read by
:mod:`mlmt_bench.report.runs`.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from mlmt_bench.errors import UserError
from mlmt_bench.metrics.stats import (
    bootstrap_ci,
    cluster_bootstrap_ci,
    mcnemar_exact,
    mean_std,
    paired_problem_diff,
    reach_point,
    sign_flip_test,
)
from mlmt_bench.report.formatting import (
    ALPHA as _ALPHA,
    CI_METRICS as _CI_METRICS,
    DASH,
    TABLE_METRICS as _TABLE_METRICS,
    fmt as _fmt,
    fmt_ci as _fmt_ci,
    fmt_mean_std as _fmt_mean_std,
    fmt_p as _fmt_p,
    fmt_reach as _fmt_reach,
    fmt_units as _fmt_units,
    mark as _mark,
)
from mlmt_bench.report.runs import (
    VALUE_EXERCISED_EV,
    RunRecord,
    acc_t2,
    group_runs,
    is_num,
    load_run,
    strip_stamp,
    with_base_critic,
)
from mlmt_bench.tracking import atomic_write_text

# reach_point compares acc >= target; the target is a mean of seed accuracies, so a seed that got
# exactly that accuracy may sit one ulp below it. Forgive float rounding only.
_TARGET_EPS = 1e-9


# ---------------------------------------------------------------------------------------------
# formatting


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|")


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(_md_cell(h) for h in header) + " |",
             "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# the comparison


def _summarise_arm(results: list[RunRecord]) -> dict[str, Any]:
    metrics: dict[str, Any] = {}
    for key, _, _ in _TABLE_METRICS:
        vals = [r.final.get(key) if key != "acc@t2" else acc_t2(r.final) for r in results]
        vals = [float(v) for v in vals if is_num(v)]
        if vals:
            mean, std = mean_std(vals)
            metrics[key] = {"mean": mean, "std": std, "n": len(vals), "per_seed": vals}
    cis: dict[str, Any] = {}
    for key, turn in _CI_METRICS:
        rows = [o for o in (r.outcomes(turn) for r in results) if o]
        if rows:
            mean, lo, hi = cluster_bootstrap_ci(rows)
            cis[key] = {"mean": mean, "lo": lo, "hi": hi, "n_problems": len(set().union(*rows)),
                        "n_seeds": len(rows)}
    start = {}
    for key, turn in _CI_METRICS:
        vals = [float(np.mean(list(o.values()))) for o in (r.outcomes(turn, at="first") for r in results) if o]
        if vals:
            start[key] = float(np.mean(vals))
    return {"runs": [str(r.path) for r in results], "seeds": [r.seed for r in results], "metrics": metrics,
            "ci": cis, "start": start, "gain": _gain(results)}


def _gain(results: list[RunRecord]) -> dict[str, Any] | None:
    """Final acc@t2 − the arm's own step-0 acc@t2: per seed (mean ± std), and per problem
    (seed-averaged) with a bootstrap CI over problems and a sign-flip test."""
    pairs = [(r.outcomes("t2"), r.outcomes("t2", at="first")) for r in results]
    pairs = [(f, s) for f, s in pairs if f and s]
    if not pairs:
        return None
    per_seed = [float(np.mean(list(f.values())) - np.mean(list(s.values()))) for f, s in pairs]
    mean, std = mean_std(per_seed)
    d = paired_problem_diff([f for f, _ in pairs], [s for _, s in pairs])
    _, lo, hi = bootstrap_ci(d)
    return {"mean": mean, "std": std, "lo": lo, "hi": hi, "p_value": sign_flip_test(d), "per_seed": per_seed}


def _reach(results: list[RunRecord], target: float, x_key: str) -> dict[str, Any]:
    """Per seed: where the eval curve first reaches ``target`` (interpolated), or "at step 0"."""
    per_seed: list[float | None] = []
    at_start = 0
    for r in results:
        xs, ys = r.curve_xy(x_key)
        if not xs:
            per_seed.append(None)
            continue
        if ys[0] >= target - _TARGET_EPS:
            at_start += 1
        order = sorted(range(len(xs)), key=lambda i: (xs[i], i))  # by cost, should a resume reorder it
        per_seed.append(reach_point([xs[i] for i in order], [ys[i] for i in order], target - _TARGET_EPS))
    reached = [x for x in per_seed if x is not None]
    return {"target": target, "per_seed": per_seed, "reached": len(reached), "n": len(per_seed),
            "at_start": at_start, "median": float(statistics.median(reached)) if reached else None}


def _paired(arm_runs: list[RunRecord], base_runs: list[RunRecord]) -> dict[str, Any]:
    """Arm − baseline on the problems both evaluated: per-problem difference of seed-averaged
    final acc@t2, its bootstrap CI over problems and sign-flip p-value; McNemar per seed."""
    a_rows = [o for o in (r.outcomes() for r in arm_runs) if o]
    b_rows = [o for o in (r.outcomes() for r in base_runs) if o]
    out: dict[str, Any] = {"n_problems": 0, "mcnemar": {}}
    if not a_rows or not b_rows:
        return out
    d = paired_problem_diff(a_rows, b_rows)
    if d.size == 0:
        return out
    diff, lo, hi = bootstrap_ci(d)
    out.update(n_problems=int(d.size), diff=diff, lo=lo, hi=hi, p_value=sign_flip_test(d))
    base_by_seed = {r.seed: r for r in base_runs if r.seed is not None}
    for r in arm_runs:
        b = base_by_seed.get(r.seed)
        if b is None:
            continue
        common = sorted(set(r.problems) & set(b.problems))
        if common:
            out["mcnemar"][r.seed] = mcnemar_exact([r.problems[p]["t2"] for p in common],
                                                   [b.problems[p]["t2"] for p in common])
    return out


def check_one_protocol(loaded: dict[str, list[RunRecord]]) -> dict[str, Any]:
    """The protocol all runs share; a UserError if they differ (never one table for two protocols)."""
    seen: dict[str, list[str]] = {}
    for results in loaded.values():
        for r in results:
            seen.setdefault(json.dumps(r.protocol, sort_keys=True), []).append(str(r.path))
    if len(seen) > 1:
        protocols = [json.loads(k) for k in seen]
        differ = sorted({k for p in protocols for k in p if len({json.dumps(q.get(k)) for q in protocols}) > 1})
        examples = "; ".join(f"{k}: " + " vs ".join(sorted({json.dumps(q.get(k)) for q in protocols}))
                             for k in differ[:3])
        raise UserError(f"the runs differ in their protocol ({examples}); report them separately")
    return json.loads(next(iter(seen))) if seen else {}


def build_comparison(
    runs: dict[str, list[Path]],
    out_dir: Path,
    *,
    baseline: str | None = "grpo",
    title: str = "",
    at_flops: float | None = None,
) -> dict[str, Any]:
    """Compare arms and write ``comparison.md``, ``acc_vs_tokens.png`` and ``index.html`` into ``out_dir``.

    runs: arm name -> its run directories (one per seed).
    baseline: the arm the others are tested against (paired tests, tokens/FLOPs to reach its final
        acc@t2); None, or an arm not in ``runs`` (said so in the report), skips those parts.
    returns: {"title", "baseline", "protocol", "target_acc@t2", "notes", "files",
              "arms": {arm: {"runs", "seeds", "metrics": {key: {"mean", "std", "n", "per_seed"}},
                            "ci": {"acc@t1"|"acc@t2"|"acc@t2_null": {"mean", "lo", "hi", "n_problems",
                                   "n_seeds"}},
                            "start": {key: step-0 mean}, "gain": {"mean", "std", "lo", "hi", "p_value"},
                            "reach": {"gen_tokens"|"flops": {"per_seed", "reached", "n", "at_start",
                                      "median"}} or None}},
              "paired": {arm: {"n_problems", "diff", "lo", "hi", "p_value", "mcnemar": {seed: {b, c,
                         p_value}}}}}
    (accuracies as fractions; McNemar b = arm right & baseline wrong, c = arm wrong & baseline right).
    at_flops: compare every run at its last evaluation within this many FLOPs (runs.load_run).
    """
    if not runs or not any(runs.values()):
        raise UserError("nothing to compare: no run directories given")
    empty = [arm for arm, paths in runs.items() if not paths]
    if empty:
        raise UserError(f"arm {empty[0]!r} has no run directories")
    out_dir = Path(out_dir)
    loaded = with_base_critic_arms({arm: [load_run(p, at_flops=at_flops) for p in paths]
                                    for arm, paths in runs.items()})
    protocol = check_one_protocol(loaded)

    notes: list[str] = _read_at_notes(loaded, at_flops) if at_flops is not None else []
    notes += _value_notes(loaded)
    for arm, results in loaded.items():
        for r in results:
            if not r.has_final and at_flops is None:
                notes.append(f"`{r.path}` ({arm}) has no final record (status: {r.status or 'unknown'}); "
                             f"its last eval (step {r.final.get('step', '?')}) is used.")
            if not r.problems:
                notes.append(f"`{r.path}` ({arm}) has no eval_problems.jsonl: no per-problem CI or paired test for it.")
        seeds = [r.seed for r in results]
        if len(set(seeds)) < len(seeds):
            notes.append(f"arm {arm} has several runs with the same seed ({seeds}).")

    if baseline is not None and baseline not in loaded:
        notes.append(f"baseline {baseline!r} is not among the arms ({', '.join(loaded)}): "
                     "no paired tests or tokens-to-reach.")
        baseline = None

    summary: dict[str, Any] = {"title": title, "baseline": baseline, "protocol": protocol, "arms": {},
                               "paired": {}, "notes": notes, "at_flops": at_flops,
                               "invalid_bases": invalid_bases(loaded)}
    for arm, results in loaded.items():
        summary["arms"][arm] = _summarise_arm(results)

    target = None
    if baseline is not None:
        base_acc = summary["arms"][baseline]["metrics"].get("acc@t2")
        target = base_acc["mean"] if base_acc else None
    summary["target_acc@t2"] = target
    for arm, results in loaded.items():
        summary["arms"][arm]["reach"] = ({x: _reach(results, target, x) for x in ("gen_tokens", "flops")}
                                         if target is not None else None)
        if baseline is not None and arm != baseline:
            summary["paired"][arm] = _paired(results, loaded[baseline])

    out_dir.mkdir(parents=True, exist_ok=True)
    md_path = out_dir / "comparison.md"
    png_path = out_dir / "acc_vs_tokens.png"
    from mlmt_bench.report.figures import plot_acc_vs_tokens
    from mlmt_bench.report.html import write_html

    plot_acc_vs_tokens(loaded, png_path, target=target, baseline=baseline, title=title)
    atomic_write_text(md_path, render_markdown(summary))
    html_path = write_html(summary, loaded, out_dir / "index.html", acc_png=png_path.read_bytes())
    summary["files"] = {"comparison.md": str(md_path), "acc_vs_tokens.png": str(png_path),
                        "index.html": str(html_path)}
    return summary


def with_base_critic_arms(loaded: dict[str, list[RunRecord]]) -> dict[str, list[RunRecord]]:
    """Each arm followed by its ``<arm> + base critic`` arm where its runs evaluated with the frozen
    base critic (METHOD v3, equal test-time compute)."""
    out: dict[str, list[RunRecord]] = {}
    for arm, results in loaded.items():
        out[arm] = results
        derived = [d for d in map(with_base_critic, results) if d is not None]
        if derived:
            out[f"{arm} + base critic"] = derived
    return out


def _value_notes(loaded: dict[str, list[RunRecord]]) -> list[str]:
    """METHOD v3: "value not exercised" for every run whose mean explained variance stays below 0.1."""
    notes = []
    for arm, results in loaded.items():
        low = [f"s{r.seed} ({r.final['value_ev_mean']:+.3f})" for r in results
               if is_num(r.final.get("value_ev_mean")) and r.final["value_ev_mean"] < VALUE_EXERCISED_EV]
        if low and not arm.endswith(" + base critic"):
            notes.append(f"{arm}: value not exercised in {', '.join(low)}: the learned value's mean explained "
                         f"variance stayed below {VALUE_EXERCISED_EV}, so its λ·V term carries little signal.")
    return notes


def invalid_bases(loaded: dict[str, list[RunRecord]]) -> list[str]:
    """The shared bases of the runs that fail METHOD v3's validity thresholds (allowed by their
    spec, ``base.allow_invalid``), one line each; a report puts them at its top."""
    out: dict[str, str] = {}
    for results in loaded.values():
        for r in results:
            base = r.manifest.get("base") or {}
            if base.get("invalid_because"):
                out[str(base.get("key"))] = (f"base `{base.get('key')}` ({base.get('preset')}, seed {base.get('seed')}): "
                                             + "; ".join(base["invalid_because"]))
    return list(out.values())


def _read_at_notes(loaded: dict[str, list[RunRecord]], budget: float) -> list[str]:
    """Where each run was read at a FLOPs budget, and which runs make that reading inexact."""
    notes = [f"Read at equal FLOPs: every run at its last evaluation within {budget:.3g} FLOPs (its final record "
             "is not used). Runs evaluated every k steps are read up to k steps before the budget."]
    for arm, results in loaded.items():
        at = ", ".join(f"s{r.seed}: step {r.read_at['step']}, {r.read_at['flops']:.3g} FLOPs, "
                       f"{r.read_at['gen_tokens']:,} tokens" for r in results if r.read_at)
        notes.append(f"{arm} read at {at}.")
        short = [f"s{r.seed}" for r in results if r.read_at and not r.read_at["reached"]]
        if short:
            notes.append(f"{arm}: runs {', '.join(short)} ended before spending {budget:.3g} FLOPs; "
                         "their last evaluation is used.")
        dependent = sorted({r.algorithm for r in results if _budget_dependent(r.algorithm)})
        if dependent:
            notes.append(f"{arm}: {', '.join(dependent)} changes what a step does with the share of its budget "
                         "spent, so reading it at a smaller FLOPs budget is not the same as stopping it there.")
    return notes


def _budget_dependent(algorithm: str | None) -> bool:
    """The algorithm's ``budget_dependent`` flag (False when it is not registered here)."""
    from mlmt_bench import registry

    if algorithm is None or algorithm not in registry.algorithms:
        return False
    return bool(getattr(registry.algorithms.get(algorithm), "budget_dependent", False))


def _fmt_gain(g: dict[str, Any] | None) -> str:
    if not g:
        return DASH
    return (f"{100 * g['mean']:+.1f} pp [{100 * g['lo']:+.1f}, {100 * g['hi']:+.1f}], "
            f"p = {_fmt_p(g['p_value'])}{_mark(g['p_value'])}")


def render_markdown(summary: dict[str, Any]) -> str:
    """The comparison.md text of a :func:`build_comparison` summary."""
    arms = list(summary["arms"])
    baseline = summary["baseline"]
    lines = [f"# {summary['title'] or 'Comparison'}", ""]
    if summary.get("invalid_bases"):
        lines += ["**Not a valid testbed (METHOD v3)**: these runs start from bases whose critic fails the "
                  "validity thresholds (allowed by `base.allow_invalid`), so what they say about feedback "
                  "is not a measurement of the method:", ""] + [f"- {b}" for b in summary["invalid_bases"]] + [""]
    if summary.get("at_flops") is not None:
        lines += [f"**Read at equal FLOPs ({summary['at_flops']:.3g})**: each run at its last evaluation within "
                  "that budget (see Notes).", ""]
    n_seeds = ", ".join(f"{a}: {len(summary['arms'][a]['runs'])}" for a in arms)
    proto = ", ".join(f"{k} = {json.dumps(v)}" for k, v in summary.get("protocol", {}).items())
    lines += [
        "Final evaluation of each run, refine-all protocol unless labelled otherwise "
        f"({proto or 'protocol not recorded'}). Statistics treat the problem as the unit (METHOD.md v2): "
        "`mean ± std` is over seeds (sample std; each seed has its own base, so it includes initialisation); "
        "the 95% CI resamples problems, each keeping all its seeds (2000 resamples, seed 0); a gain or a "
        "difference is the per-problem difference of seed-averaged correctness, with a sign-flip permutation "
        f"test over problems (* marks p < {_ALPHA}). Seeds per arm: {n_seeds}.",
        "",
    ]
    header = ["metric"] + arms
    rows: list[list[str]] = []
    for key, label, kind in _TABLE_METRICS:
        if not any(key in summary["arms"][a]["metrics"] for a in arms):
            continue
        rows.append([label] + [_fmt_mean_std(summary["arms"][a]["metrics"].get(key), kind) for a in arms])
        if key in dict(_CI_METRICS):
            rows.append([f"{label}: 95% CI (problems)"] + [_fmt_ci(summary["arms"][a]["ci"].get(key)) for a in arms])
            rows.append([f"{label} at step 0"] + [_fmt(summary["arms"][a]["start"].get(key), "pct") for a in arms])
    rows.append(["gain in acc@t2 over its own step 0 (95% CI, p)"] + [_fmt_gain(summary["arms"][a]["gain"]) for a in arms])
    if baseline is not None:
        target = summary["target_acc@t2"]
        for x_key, what, kind in (("gen_tokens", "tokens", "tok"), ("flops", "FLOPs", "flops")):
            rows.append([f"{what} to reach {baseline}'s final acc@t2 ({_fmt(target, 'pct')}): median over seeds"] +
                        [_fmt_reach((summary["arms"][a]["reach"] or {}).get(x_key), kind) for a in arms])
    rows.append(["problems × seeds in the CIs"] + [_fmt_units(summary["arms"][a]) for a in arms])
    lines += ["## Final metrics", "", _md_table(header, rows), ""]

    if baseline is not None:
        lines += [
            f"## Against {baseline}",
            "",
            f"Difference = arm − {baseline} in final acc@t2, per problem (each arm's correctness averaged over its "
            "seeds), with a bootstrap 95% CI over problems and a two-sided sign-flip permutation p-value over "
            f"problems. McNemar: exact, per seed (the arm's seed-s run against {baseline}'s; b = arm right and "
            f"{baseline} wrong, c = the reverse), never pooled over seeds.",
            "",
        ]
        prow: list[list[str]] = []
        for arm, p in summary["paired"].items():
            if not p.get("n_problems"):
                prow.append([arm, "0", DASH, DASH, "no common problems"])
                continue
            mc = "; ".join(f"s{seed}: {m['b']}/{m['c']}, p = {_fmt_p(m['p_value'])}"
                           for seed, m in sorted(p["mcnemar"].items()))
            prow.append([arm, str(p["n_problems"]),
                         f"{100 * p['diff']:+.1f} pp [{100 * p['lo']:+.1f}, {100 * p['hi']:+.1f}]",
                         _fmt_p(p["p_value"]) + _mark(p["p_value"]), mc or DASH])
        if prow:
            lines += [_md_table(["arm", "problems", "difference (95% CI)", "sign-flip p", "McNemar b/c per seed"],
                                prow), ""]
        else:
            lines += ["(no other arm)", ""]

    if summary["notes"]:
        lines += ["## Notes", ""] + [f"- {n}" for n in summary["notes"]] + [""]
    lines += ["## Runs", ""]
    for a in arms:
        lines.append(f"- **{a}**: " + ", ".join(f"`{p}`" for p in summary["arms"][a]["runs"]))
    lines += ["", "![acc@t2 vs generated tokens and FLOPs](acc_vs_tokens.png)", ""]
    return "\n".join(lines)


def report_from_dirs(
    paths: list[Path],
    out_dir: Path,
    baseline: str | None = "grpo",
    *,
    arms: dict[str, list[Path]] | None = None,
    title: str = "",
    at_flops: float | None = None,
) -> dict[str, Any]:
    """``mlmt-bench report RUN_DIR... --out DIR [--arm NAME=RUN_DIR ...]``: group, then compare.

    arms: explicitly named arms (from ``--arm``), added to those found from ``paths``.
    """
    grouped = group_runs(list(paths))
    for arm, dirs in (arms or {}).items():
        grouped.setdefault(arm, []).extend(Path(d) for d in dirs)
    if not title and len(paths) == 1 and (Path(paths[0]) / "experiment.json").is_file():
        title = strip_stamp(Path(paths[0]).name)
    return build_comparison(grouped, Path(out_dir), baseline=baseline, title=title, at_flops=at_flops)

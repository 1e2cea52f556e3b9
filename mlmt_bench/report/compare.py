"""Compare arms (GRPO, self-correction, MLMT-RL, ablations) from their run directories, with the
statistics of METHOD.md v3: seeds and problems are both random.

Output, written atomically into an output directory:

- ``comparison.md``: arms as rows (the baseline first, as in index.html), metrics as columns in
  the tables index.html groups them into: per arm, final metrics (mean ± std over seeds), accuracy
  with a 95% CI by the two-way bootstrap over seeds and problems, the arm's starting point (step 0) and its gain over
  it, tokens and FLOPs to reach the baseline's final accuracy (per seed, interpolated; median and
  count of seeds that reached it); against the baseline, the paired difference with its two-way
  CI, bootstrap p, Holm-adjusted p over the arms compared with it, minimum detectable effect and
  per-seed differences, the v2 sign-flip test over problems as a labelled secondary, and an exact
  McNemar test per seed; the same against ``<baseline> + base critic`` (equal test-time help) for
  the arms that answer with a refinement (a second turn), where the baseline's runs logged that row.
- ``acc_vs_tokens.png``: eval acc@t2 against generated tokens and against FLOPs.
- ``index.html``: all of it and more in one self-contained page (:mod:`mlmt_bench.report.html`).

Runs that differ in benchmark, split or evaluation protocol are never mixed in one table.
Statistics come from :mod:`mlmt_bench.report.analysis` (on :mod:`mlmt_bench.metrics.twoway`); run
directories are read by :mod:`mlmt_bench.report.runs`. Nothing rendered depends on where the
report directory lives (run paths are shown relative to it) or on the time, so a report published
with its raw data (:mod:`mlmt_bench.report.publish`) re-renders byte for byte.
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from mlmt_bench.errors import UserError
from mlmt_bench.io import eval_memo
from mlmt_bench.io.bounded_input import printable
from mlmt_bench.metrics.stats import mcnemar_exact, mean_std, reach_point
from mlmt_bench.report import analysis
from mlmt_bench.report.formatting import (
    CI_METRICS as _CI_METRICS,
    DASH,
    HEADLINE,
    METRIC_GROUPS,
    ONE_SEED,
    PROBLEMS,
    SHARED_BASE,
    TABLE_METRICS as _TABLE_METRICS,
    TOTALS,
    fmt as _fmt,
    fmt_ci as _fmt_ci,
    fmt_mde as _fmt_mde,
    fmt_mean_std as _fmt_mean_std,
    fmt_p as _fmt_p,
    fmt_pair_units as _fmt_pair_units,
    fmt_per_seed as _fmt_per_seed,
    fmt_pp_ci as _fmt_pp_ci,
    fmt_reach as _fmt_reach,
    fmt_read_at,
    fmt_units as _fmt_units,
    interval_tag as _interval_tag,
    mark as _mark,
    read_at_label,
    untrained_at_budget,
)
from mlmt_bench.report.runs import (
    AT_FLOPS_TOLERANCE,
    VALUE_EXERCISED_EV,
    WARM_START_ENTRY,
    RunRecord,
    acc_t2,
    experiment_record,
    group_runs,
    invalid_allowed_by,
    is_num,
    load_run,
    own_arms,
    strip_stamp,
    with_base_critic_arms,
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


def shown_path(path: Path | str, out_dir: Path | str) -> str:
    """A run directory as a report shows it: relative to the report directory (POSIX separators),
    so that the report does not depend on where it lives; absolute where no relative path exists."""
    try:
        rel = os.path.relpath(os.path.abspath(path), os.path.abspath(out_dir))
    except ValueError:  # another drive (Windows)
        return Path(os.path.abspath(path)).as_posix()
    return Path(rel).as_posix()


def _summarise_arm(arm: str, results: list[RunRecord], out_dir: Path) -> dict[str, Any]:
    metrics: dict[str, Any] = {}
    for key, _, _ in _TABLE_METRICS:
        vals: list[Any] = [r.final.get(key) if key != "acc@t2" else acc_t2(r.final) for r in results]
        vals = [float(v) for v in vals if is_num(v)]
        if vals:
            mean, std = mean_std(vals)
            metrics[key] = {"mean": mean, "std": std, "n": len(vals), "per_seed": vals}
    cis: dict[str, Any] = {}
    for key, turn in _CI_METRICS:
        ci = analysis.arm_interval(analysis.seed_rows(results, turn), arm)
        if ci is not None:
            cis[key] = ci
    start = {}
    for key, turn in _CI_METRICS:
        vals = [float(np.mean(list(o.values()))) for o in (r.outcomes(turn, at="first") for r in results) if o]
        if vals:
            start[key] = float(np.mean(vals))
    return {"runs": [shown_path(r.path, out_dir) for r in results], "seeds": [r.seed for r in results],
            "metrics": metrics, "ci": cis, "start": start, "gain": analysis.gain(results),
            "read_at": [r.read_at for r in results]}


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


def _versus(loaded: dict[str, list[RunRecord]], baseline: str, methods: list[str]) -> dict[str, dict[str, Any]]:
    """Every other arm of ``loaded`` − ``baseline``: :func:`analysis.versus_baseline`, Holm over
    ``methods``, with the McNemar test per seed."""
    return {arm: {**rec, "mcnemar": _mcnemar(loaded[arm], loaded[baseline])}
            for arm, rec in analysis.versus_baseline(loaded, baseline, methods).items()}


def method_arms(loaded: dict[str, list[RunRecord]], baseline: str) -> list[str]:
    """The arms compared with ``baseline`` that are methods, the family Holm adjusts over (METHOD v3):
    every arm of its own runs but the baseline and the upper bounds (:func:`oracle_bounds`); not the rows
    derived from an arm's runs (its base-critic, unredacted and second-solver rows)."""
    bounds = oracle_bounds(loaded)
    return [a for a in own_arms(loaded) if a != baseline and a not in bounds]


def _holm_family(paired: dict[str, dict[str, Any]]) -> list[str]:
    return [a for a, p in paired.items() if p.get("n_problems") and p.get("p_holm") is not None]


def _equal_help(loaded: dict[str, list[RunRecord]], baseline: str | None) -> dict[str, Any] | None:
    """The arms that answer with a refinement (a second turn: their final evaluation logged turn transitions)
    against ``<baseline> + base critic``, the baseline with the same test-time help (METHOD v3):
    ``{"baseline", "paired", "holm_family"}``; None when the baseline has no such row or no arm
    refines."""
    helped = f"{baseline} + base critic"
    if baseline is None or helped not in loaded:
        return None
    refining = [a for a in own_arms(loaded) if a != baseline and any("i->c" in r.final for r in loaded[a])]
    if not refining:
        return None
    paired = _versus({helped: loaded[helped], **{a: loaded[a] for a in refining}}, helped,
                     [a for a in method_arms(loaded, baseline) if a in refining])
    return {"baseline": helped, "paired": paired, "holm_family": _holm_family(paired)}


def _mcnemar(arm_runs: list[RunRecord], base_runs: list[RunRecord]) -> dict[Any, dict[str, Any]]:
    """Exact McNemar of final acc@t2 per seed, the arm's seed-s run against the baseline's, on the
    problems both evaluated (never pooled over seeds)."""
    out: dict[Any, dict[str, Any]] = {}
    base_by_seed = {r.seed: r for r in base_runs if r.seed is not None}
    for r in arm_runs:
        b = base_by_seed.get(r.seed) if r.seed is not None else None
        if b is None:
            continue
        common = sorted(set(r.problems) & set(b.problems))
        if common:
            out[r.seed] = mcnemar_exact([r.problems[p]["t2"] for p in common], [b.problems[p]["t2"] for p in common])
    return out


def _statistics_notes(summary: dict[str, Any]) -> list[str]:
    """What a reader must know about intervals that are not the two-way bootstrap of METHOD v3."""
    notes = []
    one_seed = [a for a, s in summary["arms"].items() if (s["ci"].get("acc@t2") or {}).get("interval") == ONE_SEED]
    if one_seed:
        notes.append(f"One seed ({', '.join(one_seed)}): the two-way bootstrap has no seed to resample, so "
                     "these intervals are the bootstrap over that seed's problems and leave out seed-to-seed "
                     "variation.")
    for arm, s in summary["arms"].items():
        for key, ci in s["ci"].items():
            if ci.get("interval") == PROBLEMS:
                notes.append(f"{arm}, {key}: its runs cannot be crossed as seeds × problems ({ci['why']}); the "
                             "interval falls back to the v2 bootstrap over problems of seed-averaged outcomes, "
                             "which leaves out seed-to-seed variation.")
        g = s.get("gain") or {}
        if g.get("interval") == PROBLEMS:
            notes.append(f"{arm}, gain over step 0: {g['why']}; it falls back to the v2 bootstrap over problems "
                         "of seed-averaged differences.")
    contrasts = [(summary["baseline"], summary["paired"])]
    if summary.get("equal_help"):
        contrasts.append((summary["equal_help"]["baseline"], summary["equal_help"]["paired"]))
    for baseline, paired in contrasts:
        for arm, p in paired.items():
            if p.get("interval") == PROBLEMS:
                notes.append(f"{arm} − {baseline}: not on the same seeds and problems ({p['why']}); the "
                             f"difference falls back to the v2 bootstrap over the {p['n_problems']} problems both "
                             "evaluated of seed-averaged correctness, which leaves out seed-to-seed variation.")
            elif not p.get("n_problems"):
                notes.append(f"{arm} − {baseline}: no difference ({p.get('why') or 'no common problems'}).")
    return notes


def _shown_value(value: Any) -> str:
    """A protocol value for a message: as JSON when plain (a name, a number), else described (a
    run directory may be anyone's: its spec's values are not shown)."""
    from mlmt_bench.io.bounded_input import echo, is_name, is_plain

    if isinstance(value, dict) and len(value) <= 6 and all(is_name(k) and is_plain(v) for k, v in value.items()):
        return json.dumps(value, sort_keys=True)  # benchmark options: {"difficulty": 2}
    return json.dumps(value) if is_plain(value) else echo(value)


def check_one_protocol(loaded: dict[str, list[RunRecord]]) -> dict[str, Any]:
    """The protocol all runs share; a UserError if they differ (never one table for two protocols)."""
    seen: dict[str, list[str]] = {}
    for results in loaded.values():
        for r in results:
            seen.setdefault(json.dumps(r.protocol, sort_keys=True), []).append(str(r.path))
    if len(seen) > 1:
        protocols = [json.loads(k) for k in seen]
        differ = sorted({k for p in protocols for k in p if len({json.dumps(q.get(k)) for q in protocols}) > 1})
        examples = "; ".join(f"{k}: " + " vs ".join(sorted({_shown_value(q.get(k)) for q in protocols}))
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
    notes: list[str] | None = None,
) -> dict[str, Any]:
    """Compare arms and write ``comparison.md``, ``acc_vs_tokens.png`` and ``index.html`` into ``out_dir``.

    runs: arm name -> its run directories (one per seed).
    baseline: the arm the others are tested against (paired tests, tokens/FLOPs to reach its final
        acc@t2); None, or an arm not in ``runs`` (said so in the report), skips those parts.
    returns: {"title", "baseline", "protocol", "target_acc@t2", "notes", "files", "at_flops",
              "invalid_bases",
              "statistics": :func:`mlmt_bench.report.analysis.description` plus "holm_family" (the
                            arms compared with the baseline),
              "arms": {arm: {"runs" (relative to out_dir), "seeds",
                            "metrics": {key: {"mean", "std", "n", "per_seed"}},
                            "ci": {"acc@t1"|"acc@t2"|"acc@t2_null": analysis.arm_interval: {"mean",
                                   "lo", "hi", "se", "n_seeds", "n_problems", "interval", "why"}},
                            "start": {key: step-0 mean},
                            "gain": analysis.gain: {"mean", "std", "per_seed", "diff", "lo", "hi", "se",
                                    "p_value", "mde", "per_seed_diff", "sign_flip_p", "interval", ...},
                            "reach": {"gen_tokens"|"flops": {"per_seed", "reached", "n", "at_start",
                                      "median"}} or None}},
              "paired": {arm: analysis.paired records ("n_problems", "n_seeds", "diff", "lo", "hi",
                         "se", "p_value" (two-way bootstrap), "p_holm", "mde", "per_seed_diff":
                         {seed: diff}, "sign_flip_p" (v2, secondary), "interval", "why") with
                         "mcnemar": {seed: {b, c, p_value}}},
              "equal_help": {"baseline": "<baseline> + base critic", "paired": as "paired", for the
                             arms that answer with a refinement, "holm_family"} (METHOD v3:
                             the comparison at equal test-time help) or None when the baseline's runs
                             have no ``+ base critic`` row}
    (accuracies as fractions; McNemar b = arm right & baseline wrong, c = arm wrong & baseline right;
    "interval": "two-way", "one seed" or "problems", the v2 fallback when runs cannot be crossed as
    seeds × problems, "why" saying why).
    at_flops: compare every run at its evaluation nearest this many FLOPs within ±10%, else at its last
        one below it, flagged (runs.load_run); refused when no run has one within ±10% (check_at_flops).
    notes: notes the caller adds, first (:func:`partial_note`).
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
    if at_flops is not None:
        check_at_flops(loaded, at_flops)

    notes = list(notes or [])
    notes += _read_at_notes(loaded, at_flops) if at_flops is not None else []
    notes += _value_notes(loaded)
    notes += _bound_notes(loaded)
    notes += _code_notes(loaded)
    for arm, results in loaded.items():
        for r in results:
            if not r.has_final and at_flops is None:
                notes.append(f"`{shown_path(r.path, out_dir)}` ({arm}) has no final record (status: "
                             f"{r.status or 'unknown'}); its last eval (step {r.final.get('step', '?')}) is used.")
            if not r.problems:
                notes.append(f"`{shown_path(r.path, out_dir)}` ({arm}) has no eval_problems.jsonl: no per-problem "
                             "CI or paired test for it.")
        seeds = [r.seed for r in results]
        if len(set(seeds)) < len(seeds):
            notes.append(f"arm {arm} has several runs with the same seed ({seeds}).")

    if baseline is not None and baseline not in loaded:
        notes.append(f"baseline {baseline!r} is not among the arms ({', '.join(loaded)}): "
                     "no paired tests or tokens-to-reach.")
        baseline = None
    loaded = baseline_first(loaded, baseline)

    summary: dict[str, Any] = {"title": title, "baseline": baseline, "protocol": protocol, "arms": {},
                               "paired": {}, "notes": notes, "at_flops": at_flops,
                               "invalid_bases": invalid_bases(loaded), "shared_bases": shared_bases(loaded),
                               "statistics": analysis.description()}
    for arm, results in loaded.items():
        summary["arms"][arm] = _summarise_arm(arm, results, out_dir)
    off, n_off, n_read = off_budget(loaded)
    if off:
        notes.insert(0, f"NOT AT EQUAL FLOPs: {n_off} of {n_read} runs have no evaluation within "
                        f"{AT_FLOPS_TOLERANCE:.0%} of {at_flops:.3g} FLOPs and are read below it (flagged in row "
                        f"\"read at\"): {', '.join(off)}.")
    untrained = untrained_at_budget(summary) if at_flops is not None else []
    if untrained:
        notes.insert(0, f"UNTRAINED within {at_flops:.3g} FLOPs: {', '.join(untrained)} had no evaluation after "
                        "step 0 within the budget, so their numbers are their starting point, not a trained arm's "
                        "(column \"read at\"); compare at a larger budget.")

    target = None
    if baseline is not None:
        base_acc = summary["arms"][baseline]["metrics"].get("acc@t2")
        target = base_acc["mean"] if base_acc else None
    summary["target_acc@t2"] = target
    for arm, results in loaded.items():
        summary["arms"][arm]["reach"] = ({x: _reach(results, target, x) for x in ("gen_tokens", "flops")}
                                         if target is not None else None)
    if baseline is not None:
        summary["paired"] = _versus(loaded, baseline, method_arms(loaded, baseline))
    summary["statistics"]["holm_family"] = _holm_family(summary["paired"])
    summary["equal_help"] = _equal_help(loaded, baseline)
    notes += _statistics_notes(summary)

    out_dir.mkdir(parents=True, exist_ok=True)
    md_path = out_dir / "comparison.md"
    png_path = out_dir / "acc_vs_tokens.png"
    from mlmt_bench.report.browser_page import write_problems
    from mlmt_bench.report.figures import plot_acc_vs_tokens
    from mlmt_bench.report.html import write_html

    plot_acc_vs_tokens(loaded, png_path, target=target, baseline=baseline, title=title)
    atomic_write_text(md_path, render_markdown(summary))
    html_path = write_html(summary, loaded, out_dir / "index.html", acc_png=png_path.read_bytes())
    problems_path = write_problems(summary, loaded, out_dir / "problems.html")
    summary["files"] = {"comparison.md": str(md_path), "acc_vs_tokens.png": str(png_path),
                        "index.html": str(html_path), "problems.html": str(problems_path)}
    return summary


def oracle_bounds(loaded: dict[str, list[RunRecord]]) -> list[str]:
    """The arms whose every run took its feedback from the benchmark's rule-based oracle (the manifest's
    ``roles.feedback``), which knows the answer: upper bounds, not methods (METHOD: oracle_feedback)."""
    def oracle_fed(r: RunRecord) -> bool:
        roles = r.manifest.get("roles")
        return isinstance(roles, dict) and roles.get("feedback") == "oracle"

    return [arm for arm, results in own_arms(loaded).items() if results and all(map(oracle_fed, results))]


def _bound_notes(loaded: dict[str, list[RunRecord]]) -> list[str]:
    """What a reader must know of each :func:`oracle_bounds` arm."""
    return [f"{arm} (and the rows derived from its runs): its feedback, in training and at test time, comes from the "
            "benchmark's rule-based oracle, which knows the answer (manifest: roles.feedback = oracle): an upper "
            "bound on what feedback can do, not a method, so it is compared with the baseline but left out of the "
            "Holm families." for arm in oracle_bounds(loaded)]


def _code_notes(loaded: dict[str, list[RunRecord]]) -> list[str]:
    """Where the runs compared ran more than one version of mlmt-bench's source (the manifest's ``code`` at the
    start and ``resumed_code`` at each resume; runs from before it was recorded say nothing): which runs ran
    which, so that a difference between arms is not read as one between methods alone."""
    ran: dict[str, list[str]] = {}
    for arm, results in own_arms(loaded).items():
        for r in results:
            resumed = r.manifest.get("resumed_code")
            codes = [r.manifest.get("code"), *(resumed if isinstance(resumed, list) else [])]
            for code in dict.fromkeys(c for c in codes if isinstance(c, str) and eval_memo.KEY.fullmatch(c)):
                ran.setdefault(code, []).append(f"{arm} s{r.seed}")
    if len(ran) < 2:
        return []
    return ["The runs ran " + str(len(ran)) + " versions of mlmt-bench's source (manifest: code, resumed_code): "
            + "; ".join(f"`{code[:12]}` ({', '.join(runs)})" for code, runs in ran.items()) + "."]


def _value_notes(loaded: dict[str, list[RunRecord]]) -> list[str]:
    """METHOD v3: "value not exercised" for every run whose mean explained variance stays below 0.1."""
    notes = []
    for arm, results in loaded.items():
        low = [f"s{r.seed} ({r.final['value_ev_mean']:+.3f})" for r in results
               if is_num(r.final.get("value_ev_mean")) and r.final["value_ev_mean"] < VALUE_EXERCISED_EV]
        if low and not arm.endswith(" + base critic"):
            notes.append(f"{arm}: value not exercised in {', '.join(low)}: the learned value's mean explained "
                         f"variance stayed below {VALUE_EXERCISED_EV}, so its λ·V term carries little signal and "
                         "these runs support no learned-vs-none result (METHOD v4).")
    return notes


def invalid_bases(loaded: dict[str, list[RunRecord]]) -> list[str]:
    """The shared bases of the runs that fail METHOD v3's validity thresholds or v4's critic gate
    (allowed by their spec, ``base.allow_invalid``), and the warm starts that fail the gate
    (``warm_start.allow_invalid``), one line each; a report puts them at its top."""
    out: dict[str, str] = {}
    for results in loaded.values():
        for r in results:
            base = r.manifest.get("base") or {}
            if base.get("invalid_because"):
                out[str(base.get("key"))] = (f"base `{base.get('key')}` ({base.get('preset')}, "
                                             f"seed {base.get('seed')}): " + "; ".join(base["invalid_because"]))
            warm = r.manifest.get("warm_start") or {}
            if warm.get("invalid_because"):
                out[str(warm.get("key"))] = (f"{WARM_START_ENTRY} `{warm.get('key')}` (from "
                                             f"{(warm.get('config') or {}).get('model')}): "
                                             + "; ".join(warm["invalid_because"]))
    return list(out.values())


def check_at_flops(loaded: dict[str, list[RunRecord]], budget: float) -> None:
    """``report --at-flops``: a one-line UserError when no run has an evaluation within
    ``AT_FLOPS_TOLERANCE`` of ``budget`` (nothing in the table would be read at that budget); a
    budget that some runs reach is reported, those that do not flagged (:func:`off_budget`)."""
    read = [r.read_at for results in loaded.values() for r in results if r.read_at]
    if read and not any(at["within"] for at in read):
        ratios = [at["ratio"] for at in read if at["ratio"] is not None]
        where = f" (their evaluations nearest it are at {min(ratios):.2f}×–{max(ratios):.2f}× of it)" if ratios else ""
        raise UserError(f"--at-flops {budget:.3g}: no run has an evaluation within {AT_FLOPS_TOLERANCE:.0%} of that "
                        f"budget{where}; read them at a budget where they were evaluated, or evaluate more often "
                        "(eval.every) or stop the runs there (budget: flops)")


def off_budget(loaded: dict[str, list[RunRecord]]) -> tuple[list[str], int, int]:
    """The runs read at a FLOPs budget with no evaluation within its tolerance: per arm, ``arm k/n
    (lo–hi×)`` (how many of its runs, at which shares of the budget), and the counts of such runs
    and of all runs read (each run once, under its own arm: :func:`~mlmt_bench.report.runs.own_arms`)."""
    out, n_off, n_all = [], 0, 0
    for arm, results in own_arms(loaded).items():
        read = [r.read_at for r in results if r.read_at]
        off = [at for at in read if not at["within"]]
        n_off, n_all = n_off + len(off), n_all + len(read)
        if off:
            ratios = sorted(at["ratio"] for at in off if at["ratio"] is not None)
            span = "" if not ratios else f" ({ratios[0]:.2f}×)" if ratios[0] == ratios[-1] else \
                f" ({ratios[0]:.2f}–{ratios[-1]:.2f}×)"
            out.append(f"{arm} {len(off)}/{len(read)}{span}")
    return out, n_off, n_all


def baseline_first(loaded: dict[str, list[RunRecord]], baseline: str | None) -> dict[str, list[RunRecord]]:
    """The arms with the baseline first, followed by the rows derived from its runs (every table
    and figure lists arms in this order and colours them by it); the others keep their order."""
    if baseline is None or baseline not in loaded:
        return loaded
    paths = {str(r.path) for r in loaded[baseline]}
    names = list(loaded)
    first = names.index(baseline)
    end = first + 1
    while end < len(names) and {str(r.path) for r in loaded[names[end]]} <= paths:
        end += 1
    return {a: loaded[a] for a in names[first:end] + names[:first] + names[end:]}


def _start_checkpoint(manifest: dict[str, Any]) -> tuple[str, str] | None:
    """(key, how a report names it) of the checkpoint a run started from when it is one that several
    seeds can share: a shared base (``base.key``), else a pretrained model's warm start
    (``warm_start.key``); None when the run records neither."""
    base = manifest.get("base") or {}
    if isinstance(base, dict) and base.get("key"):
        return f"base:{base['key']}", f"base `{base['key']}` ({base.get('preset')}, seed {base.get('seed')})"
    warm = manifest.get("warm_start") or {}
    if isinstance(warm, dict) and warm.get("key"):
        source = warm.get("from")
        alias = source.get("alias") if isinstance(source, dict) else None
        return f"warm_start:{warm['key']}", f"warm start `{warm['key']}` (of {alias})"
    return None


def shared_bases(loaded: dict[str, list[RunRecord]]) -> list[str]:
    """METHOD v4, "One checkpoint for every seed": each shared base or pretrained warm start that
    runs of several seeds started from (an experiment with ``base.seed`` fixed, or a ``warm_start``
    of a pretrained model), one line each naming it and its arms; a report puts them at its top,
    since its intervals are then conditional on that checkpoint. Empty when every seed had its own
    base (or no run records one)."""
    seeds: dict[str, set[int]] = {}
    arms: dict[str, list[str]] = {}
    shown: dict[str, str] = {}
    for arm, results in own_arms(loaded).items():
        for r in results:
            start = _start_checkpoint(r.manifest)
            if start is None or r.seed is None:
                continue
            key, shown[key] = start
            seeds.setdefault(key, set()).add(r.seed)
            if arm not in arms.setdefault(key, []):
                arms[key].append(arm)
    return [f"{shown[k]}: the start of every seed's runs of {', '.join(arms[k])} ({len(seeds[k])} seeds)"
            for k in seeds if len(seeds[k]) > 1]


def _read_at_notes(loaded: dict[str, list[RunRecord]], budget: float) -> list[str]:
    """Where each run was read at a FLOPs budget, and which runs make that reading inexact."""
    notes = [f"Read at {budget:.3g} FLOPs: every run at its evaluation nearest that budget within "
             f"±{AT_FLOPS_TOLERANCE:.0%} (its final record is not used), else at its last evaluation below it, "
             "flagged in column \"read at\" (that run is not read at equal FLOPs). A run stopped by train.flop_budget "
             "ends just past it, at its evaluation."]
    for arm, results in loaded.items():
        at = ", ".join(f"s{r.seed}: step {r.read_at['step']}, {r.read_at['flops']:.3g} FLOPs, "
                       f"{r.read_at['gen_tokens']:,} tokens" for r in results if r.read_at)
        notes.append(f"{arm} read at {at}.")
        short = [f"s{r.seed}" for r in results if r.read_at and not r.read_at["reached"]]
        if short:
            notes.append(f"{arm}: runs {', '.join(short)} ended before spending {budget:.3g} FLOPs; "
                         "their last evaluation is used.")
        dependent = sorted({r.algorithm for r in results if r.algorithm is not None and _budget_dependent(r.algorithm)})
        if dependent:
            notes.append(f"{arm}: {', '.join(dependent)} changes what a step does with the share of its budget "
                         "spent, so reading it at a smaller FLOPs budget is not the same as stopping it there.")
    return notes


def _budget_dependent(algorithm: str | None) -> bool:
    """The algorithm's ``budget_dependent`` flag (False when it is not registered here)."""
    from mlmt_bench import registry

    if algorithm is None or algorithm not in registry.algorithms:
        return False
    return registry.algorithms.get(algorithm).budget_dependent


def _fmt_gain(g: dict[str, Any] | None) -> str:
    if not g:
        return DASH
    return (f"{_fmt_pp_ci(g, 'mean')}, p = {_fmt_p(g['p_value'])}{_mark(g['p_value'])}, "
            f"MDE {_fmt_mde(g)}{_interval_tag(g)}")


#: a column of an arms table: its header and its cells, one per arm in the summary's order
Column = tuple[str, list[str]]


def _arms_table(summary: dict[str, Any], columns: list[Column]) -> str:
    """Arms as rows in the summary's order (the baseline first, as index.html lists them)."""
    return _md_table(["arm"] + [h for h, _ in columns],
                     [[a] + [cells[i] for _, cells in columns] for i, a in enumerate(summary["arms"])])


def _metric_columns(summary: dict[str, Any], keys: tuple[str, ...]) -> list[Column]:
    """The columns of the metrics of ``keys`` that some arm recorded, in TABLE_METRICS' order:
    mean ± std over seeds, followed for an accuracy by its 95% CI and its step-0 value."""
    arms = summary["arms"].values()
    columns: list[Column] = []
    for key, label, kind in _TABLE_METRICS:
        if key not in keys or not any(key in s["metrics"] for s in arms):
            continue
        columns.append((label, [_fmt_mean_std(s["metrics"].get(key), kind) for s in arms]))
        if key in dict(_CI_METRICS):
            columns += [(f"{label}: 95% CI (seeds × problems)", [_fmt_ci(s["ci"].get(key)) for s in arms]),
                        (f"{label} at step 0", [_fmt(s["start"].get(key), "pct") for s in arms])]
    return columns


def _metric_tables(summary: dict[str, Any]) -> list[str]:
    """The final metrics as index.html groups them, arms as rows: the headline accuracies (with
    where each arm was read, its gain over step 0 and the seeds × problems of its intervals), then
    a table per METRIC_GROUPS entry some arm recorded (tokens and FLOPs to reach the baseline's
    accuracy with the test-time cost), then the training totals and run time."""
    arms, baseline = summary["arms"].values(), summary["baseline"]
    head: list[Column] = []
    if summary.get("at_flops") is not None:
        head.append((read_at_label(summary["at_flops"]), [fmt_read_at(s) for s in arms]))
    head += _metric_columns(summary, HEADLINE)
    head += [("gain in acc@t2 over its own step 0 (95% CI, p, MDE)", [_fmt_gain(s["gain"]) for s in arms]),
             ("seeds × problems in the CIs", [_fmt_units(s) for s in arms])]
    out = [_arms_table(summary, head), ""]
    for anchor, heading, keys in (*METRIC_GROUPS, ("training", "Training cost and run time", TOTALS)):
        columns = _metric_columns(summary, keys)
        if anchor == "test-time" and baseline is not None:
            target = _fmt(summary["target_acc@t2"], "pct")
            columns += [(f"{what} to reach {baseline}'s final acc@t2 ({target}): median over seeds",
                         [_fmt_reach((s["reach"] or {}).get(x_key), kind) for s in arms])
                        for x_key, what, kind in (("gen_tokens", "tokens", "tok"), ("flops", "FLOPs", "flops"))]
        if columns:
            out += [f"### {heading}", "", _arms_table(summary, columns), ""]
    return out


def render_markdown(summary: dict[str, Any]) -> str:
    """The comparison.md text of a :func:`build_comparison` summary."""
    arms = list(summary["arms"])
    baseline = summary["baseline"]
    lines = [f"# {summary['title'] or 'Comparison'}", ""]
    if summary.get("invalid_bases"):
        lines += ["**Not a valid testbed (METHOD v3/v4)**: these runs start from bases whose critic fails the "
                  f"validity thresholds or the critic gate (allowed by {invalid_allowed_by(summary['invalid_bases'])}),"
                  " so what they say "
                  "about feedback is not a measurement of the method:", ""]
        lines += [f"- {b}" for b in summary["invalid_bases"]] + [""]
    if summary.get("shared_bases"):
        lines += [f"**{SHARED_BASE[0]}**: {SHARED_BASE[1]}:", ""] + [f"- {b}" for b in summary["shared_bases"]] + [""]
    if summary.get("at_flops") is not None:
        lines += [f"**Read at {summary['at_flops']:.3g} FLOPs**: each run at its evaluation nearest that budget "
                  f"within ±{AT_FLOPS_TOLERANCE:.0%}, else below it and flagged in column \"read at\" (see Notes).", ""]

    n_seeds = ", ".join(f"{a}: {len(summary['arms'][a]['runs'])}" for a in arms)
    proto = ", ".join(f"{k} = {json.dumps(v)}" for k, v in summary.get("protocol", {}).items())
    lines += [
        "Final evaluation of each run, refine-all protocol unless labelled otherwise "
        f"({proto or 'protocol not recorded'}). {analysis.statistics_text(summary)} Seeds per arm: {n_seeds}.",
        "",
    ]
    lines += ["## Final metrics", ""] + _metric_tables(summary)

    if baseline is not None:
        lines += [f"## Against {baseline}", "", analysis.against_text(summary), "", _paired_md(summary["paired"]), ""]
    if summary.get("equal_help"):
        help_ = summary["equal_help"]
        lines += [f"## Against {help_['baseline']} (equal test-time help)", "", analysis.equal_help_text(help_), "",
                  _paired_md(help_["paired"]), ""]

    if summary["notes"]:
        lines += ["## Notes", ""] + [f"- {n}" for n in summary["notes"]] + [""]
    lines += ["## Runs", ""]
    for a in arms:
        lines.append(f"- **{a}**: " + ", ".join(f"`{p}`" for p in summary["arms"][a]["runs"]))
    lines += ["", "![acc@t2 vs generated tokens and FLOPs](acc_vs_tokens.png)", ""]
    # arm names, titles and paths come from data (a published experiment.json): a control character
    # or bidi override in them is written escaped, never raw into a file someone will `cat`
    return "\n".join(printable(line) for line in "\n".join(lines).split("\n"))


def _paired_md(paired: dict[str, dict[str, Any]]) -> str:
    """The Markdown table of differences from one baseline (a summary's ``paired``)."""
    prow: list[list[str]] = []
    for arm, p in paired.items():
        if not p.get("n_problems"):
            prow.append([arm, "0", DASH, DASH, DASH, DASH, DASH, DASH, p.get("why") or "no common problems"])
            continue
        mc = "; ".join(f"s{seed}: {m['b']}/{m['c']}, p = {_fmt_p(m['p_value'])}"
                       for seed, m in sorted(p["mcnemar"].items()))
        prow.append([arm, _fmt_pair_units(p), _fmt_pp_ci(p) + _interval_tag(p), _fmt_p(p["p_value"]),
                     _fmt_p(p["p_holm"]) + _mark(p["p_holm"]), _fmt_mde(p), _fmt_per_seed(p),
                     _fmt_p(p["sign_flip_p"]), mc or DASH])
    if not prow:
        return "(no other arm)"
    return _md_table(["arm", "seeds × problems", "difference (95% CI)", "p", "p (Holm)", "MDE",
                      "per-seed differences (pp)", "sign-flip p (secondary: conditional on these seeds)",
                      "McNemar b/c per seed"], prow)


def check_baseline(baseline: str, arms: list[str]) -> None:
    """UserError (did-you-mean, the arms known) unless ``baseline``, asked for with ``--baseline``,
    names one of ``arms`` or one of its derived rows (``<arm> + base critic``, ``<arm> without
    redaction``, ``<arm> critic as second solver``, ``<arm> + base critic as second solver``): a
    typo (``grop``) would otherwise drop every paired test and tokens-to-reach from the report,
    with exit code 0."""
    names, suffixes = {baseline}, (" critic as second solver", " as second solver", " without redaction",
                                   " + base critic")
    for _ in range(2):  # a derived row of a derived row: "<arm> + base critic as second solver"
        names |= {n[: -len(s)] for n in names for s in suffixes if n.endswith(s)}
    if names & set(arms):
        return
    from mlmt_bench.registry import unknown_message

    raise UserError(f"--baseline: {unknown_message('arm', baseline, sorted(arms))}")


def _experiment_name(record: dict[str, Any], exp_dir: Path) -> str:
    """An experiment's title: its spec's ``name`` (experiment.json), else its directory's name
    without the time stamp (a renamed or copied directory keeps the spec's name)."""
    name = record.get("name")
    return name if isinstance(name, str) and name else strip_stamp(exp_dir.name)


def partial_note(grouped: dict[str, list[Path]], record: dict[str, Any]) -> list[str]:
    """One note when an experiment's arms have fewer finished runs than it has seeds (it is still
    running, or was published part-way: ``report --raw`` then ``run --restore`` in another session);
    [] when every arm has a run per seed, or when the seeds are not recorded."""
    seeds = record.get("seeds")
    if not isinstance(seeds, list) or not seeds or not grouped:
        return []
    n = len(seeds)
    if all(len(dirs) >= n for dirs in grouped.values()):
        return []
    done = sum(min(len(dirs), n) for dirs in grouped.values())
    each = "; ".join(f"{printable(arm)} {min(len(dirs), n)} of {n}" for arm, dirs in grouped.items())
    return [f"PARTIAL: {done} of {n * len(grouped)} arm × seed runs of this experiment have finished ({each}); "
            "each arm is shown with its finished seeds only, and an arm with none is left out."]


def report_from_dirs(
    paths: list[Path],
    out_dir: Path | None = None,
    baseline: str | None = None,
    *,
    arms: dict[str, list[Path]] | None = None,
    title: str = "",
    at_flops: float | None = None,
    raw: bool = False,
) -> dict[str, Any]:
    """``mlmt-bench report RUN_DIR... [--out DIR] [--arm NAME=RUN_DIR ...] [--raw]``: group, then compare.

    out_dir: None to re-render one experiment (or published report) directory in place.
    baseline, title, at_flops: when not given (None, "", None), what a published report recorded
        in its experiment.json (``report``), else "grpo", the experiment's name (its spec's, else
        its directory's without the time stamp), and each run's end.
    arms: explicitly named arms (from ``--arm``), added to those found from ``paths``.
    raw: publish the runs' raw data into ``out_dir`` first and report on the copies
        (:mod:`mlmt_bench.report.publish`); the summary then has ``published``: its size.
    """
    paths = [Path(p) for p in paths]
    one_exp = len(paths) == 1 and (paths[0] / "experiment.json").is_file()
    record = experiment_record(paths[0]) if one_exp else {}
    if out_dir is None:
        if not one_exp or arms:
            raise UserError("give --out DIR (without it the report is re-rendered in place, which needs one "
                            "experiment or published report directory and no --arm)")
        out_dir = paths[0]
    recorded = record.get("report")
    recorded = recorded if isinstance(recorded, dict) else {}
    asked = baseline  # the user's --baseline: it must name an arm (a default or recorded one may be absent)
    if baseline is None:
        baseline = recorded.get("baseline", "grpo")
    if not title:  # a published report's recorded title, even an empty one, is what re-renders it
        title = recorded["title"] if isinstance(recorded.get("title"), str) else (
            _experiment_name(record, paths[0]) if one_exp else "")
    if at_flops is None:
        at_flops = recorded.get("at_flops")
    grouped = group_runs(paths)
    for arm, dirs in (arms or {}).items():
        grouped.setdefault(arm, []).extend(Path(d) for d in dirs)
    partial = partial_note(grouped, record) if one_exp else []
    if partial:  # an experiment still running, or published before it finished: its finished runs
        grouped = {arm: dirs for arm, dirs in grouped.items() if dirs}
    if asked is not None:
        check_baseline(asked, list(grouped))
    if raw:
        from mlmt_bench.report import publish

        if at_flops is not None:  # refused before anything is copied
            check_at_flops({arm: [load_run(p, at_flops=at_flops) for p in dirs] for arm, dirs in grouped.items()},
                           at_flops)
        grouped = publish.publish_runs(grouped, Path(out_dir), record=record if one_exp and not arms else {},
                                       title=title, baseline=baseline, at_flops=at_flops)
    summary = build_comparison(grouped, Path(out_dir), baseline=baseline, title=title, at_flops=at_flops,
                               notes=partial)
    if raw:
        summary["published"] = publish.size(Path(out_dir))
    return summary

"""Compare arms (GRPO, self-correction, MLMT-RL, ablations) from their run directories.

Input: run directories as described in docs/run-directory.md (``metrics.jsonl`` with ``eval``
and ``final`` records, ``eval_problems.jsonl`` with per-problem correctness at each eval step,
``manifest.json``). Output, written atomically into an output directory:

- ``comparison.md``: final metrics per arm (mean ± std over seeds, 95% bootstrap CIs over
  problems pooled across seeds, tokens to reach the baseline's final acc@t2) and a paired
  exact McNemar test of every arm against the baseline (METHOD.md "Metrics").
- ``acc_vs_tokens.png``: eval acc@t2 against generated tokens and against FLOPs.

Statistics come from :mod:`mlmt_bench.metrics.stats`; nothing is recomputed here.
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mlmt_bench.errors import UserError
from mlmt_bench.metrics.stats import (
    bootstrap_ci,
    mcnemar_exact,
    mean_std,
    paired_bootstrap_diff,
    tokens_to_reach,
)
from mlmt_bench.tracking import atomic_write_text, read_jsonl_lines

# A run directory is ``<name>-<YYYYmmddTHHMMSSZ>`` with ``-<i>`` when two started the same second.
_STAMP_RE = re.compile(r"-\d{8}T\d{6}Z(?:-\d+)?$")

# Metrics of the final record shown in the table: (key, label, format kind).
#   pct: a fraction shown as a percentage; pp: a signed difference of fractions, in points;
#   nat: nats per token; num: a plain number; tok: a token count; flops: scientific.
_TABLE_METRICS: list[tuple[str, str, str]] = [
    ("acc@t1", "acc@t1", "pct"),
    ("acc@t2", "acc@t2", "pct"),
    ("delta", "delta (t2 − t1)", "pp"),
    ("i->c", "i→c", "pct"),
    ("c->i", "c→i", "pct"),
    ("correction_rate", "correction_rate", "pct"),
    ("regression_rate", "regression_rate", "pct"),
    ("acc_oracle_gated", "acc oracle-gated (optimistic: consults the verifier at test time)", "pct"),
    ("feedback_effect", "feedback_effect (g vs g∅)", "pp"),
    ("feedback_sensitivity", "feedback_sensitivity (nats/token)", "nat"),
    ("leakage_rate", "leakage_rate", "pct"),
    ("feedback_tokens", "feedback_tokens (mean per feedback)", "num"),
    ("gen_tokens", "generated tokens (training, at the end)", "tok"),
    ("flops", "FLOPs (approx., at the end)", "flops"),
]
_CI_METRICS = ("acc@t1", "acc@t2")  # bootstrapped over (seed, problem) units
DASH = "–"
# tokens_to_reach compares acc >= target; the target is a mean of seed accuracies, so a seed
# that got exactly that accuracy may sit one ulp below it. Forgive float rounding only.
_TARGET_EPS = 1e-9


@dataclass
class RunResult:
    """What a comparison needs from one run directory.

    final:    the ``final`` record of metrics.jsonl (or the last ``eval`` record when the run has
              none, e.g. it was interrupted; ``has_final`` says which).
    curve:    ``eval`` records, one per step (the last one logged wins), sorted by step.
    problems: per-problem correctness at the final eval step, ``{problem_id: {"t1", "t2",
              "t2_null"}}``; empty when the run wrote no eval_problems.jsonl.
    """

    path: Path
    name: str
    arm: str
    seed: int | None
    status: str | None
    manifest: dict[str, Any]
    final: dict[str, Any]
    has_final: bool
    curve: list[dict[str, Any]]
    final_step: int | None
    problems: dict[str, dict[str, Any]] = field(default_factory=dict)

    def curve_xy(self, x_key: str, y_key: str = "acc@t2") -> tuple[list[float], list[float]]:
        """Points (x, y) of the eval curve where both are recorded."""
        xs, ys = [], []
        for rec in self.curve:
            x, y = rec.get(x_key), _acc_t2(rec) if y_key == "acc@t2" else rec.get(y_key)
            if _is_num(x) and _is_num(y):
                xs.append(float(x))
                ys.append(float(y))
        return xs, ys


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _acc_t2(rec: dict[str, Any]) -> Any:
    """acc@t2 of a record; single-turn runs (GRPO) have acc@t2 = acc@t1 (run-directory.md)."""
    for key in ("acc@t2", "acc@t1", "acc"):
        if _is_num(rec.get(key)):
            return rec[key]
    return None


def strip_stamp(name: str) -> str:
    """``grpo-20250101T120000Z`` (or ``...Z-1``) -> ``grpo``."""
    return _STAMP_RE.sub("", name)


def _read_records(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """(line number, record) of a JSONL file, as tracking.read_jsonl_lines parses it (a torn
    last line is ignored, any other bad line is a file:line UserError); each record must be an
    object."""
    out = read_jsonl_lines(path)
    for lineno, rec in out:
        if not isinstance(rec, dict):
            raise UserError(f"{path}:{lineno}: expected a JSON object, got {type(rec).__name__}")
    return out


def load_run(path: Path | str) -> RunResult:
    """Read one run directory; a :class:`UserError` (one line) if it cannot be compared."""
    path = Path(path)
    if not path.is_dir():
        raise UserError(f"{path}: not a directory")
    metrics_path = path / "metrics.jsonl"
    manifest_path = path / "manifest.json"
    if not metrics_path.is_file() and not manifest_path.is_file():
        raise UserError(f"{path}: not a run directory (no manifest.json / metrics.jsonl)")
    manifest: dict[str, Any] = {}
    if manifest_path.is_file():
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise UserError(f"{manifest_path}: unreadable ({exc})".replace("\n", " ")) from None
        if not isinstance(manifest, dict):
            raise UserError(f"{manifest_path}: expected a JSON object")
    if not metrics_path.is_file():
        raise UserError(f"{path}: no metrics.jsonl (the run wrote no metrics yet)")

    records = _read_records(metrics_path)
    by_step: dict[int, dict[str, Any]] = {}
    final: dict[str, Any] | None = None
    for _, rec in records:
        kind = rec.get("kind")
        if kind == "eval":
            step = rec.get("step")
            by_step[int(step) if _is_num(step) else len(by_step)] = rec  # last logged per step wins
        elif kind == "final":
            final = rec
    if not by_step and final is None:
        raise UserError(f"{metrics_path}: no eval records (the run has not been evaluated yet)")
    curve = [by_step[s] for s in sorted(by_step)]
    has_final = final is not None
    if final is None:
        final = curve[-1]

    final_step = final.get("step") if _is_num(final.get("step")) else None
    problems_step, problems = _final_problems(path / "eval_problems.jsonl", final_step)
    if problems_step is not None:
        final_step = problems_step

    name = str(manifest.get("name") or strip_stamp(path.name))
    arm = str(manifest.get("arm") or strip_stamp(name))
    seed = manifest.get("seed")
    return RunResult(
        path=path, name=name, arm=arm,
        seed=int(seed) if _is_num(seed) else None,
        status=manifest.get("status"), manifest=manifest,
        final=final, has_final=has_final, curve=curve,
        final_step=int(final_step) if final_step is not None else None,
        problems=problems,
    )


def _final_problems(path: Path, final_step: Any) -> tuple[int | None, dict[str, dict[str, Any]]]:
    """(step, per-problem correctness at that step): the final record's step when it has rows,
    else the last evaluated step. A resumed run may repeat a step: the last line wins."""
    if not path.is_file():
        return None, {}
    rows = _read_records(path)
    by_step: dict[int, dict[str, dict[str, Any]]] = defaultdict(dict)
    for lineno, row in rows:
        step, pid = row.get("step"), row.get("problem_id")
        if not _is_num(step) or pid is None or "t1" not in row:
            raise UserError(f"{path}:{lineno}: record lacks step / problem_id / t1")
        t1 = bool(row["t1"])
        t2 = bool(row["t2"]) if row.get("t2") is not None else t1
        by_step[int(step)][str(pid)] = {"t1": t1, "t2": t2, "t2_null": row.get("t2_null")}
    if not by_step:
        return None, {}
    step = int(final_step) if _is_num(final_step) and int(final_step) in by_step else max(by_step)
    return step, dict(by_step[step])


# ---------------------------------------------------------------------------------------------
# formatting


def _fmt(value: float | None, kind: str) -> str:
    if value is None or not math.isfinite(value):
        return DASH
    if kind == "pct":
        return f"{100 * value:.1f}%"
    if kind == "pp":
        return f"{100 * value:+.1f} pp"
    if kind == "nat":
        return f"{value:+.3f}"
    if kind == "num":
        return f"{value:.1f}"
    if kind == "tok":
        return _fmt_count(value)
    if kind == "flops":
        return f"{value:.2e}"
    raise ValueError(kind)


def _fmt_count(value: float) -> str:
    a = abs(value)
    if a >= 1e9:
        return f"{value / 1e9:.2f}G"
    if a >= 1e6:
        return f"{value / 1e6:.2f}M"
    if a >= 1e4:
        return f"{value / 1e3:.1f}k"
    return f"{value:.0f}"


def _fmt_spread(value: float | None, kind: str) -> str:
    """A std in the units of its metric, without sign or '%' (it follows '±')."""
    if value is None or not math.isfinite(value):
        return DASH
    if kind in ("pct", "pp"):
        return f"{100 * value:.1f}"
    if kind == "nat":
        return f"{value:.3f}"
    return _fmt(value, kind)


def _fmt_mean_std(ms: dict[str, Any] | None, kind: str) -> str:
    if not ms:
        return DASH
    mean = _fmt(ms["mean"], kind)
    if ms["std"] is None:
        return f"{mean} (1 seed)" if ms["n"] == 1 else mean
    return f"{mean} ± {_fmt_spread(ms['std'], kind)}"


def _fmt_ci(ci: dict[str, Any] | None) -> str:
    if not ci:
        return DASH
    return f"{100 * ci['mean']:.1f}% [{100 * ci['lo']:.1f}, {100 * ci['hi']:.1f}]"


def _fmt_p(p: float | None) -> str:
    if p is None:
        return DASH
    return f"{p:.2e}" if p < 1e-3 else f"{p:.3f}"


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|")


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(_md_cell(h) for h in header) + " |",
             "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# the comparison


def _summarise_arm(results: list[RunResult]) -> dict[str, Any]:
    metrics: dict[str, Any] = {}
    for key, _, _ in _TABLE_METRICS:
        vals = [r.final.get(key) if key != "acc@t2" else _acc_t2(r.final) for r in results]
        vals = [float(v) for v in vals if _is_num(v)]
        if vals:
            mean, std = mean_std(vals)
            metrics[key] = {"mean": mean, "std": std, "n": len(vals), "per_seed": vals}
    cis: dict[str, Any] = {}
    for key in _CI_METRICS:
        turn = "t1" if key == "acc@t1" else "t2"
        units = [float(p[turn]) for r in results for p in r.problems.values()]
        if units:
            mean, lo, hi = bootstrap_ci(units)
            cis[key] = {"mean": mean, "lo": lo, "hi": hi, "n_units": len(units)}
    return {
        "runs": [str(r.path) for r in results],
        "seeds": [r.seed for r in results],
        "metrics": metrics,
        "ci": cis,
    }


def _tokens_to_reach(results: list[RunResult], target: float) -> dict[str, Any]:
    per_seed: list[int | None] = []
    for r in results:
        xs, ys = r.curve_xy("gen_tokens")
        if any(b < a for a, b in zip(xs, xs[1:])):  # not monotone in steps: order by tokens
            xs, ys = (list(t) for t in zip(*sorted(zip(xs, ys)))) if xs else ([], [])
        per_seed.append(tokens_to_reach(xs, ys, target - _TARGET_EPS) if xs else None)
    reached = [t for t in per_seed if t is not None]
    return {
        "target": target,
        "per_seed": per_seed,
        "reached": len(reached),
        "n": len(per_seed),
        "mean": float(np.mean(reached)) if reached else None,
    }


def _fmt_reach(tr: dict[str, Any] | None) -> str:
    if tr is None:
        return DASH
    if tr["mean"] is None:
        return "not reached"
    text = _fmt_count(tr["mean"])
    if tr["reached"] < tr["n"]:
        text += f" (reached by {tr['reached']}/{tr['n']} seeds; mean over those)"
    return text


def _paired(arm_runs: list[RunResult], base_runs: list[RunResult]) -> dict[str, Any]:
    """Pool (seed, problem) pairs with the same seed and problem id in both arms."""
    base_by_seed: dict[int, list[RunResult]] = defaultdict(list)
    for r in base_runs:
        if r.seed is not None:
            base_by_seed[r.seed].append(r)
    arm_by_seed: dict[int, list[RunResult]] = defaultdict(list)
    for r in arm_runs:
        if r.seed is not None:
            arm_by_seed[r.seed].append(r)
    a_correct: list[bool] = []
    b_correct: list[bool] = []
    seeds: list[int] = []
    for seed in sorted(set(arm_by_seed) & set(base_by_seed)):
        for ra, rb in zip(arm_by_seed[seed], base_by_seed[seed]):
            common = sorted(set(ra.problems) & set(rb.problems))
            if not common:
                continue
            seeds.append(seed)
            a_correct += [ra.problems[p]["t2"] for p in common]
            b_correct += [rb.problems[p]["t2"] for p in common]
    out: dict[str, Any] = {"seeds": seeds, "n_pairs": len(a_correct)}
    if not a_correct:
        return out
    out.update(mcnemar_exact(a_correct, b_correct))
    diff, lo, hi = paired_bootstrap_diff(np.asarray(a_correct, float), np.asarray(b_correct, float))
    out.update({"diff": diff, "lo": lo, "hi": hi})
    return out


def build_comparison(
    runs: dict[str, list[Path]],
    out_dir: Path,
    *,
    baseline: str | None = "grpo",
    title: str = "",
) -> dict[str, Any]:
    """Compare arms and write ``comparison.md`` and ``acc_vs_tokens.png`` into ``out_dir``.

    runs: arm name -> its run directories (one per seed).
    baseline: the arm the others are tested against (McNemar, tokens to reach its final
        acc@t2); None, or an arm not in ``runs`` (said so in the report), skips those parts.
    returns: {"title", "baseline", "target_acc@t2", "notes", "files",
              "arms": {arm: {"runs", "seeds", "metrics": {key: {"mean", "std", "n", "per_seed"}},
                            "ci": {"acc@t1"|"acc@t2": {"mean", "lo", "hi", "n_units"}},
                            "tokens_to_reach": {...} or None}},
              "paired": {arm: {"seeds", "n_pairs", "b", "c", "p_value", "diff", "lo", "hi"}}}
    (accuracies as fractions; b = arm right & baseline wrong, c = arm wrong & baseline right).
    """
    if not runs or not any(runs.values()):
        raise UserError("nothing to compare: no run directories given")
    empty = [arm for arm, paths in runs.items() if not paths]
    if empty:
        raise UserError(f"arm {empty[0]!r} has no run directories")
    out_dir = Path(out_dir)
    loaded = {arm: [load_run(p) for p in paths] for arm, paths in runs.items()}

    notes: list[str] = []
    for arm, results in loaded.items():
        for r in results:
            if not r.has_final:
                notes.append(f"`{r.path}` ({arm}) has no final record (status: {r.status or 'unknown'}); "
                             f"its last eval (step {r.final.get('step', '?')}) is used.")
            if not r.problems:
                notes.append(f"`{r.path}` ({arm}) has no eval_problems.jsonl: "
                             "no per-problem CI or paired test for it.")
        seeds = [r.seed for r in results]
        if len(set(seeds)) < len(seeds):
            notes.append(f"arm {arm} has several runs with the same seed ({seeds}).")

    if baseline is not None and baseline not in loaded:
        notes.append(f"baseline {baseline!r} is not among the arms ({', '.join(loaded)}): "
                     "no paired tests or tokens-to-reach.")
        baseline = None

    summary: dict[str, Any] = {"title": title, "baseline": baseline, "arms": {}, "paired": {},
                               "notes": notes}
    for arm, results in loaded.items():
        summary["arms"][arm] = _summarise_arm(results)

    target = None
    if baseline is not None:
        base_acc = summary["arms"][baseline]["metrics"].get("acc@t2")
        target = base_acc["mean"] if base_acc else None
    summary["target_acc@t2"] = target
    for arm, results in loaded.items():
        summary["arms"][arm]["tokens_to_reach"] = (
            _tokens_to_reach(results, target) if target is not None else None)
        if baseline is not None and arm != baseline:
            summary["paired"][arm] = _paired(results, loaded[baseline])

    out_dir.mkdir(parents=True, exist_ok=True)
    md_path = out_dir / "comparison.md"
    png_path = out_dir / "acc_vs_tokens.png"
    from mlmt_bench.report.figures import plot_acc_vs_tokens

    plot_acc_vs_tokens(loaded, png_path, target=target, baseline=baseline, title=title)
    atomic_write_text(md_path, render_markdown(summary))
    summary["files"] = {"comparison.md": str(md_path), "acc_vs_tokens.png": str(png_path)}
    return summary


def render_markdown(summary: dict[str, Any]) -> str:
    """The comparison.md text of a :func:`build_comparison` summary."""
    arms = list(summary["arms"])
    baseline = summary["baseline"]
    lines = [f"# {summary['title'] or 'Comparison'}", ""]
    n_seeds = ", ".join(f"{a}: {len(summary['arms'][a]['runs'])}" for a in arms)
    lines += [
        "Final evaluation of each run (refine-all protocol unless labelled otherwise). "
        "`mean ± std` is over seeds (sample std); `95% CI` is a percentile bootstrap "
        "(2000 resamples, seed 0) over problems, pooling every (seed, problem) pair of the arm. "
        f"Seeds per arm: {n_seeds}.",
        "",
    ]
    header = ["metric"] + arms
    rows: list[list[str]] = []
    for key, label, kind in _TABLE_METRICS:
        rows.append([label] + [_fmt_mean_std(summary["arms"][a]["metrics"].get(key), kind) for a in arms])
        if key in _CI_METRICS:
            rows.append([f"{label} 95% CI (problems)"] +
                        [_fmt_ci(summary["arms"][a]["ci"].get(key)) for a in arms])
    if baseline is not None:
        target = summary["target_acc@t2"]
        label = (f"tokens to reach {baseline}'s final acc@t2 ({_fmt(target, 'pct')})"
                 if target is not None else f"tokens to reach {baseline}'s final acc@t2")
        rows.append([label] + [_fmt_reach(summary["arms"][a]["tokens_to_reach"]) for a in arms])
    rows.append(["(seed, problem) units in the CIs"] +
                [_fmt_units(summary["arms"][a]) for a in arms])
    lines += ["## Final metrics", "", _md_table(header, rows), ""]

    if baseline is not None:
        lines += [
            f"## Paired test against {baseline}",
            "",
            f"Exact McNemar test on final per-problem acc@t2 correctness, pairing the same seed "
            f"and problem id and pooling the pairs over seeds. b = the arm right and {baseline} "
            f"wrong, c = the arm wrong and {baseline} right. Difference = arm − {baseline} with a "
            "paired bootstrap 95% CI over the pairs.",
            "",
        ]
        prow: list[list[str]] = []
        for arm, p in summary["paired"].items():
            if not p.get("n_pairs"):
                prow.append([arm, DASH, "0", DASH, DASH, DASH, "no pairs (no common seeds / problems)"])
                continue
            prow.append([
                arm, ", ".join(str(s) for s in p["seeds"]), str(p["n_pairs"]), str(p["b"]), str(p["c"]),
                _fmt_p(p["p_value"]),
                f"{100 * p['diff']:+.1f} pp [{100 * p['lo']:+.1f}, {100 * p['hi']:+.1f}]",
            ])
        if prow:
            lines += [_md_table(["arm", "seeds", "pairs", "b", "c", "p-value", "difference (95% CI)"], prow), ""]
        else:
            lines += ["(no other arm)", ""]

    if summary["notes"]:
        lines += ["## Notes", ""] + [f"- {n}" for n in summary["notes"]] + [""]
    lines += ["## Runs", ""]
    for a in arms:
        lines.append(f"- **{a}**: " + ", ".join(f"`{p}`" for p in summary["arms"][a]["runs"]))
    lines += ["", "![acc@t2 vs generated tokens and FLOPs](acc_vs_tokens.png)", ""]
    return "\n".join(lines)


def _fmt_units(arm: dict[str, Any]) -> str:
    ci = arm["ci"].get("acc@t2")
    return str(ci["n_units"]) if ci else DASH


# ---------------------------------------------------------------------------------------------
# grouping run directories into arms


def _experiment_arms(exp_dir: Path) -> dict[str, list[Path]]:
    path = exp_dir / "experiment.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"{path}: unreadable ({exc})".replace("\n", " ")) from None
    arms = data.get("arms") if isinstance(data, dict) else None
    if not isinstance(arms, dict) or not arms:
        raise UserError(f"{path}: no 'arms' mapping of arm -> run directories")
    out: dict[str, list[Path]] = {}
    for arm, entries in arms.items():
        if isinstance(entries, (str, dict)):
            entries = [entries]
        if not isinstance(entries, list):
            raise UserError(f"{path}: arms.{arm} must be a list of run directories")
        dirs = []
        for e in entries:
            p = e.get("run_dir") or e.get("path") if isinstance(e, dict) else e
            if not isinstance(p, str):
                raise UserError(f"{path}: arms.{arm}: cannot read a run directory from {e!r}")
            run = Path(p)
            if not run.is_absolute() and not run.exists() and (exp_dir / run).exists():
                run = exp_dir / run  # relative to the experiment directory
            dirs.append(run)
        out[str(arm)] = dirs
    return out


def group_runs(paths: list[Path]) -> dict[str, list[Path]]:
    """Arms of run / experiment directories: an experiment dir (holding experiment.json) gives
    its arms; a run dir goes to its manifest's ``arm`` (else its name without the timestamp)."""
    arms: dict[str, list[Path]] = {}
    for p in map(Path, paths):
        if (p / "experiment.json").is_file():
            for arm, dirs in _experiment_arms(p).items():
                arms.setdefault(arm, []).extend(dirs)
        else:
            arms.setdefault(load_run(p).arm, []).append(p)
    return arms


def report_from_dirs(
    paths: list[Path],
    out_dir: Path,
    baseline: str | None = "grpo",
    *,
    arms: dict[str, list[Path]] | None = None,
    title: str = "",
) -> dict[str, Any]:
    """``mlmt-bench report RUN_DIR... --out DIR [--arm NAME=RUN_DIR ...]``: group, then compare.

    arms: explicitly named arms (from ``--arm``), added to those found from ``paths``.
    """
    grouped = group_runs(list(paths))
    for arm, dirs in (arms or {}).items():
        grouped.setdefault(arm, []).extend(Path(d) for d in dirs)
    if not title and len(paths) == 1 and (Path(paths[0]) / "experiment.json").is_file():
        title = strip_stamp(Path(paths[0]).name)
    return build_comparison(grouped, Path(out_dir), baseline=baseline, title=title)

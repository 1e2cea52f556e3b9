"""Number formatting shared by the comparison's Markdown (:mod:`mlmt_bench.report.compare`) and
HTML (:mod:`mlmt_bench.report.html`) renderings: the metrics of the table, and how means, spreads,
CIs, p-values and tokens-to-reach are written."""

from __future__ import annotations

import math
from typing import Any

from mlmt_bench.report.runs import AT_FLOPS_TOLERANCE

# Metrics of the final record shown in the table: (key, label, format kind).
#   pct: a fraction shown as a percentage; pp: a signed difference of fractions, in points;
#   nat: nats per token; num: a plain number; tok: a token count; flops: scientific; hours, sec: a
#   duration in seconds, shown in hours or seconds.
TABLE_METRICS: list[tuple[str, str, str]] = [
    ("acc@t1", "acc@t1", "pct"),
    ("acc@t2", "acc@t2 (refine-all)", "pct"),
    ("acc@t2_null", "acc@t2 after g∅ (same attempts)", "pct"),
    ("delta", "delta (t2 − t1)", "pp"),
    ("i->c", "i→c", "pct"),
    ("c->i", "c→i", "pct"),
    ("correction_rate", "correction_rate", "pct"),
    ("regression_rate", "regression_rate", "pct"),
    ("acc_oracle_gated", "acc oracle-gated (optimistic: consults the verifier at test time)", "pct"),
    ("feedback_effect", "feedback_effect (g vs g∅)", "pp"),
    ("feedback_sensitivity", "feedback_sensitivity (nats/token)", "nat"),
    ("leakage_rate", "leakage_rate", "pct"),
    ("feedback/redacted_share", "feedback redacted share (feedback.redact: characters the refiner did not see)", "pct"),
    ("copy_rate", "copy_rate (refinements whose answer the shown feedback states)", "pct"),
    ("critic_states_answer_rate", "critic states an answer (feedbacks with a readable final answer)", "pct"),
    ("feedback_tokens", "feedback_tokens (mean per feedback)", "num"),
    ("false_alarm_rate", "critic false_alarm_rate (right attempts flagged)", "pct"),
    ("miss_rate", "critic miss_rate (wrong attempts approved)", "pct"),
    ("exact_correction_rate", "critic exact_correction_rate (first wrong step and its value)", "pct"),
    ("verdict_accuracy", "critic verdict_accuracy", "pct"),
    ("value_ev_mean", "value explained variance (mean over training steps)", "num3"),
    ("test_tokens_per_problem", "test-time generated tokens per problem", "num"),
    ("test_flops_per_problem", "test-time FLOPs per problem (2·P·(prompt + generated), every turn)", "flops"),
    ("gen_tokens", "generated tokens (training, at the end)", "tok"),
    ("flops", "FLOPs (training, at the end)", "flops"),
    ("wall_s", "wall time (training and evaluations, as logged on the run's machine)", "hours"),
    ("eval_s", "of it in evaluations", "hours"),
    ("train_step_s", "training step (mean)", "sec"),
    ("train_gen_tok_per_s", "generated tok/s (training rollouts)", "num"),
    ("train_tok_per_s", "trained tok/s (updates)", "num"),
]
#: accuracies with a CI by the cluster bootstrap: (metric, per-problem turn)
CI_METRICS = (("acc@t1", "t1"), ("acc@t2", "t2"), ("acc@t2_null", "t2_null"))
#: the metrics of TABLE_METRICS shown below the headline accuracies, one table each in index.html and
#: comparison.md: (anchor, heading, metric keys); the training totals (:data:`TOTALS`) close comparison.md
#: and are index.html's cost table
METRIC_GROUPS = (
    ("turns", "Turns", ("delta", "i->c", "c->i", "correction_rate", "regression_rate", "acc_oracle_gated")),
    ("feedback-final", "Feedback", ("feedback_effect", "feedback_sensitivity", "leakage_rate",
                                    "feedback/redacted_share", "copy_rate", "critic_states_answer_rate",
                                    "feedback_tokens")),
    ("critic", "Critic and value", ("false_alarm_rate", "miss_rate", "exact_correction_rate", "verdict_accuracy",
                                    "value_ev_mean")),
    ("test-time", "Test-time cost", ("test_tokens_per_problem", "test_flops_per_problem")),
)
#: the accuracies of the headline table (with their intervals and step-0 values)
HEADLINE = tuple(key for key, _ in CI_METRICS)
#: the training totals and the run time (:mod:`mlmt_bench.report.run_time`), shown apart from the metrics of the
#: final evaluation
TOTALS = ("gen_tokens", "flops", "wall_s", "eval_s", "train_step_s", "train_gen_tok_per_s", "train_tok_per_s")
#: what a report says above the shared bases that several seeds started from (compare.shared_bases):
#: its title and text
SHARED_BASE = ("One checkpoint for every seed (METHOD v4)",
               "every seed of these arms starts from the same base, so seeds vary RL sampling, data order and the "
               "value model's initialisation only, and every interval and test below is conditional on that "
               "checkpoint (as a paper's claims are on its pretrained model; seeds and problems are still "
               "resampled as random)")
#: significance level of the marks (*): p < ALPHA
ALPHA = 0.05
DASH = "–"
#: what an interval resampled (report/analysis.py): seeds and problems (METHOD v3), the problems of
#: one seed, or (arms not on the same seeds and problems) the problems of seed-averaged outcomes (v2)
TWO_WAY, ONE_SEED, PROBLEMS = "two-way", "one seed", "problems"
#: what a cell adds to an interval that is not two-way
INTERVAL_TAG = {TWO_WAY: "", ONE_SEED: " (1 seed: problems only)", PROBLEMS: " (problems only: seed means)"}


def fmt(value: float | None, kind: str) -> str:
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
    if kind == "num3":
        return f"{value:+.3f}"
    if kind == "tok":
        return fmt_count(value)
    if kind == "flops":
        return f"{value:.2e}"
    if kind == "hours":
        return f"{value / 3600:.2f} h"
    if kind == "sec":
        return f"{value:.1f} s"
    raise ValueError(kind)


def fmt_count(value: float) -> str:
    a = abs(value)
    if a >= 1e9:
        return f"{value / 1e9:.2f}G"
    if a >= 1e6:
        return f"{value / 1e6:.2f}M"
    if a >= 1e4:
        return f"{value / 1e3:.1f}k"
    return f"{value:.0f}"


def fmt_spread(value: float | None, kind: str) -> str:
    """A std in the units of its metric, without sign or '%' (it follows '±')."""
    if value is None or not math.isfinite(value):
        return DASH
    if kind in ("pct", "pp"):
        return f"{100 * value:.1f}"
    if kind in ("nat", "num3"):
        return f"{value:.3f}"
    return fmt(value, kind)


def fmt_mean_std(ms: dict[str, Any] | None, kind: str) -> str:
    if not ms:
        return DASH
    mean = fmt(ms["mean"], kind)
    if ms["std"] is None:
        return f"{mean} (1 seed)" if ms["n"] == 1 else mean
    return f"{mean} ± {fmt_spread(ms['std'], kind)}"


def fmt_ci(ci: dict[str, Any] | None) -> str:
    """An accuracy with its 95% interval, tagged when the interval is not two-way."""
    if not ci:
        return DASH
    return f"{100 * ci['mean']:.1f}% [{100 * ci['lo']:.1f}, {100 * ci['hi']:.1f}]{interval_tag(ci)}"


def interval_tag(rec: dict[str, Any]) -> str:
    return INTERVAL_TAG.get(rec.get("interval", TWO_WAY), "")


def fmt_pp_ci(d: dict[str, Any], key: str = "diff") -> str:
    """A change (``d[key]``, fractions) in signed points with its 95% interval."""
    return f"{100 * d[key]:+.1f} pp [{100 * d['lo']:+.1f}, {100 * d['hi']:+.1f}]"


def fmt_mde(d: dict[str, Any]) -> str:
    return f"{100 * d['mde']:.1f} pp" if d.get("mde") is not None else DASH


def fmt_per_seed(d: dict[str, Any]) -> str:
    """The per-seed differences of a paired record, in signed points: ``s0 +2.0, s1 -3.5``."""
    per = d.get("per_seed_diff") or {}
    return ", ".join(f"s{seed} {100 * v:+.1f}" for seed, v in per.items()) or DASH


def fmt_pair_units(d: dict[str, Any]) -> str:
    """Seeds × problems of a paired difference; the problems alone when it fell back to seed means."""
    if d.get("n_seeds") is None:
        return f"{d['n_problems']} problems (seed means)"
    return f"{d['n_seeds']} × {d['n_problems']}"


def fmt_p(p: float | None) -> str:
    if p is None:
        return DASH
    return f"{p:.2e}" if p < 1e-3 else f"{p:.3f}"



def fmt_reach(tr: dict[str, Any] | None, kind: str) -> str:
    if tr is None:
        return DASH
    if tr["at_start"] == tr["n"]:
        return "at step 0"
    if tr["median"] is None:
        return f"not reached (0/{tr['n']})"
    value = fmt_count(tr["median"]) if kind == "tok" else f"{tr['median']:.2e}"
    extra = f", {tr['at_start']} at step 0" if tr["at_start"] else ""
    return f"{value} ({tr['reached']}/{tr['n']} seeds{extra})"



def mark(p: float | None) -> str:
    return " *" if p is not None and p < ALPHA else ""



def read_at_label(budget: float) -> str:
    """The label of the table row that says where each run was read (``report --at-flops``)."""
    return f"read at (evaluation nearest {budget:.3g} FLOPs within ±{AT_FLOPS_TOLERANCE:.0%}, else below it)"


#: what a cell of the "read at" row adds for a run with no evaluation within the budget's tolerance
OFF_BUDGET = f"NOT WITHIN {AT_FLOPS_TOLERANCE:.0%}"


def fmt_read_at(arm: dict[str, Any]) -> str:
    """Where each of an arm's runs was read at a FLOPs budget (``report --at-flops``): its step and
    FLOPs, ``UNTRAINED`` for a run whose only evaluation within the budget is step 0 (its
    numbers are the starting point's, not a trained arm's), and, for a run with no evaluation
    within the budget's tolerance (``read_at["within"]`` false), its share of the budget and
    :data:`OFF_BUDGET`."""
    parts = []
    for seed, at in zip(arm["seeds"], arm.get("read_at") or []):
        if at is None:
            continue
        text = (f"s{seed}: UNTRAINED (step 0)" if not at.get("step")
                else f"s{seed}: step {at['step']}, {fmt(at['flops'], 'flops')} FLOPs")
        if at.get("within") is False:  # a report written before the tolerance has no "within"
            ratio = at.get("ratio")
            text += f" ({ratio:.2f}× the budget: {OFF_BUDGET})" if ratio is not None else f" ({OFF_BUDGET})"
        parts.append(text)
    return "; ".join(parts) or DASH


def untrained_at_budget(summary: dict[str, Any]) -> list[str]:
    """The arms with a run read at step 0 under ``report --at-flops`` (none trained within it)."""
    return [a for a, s in summary["arms"].items() if any(at is not None and not at.get("step")
                                                          for at in s.get("read_at") or [])]


def closing_rows(summary: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The arms of a comparison (:func:`mlmt_bench.report.compare.build_comparison`'s summary) as
    the few columns an experiment ends with: acc@t1, acc@t2 with its 95% interval, the gain over
    the arm's own step 0 and, with a baseline, the difference from it (Holm-adjusted p)."""
    baseline = summary.get("baseline")
    header = ["arm", "acc@t1", "acc@t2 [95% CI]", "gain over step 0"]
    if baseline is not None:
        header.append(f"vs {baseline} (p Holm)")
    rows = []
    for arm, s in summary["arms"].items():
        t1 = (s["metrics"].get("acc@t1") or {}).get("mean")
        g = s.get("gain")
        row = [arm, fmt(t1, "pct"), fmt_ci(s["ci"].get("acc@t2")),
               f"{fmt_pp_ci(g, 'mean')}{mark(g.get('p_value'))}" if g else DASH]
        if baseline is not None:
            p = summary["paired"].get(arm)
            row.append("baseline" if arm == baseline else DASH if not p or not p.get("n_problems")
                       else f"{fmt_pp_ci(p)} (p {fmt_p(p.get('p_holm'))}){mark(p.get('p_holm'))}")
        rows.append(row)
    return header, rows


def fmt_units(arm: dict[str, Any]) -> str:
    """Seeds × problems of an arm's acc@t2 interval."""
    ci = arm["ci"].get("acc@t2")
    return f"{ci['n_seeds']} × {ci['n_problems']}" if ci else DASH

"""``index.html``: the comparison as one self-contained page (no network, no external style, one
script of its own that sorts the tables (:mod:`mlmt_bench.report.page_script`, the only one its
Content-Security-Policy lets run); figures embedded as a base64 PNG or inline SVG), written
beside comparison.md by :func:`mlmt_bench.report.compare.build_comparison`.

Sections: the method × metric table (mean ± std over seeds, 95% two-way bootstrap CIs over seeds
and problems (METHOD.md v3), gains and differences with their bootstrap p-values, the differences
from the baseline Holm-adjusted and with their MDE, marked when p < 0.05), the paired tests
against the baseline (per-seed differences, the v2 sign-flip test as a labelled secondary,
McNemar per seed) and against ``<baseline> + base critic`` (equal test-time help), each run's
final accuracy per seed (linked to its run directory when the report holds it), accuracy against
generated tokens and FLOPs, the turn transitions, the feedback metrics over training, cost per
method, and example episodes on problems where the arms disagree; the table and every run's
per-problem outcomes as CSV downloads (``data:`` links, :mod:`mlmt_bench.report.downloads`).
Every text that comes from a run (model outputs above all) is escaped.
"""

from __future__ import annotations

import base64
import json
import math
import re
from pathlib import Path
from typing import Any

from mlmt_bench.metrics.stats import mean_std
from mlmt_bench.report import analysis, arm_specs, downloads, dynamics, figures, page_script, svg
from mlmt_bench.report.episodes import Disagreement, Examples, find_disagreements
from mlmt_bench.report.escape import esc
from mlmt_bench.report.formatting import (
    CI_METRICS,
    DASH,
    HEADLINE,
    METRIC_GROUPS,
    SHARED_BASE,
    TABLE_METRICS,
    fmt,
    fmt_mde,
    fmt_mean_std,
    fmt_p,
    fmt_pair_units,
    fmt_per_seed,
    fmt_pp_ci,
    fmt_reach,
    fmt_read_at,
    fmt_units,
    interval_tag,
    mark,
    read_at_label,
)
from mlmt_bench.report.runs import AT_FLOPS_TOLERANCE, RunRecord, acc_t2, invalid_allowed_by, is_num, own_arms
from mlmt_bench.tracking import atomic_write_text

#: the feedback metrics drawn over training: (eval record key, panel title, scale)
FEEDBACK_CURVES = [
    ("feedback_effect", "feedback_effect (pp: acc@t2 after g − after g∅)", 100.0),
    ("feedback_sensitivity", "feedback_sensitivity (nats/token)", 1.0),
    ("leakage_rate", "leakage_rate (% of feedbacks)", 100.0),
    ("correction_rate", "correction_rate (% of wrong attempts fixed)", 100.0),
    ("regression_rate", "regression_rate (% of right attempts broken)", 100.0),
    ("false_alarm_rate", "critic false_alarm_rate (% of right attempts flagged)", 100.0),
    ("miss_rate", "critic miss_rate (% of wrong attempts approved)", 100.0),
    ("exact_correction_rate", "critic exact_correction_rate (% of wrong attempts)", 100.0),
    ("verdict_accuracy", "critic verdict_accuracy (%)", 100.0),
    ("value_ev", "value explained variance (mean of the steps since the last evaluation)", 1.0),
]
#: cost columns of the final records: (key, header, format kind of formatting.fmt)
COST = [("gen_tokens", "generated tokens", "tok"), ("trained_tokens", "trained tokens", "tok"),
        ("flops", "FLOPs", "flops"), ("wall_s", "wall time", "hours"), ("eval_s", "of it in evaluations", "hours"),
        ("train_step_s", "training step", "sec"), ("train_gen_tok_per_s", "generated tok/s (training)", "num"),
        ("train_tok_per_s", "trained tok/s", "num")]
#: an episode's turn text is cut after this many characters (a page of a runaway generation is enough)
MAX_TURN_CHARS = 4000

#: the pages' style sheet (index.html and problems.html)
PAGE_CSS = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;max-width:1280px;
 padding:1.2em 2em 4em;color:#1d1d1f;background:#fff}
h1{margin:.2em 0 .3em;font-size:1.7em}h2{margin-top:2em;border-bottom:1px solid #ddd;padding-bottom:.2em}
h3{margin:1.4em 0 .4em;font-size:1.05em}
nav a{margin-right:1em}p.lede{color:#444;max-width:75em}
table{border-collapse:collapse;margin:.6em 0 1em;font-size:.92em}
th,td{border:1px solid #d4d4d8;padding:.3em .6em;vertical-align:top}
.wide{overflow-x:auto;max-width:100%}th{background:#f4f4f5;text-align:left}tr>th:first-child{max-width:22em}td.num{text-align:right;white-space:nowrap}
.wide tr>:first-child{position:sticky;left:0;z-index:1;background:#f4f4f5;box-shadow:1px 0 0 #d4d4d8}
td.sig{font-weight:600}td.up{background:#e3f5e3}td.down{background:#fbe4e4}
.sub{color:#555;font-size:.86em;font-weight:400}td.num .sub{white-space:normal}
.badge{display:inline-block;font-size:.75em;padding:0 .45em;border-radius:.6em;margin-left:.3em;
 background:#fde68a;color:#713f12;font-weight:600;vertical-align:1px}
.right{background:#dcfce7;color:#14532d}.wrong{background:#fee2e2;color:#7f1d1d}
figure{margin:1em 0}figure img{max-width:100%;height:auto;border:1px solid #eee}figure svg{max-width:100%;height:auto}
.panels{display:flex;flex-wrap:wrap;gap:.5em 1.2em}
table.arms th{max-width:11em;overflow-wrap:anywhere}td.num.wrap{white-space:normal;min-width:14em}
table.arms tr>th:first-child{max-width:16em;min-width:7em;overflow-wrap:normal}
table.seeds td,table.seeds th{padding:.3em .35em;font-size:.9em}
.dyn{display:grid;gap:2px 6px;align-items:center}.dyn svg{width:100%;height:auto;display:block}
.dyn-head{font-size:.8em;font-weight:600;align-self:end}.dyn-arm{font-size:.85em;font-weight:600;overflow-wrap:anywhere}
.legend span{margin-right:1.2em;font-size:.9em}
.legend i{display:inline-block;width:.9em;height:.9em;border-radius:2px;margin-right:.35em;vertical-align:-1px}
figcaption{color:#444;font-size:.9em;max-width:75em}
.episodes{display:grid;grid-template-columns:repeat(auto-fit,minmax(270px,1fr));gap:1em}
.episode{border:1px solid #d4d4d8;border-radius:6px;padding:.5em .8em;min-width:0}
.turn{margin:.5em 0}.turn .head{font-size:.85em;color:#333}
pre{white-space:pre-wrap;word-break:break-word;background:#f8f8fa;border:1px solid #eee;padding:.4em .6em;
 margin:.2em 0;font-size:.85em;max-height:22em;overflow:auto}
code{background:#f4f4f5;padding:0 .25em;border-radius:3px;font-size:.9em}
.note{background:#fff7ed;border-left:4px solid #fb923c;padding:.4em .8em}
th.sort{cursor:pointer}th.sort:after{content:" \\2195";color:#999;font-weight:400}
th[aria-sort=descending]:after{content:" \\25BE";color:#1d1d1f}
th[aria-sort=ascending]:after{content:" \\25B4";color:#1d1d1f}
"""


def _md_inline(text: str) -> str:
    """A note of comparison.md (plain text with `code` spans) as escaped HTML."""
    return re.sub(r"`([^`]*)`", r"<code>\1</code>", esc(text))


def _img(png: bytes, alt: str) -> str:
    return f'<img src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}" alt="{esc(alt)}">'


def _figure(content: str | None, caption: str, missing: str) -> str:
    """A figure (an <img> or inline SVG) with its caption, or a note saying why there is none."""
    if content is None:
        return f'<p class="note">{esc(missing)}</p>'
    return f"<figure>{content}<figcaption>{caption}</figcaption></figure>"


def _td(text: str, *, sub: list[str] | None = None, sig: str = "", key: float | None = None,
        wrap: bool = False) -> str:
    """A right-aligned cell; ``sig``: "up" or "down" for a significant change (shaded), else "";
    ``key``: the value a table sorts the cell by (NaN: none) where it is not the number its text
    starts with (:mod:`~mlmt_bench.report.page_script`); ``wrap``: a long list that may wrap."""
    subs = "".join(f'<div class="sub">{esc(s)}</div>' for s in sub or [] if s)
    cls = "num" + (" sig " + sig if sig else "") + (" wrap" if wrap else "")
    return f'<td class="{cls}"{_data_v(key)}>{esc(text)}{subs}</td>'


def _data_v(key: float | None) -> str:
    """The ``data-v`` attribute of a cell's sort key ("" for no key; an empty value for NaN)."""
    if key is None:
        return ""
    return ' data-v=""' if math.isnan(key) else f' data-v="{key!r}"'


def _sort_th(text: str) -> str:
    """A header cell that sorts its table when clicked (its text escaped)."""
    return f"<th class=sort>{esc(text)}</th>"


def _pp_ci(d: dict[str, Any]) -> str:
    """The 95% interval of a change (fractions ``lo``, ``hi``) in signed points."""
    return f"[{100 * d['lo']:+.1f}, {100 * d['hi']:+.1f}]"


def _change(d: dict[str, Any], mean_key: str, p_key: str = "p_value") -> str:
    """A cell for a change with its two-way CI, p-value and MDE (a gain over step 0, or a difference
    from the baseline with ``p_key`` "p_holm", its Holm-adjusted p, deciding the mark)."""
    p = d[p_key]
    sub = [f"95% CI {_pp_ci(d)}{interval_tag(d)}", f"p = {fmt_p(d['p_value'])}"]
    if p_key == "p_holm":
        sub.append(f"p (Holm) = {fmt_p(p)}")
    sub.append(f"MDE {fmt_mde(d)}")
    return _td(f"{100 * d[mean_key]:+.1f} pp{mark(p)}", sub=sub, sig=_sig(p, d[mean_key]))


def _sig(p: float | None, change: float) -> str:
    """The shading of a change with p-value ``p``: "up", "down", or "" when p >= ALPHA."""
    return ("up" if change > 0 else "down") if mark(p) else ""




def _head(label: str) -> str:
    """A sortable column header: a metric's label, its parenthetical on a second, smaller line."""
    name, _, more = label.partition(" (")
    return f"<th class=sort>{esc(name)}{f'<div class=sub>({esc(more)}</div>' if more else ''}</th>"


def _arm_th(arm: str, baseline: str | None) -> str:
    """A table row's first cell: the arm, marked when it is the baseline."""
    return f"<th>{esc(arm)}{'<span class=badge>baseline</span>' if arm == baseline else ''}</th>"


def _arms_table(summary: dict[str, Any], columns: list[tuple[str, Any]]) -> str:
    """Arms as rows (in the summary's order: the baseline first), one sortable column per
    ``(header HTML, cell function of the arm)``."""
    head = "<tr><th>arm</th>" + "".join(h for h, _ in columns) + "</tr>"
    rows = [f"<tr>{_arm_th(a, summary['baseline'])}{''.join(cell(a) for _, cell in columns)}</tr>"
            for a in summary["arms"]]
    return f"<div class=wide><table class=arms>{head}{''.join(rows)}</table></div>"


def _metric_column(summary: dict[str, Any], key: str, label: str, kind: str) -> tuple[str, Any]:
    """A metric's column: mean ± std over seeds, with the 95% interval and step-0 value of an accuracy."""
    badge = '<span class="badge">oracle-gated</span>' if key == "acc_oracle_gated" else ""

    def cell(a: str) -> str:
        arm = summary["arms"][a]
        sub = []
        if key in dict(CI_METRICS):
            ci = arm["ci"].get(key)
            sub = [f"95% CI [{100 * ci['lo']:.1f}, {100 * ci['hi']:.1f}]{interval_tag(ci)}" if ci else "",
                   f"step 0: {fmt(arm['start'][key], 'pct')}" if key in arm["start"] else ""]
        return _td(fmt_mean_std(arm["metrics"].get(key), kind), sub=sub)

    return _head(label).replace("</th>", badge + "</th>", 1), cell


def _shown_metrics(summary: dict[str, Any], keys: tuple[str, ...]) -> list[tuple[str, str, str]]:
    """TABLE_METRICS' entries of ``keys`` that some arm recorded, in their order."""
    return [(k, label, kind) for k, label, kind in TABLE_METRICS
            if k in keys and any(k in s["metrics"] for s in summary["arms"].values())]


def _metrics_table(summary: dict[str, Any]) -> str:
    """The headline: per arm, [where it was read,] the accuracies, the gain over its own step 0,
    the difference from the baseline, and the seeds × problems behind the intervals."""
    arms, baseline = summary["arms"], summary["baseline"]
    columns: list[tuple[str, Any]] = []
    if summary.get("at_flops") is not None:
        columns.append((_head(read_at_label(summary["at_flops"])),
                        lambda a: _read_at_cell(arms[a])))
    columns += [_metric_column(summary, *m) for m in _shown_metrics(summary, HEADLINE)]
    columns.append((_head("gain in acc@t2 (over its own step 0)"),
                    lambda a: _change(g, "mean") if (g := arms[a]["gain"]) else _td(DASH)))
    if baseline is not None:
        def versus(a: str) -> str:
            p = summary["paired"].get(a)
            if a == baseline:
                return _td("baseline")
            if not p or not p.get("n_problems"):
                return _td(DASH, sub=["no common problems"])
            return _change(p, "diff", "p_holm")

        columns.append((_head(f"acc@t2 − {baseline}'s (seeds × problems)"), versus))
    columns.append((_head("seeds × problems (in the CIs)"), lambda a: _td(fmt_units(arms[a]))))
    return _arms_table(summary, columns)


def _read_at_cell(arm: dict[str, Any]) -> str:
    """Where an arm's runs were read at a FLOPs budget: how many within its tolerance (shaded red
    when not all, or when one is UNTRAINED), each run's evaluation in a disclosure beneath
    (:func:`~mlmt_bench.report.formatting.fmt_read_at`); sorted by the share within."""
    reads = [at for at in arm.get("read_at") or [] if at is not None]
    if not reads:
        return _td(DASH)
    within = sum(at.get("within") is not False for at in reads)
    untrained = sum(not at.get("step") for at in reads)
    short = f"{within}/{len(reads)} runs within ±{AT_FLOPS_TOLERANCE:.0%}" + (
        f", {untrained} UNTRAINED" if untrained else "")
    shade = " sig down" if untrained or within < len(reads) else ""
    runs = "".join(f"<div>{esc(part)}</div>" for part in fmt_read_at(arm).split("; "))
    return (f'<td class="num wrap{shade}"{_data_v(within / len(reads))}><details><summary>{esc(short)}</summary>'
            f"{runs}</details></td>")


def _group_tables(summary: dict[str, Any]) -> str:
    """The other metrics of the final evaluation, a table per :data:`METRIC_GROUPS` entry that
    some arm recorded (the baseline's tokens and FLOPs to reach its accuracy with the test-time cost)."""
    out = []
    for anchor, heading, keys in METRIC_GROUPS:
        columns = [_metric_column(summary, *m) for m in _shown_metrics(summary, keys)]
        if anchor == "test-time" and summary["baseline"] is not None:
            columns += _reach_columns(summary)
        if columns:
            out.append(f"<h3 id='{anchor}'>{esc(heading)}</h3>" + _arms_table(summary, columns))
    return "".join(out)


def _reach_columns(summary: dict[str, Any]) -> list[tuple[str, Any]]:
    """Tokens and FLOPs to reach the baseline's final acc@t2 (median over seeds)."""
    target, baseline = summary["target_acc@t2"], summary["baseline"]
    columns = []
    for x_key, what, kind in (("gen_tokens", "tokens", "tok"), ("flops", "FLOPs", "flops")):
        def cell(a: str, x_key: str = x_key, kind: str = kind) -> str:
            r = (summary["arms"][a]["reach"] or {}).get(x_key)
            return _td(fmt_reach(r, kind), key=_reach_key(r))

        columns.append((_head(f"{what} to reach {baseline}'s acc@t2 ({fmt(target, 'pct')}: median over seeds)"),
                        cell))
    return columns


def _reach_key(reach: dict[str, Any] | None) -> float:
    """A "to reach" cell's sort key: the median over seeds, 0 when every seed started there, NaN
    when none reached it (or nothing was measured)."""
    if reach is None:
        return math.nan
    if reach["at_start"] == reach["n"]:
        return 0.0
    return math.nan if reach["median"] is None else float(reach["median"])


def _paired_table(paired: dict[str, dict[str, Any]]) -> str:
    """The table of differences from one baseline (a summary's ``paired``)."""
    rows = []
    for arm, p in paired.items():
        if not p.get("n_problems"):
            rows.append(f"<tr><th>{esc(arm)}</th><td class='num'>0</td>"
                        f"<td colspan='7'>{esc(p.get('why') or 'no common problems')}</td></tr>")
            continue
        mc = "; ".join(f"s{seed}: {m['b']}/{m['c']}, p = {fmt_p(m['p_value'])}"
                       for seed, m in sorted(p["mcnemar"].items()))
        cells = [_td(fmt_pair_units(p)), _td(fmt_pp_ci(p), sub=[interval_tag(p).strip()]), _td(fmt_p(p["p_value"])),
                 _td(fmt_p(p["p_holm"]) + mark(p["p_holm"]), sig=_sig(p["p_holm"], p["diff"])), _td(fmt_mde(p)),
                 _td(fmt_per_seed(p), wrap=True), _td(fmt_p(p["sign_flip_p"])), _td(mc or DASH, wrap=True)]
        rows.append(f"<tr><th>{esc(arm)}</th>{''.join(cells)}</tr>")
    if not rows:
        return "<p>(no other arm)</p>"
    head = "".join(_sort_th(h) for h in ("seeds × problems", "difference (95% CI)", "p", "p (Holm)", "MDE"))
    return ("<div class=wide><table><tr><th>arm</th>" + head + "<th>per-seed differences (pp)</th>"
            "<th class=sort>sign-flip p <span class='sub'>(secondary: conditional on these seeds)</span></th>"
            "<th>McNemar b/c per seed</th></tr>" + "".join(rows) + "</table></div>")


def _forest(paired: dict[str, dict[str, Any]], baseline: str, loaded: dict[str, list[RunRecord]]) -> str:
    """The differences of a paired table as a forest chart: each arm's difference from ``baseline``
    in points with its 95% interval, filled where its Holm-adjusted p is below α; the arm's colour
    as in the other charts (its place in ``loaded``)."""
    order = list(loaded)
    rows = [svg.Interval(arm, svg.arm_color(order.index(arm) if arm in order else i), 100 * p["diff"],
                         100 * p["lo"], 100 * p["hi"], bool(mark(p["p_holm"])),
                         f"{arm}: {fmt_pp_ci(p)}{interval_tag(p)}, p (Holm) = {fmt_p(p['p_holm'])}")
            for i, (arm, p) in enumerate(paired.items()) if p.get("n_problems")]
    return _figure(svg.forest_chart(rows, x_label=f"final acc@t2 − {baseline} (points)"),
                   f"Each arm's difference from {esc(baseline)} in final acc@t2 (the table above): dot, the "
                   "difference; bar, its 95% two-way bootstrap interval over seeds and problems (over problems "
                   "alone with one seed); filled, p (Holm) &lt; 0.05; dashed, no difference.",
                   f"No arm shares problems with {baseline}.")


def _inside(path: str | None) -> bool:
    """Whether a run path as the report shows it lies inside the report's directory (a link to it works
    wherever the report is copied)."""
    return path is not None and not path.startswith(("/", "..")) and ":" not in path


def _setting(value: Any) -> str:
    """A spec value as its YAML reads (a string bare, null, true, 0.0001)."""
    return value if isinstance(value, str) else json.dumps(value)


def _arm_specs_table(summary: dict[str, Any], loaded: dict[str, list[RunRecord]]) -> str:
    """Per arm: the fixed spec columns of :mod:`~mlmt_bench.report.arm_specs`, its base, its other
    distinguishing settings and a link to its first run's spec.resolved.yaml where the report holds it."""
    specs = arm_specs.arm_specs(own_arms(loaded))
    if not specs:
        return "<p class='note'>The runs record no settings in spec.resolved.yaml: what the arms are is not known.</p>"
    present = [h for h, _ in arm_specs.COLUMNS if any(h in a.columns for a in specs)]
    shared = [h for h in present if len({_setting(a.columns.get(h, DASH)) for a in specs}) == 1 and len(specs) > 1]
    headers = [h for h in present if h not in shared]
    common = ("<p class=sub>Every arm: " + ", ".join(f"{esc(h)} {esc(_setting(specs[0].columns[h]))}"
                                                     for h in shared) + ".</p>") if shared else ""
    head = ("<tr><th>arm</th>" + "".join(_sort_th(h) for h in headers)
            + "<th>base</th><th>its other settings that most arms (of its algorithm) do not share</th>"
            "<th>spec</th></tr>")
    rows = []
    for a in specs:
        cells = [_td(_setting(a.columns[h]) if h in a.columns else DASH) for h in headers]
        other = "<br>".join(f"<code>{esc(k)}: {esc(_setting(v))}</code>" for k, v in a.other) or DASH
        if a.seeds_differ:
            other += f"<div class=sub>its seeds differ in {esc(', '.join(a.seeds_differ))}</div>"
        path = (summary["arms"][a.arm]["runs"] or [None])[0]
        has = _inside(path) and (loaded[a.arm][0].path / "spec.resolved.yaml").is_file()
        link = f"<a href=\"{esc(path)}/spec.resolved.yaml\">spec.resolved.yaml</a>" if has else DASH
        rows.append(f"<tr>{_arm_th(a.arm, summary['baseline'])}{''.join(cells)}<td>{esc(a.base or DASH)}</td>"
                    f"<td>{other}</td><td>{link}</td></tr>")
    return f"{common}<div class=wide><table class=arms>{head}{''.join(rows)}</table></div>"


def _dynamics(summary: dict[str, Any], loaded: dict[str, list[RunRecord]]) -> str | None:
    """The training-dynamics small multiples (:mod:`~mlmt_bench.report.dynamics`) as a CSS grid."""
    grid = dynamics.dynamics_grid(loaded, summary["baseline"])
    if grid is None:
        return None
    head = "".join(f"<div class=dyn-head>{esc(p.title)}"
                   f"{f'<div class=sub>{esc(key)}</div>' if (key := dynamics.line_key(p)) else ''}</div>"
                   for p in grid.panels)
    cells = "".join(f"<div class=dyn-arm>{esc(arm)}</div>"
                    + "".join(f"<div>{svg_ or '<p class=sub>not logged</p>'}</div>" for svg_ in charts)
                    for arm, charts in grid.rows)
    style = f"grid-template-columns:7.5em repeat({len(grid.panels)},minmax(0,1fr))"
    return f"<div class=dyn style='{style}'><div></div>{head}{cells}</div>"


def _per_seed_table(summary: dict[str, Any], loaded: dict[str, list[RunRecord]]) -> str:
    """Arms × seeds: each run's final acc@t1 → acc@t2 (%), linked to its run directory where the
    report holds it (a path inside the report's directory)."""
    seeds = sorted({r.seed for results in loaded.values() for r in results}, key=lambda s: (s is None, s))
    head = "<tr><th>arm</th>" + "".join(_sort_th(f"seed {s}") for s in seeds) + "</tr>"
    rows = []
    for arm, results in loaded.items():
        paths = summary["arms"].get(arm, {}).get("runs", [])
        by_seed = {r.seed: (r, paths[i] if i < len(paths) else None) for i, r in enumerate(results)}
        cells = []
        for seed in seeds:
            if seed not in by_seed:
                cells.append(_td(DASH))
                continue
            r, path = by_seed[seed]
            t1, t2 = r.final.get("acc@t1"), acc_t2(r.final)
            text = f"{fmt(t1, 'pct')} → {fmt(t2, 'pct')}" if is_num(t1) else fmt(t2, "pct")
            key = float(t2) if is_num(t2) else math.nan  # acc@t2, not the acc@t1 the text starts with
            cells.append(f'<td class="num"{_data_v(key)}><a href="{esc(path)}/">{esc(text)}</a></td>' if _inside(path)
                         else _td(text, key=key))
        rows.append(f"<tr>{_arm_th(arm, summary['baseline'])}{''.join(cells)}</tr>")
    return f"<div class=wide><table class=seeds>{head}{''.join(rows)}</table></div>"


def _cost_table(summary: dict[str, Any], loaded: dict[str, list[RunRecord]]) -> str:
    head = "<tr><th>arm</th>" + "".join(_sort_th(h) for _, h, _ in COST) + "</tr>"
    rows = []
    for arm, results in loaded.items():
        cells = []
        for key, _, kind in COST:
            vals = [float(r.final[key]) for r in results if is_num(r.final.get(key))]
            ms = dict(zip(("mean", "std"), mean_std(vals)), n=len(vals)) if vals else None
            cells.append(_td(fmt_mean_std(ms, kind)))
        rows.append(f"<tr>{_arm_th(arm, summary['baseline'])}{''.join(cells)}</tr>")
    return f"<div class=wide><table>{head}{''.join(rows)}</table></div>"


def turn_html(t: dict[str, Any], limit: int = MAX_TURN_CHARS) -> str:
    """One turn of a logged episode: its kind, policy and verdict facts, and its text (escaped, cut
    after ``limit`` characters, which it says)."""
    text = str(t.get("text") or "")
    cut = f" (cut: {len(text)} characters)" if len(text) > limit else ""
    facts = [f"{k} {t[k]}" for k in ("verdict", "reward", "tokens", "finish_reason") if t.get(k) is not None]
    return (f'<div class="turn"><div class="head"><b>{esc(t.get("kind", "?"))}</b> ({esc(t.get("policy", "?"))})'
            f"{' · ' + esc(', '.join(facts)) if facts else ''}{esc(cut)}</div>"
            f"<pre>{esc(text[:limit])}</pre></div>")


def _disagreement(d: Disagreement) -> str:
    acc = ", ".join(f"{a}: {100 * v:.0f}%" for a, v in d.accuracy.items())
    cards = []
    for arm, e in d.episodes.items():
        verdict = '<span class="badge right">right</span>' if e.correct else '<span class="badge wrong">wrong</span>'
        turns = "".join(turn_html(t) for t in e.turns if isinstance(t, dict))
        cards.append(f'<div class="episode"><b>{esc(arm)}</b>, seed {esc(e.seed)}: final answer {verdict}{turns}</div>')
    return (f"<h3>problem <code>{esc(d.problem_id)}</code></h3>"
            f"<p class='sub'>final acc@t2 over seeds: {esc(acc)}</p><div class='episodes'>{''.join(cards)}</div>")


def _download(name: str, mime: str, data: bytes, what: str) -> str:
    href = f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"
    return f'<a download="{name}" href="{href}">{esc(what)}</a>'


def _downloads(summary: dict[str, Any], loaded: dict[str, list[RunRecord]]) -> str:
    """Links that save the table and every run's per-problem outcomes as CSV (:mod:`downloads`)."""
    return ("<p class='sub'>Download: "
            + _download("metrics.csv", "text/csv", downloads.metrics_csv(summary),
                        "this table (metrics.csv: means, stds, intervals, p-values; fractions)")
            + " · " + _download("outcomes.csv.gz", "application/gzip", downloads.outcomes_csv_gz(summary, loaded),
                                "per-problem outcomes of every run (outcomes.csv.gz: arm, seed, run, problem, "
                                "t1, t2, t2 after g∅)")
            + "</p>")


def _episodes(ex: Examples) -> str:
    if ex.n_disputed == 0:
        return "<p>The arms' final answers agree on every problem: no example of a disagreement.</p>"
    head = (f"<p>{ex.n_disputed} problem{'s' if ex.n_disputed != 1 else ''} where the arms' final acc@t2 "
            f"(averaged over seeds) differs; {ex.n_covered} of them with logged episodes that include a right and "
            "a wrong final answer" + (f"; the most disputed {len(ex.shown)} below (one seed per arm).</p>"
                                      if ex.shown else ".</p>"))
    if not ex.shown:
        return head + ("<p class='note'>samples.jsonl covers none of the problems where the arms disagree: "
                       "an evaluation logs only its first <code>eval.samples</code> episodes, and the final one every "
                       "problem's only with <code>eval.final_samples</code> (on by default; runs older than that "
                       "option lack it).</p>")
    return head + "".join(_disagreement(d) for d in ex.shown)


def render_html(summary: dict[str, Any], loaded: dict[str, list[RunRecord]], acc_png: bytes) -> str:
    """The page of a :func:`~mlmt_bench.report.compare.build_comparison` summary.

    loaded: arm -> its runs, as compared; acc_png: the accuracy-vs-cost figure (acc_vs_tokens.png).
    """
    title = summary["title"] or "Comparison"
    baseline = summary["baseline"]
    proto = ", ".join(f"<code>{esc(k)} = {esc(json.dumps(v))}</code>" for k, v in summary.get("protocol", {}).items())
    seeds = ", ".join(f"{esc(a)}: {len(s['runs'])}" for a, s in summary["arms"].items())
    panels, drawn = figures.metric_panels_svg(loaded, FEEDBACK_CURVES)
    feedback = svg.legend(drawn) + f"<div class='panels'>{''.join(panels)}</div>" if panels else None
    transitions = figures.transitions_svg(loaded)
    invalid = summary.get("invalid_bases") or []
    sections = [
        f"<h1>{esc(title)}</h1>",
        *(["<p class='lede'><b>Not a valid testbed (METHOD v3/v4)</b>: these runs start from bases whose critic fails "
           f"the validity thresholds or the critic gate (allowed by {_md_inline(invalid_allowed_by(invalid))}), so "
           "what they say "
           "about feedback is not a measurement of the method:</p><ul>"
           + "".join(f"<li>{_md_inline(b)}</li>" for b in invalid) + "</ul>"] if invalid else []),
        *([f"<p class='lede'><b>{esc(SHARED_BASE[0])}</b>: {esc(SHARED_BASE[1])}:</p><ul>"
           + "".join(f"<li>{_md_inline(b)}</li>" for b in summary["shared_bases"]) + "</ul>"]
          if summary.get("shared_bases") else []),
        f"<p class='lede'>Final evaluation of each run, refine-all protocol unless labelled otherwise "
        f"({proto or 'protocol not recorded'}). Seeds per arm: {seeds}. "
        f"{_md_inline(analysis.statistics_text(summary))} "
        "A shaded cell marks the same (green: up, red: down). Click a column header marked ↕ to sort the arms "
        "by it. "
        "Numbers marked <span class='badge'>oracle-gated</span> consult the verifier at test time (optimistic).</p>",
        "<nav><a href='#metrics'>metrics</a><a href='#arms'>arms</a><a href='#per-seed'>per seed</a>"
        "<a href='#curves'>curves</a><a href='#dynamics'>training</a><a href='#transitions'>transitions</a>"
        "<a href='#feedback'>feedback</a><a href='#cost'>cost</a><a href='#episodes'>episodes</a>"
        "<a href='#runs'>runs</a><a href='problems.html'>every problem</a><a href='comparison.md'>comparison.md</a>"
        "</nav>",
        "<h2 id='metrics'>Final metrics</h2>", _metrics_table(summary), _downloads(summary, loaded),
        _group_tables(summary),
        "<h2 id='arms'>What each arm is</h2>",
        "<p>The settings of each arm's runs (spec.resolved.yaml) that tell it apart: the columns every method "
        "has, then the arm's other settings that most arms do not share (algorithm parameters compared among "
        "the arms of the same algorithm). <i>base</i>: the key of the base checkpoint its runs started from.</p>",
        _arm_specs_table(summary, loaded),
        "<h2 id='per-seed'>Per seed</h2>",
        "<p>Each run's final acc@t1 → acc@t2 (refine-all): the seed-to-seed spread behind the intervals above. "
        "A number links to its run's directory where the report holds it.</p>",
        _per_seed_table(summary, loaded),
    ]
    if baseline is not None:
        sections += [f"<h2 id='baseline'>Against {esc(baseline)}</h2>",
                     f"<p>{_md_inline(analysis.against_text(summary))}</p>", _paired_table(summary["paired"]),
                     _forest(summary["paired"], baseline, loaded)]
    if summary.get("equal_help"):
        help_ = summary["equal_help"]
        sections += [f"<h2 id='equal-help'>Against {esc(help_['baseline'])} (equal test-time help)</h2>",
                     f"<p>{_md_inline(analysis.equal_help_text(help_))}</p>", _paired_table(help_["paired"]),
                     _forest(help_["paired"], help_["baseline"], loaded)]
    sections += [
        "<h2 id='curves'>Accuracy against training cost</h2>",
        _figure(_img(acc_png, "eval acc@t2 against generated tokens, one panel per arm, and against FLOPs"),
                "Eval acc@t2 (refine-all) against generated training tokens, one panel per arm with the baseline "
                "in grey behind it, and every arm against training FLOPs in the last panel. Line: mean over seeds "
                "at each evaluation (each run's last evaluation pooled as one point); band: the 95% two-way "
                "bootstrap interval over seeds and problems of that evaluation (METHOD v3; over problems alone "
                "with one seed); dashed: the baseline's final acc@t2.", ""),
        "<h2 id='dynamics'>Training dynamics</h2>",
        _figure(_dynamics(summary, loaded),
                "From each run's train records (metrics.jsonl), against generated training tokens; one row per arm, "
                "the baseline's curve in grey behind the others; line: mean over seeds at each step, band: ± one "
                "seed std. A column shares its axes across arms. Solver and critic are the two trained roles "
                "(the update's statistics of each); KL is 0 where the algorithm has no KL term (beta 0); clipped "
                "ratio: the share of tokens whose probability ratio the update clipped; truncated: completions "
                "that hit max_new_tokens.",
                "No run logged train records with these metrics."),
        "<h2 id='transitions'>Turn transitions</h2>",
        _figure(svg.legend(transitions[1]) + transitions[0] if transitions else None,
                "Final evaluation: i→c (a wrong attempt refined to a right answer), c→i (a right attempt broken), "
                "i→i (wrong both times), as % of all problems; mean over seeds, error bar ± one seed std. "
                "Refine-all protocol, no oracle.",
                "No arm has a second turn: no transitions."),
        "<h2 id='feedback'>Feedback metrics over training</h2>",
        _figure(feedback,
                "From the evaluation records, against generated training tokens; mean over seeds, band ± one seed "
                f"std (drawn in a panel of at most {figures.MAX_BANDS} arms). feedback_effect: acc@t2 after the "
                "feedback g minus after the null feedback g∅ on the same "
                "attempts; feedback_sensitivity: log π(ŷ | g) − log π(ŷ | g∅) per token of ŷ; leakage_rate: "
                "feedbacks that state the gold answer; correction / regression rate: i→c / P(attempt wrong), "
                "c→i / P(attempt right). Critic diagnostics (METHOD.md v3), of the current critic on the current "
                "solver's attempts: false alarms (right attempts flagged), misses (wrong ones approved), exact "
                "corrections (the first wrong step and its right value), verdict accuracy; and the learned value's "
                "explained variance on fresh refinements (below 0.1: not exercised).",
                "No arm recorded feedback metrics (no critic or oracle feedback, or eval.feedback_metrics off)."),
        "<h2 id='cost'>Cost per method</h2>",
        "<p>Training totals at the end of each run (final record); mean ± std over seeds. FLOPs are the "
        "METHOD.md v2 estimate (prompts, trained sequences and extra passes counted). Times are as logged on each "
        "run's machine and load (wall time from the start of training, across resumes; tokens per second of "
        "rollout and of update).</p>",
        _cost_table(summary, loaded),
        "<h2 id='episodes'>Example episodes where the arms disagree</h2>",
        "<p>Every problem of the final evaluation, with each arm's outcome on every seed and its logged episode, "
        "filtered by arm and transition: <a href='problems.html'>problems.html</a>.</p>",
        _episodes(find_disagreements(loaded)),
    ]
    if summary["notes"]:
        sections += ["<h2 id='notes'>Notes</h2><ul>"
                     + "".join(f"<li>{_md_inline(n)}</li>" for n in summary["notes"]) + "</ul>"]
    sections += ["<h2 id='runs'>Runs</h2><ul>"
                 + "".join(f"<li><b>{esc(a)}</b>: " + ", ".join(f"<code>{esc(p)}</code>" for p in s["runs"]) + "</li>"
                           for a, s in summary["arms"].items()) + "</ul>"]
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<meta http-equiv='Content-Security-Policy' content=\"{page_script.CSP}\">"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>{esc(title)}</title><style>{PAGE_CSS}</style></head><body>\n"
            + "\n".join(sections) + f"\n<script>{page_script.SORT_JS}</script>\n</body></html>\n")


def write_html(summary: dict[str, Any], loaded: dict[str, list[RunRecord]], path: Path, *, acc_png: bytes) -> Path:
    """:func:`render_html`, written atomically to ``path``."""
    atomic_write_text(Path(path), render_html(summary, loaded, acc_png))
    return Path(path)

"""Figures of a comparison: eval acc@t2 against training cost (METHOD.md "Metrics": curves are
drawn against generated tokens and FLOPs, so a method generating three turns is not flattered by
counting steps), the turn transitions per arm and the feedback metrics over training.

acc@t2 against cost is a matplotlib PNG (acc_vs_tokens.png, which comparison.md links and
index.html embeds); the HTML-only figures are inline SVG (:mod:`mlmt_bench.report.svg`), which
costs milliseconds instead of a second of matplotlib per figure. Curves are the mean over seeds.
The accuracy figure draws, as each point's band, the 95% interval of METHOD v3 (the two-way
bootstrap over seeds and problems of that evaluation's per-problem outcomes; over problems alone
with one seed), one small panel per arm with the baseline beside it, so that bands do not pile
up; the SVG panels of other metrics draw ± one sample std over seeds (they have no per-problem
outcomes). An arm keeps its colour (:func:`svg.arm_color` by its position in ``runs``) in every
figure. matplotlib is imported inside the functions, with the Agg backend.
"""

from __future__ import annotations

import dataclasses
import io
import math
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mlmt_bench.io.bounded_input import printable
from mlmt_bench.report import svg
from mlmt_bench.report.runs import acc_t2, is_num
from mlmt_bench.tracking import atomic_write_bytes

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from mlmt_bench.report.runs import RunRecord

#: x axes of the training curves: (record key, axis label)
COST_AXES = (("gen_tokens", "generated tokens (training)"), ("flops", "FLOPs (training, approx.)"))
#: the turn transitions of a final record, as fractions of all problems: (key, label)
TRANSITIONS = (("i->c", "i→c (fixed)"), ("c->i", "c→i (broken)"), ("i->i", "i→i (still wrong)"))


#: bootstrap replicates of a curve point's band (a drawn band, not a reported interval: the tables'
#: intervals use analysis.N_BOOT)
BAND_BOOT = 1000


def aggregate_curves(results: list[RunRecord], x_key: str, y_key: str | tuple[str, ...] = "acc@t2", *,
                     intervals: bool = False, train: bool = False) -> dict[str, np.ndarray]:
    """Mean over seeds at matching eval points, with the spread over seeds.

    Intermediate evals match by step; every run's last eval counts as one shared "final" point,
    because seeds stop at slightly different steps under a token budget (17 and 18, say) and
    matching those by step would draw one-seed points at the end. Each point counts the seeds
    that recorded both ``x_key`` and ``y_key`` there (acc@t2 falls back to acc@t1 for
    single-turn runs; a tuple of keys: the first a record holds, e.g. a metric's TRL name and
    its older one); x is the mean of their x values (seeds generate slightly different token
    counts by the same step). ``train``: the curve of the runs' train records instead of their
    eval records.
    returns: {"step", "x", "y", "sd", "lo", "hi", "n"} arrays over the points, ordered by x
    ("step" is the largest step in the point; "sd" the sample std over seeds, NaN where one seed;
    "lo"/"hi" the min/max over seeds); with ``intervals`` (acc@t2 only) also "ci_lo"/"ci_hi", the
    95% interval of :func:`mlmt_bench.report.analysis.arm_interval` (``BAND_BOOT`` replicates) of
    the point's per-problem outcomes, NaN where a run logged none at that step.
    """
    groups: dict[Any, list[tuple[float, float, int, int]]] = defaultdict(list)
    for k, r in enumerate(results):
        points = [(int(rec["step"]), *_point(rec, x_key, y_key)) for rec in (r.train if train else r.curve)
                  if rec.get("step") is not None]
        points = [p for p in points if p[1] is not None]
        for i, (step, xs, ys) in enumerate(points):
            assert xs is not None and ys is not None  # kept above: _point gives both or neither
            groups["final" if i == len(points) - 1 else step].append((xs, ys, step, k))
    pts = sorted((np.asarray(g, dtype=float) for g in groups.values()), key=lambda p: p[:, 0].mean())
    out = {
        "step": np.asarray([int(p[:, 2].max()) for p in pts], dtype=int),
        "x": np.asarray([p[:, 0].mean() for p in pts]),
        "y": np.asarray([p[:, 1].mean() for p in pts]),
        "sd": np.asarray([p[:, 1].std(ddof=1) if len(p) > 1 else np.nan for p in pts]),
        "lo": np.asarray([p[:, 1].min() for p in pts]),
        "hi": np.asarray([p[:, 1].max() for p in pts]),
        "n": np.asarray([len(p) for p in pts]),
    }
    if intervals and y_key == "acc@t2":
        bands = [_band(results, p) for p in pts]
        out["ci_lo"] = np.asarray([b[0] for b in bands])
        out["ci_hi"] = np.asarray([b[1] for b in bands])
    return out


def _band(results: list[RunRecord], point: np.ndarray) -> tuple[float, float]:
    """The 95% interval of one curve point from its runs' per-problem outcomes at their steps."""
    from mlmt_bench.report.analysis import arm_interval

    rows = [(results[int(k)].seed, results[int(k)].outcomes("t2", at=int(step))) for step, k in point[:, 2:4]]
    if not rows or any(not o for _, o in rows):
        return math.nan, math.nan
    ci = arm_interval(rows, n_boot=BAND_BOOT)
    return (ci["lo"], ci["hi"]) if ci is not None else (math.nan, math.nan)


def _point(rec: dict[str, Any], x_key: str, y_key: str | tuple[str, ...]) -> tuple[float | None, float | None]:
    keys = (y_key,) if isinstance(y_key, str) else y_key
    x, y = rec.get(x_key), acc_t2(rec) if keys == ("acc@t2",) else next(
        (rec[k] for k in keys if is_num(rec.get(k))), None)
    if is_num(x) and is_num(y):
        return float(x), float(y)
    return None, None


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig: Any) -> bytes:
    """The figure as PNG bytes without metadata (matplotlib writes its version as "Software"), so
    the same data give the same file with any matplotlib that draws the same pixels."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, metadata={"Software": None})
    _plt().close(fig)
    return buf.getvalue()


def _arm_line(ax: Axes, c: dict[str, np.ndarray], color: str, label: str, *, band: bool = True) -> None:
    """An arm's mean curve (in %), with its interval band where one was computed."""
    ax.plot(c["x"], 100 * c["y"], marker="o", ms=2.5, lw=1.4, color=color, label=label)
    if band and "ci_lo" in c and np.isfinite(c["ci_lo"]).any():
        ax.fill_between(c["x"], 100 * c["ci_lo"], 100 * c["ci_hi"], color=color, alpha=0.22, lw=0)


def acc_vs_cost_png(runs: dict[str, list[RunRecord]], *, target: float | None = None,
                    baseline: str | None = None, title: str = "") -> bytes:
    """:func:`acc_vs_cost_figure` as PNG bytes."""
    return _png(acc_vs_cost_figure(runs, target=target, baseline=baseline, title=title))


def acc_vs_cost_figure(runs: dict[str, list[RunRecord]], *, target: float | None = None,
                       baseline: str | None = None, title: str = "") -> Any:
    """Eval acc@t2 against training cost, as small multiples: one panel per arm against generated
    training tokens, its line the mean over seeds and its band the 95% interval of each point
    (:func:`aggregate_curves` with ``intervals``), the baseline's curve and band in grey behind
    it; then one panel with every arm's line (no bands) against FLOPs. A dashed line marks the
    baseline's final acc@t2 (``target``). All panels share the y axis; the one legend sits below
    them, outside every plot area."""
    plt = _plt()
    arms = list(runs)
    ncols = min(4, len(arms) + 1)
    nrows = math.ceil((len(arms) + 1) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.3 * ncols, 2.6 * nrows + 0.9), sharey=True,
                             constrained_layout=True, squeeze=False)
    panels = list(axes.flat)
    tokens = {arm: aggregate_curves(results, "gen_tokens", intervals=True) for arm, results in runs.items()}
    base = tokens.get(baseline) if baseline is not None else None
    # names from data are escaped: matplotlib warns of a glyph it lacks with the raw character (an ESC
    # sequence reached the terminal); a label cannot act on anything
    shown = {arm: printable(arm) for arm in arms}
    legend: dict[str, Any] = {}
    for i, arm in enumerate(arms):
        ax, c = panels[i], tokens[arm]
        if base is not None and arm != baseline and len(base["x"]):
            _arm_line(ax, base, "#8c8c8c", f"{printable(str(baseline))} (baseline, grey in every panel)")
        if len(c["x"]):
            _arm_line(ax, c, svg.arm_color(i), shown[arm])
        else:
            ax.text(0.5, 0.5, "no 'gen_tokens' recorded", ha="center", va="center", transform=ax.transAxes,
                    fontsize=8)
        n = len(runs[arm])
        ax.set_title(f"{shown[arm]} ({n} seed{'s' if n != 1 else ''})", fontsize=9)
        ax.set_xlabel("generated tokens (training)", fontsize=8)
    ax = panels[len(arms)]
    for i, (arm, results) in enumerate(runs.items()):
        c = aggregate_curves(results, "flops")
        if len(c["x"]):
            _arm_line(ax, c, svg.arm_color(i), shown[arm], band=False)
    ax.set_title("every arm against FLOPs (lines only)", fontsize=9)
    ax.set_xlabel("FLOPs (training, approx.)", fontsize=8)
    for k, ax in enumerate(panels):
        if k > len(arms):
            ax.set_visible(False)
            continue
        if target is not None:
            ax.axhline(100 * target, color="grey", ls="--", lw=1,
                       label=f"{printable(baseline)} final acc@t2" if baseline else "target")
        if k % ncols == 0:
            ax.set_ylabel("eval acc@t2 (%)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.xaxis.get_offset_text().set_fontsize(7)
        ax.grid(alpha=0.3)
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    if legend:
        fig.legend(list(legend.values()), list(legend), loc="outside lower center", ncols=min(4, len(legend)),
                   fontsize=8, frameon=False,
                   title="line: mean over seeds; band: 95% interval over seeds × problems (METHOD v3)",
                   title_fontsize=8)
    if title:
        fig.suptitle(printable(title))
    return fig


def plot_acc_vs_tokens(
    runs: dict[str, list[RunRecord]],
    path: Path,
    *,
    target: float | None = None,
    baseline: str | None = None,
    title: str = "",
) -> Path:
    """:func:`acc_vs_cost_png`, written atomically to ``path``."""
    atomic_write_bytes(Path(path), acc_vs_cost_png(runs, target=target, baseline=baseline, title=title))
    return Path(path)


#: a line panel draws its arms' ± std bands only up to this many arms
MAX_BANDS = 3


def metric_panels_svg(runs: dict[str, list[RunRecord]], metrics: list[tuple[str, str, float]],
                      x_key: str = "gen_tokens") -> tuple[list[str], list[tuple[str, str]]]:
    """One inline-SVG line chart per metric of the eval records that some arm recorded, against
    ``x_key``: a line per arm that recorded it (mean over seeds), with its band ± one seed std
    where the panel has at most ``MAX_BANDS`` lines (more bands pile up into one smear).

    metrics: (record key, panel title, scale of the values, e.g. 100 for percentages).
    returns: (the panels, empty when no arm recorded any metric; (arm, colour) of the arms drawn).
    """
    panels, drawn = [], {}
    for key, title, scale in metrics:
        series = []
        for i, (arm, results) in enumerate(runs.items()):
            c = aggregate_curves(results, x_key, key)
            if len(c["x"]):
                y, sd = scale * c["y"], scale * c["sd"]  # sd is NaN at a one-seed point: no band there
                series.append(svg.Series(arm, svg.arm_color(i), c["x"].tolist(), y.tolist(), (y - sd).tolist(),
                                         (y + sd).tolist()))
                drawn[arm] = svg.arm_color(i)
        if len(series) > MAX_BANDS:
            series = [dataclasses.replace(s, lo=None, hi=None) for s in series]
        if series:
            panels.append(svg.line_chart(series, title=title, x_label=dict(COST_AXES)[x_key]))
    return panels, [(arm, drawn[arm]) for arm in runs if arm in drawn]


def transitions_svg(runs: dict[str, list[RunRecord]]) -> tuple[str, list[tuple[str, str]]] | None:
    """Grouped bars (inline SVG): i→c, c→i, i→i of the final records per arm, in % of problems
    (mean over seeds, error bar ± one seed std); arms without a second turn (GRPO) are left out.
    returns: (the chart, (arm, colour) of its bars), or None when no arm recorded transitions."""
    series = []
    for i, (arm, results) in enumerate(runs.items()):
        means, sds = [], []
        for key, _ in TRANSITIONS:
            vals = [100 * float(r.final[key]) for r in results if is_num(r.final.get(key))]
            means.append(float(np.mean(vals)) if vals else math.nan)
            sds.append(float(np.std(vals, ddof=1)) if len(vals) > 1 else math.nan)
        if any(math.isfinite(m) for m in means):
            series.append(svg.Series(arm, svg.arm_color(i), list(range(len(TRANSITIONS))), means, None, sds))
    if not series:
        return None
    chart = svg.bar_chart([label for _, label in TRANSITIONS], series, y_label="% of problems (final eval)")
    return chart, [(s.label, s.color) for s in series]

"""Figures of a comparison: eval acc@t2 against training cost (METHOD.md "Metrics": curves are
drawn against generated tokens and FLOPs, so a method generating three turns is not flattered by
counting steps), the turn transitions per arm and the feedback metrics over training.

acc@t2 against cost is a matplotlib PNG (acc_vs_tokens.png, which comparison.md links and
index.html embeds); the HTML-only figures are inline SVG (:mod:`mlmt_bench.report.svg`), which
costs milliseconds instead of a second of matplotlib per figure. Curves are the mean over seeds
with a band of ± one sample standard deviation over seeds. An arm keeps its colour (``C<i>`` by
its position in ``runs``) in every figure. matplotlib is imported inside the functions, with the
Agg backend.
"""

from __future__ import annotations

import io
import math
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

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


def aggregate_curves(results: list[RunRecord], x_key: str, y_key: str = "acc@t2") -> dict[str, np.ndarray]:
    """Mean over seeds at matching eval points, with the spread over seeds.

    Intermediate evals match by step; every run's last eval counts as one shared "final" point,
    because seeds stop at slightly different steps under a token budget (17 and 18, say) and
    matching those by step would draw one-seed points at the end. Each point counts the seeds
    that recorded both ``x_key`` and ``y_key`` there (acc@t2 falls back to acc@t1 for
    single-turn runs); x is the mean of their x values (seeds generate slightly different token
    counts by the same step).
    returns: {"step", "x", "y", "sd", "lo", "hi", "n"} arrays over the points, ordered by x
    ("step" is the largest step in the point; "sd" the sample std over seeds, NaN where one seed;
    "lo"/"hi" the min/max over seeds).
    """
    groups: dict[Any, list[tuple[float, float, int]]] = defaultdict(list)
    for r in results:
        points = [(int(rec["step"]), *_point(rec, x_key, y_key)) for rec in r.curve if rec.get("step") is not None]
        points = [p for p in points if p[1] is not None]
        for i, (step, xs, ys) in enumerate(points):
            assert xs is not None and ys is not None  # kept above: _point gives both or neither
            groups["final" if i == len(points) - 1 else step].append((xs, ys, step))
    pts = sorted((np.asarray(g, dtype=float) for g in groups.values()), key=lambda p: p[:, 0].mean())
    return {
        "step": np.asarray([int(p[:, 2].max()) for p in pts], dtype=int),
        "x": np.asarray([p[:, 0].mean() for p in pts]),
        "y": np.asarray([p[:, 1].mean() for p in pts]),
        "sd": np.asarray([p[:, 1].std(ddof=1) if len(p) > 1 else np.nan for p in pts]),
        "lo": np.asarray([p[:, 1].min() for p in pts]),
        "hi": np.asarray([p[:, 1].max() for p in pts]),
        "n": np.asarray([len(p) for p in pts]),
    }


def _point(rec: dict[str, Any], x_key: str, y_key: str) -> tuple[float | None, float | None]:
    x, y = rec.get(x_key), acc_t2(rec) if y_key == "acc@t2" else rec.get(y_key)
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


def _draw_curves(ax: Axes, runs: dict[str, list[RunRecord]], x_key: str, y_key: str, scale: float) -> int:
    """One line per arm (mean over seeds, × ``scale``) with a ± seed-std band where ≥ 2 seeds
    recorded the point; returns how many arms had points."""
    drawn = 0
    for i, (arm, results) in enumerate(runs.items()):
        c = aggregate_curves(results, x_key, y_key)
        if not len(c["x"]):
            continue
        color = f"C{i % 10}"
        n_seeds = len(results)
        ax.plot(c["x"], scale * c["y"], marker="o", ms=3, color=color,
                label=f"{arm} ({n_seeds} seed{'s' if n_seeds != 1 else ''})")
        if np.isfinite(c["sd"]).any():
            sd = np.nan_to_num(c["sd"])  # a one-seed point has no spread to draw
            ax.fill_between(c["x"], scale * (c["y"] - sd), scale * (c["y"] + sd), color=color, alpha=0.2, lw=0)
        drawn += 1
    return drawn


def acc_vs_cost_png(runs: dict[str, list[RunRecord]], *, target: float | None = None,
                    baseline: str | None = None, title: str = "") -> bytes:
    """Two panels, eval acc@t2 vs generated tokens (training) and vs FLOPs, one line per arm
    (mean over seeds, band ± one std over seeds); a dashed line marks the baseline's final
    acc@t2 (``target``)."""
    return _png(acc_vs_cost_figure(runs, target=target, baseline=baseline, title=title))


def acc_vs_cost_figure(runs: dict[str, list[RunRecord]], *, target: float | None = None,
                       baseline: str | None = None, title: str = "") -> Any:
    """The matplotlib figure of :func:`acc_vs_cost_png`. Its one legend (the panels share their
    arms) sits below both panels, outside the plot areas: inside, eight arms covered the curves."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), constrained_layout=True)
    legend: dict[str, Any] = {}
    for ax, (x_key, xlabel) in zip(axes, COST_AXES):
        drawn = _draw_curves(ax, runs, x_key, "acc@t2", 100)
        if target is not None:
            ax.axhline(100 * target, color="grey", ls="--", lw=1,
                       label=f"{baseline} final acc@t2" if baseline else "target")
        if not drawn:
            ax.text(0.5, 0.5, f"no '{x_key}' recorded", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("eval acc@t2 (%)")
        ax.grid(alpha=0.3)
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    if legend:
        fig.legend(list(legend.values()), list(legend), loc="outside lower center", ncols=min(4, len(legend)),
                   fontsize=8, frameon=False)
    if title:
        fig.suptitle(title)
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


def metric_panels_svg(runs: dict[str, list[RunRecord]], metrics: list[tuple[str, str, float]],
                      x_key: str = "gen_tokens") -> tuple[list[str], list[tuple[str, str]]]:
    """One inline-SVG line chart per metric of the eval records that some arm recorded, against
    ``x_key``: a line per arm that recorded it (mean over seeds, band ± one seed std).

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

"""Figures of a comparison: eval acc@t2 against training cost (METHOD.md "Metrics": curves are
drawn against generated tokens and FLOPs, so a method generating three turns is not flattered by
counting steps), the turn transitions per arm and the feedback metrics over training.

Every figure is a PNG as bytes (the HTML report embeds them; ``plot_acc_vs_tokens`` also writes
one to disk). Curves are the mean over seeds with a band of ± one sample standard deviation over
seeds. An arm keeps its colour (``C<i>`` by its position in ``runs``) in every figure.
matplotlib is imported inside the functions, with the Agg backend.
"""

from __future__ import annotations

import io
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mlmt_bench.report.runs import acc_t2, is_num
from mlmt_bench.tracking import atomic_write_bytes

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from mlmt_bench.report.runs import RunRecord

#: x axes of the training curves: (record key, axis label)
COST_AXES = (("gen_tokens", "generated tokens (training)"), ("flops", "FLOPs (training, approx.)"))
#: the turn transitions of a final record, as fractions of all problems: (key, label)
TRANSITIONS = (("i->c", "i→c (fixed)"), ("c->i", "c→i (broken)"), ("i->i", "i→i (still wrong)"))


def aggregate_curves(results: list["RunRecord"], x_key: str, y_key: str = "acc@t2") -> dict[str, np.ndarray]:
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
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    _plt().close(fig)
    return buf.getvalue()


def _draw_curves(ax: "Axes", runs: dict[str, list["RunRecord"]], x_key: str, y_key: str, scale: float) -> int:
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


def acc_vs_cost_png(runs: dict[str, list["RunRecord"]], *, target: float | None = None,
                    baseline: str | None = None, title: str = "") -> bytes:
    """Two panels, eval acc@t2 vs generated tokens (training) and vs FLOPs, one line per arm
    (mean over seeds, band ± one std over seeds); a dashed line marks the baseline's final
    acc@t2 (``target``)."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), constrained_layout=True)
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
        if drawn or target is not None:
            ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    return _png(fig)


def plot_acc_vs_tokens(
    runs: dict[str, list["RunRecord"]],
    path: Path,
    *,
    target: float | None = None,
    baseline: str | None = None,
    title: str = "",
) -> Path:
    """:func:`acc_vs_cost_png`, written atomically to ``path``."""
    atomic_write_bytes(Path(path), acc_vs_cost_png(runs, target=target, baseline=baseline, title=title))
    return Path(path)


def metric_curves_png(runs: dict[str, list["RunRecord"]], metrics: list[tuple[str, str, float]],
                      x_key: str = "gen_tokens") -> bytes | None:
    """One panel per metric of the eval records against ``x_key``, one line per arm that
    recorded it (mean ± seed std); None when no arm recorded any of them. The legend takes
    the first free panel (or the bottom of the figure).

    metrics: (record key, panel title, scale of the values, e.g. 100 for percentages).
    """
    present = [m for m in metrics if any(is_num(rec.get(m[0])) for rs in runs.values() for r in rs for rec in r.curve)]
    if not present:
        return None
    plt = _plt()
    cols = min(3, len(present))
    rows = -(-len(present) // cols)
    free = rows * cols - len(present)
    w, h = 4.2 * cols, 3.0 * rows + (0 if free else 0.5)
    fig, axes = plt.subplots(rows, cols, figsize=(w, h), squeeze=False)
    # fixed margins in inches: constrained_layout measures every label and doubles the time
    fig.subplots_adjust(left=0.55 / w, right=1 - 0.15 / w, top=1 - 0.35 / h, bottom=(0.55 + (0 if free else 0.5)) / h,
                        wspace=0.3, hspace=0.55)
    for ax, (key, name, scale) in zip(axes.flat, present):
        _draw_curves(ax, runs, x_key, key, scale)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel(dict(COST_AXES)[x_key], fontsize=8)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=8)
        ax.xaxis.get_offset_text().set_fontsize(8)
    handles: dict[str, Any] = {}
    for ax in axes.flat:
        for hd, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, hd)
    spare = list(axes.flat)[len(present):]
    for ax in spare:
        ax.axis("off")
    if spare:
        spare[0].legend(list(handles.values()), list(handles), loc="center", fontsize=9, frameon=False)
    else:
        fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=min(4, len(handles)), fontsize=8,
                   frameon=False)
    return _png(fig)


def transitions_png(runs: dict[str, list["RunRecord"]]) -> bytes | None:
    """Grouped bars per arm: i→c, c→i, i→i of the final records (% of problems; mean over
    seeds, error bar ± one seed std); arms without a second turn (GRPO) are left out. None when
    no arm recorded transitions."""
    values: dict[str, list[tuple[float, float]]] = {}
    colors: dict[str, str] = {}
    for i, (arm, results) in enumerate(runs.items()):
        row = []
        for key, _ in TRANSITIONS:
            vals = [float(r.final[key]) for r in results if is_num(r.final.get(key))]
            row.append((float(np.mean(vals)), float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0)
                       if vals else (np.nan, 0.0))
        if any(np.isfinite(m) for m, _ in row):
            values[arm], colors[arm] = row, f"C{i % 10}"
    if not values:
        return None
    plt = _plt()
    w, h = max(5.0, 1.2 + 0.5 * len(TRANSITIONS) * len(values)), 3.6
    fig, ax = plt.subplots(figsize=(w, h))
    fig.subplots_adjust(left=0.7 / w, right=1 - 0.15 / w, top=1 - 0.15 / h, bottom=0.45 / h)
    width = 0.8 / len(values)
    x = np.arange(len(TRANSITIONS))
    for j, (arm, row) in enumerate(values.items()):
        means = np.asarray([100 * m for m, _ in row])
        sds = np.asarray([100 * s for _, s in row])
        bars = ax.bar(x + (j - (len(values) - 1) / 2) * width, np.nan_to_num(means), width, yerr=sds,
                      color=colors[arm], label=arm, capsize=3)
        ax.bar_label(bars, labels=[f"{m:.1f}" if np.isfinite(m) else "–" for m in means], fontsize=7, padding=2)
    ax.set_xticks(x, [label for _, label in TRANSITIONS])
    ax.set_ylabel("% of problems (final eval)")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8, loc="best")
    return _png(fig)

"""Figures of a comparison: eval acc@t2 against training cost (METHOD.md "Metrics": curves are
drawn against generated tokens and FLOPs, so a method generating three turns is not flattered by
counting steps). matplotlib is imported inside the functions, with the Agg backend."""

from __future__ import annotations

import io
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mlmt_bench.report.runs import acc_t2, is_num
from mlmt_bench.tracking import atomic_write_bytes

if TYPE_CHECKING:
    from mlmt_bench.report.runs import RunRecord


def aggregate_curves(results: list["RunRecord"], x_key: str) -> dict[str, np.ndarray]:
    """Mean over seeds at matching eval points, with the min–max band.

    Intermediate evals match by step; every run's last eval counts as one shared "final" point,
    because seeds stop at slightly different steps under a token budget (17 and 18, say) and
    matching those by step would draw one-seed points at the end. Each point counts the seeds
    that recorded both ``x_key`` and acc@t2 there; x is the mean of their x values (seeds
    generate slightly different token counts by the same step).
    returns: {"step", "x", "y", "lo", "hi", "n"} arrays over the points, ordered by x ("step"
    is the largest step in the point).
    """
    groups: dict[Any, list[tuple[float, float, int]]] = defaultdict(list)
    for r in results:
        points = [(int(rec["step"]), *_point(rec, x_key)) for rec in r.curve if rec.get("step") is not None]
        points = [p for p in points if p[1] is not None]
        for i, (step, xs, ys) in enumerate(points):
            groups["final" if i == len(points) - 1 else step].append((xs, ys, step))
    pts = sorted((np.asarray(g, dtype=float) for g in groups.values()), key=lambda p: p[:, 0].mean())
    return {
        "step": np.asarray([int(p[:, 2].max()) for p in pts], dtype=int),
        "x": np.asarray([p[:, 0].mean() for p in pts]),
        "y": np.asarray([p[:, 1].mean() for p in pts]),
        "lo": np.asarray([p[:, 1].min() for p in pts]),
        "hi": np.asarray([p[:, 1].max() for p in pts]),
        "n": np.asarray([len(p) for p in pts]),
    }


def _point(rec: dict[str, Any], x_key: str) -> tuple[float | None, float | None]:
    x, y = rec.get(x_key), acc_t2(rec)
    if is_num(x) and is_num(y):
        return float(x), float(y)
    return None, None


def plot_acc_vs_tokens(
    runs: dict[str, list["RunRecord"]],
    path: Path,
    *,
    target: float | None = None,
    baseline: str | None = None,
    title: str = "",
) -> Path:
    """Two panels, eval acc@t2 vs generated tokens (training) and vs FLOPs, one line per arm
    (mean over seeds, shaded min–max across seeds); a dashed line marks the baseline's final
    acc@t2 (``target``). Written atomically to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), constrained_layout=True)
    panels = [("gen_tokens", "generated tokens (training)"), ("flops", "FLOPs (training, approx.)")]
    for ax, (x_key, xlabel) in zip(axes, panels):
        drawn = 0
        for i, (arm, results) in enumerate(runs.items()):
            c = aggregate_curves(results, x_key)
            if not len(c["x"]):
                continue
            color = f"C{i % 10}"
            n_seeds = len(results)
            ax.plot(c["x"], 100 * c["y"], marker="o", ms=3, color=color,
                    label=f"{arm} ({n_seeds} seed{'s' if n_seeds != 1 else ''})")
            if n_seeds > 1:
                ax.fill_between(c["x"], 100 * c["lo"], 100 * c["hi"], color=color, alpha=0.2, lw=0)
            drawn += 1
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
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    atomic_write_bytes(Path(path), buf.getvalue())
    return Path(path)

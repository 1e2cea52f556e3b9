"""Training dynamics on the results page: small multiples of the train records of ``metrics.jsonl``
(reward, KL, entropy, loss, gradient norm, the clipped share of the update, the share of truncated
completions, response length per turn), one row of panels per arm with the baseline's curve in
grey behind it, as acc_vs_tokens.png draws accuracy.

Each panel is an inline SVG (:mod:`mlmt_bench.report.svg`) against generated training tokens
(the page's cost axis); a line is the mean over seeds at each training step (each run's last step
pooled as one point: :func:`mlmt_bench.report.figures.aggregate_curves`), its band ± one seed std.
Panels of one metric share their axes, so a column compares arms at a glance. A metric is looked up
under each of its names, first the one TRL logs (``reward``, ``kl``, ``entropy``,
``completions/clipped_ratio``), then this trainer's older per-role keys (``kl/solver``); a column
is drawn when some arm logged it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from mlmt_bench.report import svg
from mlmt_bench.report.figures import aggregate_curves
from mlmt_bench.report.runs import own_arms

if TYPE_CHECKING:
    from mlmt_bench.report.runs import RunRecord


@dataclass(frozen=True)
class Panel:
    """One column of the grid: ``lines``: (line label, the keys a train record may hold it under,
    first found wins); ``scale``: multiplies the values (100 for a share shown in %)."""

    title: str
    lines: tuple[tuple[str, tuple[str, ...]], ...]
    scale: float = 1.0


def _roles(metric: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """A per-role update statistic: the solver's (TRL's plain name, else ``<metric>/solver``), the critic's."""
    return (("solver", (metric, f"{metric}/solver")), ("critic", (f"{metric}/critic",)))


#: the columns of the grid
PANELS = (
    Panel("reward (batch mean)", (("", ("reward", "reward_mean")),)),
    Panel("KL to the reference", _roles("kl")),
    Panel("entropy (nats/token)", _roles("entropy")),
    Panel("loss", _roles("loss")),
    Panel("grad norm (before clipping)", _roles("grad_norm")),
    Panel("clipped ratio (% of tokens)", (("solver", ("clip_ratio/region_mean", "clip_frac/solver")),
                                          ("critic", ("clip_frac/critic",))), 100.0),
    Panel("truncated completions (%)", (("", ("completions/clipped_ratio",)),), 100.0),
    Panel("response length (tokens/turn)", (("attempt", ("completions/mean_length/attempt", "len/attempt")),
                                            ("feedback", ("completions/mean_length/feedback", "len/feedback")),
                                            ("refine", ("completions/mean_length/refine", "len/refine")))),
)
#: the stroke of a panel's first, second and third line (the arm's colour tells arms apart)
DASHES = ("", "4 3", "1.5 2.5")
#: the baseline's curve behind every other arm's
BASELINE_GREY = "#9a9a9a"
#: a panel's size in SVG units (the page scales it to its column)
WIDTH, HEIGHT = 190, 130


def _series(results: list[RunRecord], panel: Panel, color: str, *, band: bool) -> list[svg.Series]:
    out = []
    for (label, keys), dash in zip(panel.lines, DASHES):
        c = aggregate_curves(results, "gen_tokens", keys, train=True)
        if len(c["x"]):
            y, sd = panel.scale * c["y"], panel.scale * c["sd"]
            lo, hi = ((y - sd).tolist(), (y + sd).tolist()) if band else (None, None)
            out.append(svg.Series(label, color, c["x"].tolist(), y.tolist(), lo, hi, dash=dash))
    return out


@dataclass
class Grid:
    """The small multiples: ``panels`` (the columns: those some arm logged), ``rows``: per arm, its
    panels' SVG (None where the arm logged none of that panel's keys)."""

    panels: list[Panel]
    rows: list[tuple[str, list[str | None]]]


def dynamics_grid(runs: dict[str, list[RunRecord]], baseline: str | None) -> Grid | None:
    """The training-dynamics grid of the arms of ``runs`` that trained (not the rows derived from
    another arm's runs: :func:`~mlmt_bench.report.runs.own_arms`), each in the colour of its
    position in ``runs``, as in every figure of the page; the baseline's curves in grey behind every
    other arm's; None when no arm logged any of :data:`PANELS`' metrics."""
    own = own_arms(runs)
    drawn = {arm: {p.title: _series(results, p, svg.arm_color(i), band=True) for p in PANELS}
             for i, (arm, results) in enumerate(runs.items()) if arm in own}
    panels = [p for p in PANELS if any(by_panel[p.title] for by_panel in drawn.values())]
    if not panels:
        return None
    extents = {p.title: svg.data_range([s for by_panel in drawn.values() for s in by_panel[p.title]]) for p in panels}
    behind = {p.title: [svg.Series(f"{baseline} (baseline)", BASELINE_GREY, s.x, s.y, dash=s.dash)
                        for s in drawn[baseline][p.title]] for p in panels} if baseline in drawn else {}
    rows: list[tuple[str, list[str | None]]] = []
    for arm, by_panel in drawn.items():
        cells: list[str | None] = []
        for p in panels:
            lines = by_panel[p.title]
            grey = behind.get(p.title, []) if arm != baseline else []
            cells.append(svg.line_chart(grey + lines, title="", x_label="", width=WIDTH, height=HEIGHT, left=40,
                                        extent=extents[p.title], markers=False) if lines else None)
        rows.append((arm, cells))
    return Grid(panels, rows)


def line_key(panel: Panel) -> str:
    """Which stroke is which line of a panel of several ("solid: solver, dashed: critic"); "" for one line."""
    if len(panel.lines) < 2:
        return ""
    return ", ".join(f"{n}: {label}" for n, (label, _) in zip(("solid", "dashed", "dotted"), panel.lines))

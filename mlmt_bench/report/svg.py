"""Small inline-SVG charts for the HTML report: line charts with bands, grouped bar charts and forest
charts (differences with their intervals).

matplotlib takes about a second of CPU per multi-panel figure (text layout and rasterising);
these are strings, built in milliseconds, and stay sharp at any zoom. Colours follow
matplotlib's default cycle (``C0``, ``C1``, ...), so an arm has the same colour here as in
acc_vs_tokens.png. Every text is escaped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from mlmt_bench.report.escape import esc

#: matplotlib's tab10 cycle (its grey C7 swapped for navy: grey draws the baseline), then tab20's
#: light shades and four darker ones: twenty colours, so that an experiment of up to twenty arms
#: (the headline has twelve rows) never gives two arms one colour
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#393b79", "#bcbd22",
           "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#000000", "#7b4173",
           "#637939", "#843c39")
_FONT = 'font-family="system-ui,sans-serif"'


def arm_color(i: int) -> str:
    """The colour of the i-th arm (:data:`PALETTE`, cycled)."""
    return PALETTE[i % len(PALETTE)]


@dataclass
class Series:
    """One line: points (x, y) with an optional band [lo, hi] per point (NaN: no band there)."""

    label: str
    color: str
    x: Sequence[float]
    y: Sequence[float]
    lo: Sequence[float] | None = None
    hi: Sequence[float] | None = None
    dash: str = ""  # an SVG stroke-dasharray ("4 3"); "" draws a solid line


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """Round values (multiples of 1, 2, 2.5 or 5 × 10^k) inside [lo, hi], about ``n`` of them."""
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(s * mag for s in (1, 2, 2.5, 5, 10) if s * mag >= raw)
    first, last = math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9)
    return [round(k * step, 12) for k in range(first, last + 1)]


def padded(lo: float, hi: float, frac: float = 0.05) -> tuple[float, float]:
    """[lo, hi] widened by ``frac`` of its span on each side (by 1, or 10% of |lo|, when it has none)."""
    if not hi > lo:
        d = 0.1 * abs(lo) or 1.0
        return lo - d, hi + d
    d = frac * (hi - lo)
    return lo - d, hi + d


def data_range(series: Sequence[Series]) -> tuple[tuple[float, float], tuple[float, float]] | None:
    """The (x, y) extents of the series' points and bands, unpadded; None when they have none."""
    xs = [v for s in series for v in _finite(s.x)]
    ys = [v for s in series for v in _finite(s.y) + _finite(s.lo) + _finite(s.hi)]
    return ((min(xs), max(xs)), (min(ys), max(ys))) if xs and ys else None


def wrap(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width`` characters, broken at spaces (a longer word is its own line)."""
    lines: list[str] = []
    for word in text.split():
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines or [""]


def tick_label(v: float) -> str:
    """Compact: 0.25, 40, 12k, 1.5M, 3G, 2T."""
    a = abs(v)
    for div, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= div:
            return f"{v / div:g}{suffix}"
    return f"{v:.6g}"


#: a title's characters per pixel of width at its font size (12 px), on the safe side, and its line height
_TITLE_CHAR_PX, _TITLE_LINE_PX = 6.8, 14
#: pixels per character of a row label at 11 px (a forest chart's left margin fits its longest label)
_LABEL_CHAR_PX = 6.2


class _Frame:
    """Maps data to pixels inside a plot area and draws its axes, grid and labels."""

    def __init__(self, width: int, height: int, x_range: tuple[float, float] | None,
                 y_range: tuple[float, float], left: int = 48, bottom: int = 36, top: int = 24, right: int = 12,
                 title: str = "", y_ticks: list[float] | None = None):
        """x_range, y_range: the axes' limits (x_range None: no x axis, e.g. bars); title: wrapped to
        the width, the plot area moved down by its extra lines; y_ticks: instead of round ones."""
        self.title = wrap(title, max(8, int(width / _TITLE_CHAR_PX)))
        top += _TITLE_LINE_PX * (len(self.title) - 1)
        self.w, self.h = width, height
        self.x0, self.x1, self.y0, self.y1 = left, width - right, top, height - bottom
        self.ylo, self.yhi = y_range
        # about one tick per 70 px across and 40 px up, so that a small multiple's labels do not collide
        self.yt = nice_ticks(*y_range, n=max(2, min(5, (self.y1 - self.y0) // 40))) if y_ticks is None else y_ticks
        self.xlo, self.xhi = x_range or (0.0, 1.0)
        self.xt = nice_ticks(*x_range, n=max(2, min(5, (self.x1 - self.x0) // 70))) if x_range else []

    def px(self, x: float) -> float:
        return self.x0 + (x - self.xlo) / (self.xhi - self.xlo) * (self.x1 - self.x0)

    def py(self, y: float) -> float:
        return self.y1 - (y - self.ylo) / (self.yhi - self.ylo) * (self.y1 - self.y0)

    def axes(self, x_label: str, y_label: str) -> list[str]:
        out = [f'<rect x="{self.x0}" y="{self.y0}" width="{self.x1 - self.x0}" height="{self.y1 - self.y0}" '
               'fill="#fff" stroke="#444" stroke-width="0.8"/>']
        for t in self.yt:
            y = self.py(t)
            out.append(f'<line x1="{self.x0}" x2="{self.x1}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e5e5e5"/>'
                       f'<text x="{self.x0 - 4}" y="{y + 3.5:.1f}" font-size="10" text-anchor="end">'
                       f"{esc(tick_label(t))}</text>")
        for t in self.xt:
            x = self.px(t)
            out.append(f'<line y1="{self.y0}" y2="{self.y1}" x1="{x:.1f}" x2="{x:.1f}" stroke="#e5e5e5"/>'
                       f'<text x="{x:.1f}" y="{self.y1 + 13}" font-size="10" text-anchor="middle">'
                       f"{esc(tick_label(t))}</text>")
        out += [f'<text x="{self.w / 2:.1f}" y="{15 + _TITLE_LINE_PX * i}" font-size="12" font-weight="600" '
                f'text-anchor="middle">{esc(line)}</text>' for i, line in enumerate(self.title) if line]
        if x_label:
            out.append(f'<text x="{(self.x0 + self.x1) / 2:.1f}" y="{self.h - 6}" font-size="10.5" '
                       f'text-anchor="middle">{esc(x_label)}</text>')
        if y_label:
            cy = (self.y0 + self.y1) / 2
            out.append(f'<text x="11" y="{cy:.1f}" font-size="10.5" text-anchor="middle" '
                       f'transform="rotate(-90 11 {cy:.1f})">{esc(y_label)}</text>')
        return out

    def svg(self, body: list[str], label: str) -> str:
        return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {self.w} {self.h}" width="{self.w}" '
                f'height="{self.h}" role="img" aria-label="{esc(label)}" {_FONT}>{"".join(body)}</svg>')


def _finite(values: Sequence[float | None] | None) -> list[float]:
    return [float(v) for v in values or [] if v is not None and math.isfinite(v)]


def line_chart(series: list[Series], *, title: str, x_label: str, y_label: str = "", width: int = 380,
               height: int = 250, extent: tuple[tuple[float, float], tuple[float, float]] | None = None,
               left: int = 48, markers: bool = True) -> str:
    """Lines with markers and shaded bands; an empty frame saying so when no series has a point.

    extent: the (x, y) data ranges the axes span (padded as the chart pads its own), so that small
    multiples share their scales; default: the series' own (:func:`data_range`); markers: a dot with
    its value as a tooltip at each point (small multiples leave them out). A y range without
    a span (a metric constant at every point: a KL of 0 without a KL term) gets the one tick at that
    value and says so, not a range of round numbers around it."""
    extent = extent or data_range(series)
    top, bottom = 24 if title else 8, 36 if x_label else 20
    if extent is None:
        f = _Frame(width, height, (0.0, 1.0), (0.0, 1.0), left=left, top=top, bottom=bottom, title=title)
        return f.svg(f.axes(x_label, y_label) + [_note(f, "not recorded")], title)
    (xlo, xhi), (ylo, yhi) = extent
    flat = not yhi > ylo
    f = _Frame(width, height, padded(xlo, xhi, 0.03), padded(ylo, yhi), left=left, top=top, bottom=bottom,
               title=title, y_ticks=[ylo] if flat else None)
    body = f.axes(x_label, y_label)
    if flat:
        body.append(_note(f, f"constant {tick_label(ylo)}"))
    for s in series:
        pts = [(x, y) for x, y in zip(s.x, s.y) if math.isfinite(x) and math.isfinite(y)]
        if s.lo is not None and s.hi is not None:
            band = [(x, lo, hi) for x, lo, hi in zip(s.x, s.lo, s.hi) if math.isfinite(lo) and math.isfinite(hi)]
            if len(band) > 1:
                poly = [(f.px(x), f.py(hi)) for x, _, hi in band] + [(f.px(x), f.py(lo)) for x, lo, _ in band[::-1]]
                body.append(f'<polygon points="{" ".join(f"{a:.1f},{b:.1f}" for a, b in poly)}" '
                            f'fill="{s.color}" fill-opacity="0.2" stroke="none"/>')
        if len(pts) > 1:
            dash = f' stroke-dasharray="{s.dash}"' if s.dash else ""
            body.append(f'<polyline points="{" ".join(f"{f.px(x):.1f},{f.py(y):.1f}" for x, y in pts)}" '
                        f'fill="none" stroke="{s.color}" stroke-width="1.6"{dash}/>')
        body += [f'<circle cx="{f.px(x):.1f}" cy="{f.py(y):.1f}" r="2.3" fill="{s.color}">'
                 f"<title>{esc(s.label)}: {esc(tick_label(y))} at {esc(tick_label(x))}</title></circle>"
                 for x, y in pts if markers]
    return f.svg(body, title)


def _note(f: _Frame, text: str) -> str:
    """A grey note in the middle of the plot area."""
    return (f'<text x="{(f.x0 + f.x1) / 2:.1f}" y="{(f.y0 + f.y1) / 2 - 6:.1f}" font-size="11" '
            f'text-anchor="middle" fill="#666">{esc(text)}</text>')


def _error_bars(s: Series) -> Sequence[float | None]:
    """A bar series' error-bar half-lengths (``hi``), None for each bar without one."""
    return s.hi or [None] * len(s.y)


def bar_chart(categories: list[str], series: list[Series], *, y_label: str, title: str = "",
              height: int = 260) -> str:
    """Grouped bars: one group per category, one bar per series (``y`` per category, ``hi`` the
    error bar's half-length or None), each labelled with its value; a NaN value draws no bar."""
    vals = [v for s in series for v in _finite(s.y)]
    tops = [y + (e if e is not None and math.isfinite(e) else 0) for s in series
            for y, e in zip(s.y, _error_bars(s)) if math.isfinite(y)]
    lo, hi = min([0.0] + vals), max([1.0] + tops)
    f = _Frame(max(420, 70 + len(categories) * (30 * len(series) + 36)), height, None,
               (lo - 0.1 * (hi - lo) if lo < 0 else 0.0, hi + 0.12 * (hi - lo)), title=title)  # room for labels
    body = f.axes("", y_label)
    group = (f.x1 - f.x0) / len(categories)
    bar = min(34.0, 0.8 * group / max(1, len(series)))
    for c, cat in enumerate(categories):
        cx = f.x0 + (c + 0.5) * group
        body.append(f'<text x="{cx:.1f}" y="{f.y1 + 14}" font-size="11" text-anchor="middle">{esc(cat)}</text>')
        for j, s in enumerate(series):
            y = s.y[c]
            if not math.isfinite(y):
                continue
            x = cx + (j - len(series) / 2) * bar
            top, base = f.py(max(y, 0.0)), f.py(min(y, 0.0))
            body.append(f'<rect x="{x:.1f}" y="{top:.1f}" width="{bar:.1f}" height="{max(base - top, 0.5):.1f}" '
                        f'fill="{s.color}"><title>{esc(s.label)}: {y:.1f}</title></rect>')
            err = _error_bars(s)[c]
            if err is not None and math.isfinite(err) and err > 0:
                mid = x + bar / 2
                body.append(f'<path d="M{mid:.1f},{f.py(y + err):.1f}V{f.py(y - err):.1f}'
                            f'M{mid - 3:.1f},{f.py(y + err):.1f}h6M{mid - 3:.1f},{f.py(y - err):.1f}h6" '
                            'stroke="#222" stroke-width="1"/>')
            label_y = f.py(y + (err if err is not None and math.isfinite(err) else 0)) - 3
            body.append(f'<text x="{x + bar / 2:.1f}" y="{label_y:.1f}" font-size="9" text-anchor="middle">'
                        f"{y:.1f}</text>")
    return f.svg(body, title or y_label)


@dataclass
class Interval:
    """One row of a forest chart: an estimate with its interval, filled when ``marked`` (significant)."""

    label: str
    color: str
    estimate: float
    lo: float
    hi: float
    marked: bool = False
    tip: str = ""


def forest_chart(rows: list[Interval], *, x_label: str, title: str = "", width: int = 640) -> str | None:
    """Intervals as horizontal bars with a dot at the estimate, one row each, against a dashed line at
    0 (no difference); a marked row's dot is filled, an unmarked one's hollow. Rows with a non-finite
    number are left out; None when none is left."""
    kept = [r for r in rows if all(math.isfinite(v) for v in (r.estimate, r.lo, r.hi))]
    if not kept:
        return None
    lo, hi = min([0.0] + [r.lo for r in kept]), max([0.0] + [r.hi for r in kept])
    row_px, label_px = 20, min(300, 16 + int(_LABEL_CHAR_PX * max(len(r.label) for r in kept)))
    top = 24 if title else 8
    f = _Frame(width, top + row_px * len(kept) + 36, padded(lo, hi), (0.0, float(len(kept))), left=label_px,
               top=top, title=title, y_ticks=[])
    body = f.axes(x_label, "")
    zero = f.px(0.0)
    body.append(f'<line x1="{zero:.1f}" x2="{zero:.1f}" y1="{f.y0}" y2="{f.y1}" stroke="#666" '
                'stroke-dasharray="4 3"/>')
    for i, r in enumerate(kept):
        y = f.py(len(kept) - i - 0.5)  # the first row on top
        fill = r.color if r.marked else "#fff"
        body.append(f'<text x="{f.x0 - 6}" y="{y + 3.5:.1f}" font-size="11" text-anchor="end">{esc(r.label)}</text>'
                    f'<line x1="{f.px(r.lo):.1f}" x2="{f.px(r.hi):.1f}" y1="{y:.1f}" y2="{y:.1f}" '
                    f'stroke="{r.color}" stroke-width="2"/>'
                    f'<circle cx="{f.px(r.estimate):.1f}" cy="{y:.1f}" r="4" fill="{fill}" stroke="{r.color}" '
                    f'stroke-width="1.6"><title>{esc(r.tip or r.label)}</title></circle>')
    return f.svg(body, title or x_label)


def legend(items: list[tuple[str, str]]) -> str:
    """An HTML legend: (label, colour) swatches in a row."""
    return '<div class="legend">' + "".join(
        f'<span><i style="background:{c}"></i>{esc(label)}</span>' for label, c in items) + "</div>"

"""Charts of a run as SVG, for the Prefect UI.

Prefect's image artifacts need a URL the browser can fetch, which a run root on local disk or
S3 is not; its markdown artifacts, though, render images given as ``data:`` URIs (checked in
headless Chromium, ``bench/ui_check.py``). So each chart is a small hand-written SVG (no
plotting dependency in the main install) embedded in one markdown artifact per run.

A chart is built as data first (``LineChart``, ``Histogram``: axis ranges, ticks and their
labels, series, marks) and drawn from it, so tests check what a reader sees without pixels:
round ticks, an x axis that starts at the first point, the bins of a histogram.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from html import escape

Series = Mapping[str, Sequence[tuple[float, float]]]

_W, _H = 640, 260
_LEFT, _RIGHT, _TOP, _BOTTOM = 56, 150, 30, 40
_COLORS = ("#3b82f6", "#f97316", "#22c55e", "#ef4444", "#a855f7", "#eab308", "#14b8a6")


@dataclass(frozen=True)
class Axis:
    """An axis: the range drawn, where ticks go and what they read."""

    lo: float
    hi: float
    ticks: tuple[float, ...]
    labels: tuple[str, ...]
    title: str = ""


def nice_step(span: float, n: int = 5) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten that splits ``span`` into at most
    ``n`` intervals."""
    if span <= 0 or not math.isfinite(span):
        return 1.0
    raw = span / n
    power = 10.0 ** math.floor(math.log10(raw))
    return next(m * power for m in (1.0, 2.0, 2.5, 5.0, 10.0) if m * power >= raw * (1 - 1e-9))


def _label(v: float, step: float) -> str:
    """``v`` with as many decimals as the tick step needs (0.25 -> 2, 0.5 -> 1, 50 -> 0)."""
    decimals = 0
    while decimals < 8 and abs(round(step, decimals) - step) > 1e-9 * max(abs(step), 1.0):
        decimals += 1
    value = round(v / step) * step
    return f"{value if value else 0.0:.{decimals}f}"  # never "-0"


def value_axis(values: Sequence[float], floor_zero: bool = False, title: str = "") -> Axis:
    """A y axis over ``values`` that ends on round ticks (0, 0.25, 0.5 ... rather than 0.0837)."""
    lo, hi = min(values), max(values)
    if floor_zero:
        lo, hi = min(lo, 0.0), max(hi, 0.0)
    if hi == lo:
        lo, hi = lo - (abs(lo) or 1.0) * 0.1, hi + (abs(hi) or 1.0) * 0.1
    step = nice_step(hi - lo)
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    ticks = tuple(i * step for i in range(first, last + 1))
    return Axis(ticks[0], ticks[-1], ticks, tuple(_label(t, step) for t in ticks), title)


def position_axis(
    xs: Sequence[float], title: str = "", names: Mapping[float, str] | None = None
) -> Axis:
    """An x axis from the first point to the last (no padding before the first step). Named
    positions (checkpoints: theta_0, it.1 ...) are ticked by name; a few whole numbers each;
    otherwise round ticks inside the range."""
    lo, hi = min(xs), max(xs)
    if names:
        ticks = tuple(sorted(names))
        labels = tuple(names[t] for t in ticks)
    elif all(float(v).is_integer() for v in xs) and hi - lo <= 12:
        ticks = tuple(float(v) for v in range(int(lo), int(hi) + 1))
        labels = tuple(str(int(t)) for t in ticks)
    else:
        step = nice_step(hi - lo) if hi > lo else 1.0
        ticks = tuple(
            i * step for i in range(math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9) + 1)
        )
        labels = tuple(_label(t, step) for t in ticks)
    if hi == lo:  # one point: centre it
        lo, hi = lo - 0.5, hi + 0.5
    return Axis(lo, hi, ticks, labels, title)


@dataclass(frozen=True)
class LineChart:
    """Lines (dots where few) per named series over shared axes; ``marks`` are vertical
    boundaries (x, the name of what starts there), e.g. where each iteration's steps begin;
    ``bands`` are intervals drawn as error bars in their series' colour (x, low, high), e.g. a
    win rate's bootstrap interval."""

    title: str
    x: Axis
    y: Axis
    series: Mapping[str, Sequence[tuple[float, float]]]
    marks: tuple[tuple[float, str], ...] = ()
    bands: Mapping[str, Sequence[tuple[float, float, float]]] = field(default_factory=dict)

    def svg(self) -> str:
        parts = _frame(self.title, self.x, self.y)
        for xm, name in self.marks:
            px = _px(xm, self.x)
            if xm > self.x.lo:
                parts.append(f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{_TOP}" y2="{_H - _BOTTOM}" '
                             'stroke="#6b7280" stroke-dasharray="4,3"/>')  # fmt: skip
            at = _px(max(xm, self.x.lo), self.x)  # the first one's name at the axis' start
            parts.append(f'<text x="{at + 3:.1f}" y="{_TOP + 10}" fill="#6b7280">'
                         f"{escape(name)}</text>")  # fmt: skip
        for i, (name, pts) in enumerate(self.series.items()):
            color = _COLORS[i % len(_COLORS)]
            if not pts:
                continue
            path = " ".join(f"{_px(a, self.x):.1f},{_py(b, self.y):.1f}" for a, b in sorted(pts))
            parts.append(f'<polyline points="{path}" fill="none" stroke="{color}" '
                         'stroke-width="2"/>')  # fmt: skip
            if len(pts) <= 30:
                parts += [f'<circle cx="{_px(a, self.x):.1f}" cy="{_py(b, self.y):.1f}" r="3" '
                          f'fill="{color}"/>' for a, b in pts]  # fmt: skip
            parts += _error_bars(self.bands.get(name, ()), self.x, self.y, color)
            parts += _legend(i, name, color)
        return "\n".join([*parts, "</svg>"])


@dataclass(frozen=True)
class Histogram:
    """Shares of values per bin (``edges``), one bar per group side by side in each bin."""

    title: str
    edges: tuple[float, ...]
    groups: Mapping[str, Sequence[float]]
    y: Axis
    xlabel: str = ""
    x: Axis = field(init=False)

    def __post_init__(self) -> None:
        # The score table's edges are the data's (0.0997 ...); two digits read at a glance.
        labels = tuple(f"{e:.2g}" for e in self.edges)
        object.__setattr__(
            self, "x", Axis(self.edges[0], self.edges[-1], self.edges, labels, self.xlabel)
        )

    def svg(self) -> str:
        parts = _frame(self.title, self.x, self.y)
        width = (_px(self.edges[1], self.x) - _px(self.edges[0], self.x)) * 0.8 / len(self.groups)
        for gi, (name, shares) in enumerate(self.groups.items()):
            color = _COLORS[gi % len(_COLORS)]
            for b, share in enumerate(shares):
                left = _px(self.edges[b], self.x) + width * (0.125 * len(self.groups) + gi)
                top = _py(share, self.y)
                parts.append(f'<rect x="{left:.1f}" y="{top:.1f}" width="{width:.1f}" '
                             f'height="{_H - _BOTTOM - top:.1f}" fill="{color}"/>')  # fmt: skip
            parts += _legend(gi, name, color)
        return "\n".join([*parts, "</svg>"])


Chart = LineChart | Histogram


def line_chart(
    title: str,
    series: Series,
    xlabel: str,
    floor_zero: bool = False,
    *,
    ylabel: str = "",
    names: Mapping[float, str] | None = None,
    marks: Sequence[tuple[float, str]] = (),
    bands: Mapping[str, Sequence[tuple[float, float, float]]] | None = None,
) -> LineChart | None:
    """A line chart of the finite points of each series (None when there are none), with the
    finite intervals of ``bands`` (series name -> (x, low, high)) as error bars."""
    points = {k: [(x, y) for x, y in v if math.isfinite(y)] for k, v in series.items()}
    points = {k: v for k, v in points.items() if v}
    kept = {
        k: [(x, lo, hi) for x, lo, hi in v if math.isfinite(lo) and math.isfinite(hi)]
        for k, v in (bands or {}).items()
        if k in points
    }
    xs = [x for v in points.values() for x, _ in v]
    ys = [y for v in points.values() for _, y in v]
    ys += [y for v in kept.values() for _, lo, hi in v for y in (lo, hi)]
    if not xs:
        return None
    return LineChart(
        title,
        position_axis(xs, xlabel, names),
        value_axis(ys, floor_zero, ylabel),
        points,
        tuple(marks),
        kept,
    )


def histogram(
    title: str, edges: Sequence[float], groups: Mapping[str, Sequence[float]], xlabel: str
) -> Histogram | None:
    """Bars of per-bin shares (``groups``: one share per bin each) over the bins ``edges``."""
    values = [v for g in groups.values() for v in g]
    if len(edges) < 2 or not values:
        return None
    y = value_axis([0.0, max(values)], floor_zero=True, title="share of prompts")
    return Histogram(title, tuple(edges), groups, y, xlabel)


def _frame(title: str, x: Axis, y: Axis) -> list[str]:
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" '
        f'font-family="sans-serif" font-size="11">',
        f'<rect width="{_W}" height="{_H}" fill="#ffffff"/>',
        f'<text x="{_LEFT}" y="18" font-size="13" font-weight="bold">{escape(title)}</text>',
    ]
    for v, label in zip(y.ticks, y.labels, strict=True):
        py = _py(v, y)
        parts.append(f'<line x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{py:.1f}" y2="{py:.1f}" '
                     'stroke="#e5e7eb"/>')  # fmt: skip
        parts.append(f'<text x="{_LEFT - 6}" y="{py + 4:.1f}" text-anchor="end">{label}</text>')
    for v, label in zip(x.ticks, x.labels, strict=True):
        parts.append(f'<text x="{_px(v, x):.1f}" y="{_H - _BOTTOM + 16}" '
                     f'text-anchor="middle">{escape(label)}</text>')  # fmt: skip
    parts.append(
        f'<text x="{(_LEFT + _W - _RIGHT) / 2}" y="{_H - 6}" text-anchor="middle">'
        f"{escape(x.title)}</text>"
    )
    if y.title:
        parts.append(f'<text x="12" y="{(_TOP + _H - _BOTTOM) / 2}" text-anchor="middle" '
                     f'transform="rotate(-90 12 {(_TOP + _H - _BOTTOM) / 2})">'
                     f"{escape(y.title)}</text>")  # fmt: skip
    return parts


def _error_bars(
    bands: Sequence[tuple[float, float, float]], x: Axis, y: Axis, color: str
) -> list[str]:
    """A vertical bar from low to high at each x, capped at both ends."""
    parts = []
    for at, low, high in bands:
        px, top, bottom = _px(at, x), _py(high, y), _py(low, y)
        parts.append(f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{top:.1f}" y2="{bottom:.1f}" '
                     f'stroke="{color}" stroke-width="1.5"/>')  # fmt: skip
        parts += [f'<line x1="{px - 4:.1f}" x2="{px + 4:.1f}" y1="{py:.1f}" y2="{py:.1f}" '
                  f'stroke="{color}" stroke-width="1.5"/>' for py in (top, bottom)]  # fmt: skip
    return parts


def _legend(i: int, name: str, color: str) -> list[str]:
    ly = _TOP + 14 * i
    return [
        f'<rect x="{_W - _RIGHT + 10}" y="{ly}" width="10" height="10" fill="{color}"/>',
        f'<text x="{_W - _RIGHT + 24}" y="{ly + 9}">{escape(name)}</text>',
    ]


def _px(v: float, x: Axis) -> float:
    return _LEFT + (v - x.lo) / ((x.hi - x.lo) or 1.0) * (_W - _LEFT - _RIGHT)


def _py(v: float, y: Axis) -> float:
    return _H - _BOTTOM - (v - y.lo) / ((y.hi - y.lo) or 1.0) * (_H - _TOP - _BOTTOM)


def embed(chart: Chart | None, alt: str) -> str:
    """A markdown image of ``chart`` as an SVG data URI (a note when there is nothing to draw)."""
    if chart is None:
        return f"*{alt}: nothing to draw yet*"
    return f"![{alt}](data:image/svg+xml;base64,{base64.b64encode(chart.svg().encode()).decode()})"

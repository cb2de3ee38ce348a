"""Charts of a run as SVG, for the Prefect UI.

Prefect's image artifacts need a URL the browser can fetch, which a run root on local disk or
S3 is not; its markdown artifacts, though, render images given as ``data:`` URIs (checked in
headless Chromium, ``bench/ui_check.py``). So each chart is a small hand-written SVG (no
plotting dependency in the main install) embedded in one markdown artifact per run.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping, Sequence
from html import escape

Series = Mapping[str, Sequence[tuple[float, float]]]

_W, _H = 560, 260
_LEFT, _RIGHT, _TOP, _BOTTOM = 56, 130, 30, 40
_COLORS = ("#3b82f6", "#f97316", "#22c55e", "#ef4444", "#a855f7", "#eab308", "#14b8a6")


def _ticks(lo: float, hi: float, n: int = 4) -> list[float]:
    if hi <= lo:
        hi = lo + 1.0
    step = (hi - lo) / n
    return [lo + i * step for i in range(n + 1)]


def _fmt(v: float) -> str:
    return f"{v:.3g}"


def _frame(
    title: str,
    x: tuple[float, float],
    y: tuple[float, float],
    xlabel: str,
    xticks: Sequence[float] | None = None,
) -> list[str]:
    (x0, x1), (y0, y1) = x, y
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" '
        f'font-family="sans-serif" font-size="11">',
        f'<rect width="{_W}" height="{_H}" fill="#ffffff"/>',
        f'<text x="{_LEFT}" y="18" font-size="13" font-weight="bold">{escape(title)}</text>',
    ]
    for v in _ticks(y0, y1):
        py = _py(v, y)
        parts.append(f'<line x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{py:.1f}" y2="{py:.1f}" '
                     'stroke="#e5e7eb"/>')  # fmt: skip
        parts.append(f'<text x="{_LEFT - 6}" y="{py + 4:.1f}" text-anchor="end">{_fmt(v)}</text>')
    for v in _ticks(x0, x1) if xticks is None else xticks:
        px = _px(v, x)
        parts.append(
            f'<text x="{px:.1f}" y="{_H - _BOTTOM + 16}" text-anchor="middle">{_fmt(v)}</text>'
        )
    parts.append(
        f'<text x="{(_LEFT + _W - _RIGHT) / 2}" y="{_H - 6}" text-anchor="middle">'
        f"{escape(xlabel)}</text>"
    )
    return parts


def _px(v: float, x: tuple[float, float]) -> float:
    x0, x1 = x
    return _LEFT + (v - x0) / ((x1 - x0) or 1.0) * (_W - _LEFT - _RIGHT)


def _py(v: float, y: tuple[float, float]) -> float:
    y0, y1 = y
    return _H - _BOTTOM - (v - y0) / ((y1 - y0) or 1.0) * (_H - _TOP - _BOTTOM)


def _range(values: Sequence[float], floor_zero: bool) -> tuple[float, float]:
    lo, hi = min(values), max(values)
    if floor_zero:
        lo = min(lo, 0.0)
    if hi == lo:
        hi = lo + (abs(lo) or 1.0) * 0.1
    pad = (hi - lo) * 0.05
    return (lo if floor_zero and lo == 0 else lo - pad), hi + pad


def line_chart(title: str, series: Series, xlabel: str, floor_zero: bool = False) -> str:
    """One line (with dots) per named series of (x, y) points; NaN points are skipped."""
    points = {k: [(x, y) for x, y in v if math.isfinite(y)] for k, v in series.items()}
    xs = [x for v in points.values() for x, _ in v]
    ys = [y for v in points.values() for _, y in v]
    if not ys:
        return ""
    x, y = _range(xs, False), _range(ys, floor_zero)
    # Iterations and checkpoints are whole numbers: tick exactly those.
    whole = all(float(v).is_integer() for v in xs) and max(xs) - min(xs) <= 20
    ticks = list(range(int(min(xs)), int(max(xs)) + 1)) if whole else None
    parts = _frame(title, x, y, xlabel, ticks)
    for i, (name, pts) in enumerate(points.items()):
        color = _COLORS[i % len(_COLORS)]
        path = " ".join(f"{_px(a, x):.1f},{_py(b, y):.1f}" for a, b in sorted(pts))
        parts.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        if len(pts) <= 30:
            parts += [f'<circle cx="{_px(a, x):.1f}" cy="{_py(b, y):.1f}" r="3" fill="{color}"/>'
                      for a, b in pts]  # fmt: skip
        ly = _TOP + 14 * i
        parts.append(f'<rect x="{_W - _RIGHT + 10}" y="{ly}" width="10" height="10" '
                     f'fill="{color}"/>')  # fmt: skip
        parts.append(f'<text x="{_W - _RIGHT + 24}" y="{ly + 9}">{escape(name)}</text>')
    return "\n".join([*parts, "</svg>"])


def bar_chart(title: str, groups: Mapping[str, Sequence[tuple[str, float]]], xlabel: str) -> str:
    """Grouped bars: for each named group (a legend entry) one bar per label, side by side."""
    labels = list(dict.fromkeys(lab for g in groups.values() for lab, _ in g))
    values = [v for g in groups.values() for _, v in g]
    if not labels or not values:
        return ""
    y = (0.0, max(values) * 1.05 or 1.0)
    parts = _frame(title, (0.0, 1.0), y, xlabel, xticks=())  # bars are labelled instead
    slot = (_W - _LEFT - _RIGHT) / len(labels)
    width = slot * 0.8 / max(len(groups), 1)
    for gi, (name, bars) in enumerate(groups.items()):
        color = _COLORS[gi % len(_COLORS)]
        for lab, v in bars:
            left = _LEFT + labels.index(lab) * slot + slot * 0.1 + gi * width
            top = _py(v, y)
            parts.append(f'<rect x="{left:.1f}" y="{top:.1f}" width="{width:.1f}" '
                         f'height="{_H - _BOTTOM - top:.1f}" fill="{color}"/>')  # fmt: skip
        ly = _TOP + 14 * gi
        parts.append(f'<rect x="{_W - _RIGHT + 10}" y="{ly}" width="10" height="10" '
                     f'fill="{color}"/>')  # fmt: skip
        parts.append(f'<text x="{_W - _RIGHT + 24}" y="{ly + 9}">{escape(name)}</text>')
    for i, lab in enumerate(labels):
        parts.append(f'<text x="{_LEFT + (i + 0.5) * slot:.1f}" y="{_H - _BOTTOM + 16}" '
                     f'text-anchor="middle">{escape(lab)}</text>')  # fmt: skip
    return "\n".join([*parts, "</svg>"])


def embed(svg: str, alt: str) -> str:
    """A markdown image of ``svg`` as a data URI (empty when there is nothing to draw)."""
    if not svg:
        return f"*{alt}: nothing to draw yet*"
    return f"![{alt}](data:image/svg+xml;base64,{base64.b64encode(svg.encode()).decode()})"

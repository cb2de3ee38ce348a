"""The run's charts: hand-placed SVG points, and every chart of a finished run drawn."""

from __future__ import annotations

import base64
import re

from flows.charts import _H, _LEFT, _RIGHT, _TOP, _W, bar_chart, embed, line_chart


def test_line_chart_places_points_in_the_plot_area_and_skips_nan() -> None:
    svg = line_chart("t", {"a": [(0, 0.0), (1, 1.0), (2, float("nan"))]}, "x", floor_zero=True)
    (points,) = re.findall(r'<polyline points="([^"]+)"', svg)
    (x0, y0), (x1, y1) = [tuple(map(float, p.split(","))) for p in points.split()]
    # Inside the plot area, left to right; y = 0 is drawn below y = 1.
    assert _LEFT < x0 < x1 < _W - _RIGHT and _TOP < y1 < y0 < _H
    assert svg.count("<circle") == 2 and ">a</text>" in svg  # NaN dropped; legend named
    assert line_chart("t", {"a": [(0, float("nan"))]}, "x") == ""


def test_bar_chart_and_embedding() -> None:
    svg = bar_chart("b", {"g1": [("x", 1.0), ("y", 2.0)], "g2": [("x", 0.5)]}, "bins")
    bars = re.findall(r'<rect x="[^"]+" y="[^"]+" width="([^"]+)" height="([^"]+)"', svg)
    heights = [float(h) for w, h in bars if w != "10"]  # not the legend's swatches
    assert len(heights) == 3 and heights[1] == max(heights)  # y = 2.0 is the tallest bar
    md = embed(svg, "alt")
    assert md.startswith("![alt](data:image/svg+xml;base64,")
    assert base64.b64decode(md.split(",", 1)[1].rstrip(")")).decode() == svg
    assert embed("", "alt") == "*alt: nothing to draw yet*"

"""The run's charts as data (axes, ticks, bins, marks) drawn from a run's artifacts, and their
SVG: hand-computed ticks and points, a store written by hand for an eva run and an online run."""

from __future__ import annotations

import base64
import re
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from flows.charts import (
    _H,
    _LEFT,
    _RIGHT,
    _TOP,
    _W,
    Histogram,
    LineChart,
    embed,
    histogram,
    line_chart,
    nice_step,
    position_axis,
    value_axis,
)
from flows.config import RunConfig
from flows.run_charts import BINS, offline_charts, online_charts, run_charts
from tasks.score import distribution
from tasks.store import RunStore


def test_value_axis_ends_on_round_ticks() -> None:
    axis = value_axis([0.0837, 0.912])
    assert axis.labels == ("0.0", "0.2", "0.4", "0.6", "0.8", "1.0")
    assert (axis.lo, axis.hi) == (0.0, 1.0)
    axis = value_axis([-0.31, 2.7])
    assert axis.labels == ("-1", "0", "1", "2", "3")
    assert value_axis([0.55, 0.83]).labels == ("0.5", "0.6", "0.7", "0.8", "0.9")
    assert value_axis([0.2, 0.8], floor_zero=True).lo == 0.0
    assert [nice_step(s) for s in (1.0, 0.6, 188, 3)] == [0.2, 0.2, 50, 1]


def test_position_axis_starts_at_the_first_point() -> None:
    axis = position_axis([1.0, 40.0, 189.0], "step")
    assert (axis.lo, axis.hi) == (1.0, 189.0)  # no padding: the axis starts at step 1
    assert axis.labels == ("50", "100", "150")
    names = {0.0: "theta_0", 1.0: "it.1", 2.0: "it.2"}
    assert position_axis([0.0, 1.0, 2.0], names=names).labels == ("theta_0", "it.1", "it.2")
    assert position_axis([1.0, 2.0, 3.0]).labels == ("1", "2", "3")


def test_line_chart_places_points_in_the_plot_area_and_skips_nan() -> None:
    chart = line_chart("t", {"a": [(0, 0.0), (1, 1.0), (2, float("nan"))]}, "x", floor_zero=True)
    assert isinstance(chart, LineChart) and chart.series == {"a": [(0, 0.0), (1, 1.0)]}
    svg = chart.svg()
    (points,) = re.findall(r'<polyline points="([^"]+)"', svg)
    (x0, y0), (x1, y1) = [tuple(map(float, p.split(","))) for p in points.split()]
    # The first point on the left edge, the last on the right; y = 0 drawn below y = 1.
    assert x0 == _LEFT and x1 == _W - _RIGHT and _TOP <= y1 < y0 <= _H
    assert svg.count("<circle") == 2 and ">a</text>" in svg  # NaN dropped; legend named
    assert line_chart("t", {"a": [(0, float("nan"))]}, "x") is None


def test_histogram_and_embedding() -> None:
    chart = histogram("b", [0.0, 0.5, 1.0], {"g1": [0.25, 0.75], "g2": [0.5, 0.5]}, "bins")
    assert chart is not None and chart.x.labels == ("0", "0.5", "1")
    assert chart.y.labels[0] == "0.0" and chart.y.hi == 0.8
    bars = re.findall(r'<rect x="[^"]+" y="[^"]+" width="([^"]+)" height="([^"]+)"', chart.svg())
    heights = [float(h) for w, h in bars if w != "10"]  # not the legend's swatches
    assert len(heights) == 4 and heights[1] == max(heights)  # 0.75 is the tallest bar
    md = embed(chart, "alt")
    assert md.startswith("![alt](data:image/svg+xml;base64,")
    assert base64.b64decode(md.split(",", 1)[1].rstrip(")")).decode() == chart.svg()
    assert embed(None, "alt") == "*alt: nothing to draw yet*"


def _write(store: RunStore, it: int | None, stage: str, table: pa.Table, **stats: Any) -> None:
    uri, _, nbytes = store.write_table(it, stage, table)
    manifest = {"artifact": stage, "iteration": it, "key": stage, "content_hash": "-",
                "uri": uri, "rows": table.num_rows, "bytes": nbytes, "stats": stats}  # fmt: skip
    store.write_manifest(it, stage, manifest)


def _eval(store: RunStore, it: int | None, score: float, cats: dict[str, float]) -> None:
    _write(store, it, "evaluate", pa.table({"prompt_id": ["a"], "reward": [score]}),
           score=score, per_category=cats)  # fmt: skip


@pytest.fixture
def offline_store(tmp_path: Any) -> tuple[RunStore, RunConfig]:
    config = RunConfig(run="c", root=str(tmp_path), iterations=2)
    store = RunStore(config.root, config.run)
    info = {1: np.array([0.0, 0.1, 0.45, 0.9, 0.9]), 2: np.array([0.0, 0.0, 0.3, 0.5, 1.0])}
    _eval(store, None, 0.5, {"add": 0.6, "rev": 0.4})
    for t in (0, 1, 2):
        _eval(store, t, 0.6 + 0.1 * t, {"add": round(0.7 + 0.1 * t, 4), "rev": 0.5})
        steps = range(1, 64)  # 63 DPO steps per iteration
        _write(store, t, "train", pa.table({"step": list(steps), "loss": [0.69] * 63,
                                            "rewards/margins": [3.0 * t + 1] * 63}))  # fmt: skip
        if t:
            _write(store, t, "score", pa.table({"informativeness": info[t]}))
            _write(store, t, "mix", pa.table({"x": [1]}), categories={"add": 3, "rev": 1},
                   depths={"0": 1, "1": 3})  # fmt: skip
            _write(store, t, "complexity", pa.table({"x": [1]}), mean_complexity=1.5 + t)
    return store, config


def test_offline_charts_read_at_a_glance(offline_store: tuple[RunStore, RunConfig]) -> None:
    store, config = offline_store
    rows = [{"iteration": "theta_0", "heldout_score": 0.5}] + [
        {"iteration": t, "heldout_score": 0.6 + 0.1 * t, "win_vs_theta_0": 0.7} for t in (0, 1, 2)
    ]
    charts = dict(offline_charts(store, config, rows))
    assert all(charts.values()) and len(charts) == 8
    held = charts["held-out score"]
    assert held is not None and held.x.labels == ("theta_0", "it.0", "it.1", "it.2")
    assert "=" not in held.title and held.y.labels == ("0.5", "0.6", "0.7", "0.8")
    cats = charts["held-out score per category"]
    assert isinstance(cats, LineChart) and cats.series["add"] == [
        (0, 0.6),
        (1, 0.7),
        (2, 0.8),
        (3, 0.9),
    ]
    # Loss and margin apart; steps of iterations 0, 1, 2 one after another from step 1.
    loss, margin = charts["training loss"], charts["training reward margin"]
    assert isinstance(loss, LineChart) and isinstance(margin, LineChart)
    assert (loss.x.lo, loss.x.hi) == (1.0, 189.0) and loss.x.labels == ("50", "100", "150")
    assert loss.marks == ((0.5, "it.0"), (63.5, "it.1"), (126.5, "it.2"))
    assert margin.y.labels == ("0", "2", "4", "6", "8") and "loss" not in margin.series
    # The histogram's bins: one iteration alone has exactly its score table's.
    hist = charts["informativeness distribution"]
    assert hist is not None and len(hist.x.ticks) == BINS + 1 == 11
    assert hist.x.labels[0] == "0" and hist.x.labels[-1] == "1"
    alone = RunConfig(run="c", root=config.root, iterations=1, iteration0_dpo=False)
    one = dict(offline_charts(store, alone, rows[:1]))["informativeness distribution"]
    table = distribution(np.array([0.0, 0.1, 0.45, 0.9, 0.9]))
    assert isinstance(one, Histogram) and list(one.x.ticks) == pytest.approx(
        [r["from"] for r in table] + [table[-1]["to"]], abs=1e-4
    )
    assert one.groups["X_0 (it.1)"] == pytest.approx([r["share"] for r in table])
    md = run_charts(store, config, rows)
    assert md.count("](data:image/svg+xml;base64,") == 8 and "nothing to draw" not in md


def test_online_charts(tmp_path: Any) -> None:
    store = RunStore(str(tmp_path), "o")
    _eval(store, None, 0.4, {"add": 0.4})
    for s in (1, 2):
        _eval(store, s, 0.4 + 0.1 * s, {"add": 0.5})
        first = (s - 1) * 3  # the loop numbers steps from 0 across segments
        log = pa.table({
            "step": [first, first, first + 1, first + 2],
            "rewards": [[0.0, 1.0], [1.0, 1.0], [0.0, 0.0], [0.5, 0.5]],
            "informativeness": [0.5, 0.0, 0.0, 0.0],
        })  # fmt: skip
        _write(store, s, "online", log, buffer_categories={"add": 2, "rev": 2 * s},
               buffer_depths={"0": 4, **({"1": 2} if s == 2 else {})})  # fmt: skip
    rows: list[dict[str, Any]] = [{"segment": "theta_0", "heldout_score": 0.4},
            {"segment": 1, "heldout_score": 0.5}, {"segment": 2, "heldout_score": 0.6}]  # fmt: skip
    charts = dict(online_charts(store, rows))
    held = charts["held-out score"]
    assert held is not None and held.x.labels == ("theta_0", "seg.1", "seg.2")
    steps = charts["reward and informativeness per step"]
    assert isinstance(steps, LineChart) and steps.x.lo == 1.0 and steps.x.hi == 6.0
    assert steps.marks == ((0.5, "seg.1"), (3.5, "seg.2"))
    # Step 1's prompts: rewards 0, 1, 1, 1 -> 0.75; informativeness (0.5 + 0) / 2.
    assert steps.series["mean reward"][0] == (1, 0.75)
    assert steps.series["mean informativeness"][0] == (1, 0.25)
    mix = charts["buffer: category mix"]
    assert isinstance(mix, LineChart) and mix.series["rev"] == [(1, 0.5), (2, 4 / 6)]
    # A depth that first appears in segment 2 starts from a share of 0 in segment 1.
    depths = charts["buffer: depth mix"]
    assert isinstance(depths, LineChart) and list(depths.series) == ["depth 0", "depth 1"]
    assert depths.series["depth 1"] == [(1, 0.0), (2, 2 / 6)]

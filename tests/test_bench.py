"""The pipeline-cost benchmark (bench.costs), on a tiny world: what it measures and reports."""

from __future__ import annotations

import pytest

import bench.costs as costs
from bench.costs import _floor_lines, write_costs_report
from tests.conftest import tiny_run_config

pytestmark = pytest.mark.usefixtures("prefect_api")


def test_costs_quick_measures_a_run_its_cached_rerun_and_rollouts(tmp_path) -> None:
    base = tiny_run_config("unused", iterations=2)
    base.pop("root")
    results = costs.run_costs(str(tmp_path / "costs"), quick=True, base=base)
    its = results["demo"]["iterations"]
    assert [it["t"] for it in its] == [1, 2]
    for it in its:
        # The parts add up to the iteration's wall time, and every backend stage was timed.
        parts = it["backend"] + it["stage_io"] + it["orchestration"]
        assert abs(parts - it["wall"]) < 1e-2
        assert 0 < it["subflow"] < it["wall"]  # the call also creates and closes the subflow run
        assert all(it["stages"][s]["backend"] > 0 for s in ("generate", "train", "evaluate"))
        assert 0 < it["overhead_share"] < 1
    floor = results["prefect_floor"]  # an iteration's shape in no-op task runs
    assert floor["tasks"] == len(its[0]["stages"]) and len(floor["runs"]) == 9
    assert floor["seconds"] > 0  # how it compares with an iteration is a figure, not a test
    for it in its:  # the overhead, split into the floor and eva's share above it
        assert it["floor_share"] == round(floor["seconds"] / it["wall"], 4)
        assert abs(it["floor_share"] + it["eva_share"] - it["overhead_share"]) < 2e-4
    cached = results["cached_rerun"]
    assert cached["reexecuted"] == [] and cached["stages"] > 20
    assert cached["cached_tasks"] == cached["stages"]  # every stage task came back Cached
    assert results["demo"]["backend"] > sum(it["backend"] for it in its)  # setup counted too
    assert 0 < cached["share"] < 1
    roll = results["rollout_demo"]
    assert roll["same_outputs"] and roll["tokens"] > 24 * 4  # at least one token per response
    # Generation per pair: eva samples X_{t-1} and X_t; iterative DPO and the previous and
    # predicted creators sample only X_t (24 prompts x 4 responses x 2 iterations).
    per_pair = results["generation_per_pair"]
    assert per_pair["dpo"]["responses"] == per_pair["eva-previous"]["responses"] == 192
    assert per_pair["eva-predicted"]["responses"] == 192
    assert per_pair["eva"]["responses"] == 2 * 192
    md = write_costs_report(results, str(tmp_path), "c", command="c")
    for title in (
        "Time per stage",
        "overhead per iteration",
        "Prefect's floor",
        "Cached rerun",
        "Rollout",
    ):
        assert title in md
    assert "re-executed: none" in md
    assert "eva's overhead above Prefect's floor, target at most 1%" in md


def test_costs_report_splits_the_overhead_at_prefects_floor() -> None:
    # Iteration 1: 5.0 s, backends 4.7 s, overhead 6.0% = floor 0.25 s (5.0%) + eva 1.0%;
    # iteration 2: 4.0 s, backends 3.7 s, overhead 7.5% = floor 6.25% + eva 1.25%.
    run = {"iterations": [
        {"t": 1, "wall": 5.0, "backend": 4.7, "overhead_share": 0.06},
        {"t": 2, "wall": 4.0, "backend": 3.7, "overhead_share": 0.075},
    ]}  # fmt: skip
    costs.above_floor(run, 0.25)
    assert [(it["floor_share"], it["eva_share"]) for it in run["iterations"]] == [
        (0.05, 0.01),
        (0.0625, 0.0125),
    ]
    results = {"demo": run, "prefect_floor": {"tasks": 12, "seconds": 0.25, "runs": [0.25]}}
    assert "5.0% of demo iteration 1's wall time" in _floor_lines(results)[0]
    (line,) = [x for x in _floor_lines(results) if x.startswith("eva's overhead")]
    assert "**missed** (largest 1.2%" in line  # 1.25% rounds to 1.2% (banker's rounding)
    assert "iteration 1: overhead 6.0% = floor 5.0% + eva 1.0%" in line
    run["iterations"].pop()
    (line,) = [x for x in _floor_lines(results) if x.startswith("eva's overhead")]
    assert "**held** (largest 1.0%" in line

"""The method benchmark's harness, on a tiny world: it runs every quick arm and writes tables."""

from __future__ import annotations

import re

import pytest

import bench.method as method
from bench.report import write_method_report
from tests.conftest import tiny_run_config

pytestmark = pytest.mark.usefixtures("prefect_api")


def test_quick_arms_produce_well_formed_tables(tmp_path, monkeypatch) -> None:
    def tiny_base(root: str, seed: int, quick: bool) -> dict:
        cfg = tiny_run_config(root, seed=seed)
        cfg.pop("run")
        cfg["pairs"] = {"max_pairs": 4}
        return cfg

    monkeypatch.setattr(method, "base_config", tiny_base)
    results = {"0": method.run_seed(str(tmp_path / "runs"), 0, quick=True)}
    assert set(results["0"]) == {
        "theta_0",
        "theta_1",
        "fresh",
        "eva",
        "metric-uniform",
        "subset-weighted",
    }
    eva = results["0"]["eva"]["iterations"]
    assert len(eva) == 2 and all(r["pairs"] <= 4 for r in eva)
    md = write_method_report(results, str(tmp_path), "m", seconds=1.0, quick=True)
    for title in ("Table 2", "Table 4", "Table 5", "Table 13", "Table 7"):
        assert f"### {title}" in md
    rows = [line for line in md.splitlines() if line.startswith("| +eva")]
    assert len(rows) == 1
    score = float(rows[0].split("|")[2])
    assert 0.0 <= score <= 1.0
    # Every table row has as many cells as its header.
    for block in re.findall(r"(\| arm .*?)\n\n", md, flags=re.S):
        widths = {line.count("|") for line in block.splitlines() if line.startswith("|")}
        assert len(widths) == 1, block
    assert (tmp_path / "m-curriculum.png").stat().st_size > 1000

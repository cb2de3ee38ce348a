"""eva_adapters.common: a creator from a framework config's plain options, and its state file."""

from __future__ import annotations

from typing import Any

import pytest

from eva_adapters.common import build_creator, save_state

SEEDS = [{"prompt": f"What is {i} plus {i}?", "data_source": "gsm"} for i in range(6)]


def rewrite(parents: list[dict[str, Any]], n: int, seed: int) -> list[list[str]]:
    return [[f"{p['prompt']} Show the steps ({j})." for j in range(n)] for p in parents]


def test_a_resumed_creator_keeps_the_options_its_state_does_not_hold(tmp_path) -> None:
    options = {"rewriter": "tests.test_adapter_common:rewrite", "size": 10,
               "inherit": ["data_source"], "max_chars": 60,
               "state_path": str(tmp_path / "eva.json")}  # fmt: skip
    first = build_creator(SEEDS, options)
    batch = first.draw(2)
    first.observe((r["prompt_id"], [0.0, 1.0]) for r in batch)
    save_state(first, options["state_path"])
    resumed = build_creator(SEEDS, options)  # the file exists now: resume from it
    assert resumed.state() == first.state()
    assert resumed.inherit == ("data_source",) and resumed.max_chars == 60
    batch = resumed.draw(2)
    resumed.observe((r["prompt_id"], [0.0, 1.0]) for r in batch)
    assert all(e.record["data_source"] == "gsm" for e in resumed.buffer.entries)


def test_unknown_or_malformed_options_are_refused() -> None:
    with pytest.raises(ValueError, match=r"unknown eva creator option\(s\) \['sizee'\]"):
        build_creator(SEEDS, {"sizee": 3})
    with pytest.raises(ValueError, match="expected 'module:attribute'"):
        build_creator(SEEDS, {"rewriter": "tests.test_adapter_common.rewrite"})

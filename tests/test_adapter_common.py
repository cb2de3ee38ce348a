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


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"sizee": 3}, "data.eva.sizee is not an eva creator option (known: duplicates, "),
        ({"ratio_evol": 2.0}, "data.eva.ratio_evol must be a number in [0, 1], got 2.0"),
        ({"ratio_evol": -1}, "data.eva.ratio_evol must be a number in [0, 1], got -1"),
        ({"metric": "a_maxx"}, "data.eva.metric must be one of a_min, a_avg, a_dis, var, "),
        ({"rewriter": "my_pkg.nope:rewrite"},
         "data.eva.rewriter cannot be imported (No module named 'my_pkg'), got "
         "'my_pkg.nope:rewrite'"),
        ({"rewriter": "tests.test_adapter_common.rewrite"},
         "data.eva.rewriter must be 'module:attribute', got 'tests.test_adapter_common.rewrite'"),
        ({"rewriter": "tests.test_adapter_common:nothing"},
         "data.eva.rewriter names nothing: tests.test_adapter_common has no 'nothing'"),
        ({"rewriter": "tests.test_adapter_common:SEEDS"},
         "data.eva.rewriter must name a callable rewriter(parents, n, seed)"),
        ({"skip_tied": {"threshold": 0.2}}, "data.eva.skip_tied must be true or TiePosterior"),
        ({"evolve_lag": "1"}, "data.eva.evolve_lag must be an integer >= 0, got '1'"),
        ({"size": 0}, "data.eva.size must be an integer >= 1, got 0"),
    ],
)  # fmt: skip
def test_every_option_is_checked_when_built_naming_its_key(options, says) -> None:
    with pytest.raises(ValueError) as refused:
        build_creator(SEEDS, options, key="data.eva")
    assert str(refused.value).startswith(says) and "\n" not in str(refused.value)


def test_a_state_file_that_cannot_resume_is_named(tmp_path) -> None:
    path = tmp_path / "eva.json"
    save_state(build_creator(SEEDS, {}), str(path))
    with pytest.raises(ValueError) as refused:
        build_creator(SEEDS[:2], {"state_path": str(path)}, key="data.eva")
    message = str(refused.value)
    assert message.startswith("data.eva.state_path holds a state that cannot resume (saved ")
    assert "seeds were other seed prompts: these are 2" in message and str(path) in message

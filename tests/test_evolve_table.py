"""The evolve stage's UI table: each evolved prompt beside its parent and why the parent was
picked (its informativeness and draw rank, from the sample stage's table)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from eva_core.schema import seed_records
from eva_world.world import SEED_DISTRIBUTION, sample_prompts
from tasks.evolve import EvolveConfig
from tests.conftest import world


def test_evolved_rows_show_their_parents_informativeness_and_rank(tmp_path: Path) -> None:
    from tasks.context import RunContext, StageContext
    from tasks.evolve import evolve

    prompts = sample_prompts(SEED_DISTRIBUTION, 3, seed=0)
    subset = seed_records(prompts)
    subset = subset.append_column("informativeness", pa.array([0.5, 1.0, 0.25]))
    subset = subset.append_column("draw_rank", pa.array([1, 0, 2], pa.int32()))
    run = RunContext(root=str(tmp_path), run="t", seed=0)
    ctx = StageContext(run, 1, "evolve", 4, {}, str(tmp_path), run.store(), lambda _: None)
    config = EvolveConfig.model_validate(
        {"num_evolutions": 2, "evolver": world("components:WorldRewriter")}
    )
    out = evolve.fn(ctx, config, subset=subset, heldout=seed_records(["x"]))
    rows = out.ui_tables["evolved"]
    by_id = {r["prompt_id"]: (i, r) for i, r in enumerate(subset.to_pylist())}
    assert rows and all(r["parent"] == by_id[r["parent_id"]][1]["prompt"] for r in rows)
    assert {r["parent_informativeness"] for r in rows} <= {0.5, 1.0, 0.25}
    for r in rows:
        parent = by_id[r["parent_id"]][1]
        assert (r["parent_informativeness"], r["parent_draw_rank"]) == (
            parent["informativeness"], parent["draw_rank"],
        )  # fmt: skip
    # A subset without the sample stage's columns (a user's) still gets its table.
    plain = evolve.fn(ctx, config, subset=seed_records(prompts), heldout=seed_records(["x"]))
    assert "parent_informativeness" not in plain.ui_tables["evolved"][0]

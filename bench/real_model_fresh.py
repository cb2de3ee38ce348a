"""The real-model benchmark's baseline: iterative DPO on new seed prompts, taken from the training
file in order after X_0 (``bench.real_model``). ``bench.arms`` does the same for the built-in
world, whose prompts are drawn by code; here they are rows of a user's file, each used once.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from prefect import flow
from pydantic import BaseModel, ConfigDict, Field

from eva_core.schema import PROMPT_COLUMNS
from flows.config import RunConfig
from flows.iteration import dpo_iteration, setup
from flows.launch import opened_run, publish_summary, run_name
from flows.summary import iteration_summary
from tasks.content_hashes import hash_file
from tasks.context import StageContext, StageOutput
from tasks.prompt_files import read_prompt_file
from tasks.stage import StageError, stage


class FileSplit(BaseModel):
    """Rows ``[size + (t - 1) * take, size + t * take)`` of ``path`` for iteration t: X_0 is
    its first ``size`` rows, and no split repeats X_0 or another split."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    path: str
    size: int = Field(ge=1)
    take: int = Field(ge=1)


@stage(
    "split",
    version=1,
    inputs={"seed_set": ("prompt_id",)},
    outputs=PROMPT_COLUMNS,
    extra_key=lambda c: {"file_sha256": hash_file(c.path)},
)
def file_split(ctx: StageContext, config: FileSplit, seed_set: pa.Table) -> StageOutput:
    assert ctx.iteration is not None
    rows = read_prompt_file(config.path).table
    start = config.size + (ctx.iteration - 1) * config.take
    split = rows.slice(start, config.take)
    if split.num_rows < config.take:
        raise StageError(
            f"split {ctx.iteration}: {config.path} has {rows.num_rows} rows, {start + config.take}"
            " needed", field="prompts.path",
        )  # fmt: skip
    seen = set(seed_set.column("prompt_id").to_pylist())
    if seen & set(split.column("prompt_id").to_pylist()):
        raise StageError(f"split {ctx.iteration} repeats a prompt of X_0")
    return StageOutput(split, stats={"prompts": split.num_rows, "first_row": start})


@flow(name="eva-fresh-split", flow_run_name=run_name)
def fresh_run(config: RunConfig, take: int) -> list[dict[str, Any]]:
    """T iterations of iterative DPO, each on ``take`` new rows of the prompt file."""
    assert config.prompts.path is not None and config.prompts.limit is not None
    source = FileSplit(path=config.prompts.path, size=config.prompts.limit, take=take)
    with opened_run(config, None) as run:
        x0, heldout, policy, answers = setup(run, config)
        for t in range(1, config.iterations + 1):
            prompts = file_split(run, t, source, artifact="prompts", seed_set=x0)
            policy = dpo_iteration(run, t, config, prompts, policy, heldout, answers).policy
        rows = iteration_summary(run.store(), config)
        publish_summary(config.run, rows, f"fresh prompts, iteration {config.iterations}")
        return rows

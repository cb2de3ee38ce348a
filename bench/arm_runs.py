"""One arm's run, by its source: eva (``flows.run.eva_run``, or at equal generated responses a
flow that sizes each X_t to spend what the creator left of the budget), iterative DPO on new
prompts (``bench.arms`` on the world's streams; here on a prompt file's next rows, each used
once), or eva online."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from prefect import flow
from pydantic import BaseModel, ConfigDict, Field

from bench.arm_config import split_factor, x0_size
from bench.measures import responses
from bench.study import Arm
from eva_core.schema import PROMPT_COLUMNS
from eva_runtime.errors import EvaError
from flows.config import RunConfig
from flows.iteration import Step, dpo_iteration, eva_iteration, setup
from flows.launch import opened_run, publish_summary, run_name
from flows.summary import iteration_summary
from tasks.content_hashes import hash_file
from tasks.context import StageContext, StageOutput
from tasks.prompts import PromptsConfig, read_prompt_set
from tasks.stage import StageError, stage
from tasks.store import Ref, RunStore


def run_arm(arm: Arm, config: Any, factor: float, budget: int | None) -> Any:
    """Run ``config`` (the arm up to its current iteration; its finished stages are reused)
    and return its store. ``factor``: how far a split grows; ``budget``: G responses an
    iteration (None: the arm is not equalised by generation)."""
    if arm.source == "online":
        from flows.online import eva_online

        eva_online(config)
    elif arm.source in ("fresh", "target"):
        size = x0_size(config.model_dump(mode="json"))
        grow = split_factor(size, config.generate.n, factor, budget)
        if config.prompts.path is not None:  # rows of the file after X_0, each used once
            if arm.source == "target":
                raise EvaError("the target arm draws from a distribution, not a file")
            fresh_run(config, take=round(size * grow))
        else:
            from bench.arms import baseline_run

            baseline_run(config, arm.source, grow)
    elif budget is not None and config.iterations > 0:
        matched_run(config, budget)
    else:
        from flows.run import eva_run

        eva_run(config)
    return RunStore(config.root, config.run, config.storage_options)


@flow(name="eva-matched", flow_run_name=run_name)
def matched_run(config: RunConfig, budget: int) -> list[int]:
    """eva's iterations with X_t sized so that creator and solver generate ``budget`` responses
    together: the creator's pass over X_{t-1} (fresh creator rollouts, or any creator at
    iteration 1, before the run has solver readings) is known before it runs; otherwise (a
    probe, say) the iteration is rerun once with what it spent (its creator stages reused).
    ``size / evolutions`` parents are evolved, four children each by default, so the share of
    spare children is the plain run's. Returns |X_t| per iteration."""
    n, sizes = config.generate.n, []
    with opened_run(config, None) as run:
        prompts, heldout, policy, answers = setup(run, config)
        step: Step | None = None
        older: Ref | None = None
        for t in range(1, config.iterations + 1):
            last = step.rollouts if step else None
            first = config.creator_rollouts == "fresh" or t == 1
            creator = prompts.rows * n if first else 0
            for _ in range(3):
                size = round((budget - creator) / n)
                if size < 1:
                    raise EvaError(f"the creator spent {creator} of {budget}: no solver prompts")
                fraction = min(1.0, size / (config.evolve.num_evolutions * prompts.rows))
                cfg = config
                if size != prompts.rows or fraction != config.sample.fraction:
                    cfg = config.model_copy(update={
                        "mix": config.mix.model_copy(update={"size": size}),
                        "sample": config.sample.model_copy(update={"fraction": fraction}),
                    })  # fmt: skip
                step = eva_iteration(run, t, cfg, prompts, policy, heldout, last, older, answers)
                spent = responses(run.store(), t, "creator_generate")
                if spent == creator:
                    break
                creator = spent
            else:
                raise EvaError(f"iteration {t}: the creator's generation did not settle")
            sizes.append(size)
            prompts, policy, older = step.prompts, step.policy, last
    return sizes


class FileSplit(BaseModel):
    """Rows ``[size + (t - 1) * take, size + t * take)`` of ``path`` for iteration t: X_0 is
    its first ``size`` rows, and no split repeats X_0 or another split."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    path: str
    size: int = Field(ge=1)
    take: int = Field(ge=1)
    # How X_0 was read (the prompts section's column, turns and invalid rows, non-default only):
    # the splits are rows of the same table.
    reading: dict[str, Any] = Field(
        default_factory=dict, json_schema_extra={"key": "unless default"}
    )

    @classmethod
    def of(cls, prompts: PromptsConfig, take: int) -> FileSplit:
        """The splits of ``prompts``' file after its first ``limit`` rows (X_0), read as X_0 is."""
        assert prompts.path is not None and prompts.limit is not None
        reading = prompts.model_dump(mode="json", include=READING, exclude_defaults=True)
        return cls(path=prompts.path, size=prompts.limit, take=take, reading=reading)

    def rows(self) -> pa.Table:
        """Every row of the file, read as X_0 was, without X_0's limit."""
        return read_prompt_set(PromptsConfig(path=self.path, **self.reading)).table


READING = {"prompt_column", "category_column", "multi_turn", "drop_invalid", "max_chars",
           "storage_options"}  # fmt: skip


@stage(
    "split",
    version=1,
    inputs={"seed_set": ("prompt_id",)},
    outputs=PROMPT_COLUMNS,
    extra_key=lambda c: {"file_sha256": hash_file(c.path)},
)
def file_split(ctx: StageContext, config: FileSplit, seed_set: pa.Table) -> StageOutput:
    assert ctx.iteration is not None
    rows = config.rows()
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
    source = FileSplit.of(config.prompts, take)
    with opened_run(config, None) as run:
        x0, heldout, policy, answers = setup(run, config)
        for t in range(1, config.iterations + 1):
            prompts = file_split(run, t, source, artifact="prompts", seed_set=x0)
            policy = dpo_iteration(run, t, config, prompts, policy, heldout, answers).policy
        rows = iteration_summary(run.store(), config)
        publish_summary(config.run, rows, f"fresh prompts, iteration {config.iterations}")
        return rows

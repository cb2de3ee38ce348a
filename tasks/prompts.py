"""Stages ``prompts`` and ``heldout``: the seed set X_0 and the held-out evaluation set.

A prompt set comes from a file of the user's (``path``: JSONL, JSON, CSV or parquet at any fsspec
URL; ``tasks.prompt_files``) or from code the config names (``source``: an object whose
``draw(seed, exclude)`` returns ``(prompt, category)`` pairs, such as the built-in world's
distributions, ``eva_world.components:WorldPrompts``). A ``path`` given on top of a config with
a ``source`` (``--set prompts.path=mine.jsonl``) replaces the source. The held-out set never
overlaps the seed set: a source is asked to draw around it.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from eva_core.schema import PROMPT_COLUMNS, seed_records
from tasks.backends.python import PythonComponent
from tasks.context import StageContext, StageOutput
from tasks.prompt_files import read_prompt_file
from tasks.stage import StageError, stage
from tasks.store import hash_file


class PromptsConfig(BaseModel):
    """Where a prompt set comes from: a file (``path``), else code (``source``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    path: str | None = Field(
        default=None,
        description="Prompt file (.jsonl/.json/.csv/.parquet, any fsspec URL); when set, it is "
        "used instead of source.",
    )
    prompt_column: str = Field(default="prompt", description="Column holding the prompt text.")
    category_column: str | None = Field(
        default="category", description="Optional column with a category label."
    )
    limit: int | None = Field(default=None, ge=1, description="Keep only the first N prompts.")
    storage_options: dict[str, Any] = Field(default_factory=dict, description="fsspec options.")
    source: PythonComponent | None = Field(
        default=None,
        description="Prompts drawn by code: {kind: python, factory: package.module:Name, "
        "options: {...}}, an object with draw(seed, exclude) -> [(prompt, category)] (the "
        "built-in world's: eva_world.components:WorldPrompts).",
    )

    @property
    def given(self) -> bool:
        return self.path is not None or self.source is not None


def read_prompts(config: PromptsConfig) -> pa.Table:
    """The prompt records of ``config.path`` (a ``ValueError`` naming the file and row)."""
    assert config.path is not None
    return read_prompt_file(
        config.path,
        prompt_column=config.prompt_column,
        category_column=config.category_column,
        limit=config.limit,
        storage_options=config.storage_options,
    )


def _file_key(config: PromptsConfig) -> dict[str, str]:
    return {"file_sha256": hash_file(config.path, config.storage_options)} if config.path else {}


def _records(ctx: StageContext, config: PromptsConfig, exclude: set[str]) -> pa.Table:
    if config.path:
        return read_prompts(config)
    if config.source is None:
        raise StageError(
            f"{ctx.artifact}: no prompts", field=f"{ctx.artifact}.path", hint="set a prompt file"
        )
    drawn = config.source.load().draw(ctx.seed, exclude)
    if config.limit:
        drawn = drawn[: config.limit]
    return seed_records([p for p, _ in drawn], [c for _, c in drawn])


def _output(table: pa.Table) -> StageOutput:
    cats = table.column("category").to_pylist()
    counts = {str(c): cats.count(c) for c in sorted(set(cats), key=str)}
    return StageOutput(
        table,
        stats={"prompts": table.num_rows, "categories": counts},
        ui_tables={"sample": table.slice(0, 20).to_pylist()},
    )


@stage(
    "prompts",
    version=1,
    libraries=("pyarrow",),
    inputs={},
    outputs=PROMPT_COLUMNS,
    extra_key=_file_key,
)
def load_prompts(ctx: StageContext, config: PromptsConfig) -> StageOutput:
    return _output(_records(ctx, config, exclude=set()))


@stage(
    "heldout",
    version=1,
    libraries=("pyarrow",),
    inputs={"seed_set": ("prompt",)},
    outputs=PROMPT_COLUMNS,
    extra_key=_file_key,
)
def load_heldout(ctx: StageContext, config: PromptsConfig, seed_set: pa.Table) -> StageOutput:
    return _output(_records(ctx, config, exclude=set(seed_set.column("prompt").to_pylist())))

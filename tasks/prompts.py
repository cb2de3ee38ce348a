"""Stages ``prompts`` and ``heldout``: the seed set X_0 and the held-out evaluation set.

A prompt set comes from a file of the user's (``path``: JSONL, JSON, CSV or parquet at any fsspec
URL, ``hf://datasets/...`` included; ``tasks.prompt_files``), from a Hugging Face dataset
(``dataset`` and ``split``: a Hub id or a folder written by ``save_to_disk``;
``tasks.prompt_datasets``) or from code the config names (``source``: an object whose
``draw(seed, exclude)`` returns ``(prompt, category)`` pairs, such as the built-in world's
distributions, ``eva_world.components:WorldPrompts``). A ``path`` or ``dataset`` given on top of
a config with a ``source`` (``--set prompts.path=mine.jsonl``) replaces the source. The held-out
set never overlaps the seed set: a source is asked to draw around it.

Rows of a file or dataset become prompts by ``tasks.prompt_rows``: a list of turns gives its
first turn or all of them joined (``multi_turn``), and a row that cannot be used is an error or,
with ``drop_invalid``, dropped and counted in the stage's stats (``dropped``) and its log line.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from eva_core.schema import PROMPT_COLUMNS, seed_records
from eva_runtime.errors import ConfigError
from tasks.backends.python import Builds, PythonComponent
from tasks.content_hashes import hash_file
from tasks.context import StageContext, StageOutput
from tasks.package_files import is_package_file, package_file
from tasks.prompt_datasets import check_dataset_name, dataset_key, read_prompt_dataset
from tasks.prompt_files import read_prompt_file
from tasks.prompt_rows import DROP_REASONS, MultiTurn, PromptRows, RowRules, dropped_line
from tasks.stage import StageError, stage


class PromptsConfig(BaseModel):
    """Where a prompt set comes from: a file (``path``) or a dataset (``dataset``), else code
    (``source``); and what its rows become."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    path: str | None = Field(
        default=None,
        description="Prompt file (.jsonl/.json/.csv/.parquet, any fsspec URL, hf://datasets/... "
        "included, or package:<module>/<file> inside an installed package: IFEval's 541 prompts "
        "are package:eval_framework/tasks/ifeval/data/input_data.jsonl); when set, it is used "
        "instead of source.",
    )
    dataset: str | None = Field(
        default=None,
        description="A Hugging Face dataset instead of a file: a Hub id (org/name), a local "
        "dataset folder, or a folder written by save_to_disk (local or an fsspec URL).",
    )
    dataset_config: str | None = Field(
        default=None, description="The Hub dataset's configuration (subset), if it has several."
    )
    split: str = Field(
        default="train",
        description="The dataset's split (a folder saved from one Dataset has none: ignored).",
    )
    prompt_column: str = Field(default="prompt", description="Column holding the prompt text.")
    category_column: str | None = Field(
        default="category", description="Optional column with a category label."
    )
    multi_turn: MultiTurn = Field(
        default="first",
        description="A prompt that is a list of turns (MT-Bench's turns, a chat's messages): "
        "first keeps the first user turn; join sends every user turn, separated by a blank "
        "line, as one message.",
    )
    drop_invalid: bool = Field(
        default=False,
        description="Drop rows whose prompt is empty, not text, longer than max_chars or a "
        "repeat, counting them in the stage's stats; false: such a row is an error.",
    )
    max_chars: int | None = Field(
        default=None, ge=1, description="A prompt longer than this many characters is invalid."
    )
    limit: int | None = Field(
        default=None, ge=1, description="Keep only the first N prompts (valid ones, if dropping)."
    )
    storage_options: dict[str, Any] = Field(
        default_factory=dict, description="fsspec options for path, or a saved dataset's URL."
    )
    source: Annotated[PythonComponent | None, Builds("a prompt source", ("draw",))] = Field(
        default=None,
        description="Prompts drawn by code: {kind: python, factory: package.module:Name, "
        "options: {...}}, an object with draw(seed, exclude) -> [(prompt, category)] (the "
        "built-in world's: eva_world.components:WorldPrompts).",
    )

    @field_validator("path")
    @classmethod
    def _package_file(cls, path: str | None) -> str | None:
        return package_file(path) if path is not None and is_package_file(path) else path

    @field_validator("dataset")
    @classmethod
    def _dataset_name(cls, name: str | None) -> str | None:
        return None if name is None else check_dataset_name(name)

    @model_validator(mode="after")
    def _one_origin(self) -> PromptsConfig:
        if self.path is not None and self.dataset is not None:
            raise ValueError(
                f"both path ({self.path}) and dataset ({self.dataset}) are set; keep one "
                "(--set ...dataset=null or ...path=null)"
            )
        return self

    @property
    def given(self) -> bool:
        return self.path is not None or self.dataset is not None or self.source is not None

    @property
    def origin(self) -> tuple[str, str] | None:
        """``(field, value)`` of the file or dataset read, for messages; None for a source."""
        if self.path is not None:
            return "path", self.path
        if self.dataset is not None:
            return "dataset", self.dataset
        return None

    @property
    def rules(self) -> RowRules:
        return RowRules(self.multi_turn, self.drop_invalid, self.max_chars, self.limit)


def read_prompt_set(config: PromptsConfig) -> PromptRows:
    """The prompt records of ``config.path`` or ``config.dataset``, with what was dropped (a
    ``ValueError`` naming the file or dataset and the row)."""
    if config.dataset is not None:
        return read_prompt_dataset(
            config.dataset,
            config_name=config.dataset_config,
            split=config.split,
            prompt_column=config.prompt_column,
            category_column=config.category_column,
            rules=config.rules,
            storage_options=config.storage_options,
        )
    assert config.path is not None
    return read_prompt_file(
        config.path,
        prompt_column=config.prompt_column,
        category_column=config.category_column,
        rules=config.rules,
        storage_options=config.storage_options,
    )


def read_prompts(config: PromptsConfig) -> pa.Table:
    """The prompt records of ``config.path`` or ``config.dataset``."""
    return read_prompt_set(config).table


def _file_key(config: PromptsConfig) -> dict[str, str]:
    """What the config points at: a file's bytes, a dataset folder's bytes, a Hub dataset's
    fingerprint."""
    if config.dataset is not None:
        return dataset_key(
            config.dataset,
            config_name=config.dataset_config,
            split=config.split,
            storage_options=config.storage_options,
        )
    return {"file_sha256": hash_file(config.path, config.storage_options)} if config.path else {}


# The counts of dropped rows travel with the records, in their schema's metadata, to the
# stage's stats (_output); the artifact is written without them.
_DROPPED = b"eva.dropped"


def _records(ctx: StageContext, config: PromptsConfig, exclude: set[str]) -> pa.Table:
    if config.origin is not None:
        named, shown = config.origin
        # The readers name the file, the row and the column, not the config key: the artifact
        # is the key's section (prompts or heldout), as flows.inputs names it at the edge.
        try:
            rows = read_prompt_set(config)
        except FileNotFoundError:
            raise ConfigError(f"no file at {shown!r}", field=f"{ctx.artifact}.path") from None
        except ValueError as exc:
            raise ConfigError(str(exc), field=f"{ctx.artifact}.{named}") from None
        ctx.log.info("%s: %s: %s", ctx.artifact, shown, dropped_line(rows))
        return rows.table.replace_schema_metadata({_DROPPED: json.dumps(rows.dropped)})
    if config.source is None:
        raise StageError(
            f"{ctx.artifact}: no prompts", field=f"{ctx.artifact}.path", hint="set a prompt file"
        )
    drawn = config.source.load().draw(ctx.seed, exclude)
    if config.limit:
        drawn = drawn[: config.limit]
    return seed_records([p for p, _ in drawn], [c for _, c in drawn])


def _output(table: pa.Table) -> StageOutput:
    metadata = table.schema.metadata or {}
    dropped = json.loads(metadata[_DROPPED]) if _DROPPED in metadata else None
    table = table.replace_schema_metadata(None)
    cats = table.column("category").to_pylist()
    counts = {str(c): cats.count(c) for c in sorted(set(cats), key=str)}
    stats: dict[str, Any] = {"prompts": table.num_rows, "categories": counts}
    if dropped is not None:  # read from a file or dataset: every reason, zeros included
        stats["dropped"] = {reason: dropped.get(reason, 0) for reason in DROP_REASONS}
    return StageOutput(table, stats=stats, ui_tables={"sample": table.slice(0, 20).to_pylist()})


@stage(
    "prompts",
    # 2: a folder of data files is read from its bytes, never load_dataset's cache.
    # 3: prompts keep the instructions a file gives them (instruction_id_list, kwargs).
    version=3,
    libraries=("pyarrow",),
    inputs={},
    outputs=PROMPT_COLUMNS,
    extra_key=_file_key,
)
def load_prompts(ctx: StageContext, config: PromptsConfig) -> StageOutput:
    return _output(_records(ctx, config, exclude=set()))


@stage(
    "heldout",
    # 2: a folder of data files is read from its bytes, never load_dataset's cache.
    # 3: prompts keep the instructions a file gives them (instruction_id_list, kwargs).
    version=3,
    libraries=("pyarrow",),
    inputs={"seed_set": ("prompt",)},
    outputs=PROMPT_COLUMNS,
    extra_key=_file_key,
)
def load_heldout(ctx: StageContext, config: PromptsConfig, seed_set: pa.Table) -> StageOutput:
    seeds = set(seed_set.column("prompt").to_pylist())
    table = _records(ctx, config, exclude=seeds)
    # A source draws around the seeds; a file or dataset may hold them (the edge checks two
    # files against each other, this a file against prompts drawn from a source).
    shared = sum(p in seeds for p in table.column("prompt").to_pylist())
    if shared and shared == table.num_rows:
        raise StageError(
            f"{ctx.artifact}: all {shared} held-out prompts are training prompts too: it "
            "measures nothing training did not see",
            field="heldout",
            hint="use prompts disjoint from the training prompts",
        )
    if shared > table.num_rows / 2:
        ctx.log.warning("%s: %d of %d held-out prompts are training prompts too",
                        ctx.artifact, shared, table.num_rows)  # fmt: skip
    return _output(table)

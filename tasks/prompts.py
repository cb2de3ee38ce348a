"""Stages ``prompts`` and ``heldout``: the seed set X_0 and the held-out evaluation set.

Both come either from a user file (JSONL, JSON, CSV or parquet at any fsspec URL, with a
``prompt`` column; a list column such as MT-Bench's ``turns`` contributes its first turn) or,
by default, from the built-in world: seed prompts from its narrow seed distribution, held-out
prompts from its broader target distribution, never overlapping the seed set.
"""

from __future__ import annotations

import io
import json
import os
from typing import Any, Literal

import fsspec
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field

from eva_core.schema import PROMPT_COLUMNS, seed_records
from eva_runtime.errors import first_line
from eva_world import world
from tasks.stage import StageContext, StageOutput, stage, stage_seed
from tasks.store import hash_file


class PromptsConfig(BaseModel):
    """Where a prompt set comes from."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    path: str | None = Field(
        default=None,
        description="Prompt file (.jsonl/.json/.csv/.parquet, any fsspec URL). None: the world.",
    )
    prompt_column: str = Field(default="prompt", description="Column holding the prompt text.")
    category_column: str | None = Field(
        default="category", description="Optional column with a category label."
    )
    limit: int | None = Field(default=None, ge=1, description="Keep only the first N prompts.")
    world_size: int = Field(default=256, ge=1, description="Prompts to draw from the world.")
    world_distribution: Literal["seed", "heldout"] = Field(
        default="seed", description="Which world distribution to draw from when path is None."
    )
    storage_options: dict[str, Any] = Field(default_factory=dict, description="fsspec options.")


def _read_table(path: str, ext: str, storage_options: dict[str, Any]) -> pa.Table:
    with fsspec.open(path, "rb", **storage_options) as f:
        if ext == ".parquet":
            return pq.read_table(f)
        if ext == ".csv":
            return pacsv.read_csv(f)
        data = f.read()
    text = data.decode("utf-8")  # a non-UTF-8 file fails here, and is named by the caller
    if ext == ".json":
        # A JSON array of objects, or of plain strings (each a prompt); anything else is named
        # rather than misread (a mapping of columns would silently become one row).
        rows = json.loads(text)
        if not isinstance(rows, list):
            raise ValueError(
                "a JSON file must hold an array of objects or of strings (one per prompt); "
                "for one object per line use .jsonl"
            )
        if rows and all(isinstance(r, str) for r in rows):
            rows = [{"prompt": r} for r in rows]
        for i, r in enumerate(rows):
            if not isinstance(r, dict):
                raise ValueError(
                    f"row {i}: expected an object or a string like every row, got "
                    f"{type(r).__name__}"
                )
        return pa.Table.from_pylist(rows)
    return pajson.read_json(io.BytesIO(data))


def read_prompt_file(config: PromptsConfig) -> pa.Table:
    """Read and validate a user prompt file into prompt records; errors name the row or field."""
    assert config.path is not None
    if not config.path.strip():
        raise ValueError("empty path (null uses the built-in world)")
    try:
        fs, fs_path = fsspec.core.url_to_fs(config.path, **config.storage_options)
        is_dir = fs.isdir(fs_path)
    except FileNotFoundError:
        raise
    except Exception as exc:  # a remote store that refuses or does not answer
        raise ValueError(f"{config.path}: cannot be reached ({first_line(exc)})") from None
    if is_dir:
        raise ValueError(f"{config.path} is a directory, not a prompt file")
    ext = os.path.splitext(config.path.split("?")[0])[1].lower()
    if ext not in (".parquet", ".jsonl", ".json", ".ndjson", ".csv"):
        raise ValueError(f"unsupported file type {ext!r} (jsonl, json, csv, parquet)")
    try:
        table = _read_table(config.path, ext, config.storage_options)
    except UnicodeDecodeError as exc:
        raise ValueError(f"{config.path}: not UTF-8 text (byte {exc.start})") from None
    except (pa.ArrowInvalid, json.JSONDecodeError, UnicodeError) as exc:
        first = first_line(exc, with_type=False)
        raise ValueError(f"{config.path}: cannot be read as {ext[1:]}: {first}") from None
    except ValueError as exc:
        raise ValueError(f"{config.path}: {exc}") from None
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise ValueError(f"{config.path}: cannot be read ({first_line(exc)})") from None
    if config.prompt_column not in table.column_names:
        raise ValueError(
            f"{config.path}: no column {config.prompt_column!r} (columns: "
            f"{', '.join(table.column_names) or 'none'}); set prompts.prompt_column"
        )
    if config.limit:
        table = table.slice(0, config.limit)
    if table.num_rows == 0:
        raise ValueError(f"{config.path}: no prompts (0 rows)")
    texts = table.column(config.prompt_column).to_pylist()
    texts = [t[0] if isinstance(t, list) and t else t for t in texts]
    categories = None
    if config.category_column and config.category_column in table.column_names:
        categories = [
            None if c is None else str(c) for c in table.column(config.category_column).to_pylist()
        ]
    try:
        return seed_records(texts, categories)
    except ValueError as exc:
        raise ValueError(f"{config.path}: {exc}") from None


def _file_key(config: PromptsConfig) -> dict[str, str]:
    return {"file_sha256": hash_file(config.path, config.storage_options)} if config.path else {}


def _world_records(prompts: list[str]) -> pa.Table:
    return seed_records(prompts, [world.category_of(p) for p in prompts])


def _world_distribution(config: PromptsConfig) -> world.Distribution:
    return (
        world.SEED_DISTRIBUTION
        if config.world_distribution == "seed"
        else world.HELDOUT_DISTRIBUTION
    )


def _output(table: pa.Table) -> StageOutput:
    cats = table.column("category").to_pylist()
    counts = {str(c): cats.count(c) for c in sorted(set(cats), key=str)}
    return StageOutput(
        table,
        stats={"prompts": table.num_rows, "categories": counts},
        ui_tables={"sample": table.slice(0, 20).to_pylist()},
    )


@stage("prompts", inputs={}, outputs=PROMPT_COLUMNS, extra_key=_file_key)
def load_prompts(ctx: StageContext, config: PromptsConfig) -> StageOutput:
    if config.path:
        return _output(read_prompt_file(config))
    dist = _world_distribution(config)
    return _output(_world_records(world.sample_prompts(dist, config.world_size, seed=ctx.seed)))


@stage("heldout", inputs={"seed_set": ("prompt",)}, outputs=PROMPT_COLUMNS, extra_key=_file_key)
def load_heldout(ctx: StageContext, config: PromptsConfig, seed_set: pa.Table) -> StageOutput:
    if config.path:
        return _output(read_prompt_file(config))
    dist = _world_distribution(config)
    exclude = set(seed_set.column("prompt").to_pylist())
    return _output(
        _world_records(world.sample_prompts(dist, config.world_size, ctx.seed, exclude=exclude))
    )


@stage("split", inputs={"heldout": ("prompt",)}, outputs=PROMPT_COLUMNS)
def load_split(ctx: StageContext, config: PromptsConfig, heldout: pa.Table) -> StageOutput:
    """Split t of a baseline arm: ``world_size`` new world prompts for iteration t.

    Every split of an arm comes from one seeded stream that skips the held-out prompts, split
    t taking its t-th slice, so splits never repeat each other and never touch the held-out
    set. The stream has X_0's seed, so for the seed distribution its first slice *is* X_0
    ("+new seed prompts" never retrains on X_0); for the target distribution (the upper-bound
    arm) it is a stream of its own.
    """
    if config.path:
        raise ValueError("new splits are drawn from the world; unset prompts.path")
    assert ctx.iteration is not None, "a split belongs to an iteration"
    size = config.world_size
    stream = world.sample_prompts(
        _world_distribution(config),
        (ctx.iteration + 1) * size,
        seed=stage_seed(ctx.run.seed, None, "prompts"),
        exclude=set(heldout.column("prompt").to_pylist()),
    )
    return _output(_world_records(stream[ctx.iteration * size :]))

"""Stage ``bootstrap``: theta_0, the policy every eva run starts from.

Either the user's checkpoint (``init_checkpoint``: a local directory ``from_pretrained`` can
load, used in place and keyed on its bytes; a Hugging Face Hub id ``org/name``, loaded through
the Hub's cache wherever a stage needs it and keyed on the commit that cache holds; or a GGUF
file, keyed on its bytes and converted once into a folder every stage loads:
``tasks.checkpoints``), or a policy built by code the config names
(``builder``, e.g. the built-in world's SFT from scratch, ``eva_world.bootstrap:WorldSFT``). A
checkpoint given on top of a config with a builder (``--set bootstrap.init_checkpoint=...``)
replaces the builder.
"""

from __future__ import annotations

import os
import time
from typing import Annotated

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, field_validator

from eva_runtime.hub import record_revision
from tasks.backends.protocols import stats_of
from tasks.backends.python import Builds, PythonComponent
from tasks.checkpoints import converted, gguf_path, is_gguf
from tasks.content_hashes import checkpoint_hash, hash_file, hub_ref, is_hub_id
from tasks.context import StageContext, StageOutput
from tasks.stage import StageError, stage


class BootstrapConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    init_checkpoint: str | None = Field(
        default=None,
        description="The policy to start from: a local directory (checked now, keyed on its "
        "bytes), a Hugging Face Hub id org/name (loaded through the Hub's cache), or a GGUF "
        "file (a path, or package:<module>/<file> for one an installed package ships; "
        "converted once into a Hugging Face folder, cached by its bytes); write a relative "
        "local path as ./dir. When set, it is used instead of builder.",
    )
    builder: Annotated[PythonComponent | None, Builds("a policy builder", ("build",))] = Field(
        default=None,
        description="Build theta_0 with code instead: {kind: python, factory: "
        "package.module:Name, options: {...}}, an object with build(out_dir, seed, exclude, "
        "progress) (the built-in world's: eva_world.bootstrap:WorldSFT).",
    )

    @field_validator("init_checkpoint")
    @classmethod
    def _checkpoint_exists(cls, path: str | None) -> str | None:
        if path is None or is_hub_id(path):
            return path
        if is_gguf(path):
            gguf_path(path)  # the file exists (it is read when the run starts)
            return path
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise ValueError(f"no checkpoint at {path!r} (expected a directory with config.json)")
        return path


def _checkpoint_key(config: BootstrapConfig) -> dict[str, str]:
    # A user checkpoint is keyed on its bytes, so replacing it re-runs everything downstream.
    ref = config.init_checkpoint
    if ref is None:
        return {}
    return {"checkpoint": hash_file(gguf_path(ref)) if is_gguf(ref) else checkpoint_hash(ref)}


@stage(
    "bootstrap",
    version=1,
    inputs={"heldout": ("prompt",)},
    outputs=("step", "loss"),
    extra_key=_checkpoint_key,
)
def bootstrap(ctx: StageContext, config: BootstrapConfig, heldout: pa.Table) -> StageOutput:
    if config.init_checkpoint:
        table = pa.table({"step": pa.array([], pa.int64()), "loss": pa.array([], pa.float64())})
        ref = config.init_checkpoint
        if is_gguf(ref):  # converted once, into the cache every run shares
            folder = converted(ref, say=ctx.log.info)
            return StageOutput(table, stats={"checkpoint": ref, "converted": folder},
                               external_model=folder)  # fmt: skip
        if is_hub_id(ref):
            # The commit the later stages load, recorded in the Hub's cache now: the content
            # hash of theta_0 names it (tasks.content_hashes.checkpoint_hash) from the first
            # launch on.
            record_revision(ref)
            ref = hub_ref(ref)  # never a path inside the run: loaded through the Hub's cache
        elif "://" not in ref:
            ref = os.path.abspath(ref)  # manifests resolve relative paths inside the run
        return StageOutput(table, stats={"checkpoint": config.init_checkpoint}, external_model=ref)
    if config.builder is None:
        raise StageError(
            "bootstrap: no policy to start from", field="bootstrap.init_checkpoint",
            hint="set it to a Hub id or a local checkpoint",
        )  # fmt: skip
    started = time.perf_counter()
    builder = config.builder.load()
    out_dir = os.path.join(ctx.scratch, "model")
    # The held-out prompts are kept out of what theta_0 learns from: no arm ever trains on them.
    exclude = set(heldout.column("prompt").to_pylist())
    metrics = builder.build(out_dir, ctx.seed, exclude, ctx.progress)
    seconds = time.perf_counter() - started
    # Wall-clock seconds stay out of the table: its content hash keys everything downstream,
    # and a rerun that reproduces the same model must not look like a new theta_0.
    table = pa.Table.from_pylist([{k: v for k, v in m.items() if k != "seconds"} for m in metrics])
    if table.num_columns == 0:
        table = pa.table({"step": pa.array([], pa.int64()), "loss": pa.array([], pa.float64())})
    stats = {**stats_of(builder), "backend_seconds": round(seconds, 3)}
    return StageOutput(table, stats=stats, model_dir=out_dir)

"""Stage ``bootstrap``: theta_0, the policy every eva run starts from.

Either an existing checkpoint (``init_checkpoint``: a directory ``from_pretrained`` can load,
used in place, not copied) or, for the built-in world, a tiny GPT-2 trained from scratch by SFT
on the world's SFT distribution: easy problems of every category, so theta_0 can do a little of
everything and much of the seed set, which leaves informativeness a frontier to find.
"""

from __future__ import annotations

import os
import time

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, field_validator

from eva_world import world
from eva_world.tiny_lm import (
    SFTConfig,
    TinyModelConfig,
    build_char_tokenizer,
    build_tiny_model,
    save_checkpoint,
    sft,
)
from tasks.stage import StageContext, StageOutput, stage
from tasks.store import checkpoint_hash, is_hub_id


class BootstrapConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    init_checkpoint: str | None = Field(
        default=None,
        description="Start from this checkpoint instead of the world's SFT: a local directory "
        "(checked now, keyed on its bytes) or a Hub id org/name (fetched by from_pretrained); "
        "write a relative local path as ./dir.",
    )
    model: TinyModelConfig = Field(default_factory=TinyModelConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)
    sft_examples: int = Field(
        default=192_000,
        ge=1,
        description="World demonstrations to draw (one pass at 3,000 steps x batch 64).",
    )
    careless: float = Field(
        default=0.6,
        ge=0.0,
        le=1.0,
        description="Share of careless world demonstrations (carries or borrows dropped, strings "
        "copied instead of reversed). Above one half, theta_0's most likely answer is often the "
        "careless one while the correct one stays among its samples: the uncertainty that "
        "preference optimization learns from (docs/benchmarks.md, world design).",
    )

    @field_validator("init_checkpoint")
    @classmethod
    def _checkpoint_exists(cls, path: str | None) -> str | None:
        if path is None or is_hub_id(path):
            return path
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise ValueError(f"no checkpoint at {path!r} (expected a directory with config.json)")
        return path


def _checkpoint_key(config: BootstrapConfig) -> dict[str, str]:
    # A user checkpoint is keyed on its bytes, so replacing it re-runs everything downstream.
    return {"checkpoint": checkpoint_hash(config.init_checkpoint)} if config.init_checkpoint else {}


@stage(
    "bootstrap",
    inputs={"heldout": ("prompt",)},
    outputs=("step", "loss"),
    extra_key=_checkpoint_key,
)
def bootstrap(ctx: StageContext, config: BootstrapConfig, heldout: pa.Table) -> StageOutput:
    if config.init_checkpoint:
        table = pa.table({"step": pa.array([], pa.int64()), "loss": pa.array([], pa.float64())})
        ref = config.init_checkpoint
        if not is_hub_id(ref) and "://" not in ref:
            ref = os.path.abspath(ref)  # manifests resolve relative paths inside the run
        return StageOutput(table, stats={"checkpoint": ref}, external_model=ref)
    started = time.perf_counter()
    tokenizer = build_char_tokenizer(world.ALPHABET)
    model = build_tiny_model(config.model, tokenizer, seed=ctx.seed)
    # The held-out prompts are kept out of the demonstrations: no arm ever trains on them.
    examples = world.sft_examples(
        world.SFT_DISTRIBUTION,
        config.sft_examples,
        seed=ctx.seed,
        careless=config.careless,
        exclude=set(heldout.column("prompt").to_pylist()),
    )
    metrics = sft(
        model, tokenizer, examples, **config.sft.model_dump(), seed=ctx.seed, progress=ctx.progress
    )
    out_dir = os.path.join(ctx.scratch, "model")
    save_checkpoint(model, tokenizer, out_dir)
    seconds = time.perf_counter() - started
    # Wall-clock seconds stay out of the table: its content hash keys everything downstream,
    # and a rerun that reproduces the same model must not look like a new theta_0.
    table = pa.Table.from_pylist([{k: v for k, v in m.items() if k != "seconds"} for m in metrics])
    params = sum(p.numel() for p in model.parameters())
    final = metrics[-1] if metrics else {}
    return StageOutput(
        table,
        stats={
            "parameters": params,
            "steps": config.sft.steps,
            "final_loss": final.get("loss"),
            "backend_seconds": round(seconds, 3),
        },
        model_dir=out_dir,
    )

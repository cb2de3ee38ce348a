"""Stage ``evolve``: rewrite the sampled prompts into new ones (paper section 3.2).

The evolver is whatever the config names (the world's operators here; EvolInstruct or the
paper's templates over an LLM in a real deployment); this stage only cleans its output and
records lineage. Stats carry the drop counts and, for LLM evolvers, their request outcomes
(``backend``: requests, timeouts, HTTP errors, chain links skipped after a failure).
"""

from __future__ import annotations

import time

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from eva_core.evolution import evolved_records
from eva_core.schema import PROMPT_COLUMNS
from tasks.backends.evolver import EvolverBackend, WorldEvolver
from tasks.stage import StageContext, StageOutput, stage


class EvolveConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    num_evolutions: int = Field(default=4, ge=1, description="New prompts per parent (paper: 4).")
    max_chars: int | None = Field(
        default=8192, ge=1, description="Drop rewrites longer than this many characters."
    )
    evolver: EvolverBackend = Field(default_factory=WorldEvolver)


@stage(
    "evolve",
    inputs={"subset": PROMPT_COLUMNS, "heldout": ("prompt_id",)},
    outputs=PROMPT_COLUMNS,
)
def evolve(
    ctx: StageContext, config: EvolveConfig, subset: pa.Table, heldout: pa.Table
) -> StageOutput:
    parents = subset.column("prompt").to_pylist()
    started = time.perf_counter()
    evolver = config.evolver.load()
    raw = evolver.evolve(
        parents, subset.column("category").to_pylist(), config.num_evolutions, ctx.seed
    )
    seconds = time.perf_counter() - started
    assert ctx.iteration is not None, "evolve runs inside an iteration"
    table, stats = evolved_records(
        subset,
        raw,
        ctx.iteration,
        config.max_chars,
        categorize=getattr(evolver, "category_of", None),
        # Decontamination: an evolved prompt that is a held-out prompt never reaches training.
        exclude_ids=set(heldout.column("prompt_id").to_pylist()),
    )
    parent_text = dict(zip(subset.column("prompt_id").to_pylist(), parents, strict=True))
    rows = [
        {
            "parent": parent_text[r["parent_id"]],
            "evolved": r["prompt"],
            "method": r["evolve_method"],
            "category": r["category"],
        }
        for r in table.slice(0, 40).to_pylist()
    ]
    backend = evolver.stats() if hasattr(evolver, "stats") else None
    out_stats = {
        **stats.as_dict(),
        "backend_seconds": round(seconds, 3),
        **({"backend": backend} if backend is not None else {}),
    }
    return StageOutput(table, stats=out_stats, ui_tables={"evolved": rows})

"""Stage ``evolve``: rewrite the sampled prompts into new ones (paper section 3.2).

The evolver is whatever the config names (the world's operators here; EvolInstruct or the
paper's templates over an LLM in a real deployment); this stage only cleans its output and
records lineage. Stats carry the drop counts and, for LLM evolvers, their request outcomes
(``backend``: requests, timeouts, HTTP errors, chain links skipped after a failure).
"""

from __future__ import annotations

import time
from typing import Annotated

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from eva_core.evolution import clean_rewrite, evolved_records
from eva_core.schema import LINEAGE_COLUMNS, PROMPT_COLUMNS
from tasks.backends.evolve import EvolverBackend
from tasks.backends.protocols import ReportsStats, prompt_columns
from tasks.backends.python import Builds
from tasks.context import StageContext, StageOutput, check_failures
from tasks.stage import StageError, stage


class EvolveConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    num_evolutions: int = Field(default=4, ge=1, description="New prompts per parent (paper: 4).")
    max_failed_share: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="Fail the stage when an LLM evolver returned nothing usable for more than "
        "this share of parents (an endpoint that is down or refuses); fewer are counted.",
    )
    max_chars: int | None = Field(
        default=8192, ge=1, description="Drop rewrites longer than this many characters."
    )
    min_shared_words: int = Field(
        default=1,
        ge=0,
        description="An in-depth rewrite (the same task made harder; the evolver says which "
        "methods are) must share at least this many words of 3+ letters with its parent, "
        "else it is dropped as unrelated; parents of fewer than 3 such words and in-breadth "
        "rewrites are not judged. 0: off.",
    )
    evolver: Annotated[EvolverBackend | None, Builds("an evolver", ("evolve",))] = Field(
        default=None,
        description="The rewriter, by kind: distilabel (EvolInstruct over an OpenAI-compatible "
        "LLM, the paper's), paper (the paper's appendix-F templates), python (an object of "
        "yours). Required when prompts are evolved.",
    )


@stage(
    "evolve",
    # 3: a child carries instruction columns of its own where its evolver gives them.
    version=3,
    inputs={"subset": PROMPT_COLUMNS, "heldout": ("prompt_id",)},
    outputs=PROMPT_COLUMNS,
)
def evolve(
    ctx: StageContext, config: EvolveConfig, subset: pa.Table, heldout: pa.Table
) -> StageOutput:
    parents = subset.column("prompt").to_pylist()
    if config.evolver is None:
        raise StageError(f"{ctx.artifact}: no evolver", field="evolve.evolver")
    started = time.perf_counter()
    evolver = config.evolver.load()
    raw = evolver.evolve(
        parents, subset.column("category").to_pylist(), config.num_evolutions, ctx.seed,
        **prompt_columns(evolver, subset),
    )  # fmt: skip
    seconds = time.perf_counter() - started
    failed = sum(not any(clean_rewrite(r[0]) for r in rewrites) for rewrites in raw)
    endpoint = getattr(getattr(config.evolver, "llm", None), "base_url", None)
    if endpoint is not None:  # the world's operators cannot fail; an LLM behind a URL can
        check_failures(
            ctx.artifact, failed, len(parents), "the evolver returned no usable rewrite",
            config.max_failed_share, "evolve.max_failed_share", endpoint,
        )  # fmt: skip
    assert ctx.iteration is not None, "evolve runs inside an iteration"
    table, stats = evolved_records(
        subset,
        raw,
        ctx.iteration,
        config.max_chars,
        categorize=getattr(evolver, "category_of", None),
        # Decontamination: an evolved prompt that is a held-out prompt never reaches training.
        exclude_ids=set(heldout.column("prompt_id").to_pylist()),
        keeps_topic=getattr(evolver, "keeps_topic", None),
        min_shared_words=config.min_shared_words,
    )
    parent_ids = subset.column("prompt_id").to_pylist()
    parent_text = dict(zip(parent_ids, parents, strict=True))
    # Why each parent was picked: its informativeness and draw rank (the sample stage's columns;
    # its samples' rewards are in the score stage's table, by the same prompt_id).
    why = {
        c: dict(zip(parent_ids, subset.column(c).to_pylist(), strict=True))
        for c in ("informativeness", "draw_rank")
        if c in subset.column_names
    }
    rows = [
        {
            "parent": parent_text[r["parent_id"]],
            "evolved": r["prompt"],
            **{f"parent_{c}": values[r["parent_id"]] for c, values in why.items()},
            "method": r["evolve_method"],
            "category": r["category"],
            **{c: r[c] for c in LINEAGE_COLUMNS},
        }
        for r in table.slice(0, 40).to_pylist()
    ]
    backend = evolver.stats() if isinstance(evolver, ReportsStats) else None
    out_stats = {
        **stats.as_dict(),
        "parents_without_rewrite": failed,
        "backend_seconds": round(seconds, 3),
        **({"backend": backend} if backend is not None else {}),
    }
    note = f"first {len(rows)} of {table.num_rows} evolved prompts beside their parents"
    return StageOutput(
        table, stats=out_stats, ui_tables={"evolved": rows}, ui_notes={"evolved": note}
    )

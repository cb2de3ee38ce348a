"""Stage ``mix``: X_t = 80% evolved + 20% original prompts (paper section 3.2)."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from eva_core.mixing import mix_prompt_sets
from eva_core.schema import LINEAGE_COLUMNS, PROMPT_COLUMNS
from tasks.context import StageContext, StageOutput
from tasks.stage import stage


class MixConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    ratio_evolved: float = Field(
        default=0.8, ge=0.0, le=1.0, description="Share of evolved prompts."
    )
    size: int | None = Field(
        default=None, ge=1, description="Size of X_t (default: the size of X_{t-1})."
    )


@stage(
    "mix",
    # 3: X_t keeps its prompts' instruction columns.
    version=3,
    libraries=("numpy",),
    inputs={"current": PROMPT_COLUMNS, "evolved": PROMPT_COLUMNS},
    outputs=PROMPT_COLUMNS,
)
def mix(ctx: StageContext, config: MixConfig, current: pa.Table, evolved: pa.Table) -> StageOutput:
    mixed, stats = mix_prompt_sets(current, evolved, config.ratio_evolved, ctx.seed, config.size)
    categories = Counter(str(c) for c in mixed.column("category").to_pylist())
    depths = Counter(mixed.column("depth").to_pylist())
    # Kept from X_{t-1} = not evolved in this iteration: X_{t-1}'s own evolved prompts (from
    # earlier iterations) are kept ones too, or an 80/20 mix would read as 95/5.
    new = set(evolved.column("prompt_id").to_pylist())
    kept = [r for r in mixed.to_pylist() if r["prompt_id"] not in new]
    shown = [{"prompt": r["prompt"], "category": r["category"],
              **{c: r[c] for c in LINEAGE_COLUMNS}} for r in kept[:50]]  # fmt: skip
    return StageOutput(
        mixed,
        stats={
            **stats.as_dict(),
            "categories": dict(sorted(categories.items())),
            "depths": {str(k): v for k, v in sorted(depths.items())},
        },
        ui_tables={"originals-kept": shown},
        ui_notes={
            "originals-kept": f"first {len(shown)} of the {len(kept)} prompts of X_t-1 kept "
            f"beside {mixed.num_rows - len(kept)} evolved ones, in X_t's order"
        },
    )

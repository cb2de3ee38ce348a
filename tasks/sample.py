"""Stage ``sample``: the subset of X_{t-1} the creator evolves (paper section 3.2)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, model_validator

from eva_core.sampling import SampleMethod, select_subset, subset_size, tempered
from eva_core.schema import LINEAGE_COLUMNS, PROMPT_COLUMNS
from tasks.context import StageContext, StageOutput
from tasks.stage import stage


class SampleConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    fraction: float = Field(default=0.25, gt=0.0, le=1.0, description="Share of prompts drawn.")
    method: SampleMethod = Field(
        default="weighted",
        description="weighted: proportional to informativeness, without replacement (paper); "
        "greedy: top-k; uniform: ignore informativeness.",
    )
    temperature: float = Field(
        default=1.0,
        gt=0.0,
        json_schema_extra={"key": "unless default"},
        description="weighted only: draw in proportion to informativeness ** (1 / temperature) "
        "(1: the paper; below 1 leans towards greedy, above 1 towards uniform).",
    )

    @model_validator(mode="after")
    def _temperature_is_weighted(self) -> SampleConfig:
        if self.temperature != 1.0 and self.method != "weighted":
            raise ValueError(
                f"temperature: applies to method weighted only, not {self.method!r} "
                "(greedy and uniform are its limits 0 and infinity)"
            )
        return self


@stage(
    "sample",
    version=2,  # 2: a temperature other than 1 ranks in log space (T = 1 draws as before)
    libraries=("numpy",),
    inputs={"scores": (*PROMPT_COLUMNS, "informativeness")},
    outputs=(*PROMPT_COLUMNS, "informativeness", "draw_rank"),
)
def sample(ctx: StageContext, config: SampleConfig, scores: pa.Table) -> StageOutput:
    weights = scores.column("informativeness").to_numpy(zero_copy_only=False)
    k = subset_size(scores.num_rows, config.fraction)
    subset = select_subset(weights, k, config.method, ctx.seed, config.temperature)
    out = scores.select([*PROMPT_COLUMNS, "informativeness"]).take(subset.indices)
    out = out.append_column("draw_rank", pa.array(np.arange(len(subset.indices)), pa.int32()))
    finite = weights[np.isfinite(weights)]
    picked = out.column("informativeness").to_numpy(zero_copy_only=False)
    picked = picked[np.isfinite(picked)]
    stats = {
        "method": config.method, "prompts": scores.num_rows, "selected": len(subset.indices),
        "fell_back_to_uniform": subset.fell_back_to_uniform,
        "zero_weight_filled": subset.zero_weight_filled,
        "mean_informativeness_all": round(float(finite.mean()), 4) if finite.size else None,
        "mean_informativeness_selected": round(float(picked.mean()), 4) if picked.size else None,
    }  # fmt: skip
    if subset.fell_back_to_uniform:
        ctx.log.warning("every informativeness weight is zero: sampled uniformly instead")
    # The share of the draw's weight each prompt carried (weighted sampling's odds).
    odds = tempered(weights, config.temperature)
    total = float(odds[np.isfinite(odds)].sum())
    drawn = [
        {
            "draw_rank": r["draw_rank"],
            "prompt": r["prompt"],
            "informativeness": r["informativeness"],
            "weight_share": float(odds[i]) / total if total else None,
            "category": r["category"],
            **{c: r[c] for c in LINEAGE_COLUMNS},
        }
        for i, r in zip(subset.indices, out.slice(0, 50).to_pylist(), strict=False)
    ]
    note = (
        f"first {len(drawn)} of the {out.num_rows} prompts drawn from {scores.num_rows} "
        f"({config.method}), in draw order"
    )
    return StageOutput(out, stats=stats, ui_tables={"drawn": drawn}, ui_notes={"drawn": note})

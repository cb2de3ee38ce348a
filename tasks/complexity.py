"""Stage ``complexity``: how hard and how well-posed each prompt of a prompt set is.

The paper (Table 7) shows that evolved prompts grow in complexity and keep their quality by
asking an LLM judge to rate both from 1 to 10 (``llm``, over any OpenAI-compatible endpoint).
A judge of your own plugs in as ``python``: the built-in world's reports the exact difficulty
(digits + 2 per extra operand, or string length) and no quality. The judges live in
``tasks.backends.evolve.judge``.
"""

from __future__ import annotations

import math
from typing import Annotated

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, Field

from tasks.backends.evolve.judge import ComplexityJudgeBackend
from tasks.backends.protocols import stats_of
from tasks.backends.python import Builds
from tasks.context import StageContext, StageOutput
from tasks.stage import stage

COMPLEXITY_COLUMNS = ("prompt_id", "prompt", "complexity", "quality")


class ComplexityConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    judge: Annotated[ComplexityJudgeBackend, Builds("a complexity judge", ("score",))] = Field(
        description="llm (the paper's Table 7 judge over an OpenAI-compatible endpoint) or python "
        "(an object of yours; the built-in world's: eva_world.components:WorldDifficulty)."
    )
    chunk: int = Field(default=256, ge=1, description="Prompts per judge call (progress step).")


@stage(
    "complexity", version=1, inputs={"prompts": ("prompt_id", "prompt")}, outputs=COMPLEXITY_COLUMNS
)
def complexity(ctx: StageContext, config: ComplexityConfig, prompts: pa.Table) -> StageOutput:
    judge = config.judge.load()
    texts = prompts.column("prompt").to_pylist()
    scores: list[tuple[float, float]] = []
    for start in range(0, len(texts), config.chunk):
        scores += judge.score(texts[start : start + config.chunk])
        ctx.progress(min(1.0, (start + config.chunk) / max(len(texts), 1)))
    values = np.array(scores, dtype=float).reshape(-1, 2)
    out = prompts.select(["prompt_id", "prompt"])
    out = out.append_column("complexity", pa.array(values[:, 0], pa.float64()))
    out = out.append_column("quality", pa.array(values[:, 1], pa.float64()))

    def mean(col: np.ndarray) -> float | None:
        ok = col[np.isfinite(col)]
        return round(float(ok.mean()), 4) if ok.size else None

    stats = {
        "judge": getattr(config.judge, "factory", config.judge.kind), "prompts": len(texts),
        "mean_complexity": mean(values[:, 0]), "mean_quality": mean(values[:, 1]),
        "unscored": int((~np.isfinite(values[:, 0])).sum()), "backend": stats_of(judge),
    }  # fmt: skip
    top = pc.sort_indices(out, [("complexity", "descending")])[:20]
    rows = [
        {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
        for r in out.take(top).select(["prompt", "complexity", "quality"]).to_pylist()
    ]
    return StageOutput(out, stats=stats, ui_tables={"most-complex": rows})

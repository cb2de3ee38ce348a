"""Stage ``train``: the solver step, theta_{t-1} -> theta_t on the pairs of X_t.

Incremental, as in the paper's offline protocol: each iteration starts from the last
checkpoint, which is also the DPO reference model.
"""

from __future__ import annotations

import os

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from tasks.backends.trl_dpo import DPOSolverConfig
from tasks.stage import MODEL, StageContext, StageOutput, stage


class TrainConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    solver: DPOSolverConfig = Field(default_factory=DPOSolverConfig)


@stage(
    "train", inputs={"pairs": ("prompt", "chosen", "rejected"), "policy": MODEL}, outputs=("step",)
)
def train(ctx: StageContext, config: TrainConfig, pairs: pa.Table) -> StageOutput:
    solver = config.solver.load()
    out_dir = os.path.join(ctx.scratch, "model")
    metrics = solver.train(
        ctx.model_dir("policy"),
        pairs.column("prompt").to_pylist(),
        pairs.column("chosen").to_pylist(),
        pairs.column("rejected").to_pylist(),
        out_dir,
        ctx.seed,
        ctx.progress,
    )
    table = (
        pa.Table.from_pylist(metrics) if metrics else pa.table({"step": pa.array([], pa.int64())})
    )
    last = metrics[-1] if metrics else {}
    stats = {
        "pairs": pairs.num_rows,
        "steps": int(last.get("step", 0)),
        **{k: round(v, 4) for k, v in last.items() if k != "step" and isinstance(v, float)},
    }
    return StageOutput(table, stats=stats, model_dir=out_dir)

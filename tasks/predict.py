"""Stage ``predict``: the creator's informativeness of X_{t-1} from the solver's history
(``creator_rollouts: predicted``), with no rollout pass of its own.

It writes what ``score`` writes, so ``sample`` draws from it unchanged, plus per prompt where
its estimate came from (history, inherited, prior), how uncertain it is, and the readings it
was made from. The model is ``eva_core.predicted``'s.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, Field

from eva_core.informativeness import Metric, informativeness, reward_matrix
from eva_core.predicted import predict_informativeness
from eva_core.schema import LINEAGE_COLUMNS, PROMPT_COLUMNS
from tasks.context import StageContext, StageOutput
from tasks.score import SCORE_COLUMNS, distribution, reward_summary
from tasks.stage import stage

PREDICT_COLUMNS = (*SCORE_COLUMNS, "estimate", "uncertainty", "reading_recent", "reading_older")


class PredictConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    metric: Metric | None = Field(
        default=None,
        description="Informativeness metric of each reading (None: the score stage's metric).",
    )
    rho_prior: float = Field(
        default=0.8,
        ge=0.0,
        lt=1.0,
        description="Correlation of a prompt's informativeness from one policy to the next, "
        "used until it can be measured (from min_pairs prompts read by two solver steps, "
        "usually from iteration 2): how far an old reading is pulled towards the set's mean.",
    )
    min_pairs: int = Field(
        default=30, ge=2, description="Prompts read at both ages needed to measure rho."
    )


def _readings(values: np.ndarray, read_ids: pa.Array, ids: pa.Array) -> np.ndarray:
    """``values`` (one per ``read_ids``) looked up for each of ``ids`` (NaN where absent)."""
    at = pc.index_in(ids, value_set=read_ids)
    index = pc.fill_null(at, -1).to_numpy(zero_copy_only=False)
    found = index >= 0
    out = np.full(len(ids), np.nan)
    out[found] = values[index[found]]
    return out


@stage(
    "predict",
    version=1,
    libraries=("numpy",),
    inputs={"recent": (*PROMPT_COLUMNS, "rewards"), "older": (*PROMPT_COLUMNS, "rewards")},
    outputs=PREDICT_COLUMNS,
)
def predict(
    ctx: StageContext, config: PredictConfig, recent: pa.Table, older: pa.Table
) -> StageOutput:
    metric = config.metric or "a_min"
    ids = recent.column("prompt_id").combine_chunks()
    # At iteration 1 there is no older step: the flow passes the same rollouts twice.
    same = ctx.refs["older"].content_hash == ctx.refs["recent"].content_hash
    history = older.slice(0, 0) if same else older
    rewards = reward_matrix(recent.column("rewards"))
    reading_recent = informativeness(rewards, metric)
    # One reading per prompt of X_{t-2}, looked up for each prompt and for its parent.
    if history.num_rows:
        older_values = informativeness(reward_matrix(history.column("rewards")), metric)
    else:
        older_values = np.zeros(0)
    older_ids = history.column("prompt_id").combine_chunks()
    reading_older = _readings(older_values, older_ids, ids)
    parents = recent.column("parent_id").combine_chunks().fill_null("")
    parent_older = _readings(older_values, older_ids, parents)
    methods = recent.column("evolve_method").to_pylist()
    pred = predict_informativeness(
        reading_recent, reading_older, parent_older, methods, config.rho_prior, config.min_pairs
    )
    out = reward_summary(recent, pred.mean, rewards)
    for name, values in (
        ("estimate", pa.array(pred.source, pa.string())),
        ("uncertainty", pa.array(pred.sd)),
        ("reading_recent", pa.array(reading_recent, from_pandas=True)),
        ("reading_older", pa.array(reading_older, from_pandas=True)),
    ):
        out = out.append_column(name, values)
    sources = {s: pred.source.count(s) for s in ("history", "inherited", "prior")}
    stats = {
        "metric": metric,
        "prompts": recent.num_rows,
        "mean_informativeness": round(float(pred.mean.mean()), 4) if len(pred.mean) else None,
        "rho": round(pred.rho, 4),
        "rho_measured": pred.rho_measured,
        "read_twice": int(np.isfinite(reading_older).sum()),
        "mean_uncertainty": round(float(pred.sd.mean()), 4) if len(pred.sd) else None,
        "estimates": sources,
        "method_shifts": {k: round(v, 4) for k, v in pred.shifts.items()},
        "generated_responses": 0,
    }
    top = pc.sort_indices(out, [("informativeness", "descending")])[:20]
    rows = [
        {"prompt": r["prompt"], "category": r["category"],
         "informativeness": round(r["informativeness"], 4),
         "uncertainty": round(r["uncertainty"], 4), "estimate": r["estimate"],
         **{c: r[c] for c in LINEAGE_COLUMNS}}
        for r in out.take(top).to_pylist()
    ]  # fmt: skip
    return StageOutput(
        out,
        stats=stats,
        ui_tables={"most-informative": rows, "distribution": distribution(pred.mean)},
        ui_notes={
            "most-informative": f"top {len(rows)} of {recent.num_rows} prompts by predicted "
            f"informativeness ({metric}; rho {pred.rho:.2f}"
            f"{'' if pred.rho_measured else ', prior'}), descending",
            "distribution": f"predicted informativeness of the {recent.num_rows} prompts, "
            "in 10 equal bins",
        },
    )

"""Stage ``score``: informativeness of every prompt of X_{t-1} (paper section 3.2)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, Field

from eva_core.informativeness import Metric, informativeness, reward_matrix
from eva_core.schema import LINEAGE_COLUMNS, PROMPT_COLUMNS
from tasks.context import StageContext, StageOutput
from tasks.stage import stage

SCORE_COLUMNS = (*PROMPT_COLUMNS, "informativeness", "reward_max", "reward_min", "reward_mean")


class ScoreConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    metric: Metric = Field(
        default="a_min",
        description="a_min = max - min (offline default); a_avg = max - mean (online default); "
        "a_dis, var, avg, inv_avg, inv_a_min, uniform are the paper's ablations.",
    )


@stage(
    "score",
    version=1,
    libraries=("numpy",),
    inputs={"annotated": (*PROMPT_COLUMNS, "rewards")},
    outputs=SCORE_COLUMNS,
)
def score(ctx: StageContext, config: ScoreConfig, annotated: pa.Table) -> StageOutput:
    rewards = reward_matrix(annotated.column("rewards"))
    info = informativeness(rewards, config.metric)
    out = reward_summary(annotated, info, rewards)
    top = pc.sort_indices(out, [("informativeness", "descending")])[:20]
    ui = annotated.take(top).append_column(
        "informativeness", out.column("informativeness").take(top)
    )
    valid = info[np.isfinite(info)]
    stats = {
        "metric": config.metric, "prompts": len(info),
        "mean_informativeness": round(float(valid.mean()), 4) if valid.size else None,
        "zero_informativeness": int((valid == 0).sum()),
        "unscored_prompts": int(len(info) - valid.size),
    }  # fmt: skip
    rows = [
        {
            "prompt": r["prompt"],
            "category": r["category"],
            "informativeness": round(r["informativeness"], 4),
            "rewards": [round(x, 3) for x in r["rewards"]],
            "responses": r["responses"],
            **{c: r[c] for c in LINEAGE_COLUMNS},
        }
        for r in ui.to_pylist()
    ]
    n = len(info)
    return StageOutput(
        out,
        stats=stats,
        ui_tables={"most-informative": rows, "distribution": distribution(valid)},
        ui_notes={
            "most-informative": f"top {len(rows)} of {n} prompts by informativeness "
            f"({config.metric}), descending",
            "distribution": f"informativeness ({config.metric}) of the {valid.size} scored "
            f"prompts of {n}, in 10 equal bins",
        },
    )


def reward_summary(annotated: pa.Table, info: np.ndarray, rewards: np.ndarray) -> pa.Table:
    """``annotated``'s prompt records with each prompt's informativeness and the max, min and
    mean of its ``rewards`` (its reward matrix; NaN where it has no finite reward): the columns
    ``sample`` draws from."""
    with np.errstate(all="ignore"):
        finite = np.isfinite(rewards)
        r_max = np.where(finite, rewards, -np.inf).max(axis=1, initial=-np.inf)
        r_min = np.where(finite, rewards, np.inf).min(axis=1, initial=np.inf)
        r_mean = np.where(finite, rewards, 0).sum(axis=1) / finite.sum(axis=1)
    out = annotated.select(list(PROMPT_COLUMNS))
    for name, values in (
        ("informativeness", info),
        ("reward_max", r_max),
        ("reward_min", r_min),
        ("reward_mean", r_mean),
    ):
        out = out.append_column(name, pa.array(np.where(np.isfinite(values), values, np.nan)))
    return out


def distribution(values: np.ndarray, bins: int = 10) -> list[dict[str, Any]]:
    """A histogram as table rows (bin edges, count, share): the whole distribution, not only
    its top, so a set where most prompts carry no signal shows as such."""
    if values.size == 0:
        return []
    counts, edges = np.histogram(values, bins=bins)
    return [
        {"from": round(float(lo), 4), "to": round(float(hi), 4), "prompts": int(c),
         "share": round(float(c) / values.size, 4)}
        for lo, hi, c in zip(edges[:-1], edges[1:], counts, strict=True)
    ]  # fmt: skip

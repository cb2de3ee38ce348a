"""Stage ``pairs``: best vs worst response of each prompt of X_t (paper section 3.1)."""

from __future__ import annotations

import pyarrow as pa
from pydantic import BaseModel, ConfigDict

from eva_core.informativeness import reward_matrix
from eva_core.pairs import choose_pairs, pick
from tasks.stage import StageContext, StageOutput, stage

PAIR_COLUMNS = ("prompt_id", "prompt", "chosen", "rejected", "chosen_reward", "rejected_reward")


class PairsConfig(BaseModel):
    """Pair construction follows the paper exactly; there is nothing to tune yet."""

    model_config = ConfigDict(frozen=True, extra="forbid")


@stage(
    "pairs",
    inputs={"annotated": ("prompt_id", "prompt", "responses", "rewards")},
    outputs=PAIR_COLUMNS,
)
def pairs(ctx: StageContext, config: PairsConfig, annotated: pa.Table) -> StageOutput:
    rewards = reward_matrix(annotated.column("rewards"))
    choice, stats = choose_pairs(rewards)
    responses = annotated.column("responses").to_pylist()
    kept = annotated.take(choice.rows)
    out = pa.table({
        "prompt_id": kept.column("prompt_id"),
        "prompt": kept.column("prompt"),
        "chosen": pick(responses, choice.rows, choice.chosen),
        "rejected": pick(responses, choice.rows, choice.rejected),
        "chosen_reward": rewards[choice.rows, choice.chosen],
        "rejected_reward": rewards[choice.rows, choice.rejected],
    })  # fmt: skip
    return StageOutput(
        out, stats=stats.as_dict(), ui_tables={"pairs": out.slice(0, 20).to_pylist()}
    )

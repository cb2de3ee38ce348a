"""Stage ``pairs``: best vs worst response of each prompt of X_t (paper section 3.1)."""

from __future__ import annotations

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from eva_core.informativeness import reward_matrix
from eva_core.pairs import TruncatedRule, cap_pairs, choose_pairs, pick
from tasks.context import StageContext, StageOutput
from tasks.stage import stage

PAIR_COLUMNS = ("prompt_id", "prompt", "chosen", "rejected", "chosen_reward", "rejected_reward")


class PairsConfig(BaseModel):
    """Pair construction follows the paper: best vs worst response, ties skipped."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    max_pairs: int | None = Field(
        default=None,
        ge=1,
        description="Train on at most this many pairs (a seeded random subset): equal budgets "
        "when comparing prompt-set strategies. None keeps every pair.",
    )
    min_chosen_reward: float | None = Field(
        default=None,
        description="Skip prompts whose best response scores below this (not in the paper; "
        "with a verifier reward, 1.0 trains only on correct chosen answers). None: off.",
    )
    truncated: TruncatedRule = Field(
        default="reject_only",
        description="Responses cut at the length cap: reject_only = never the chosen side "
        "(the solver would close it with the end-of-turn token and teach stopping "
        "mid-sentence), but may be the rejected one; exclude = on neither side; allow = pair "
        "by reward alone.",
    )


@stage(
    "pairs",
    # 2: a response cut at the length cap is never chosen (``truncated``).
    version=2,
    libraries=("numpy",),
    inputs={"annotated": ("prompt_id", "prompt", "responses", "finished", "rewards")},
    outputs=PAIR_COLUMNS,
)
def pairs(ctx: StageContext, config: PairsConfig, annotated: pa.Table) -> StageOutput:
    rewards = reward_matrix(annotated.column("rewards"))
    finished = reward_matrix(annotated.column("finished").cast(pa.list_(pa.float64()))) == 1.0
    choice, stats = choose_pairs(rewards, config.min_chosen_reward, finished, config.truncated)
    capped = cap_pairs(choice, config.max_pairs, ctx.seed)
    over_budget = len(choice.rows) - len(capped.rows)
    choice = capped
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
    # "pairs" counts what the solver trains on; the cap's drops are reported beside it.
    stats_out = {**stats.as_dict(), "pairs": len(choice.rows), "dropped_over_budget": over_budget}
    return StageOutput(out, stats=stats_out, ui_tables={"pairs": out.slice(0, 20).to_pylist()})

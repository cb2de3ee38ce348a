"""Stage ``annotate`` (and ``creator_annotate``): a reward for every response."""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from tasks.backends.reward import RewardBackend
from tasks.backends.world import WorldReward
from tasks.generate import ROLLOUT_COLUMNS
from tasks.stage import StageContext, StageOutput, stage

ANNOTATED_COLUMNS = (*ROLLOUT_COLUMNS, "rewards")


class AnnotateConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    reward: RewardBackend = Field(
        default_factory=WorldReward,
        description="world (verifier), sequence_classifier (Skywork/ArmoRM-style RM), "
        "vllm_pooling, callable (package.module:function), pairwise (LLM judge win rate).",
    )


@stage("annotate", inputs={"rollouts": ROLLOUT_COLUMNS}, outputs=ANNOTATED_COLUMNS)
def annotate(ctx: StageContext, config: AnnotateConfig, rollouts: pa.Table) -> StageOutput:
    started = time.perf_counter()  # load included, as in every stage's backend_seconds
    model = config.reward.load()
    rewards = model.score(
        rollouts.column("prompt").to_pylist(),
        rollouts.column("responses").to_pylist(),
        ctx.progress,
    )
    seconds = time.perf_counter() - started
    flat = np.array([r for rs in rewards for r in rs], dtype=np.float64)
    out = rollouts.append_column("rewards", pa.array(rewards, pa.list_(pa.float64())))
    finite = flat[np.isfinite(flat)]
    stats = {
        "responses": int(flat.size), "unscored": int(flat.size - finite.size),
        "mean_reward": round(float(finite.mean()), 4) if finite.size else None,
        "backend_seconds": round(seconds, 3),
        # Backend-specific counts (failures, too-long conversations, unreadable verdicts).
        **getattr(model, "last_stats", {}),
    }  # fmt: skip
    return StageOutput(out, stats=stats)

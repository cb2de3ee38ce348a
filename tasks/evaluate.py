"""Stage ``evaluate``: held-out score of a checkpoint.

The score is the mean reward of one greedy response per held-out prompt, under the same reward
backend the run trains with (the world's verifier here; a reward model in a real deployment);
``solved`` is the share of responses with reward 1 where rewards are a verifier's (every
scored one in [0, 1]); a reward model's unbounded scores have no "solved", nor has an
evaluation that scored nothing. Every category gets its own mean.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Annotated

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from tasks.backends.generate import GenerationBackend
from tasks.backends.generate.transformers import TransformersGeneration
from tasks.backends.judge.llm import JudgeConfig
from tasks.backends.protocols import close_after, engine_stats, prompt_columns, stats_of
from tasks.backends.python import Builds
from tasks.backends.reward import PointwiseRewardBackend
from tasks.context import StageContext, StageOutput, finite_mean, share
from tasks.generate import warn_truncated
from tasks.stage import MODEL, StageError, stage


class EvaluateConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    generation: GenerationBackend = Field(
        default_factory=lambda: TransformersGeneration(temperature=0.0),
        description="Decoding for evaluation (greedy by default).",
    )
    reward: Annotated[PointwiseRewardBackend | None, Builds("a reward model", ("score",))] = Field(
        default=None,
        description="Scores one answer per prompt: a reward model, a function, an object of "
        "yours, or a verifiable reward against the held-out set's known answers (unknown: "
        "drop; a held-out prompt without one is unscored and counted). Pairwise judges do not "
        "apply. None: the run's own reward model.",
    )
    judge: JudgeConfig | None = Field(
        default=None,
        # Added after runs were keyed: left out of the key when off (tasks/keys.py); the
        # evaluate stage itself never sees it (the judge is its own stage).
        json_schema_extra={"key": "unless default"},
        description="An LLM judge's win rate against reference answers, as the paper reports "
        "(Arena-Hard: gpt-4-1106-preview judging against gpt-4-0314's answers): {llm: {base_url, "
        "model, api_key_env}, reference: {kind: column|file|generate, ...}}. null (the "
        "default): no judge.",
    )

    def without_judge(self) -> EvaluateConfig:
        """The evaluate stage's config: the judge runs as stages of its own (tasks.judge)."""
        return self.model_copy(update={"judge": None})


@stage(
    "evaluate",
    # 3: records whether each answer finished before the length cap; prompts without a
    # category get no per-category mean.
    version=3,
    inputs={"heldout": ("prompt_id", "prompt", "category"), "policy": MODEL},
    outputs=("prompt_id", "prompt", "category", "response", "finished", "reward"),
)
def evaluate(ctx: StageContext, config: EvaluateConfig, heldout: pa.Table) -> StageOutput:
    prompts = heldout.column("prompt").to_pylist()
    model_dir = ctx.model_dir("policy")
    started = time.perf_counter()
    # Closed before the reward model loads: an in-process policy gives its GPU back first (a
    # served one stays up for the next iteration's creator unless its config says reuse: false).
    with close_after(config.generation.load(model_dir)) as generator:
        responses, finished = generator.generate(prompts, 1, ctx.seed, ctx.progress).firsts()
        requests = stats_of(generator) or None  # HTTP backends count their requests
        engines = engine_stats(generator)
    if config.reward is None:  # a run config resolves it to the run's own reward model
        raise StageError(f"{ctx.artifact}: no reward model", field="evaluate.reward")
    reward = config.reward.load()
    scores = reward.score(prompts, [[r] for r in responses], **prompt_columns(reward, heldout))
    rewards = np.array([rs[0] for rs in scores])
    seconds = time.perf_counter() - started
    truncated = finished.count(False)
    warn_truncated(ctx, "evaluate.generation", config.generation, truncated, len(prompts))
    categories = heldout.column("category").to_pylist()
    by_cat: dict[str, list[float]] = defaultdict(list)
    for c, r in zip(categories, rewards, strict=True):
        if c is not None:  # a prompt without a category is in the score, not in a category
            by_cat[str(c)].append(float(r))
    out = pa.table(
        {
            "prompt_id": heldout.column("prompt_id"),
            "prompt": prompts,
            "category": categories,
            "response": responses,
            "finished": finished,
            "reward": rewards,
        }
    )
    stats = {
        "score": finite_mean(rewards),
        "solved": _solved(rewards),
        "unscored": int(np.count_nonzero(~np.isfinite(rewards))),
        "truncated": truncated,
        "truncated_share": share(truncated, len(finished)),
        # A category no answer of which was scored is left out (charts plot numbers only).
        "per_category": {
            c: m for c, v in sorted(by_cat.items()) if (m := finite_mean(v)) is not None
        },
        "backend_seconds": round(seconds, 3),
        **({"backend": requests} if requests is not None else {}),
        # The reward's own counts (an instruction-following reward's instructions followed).
        **({"reward": counted} if (counted := stats_of(reward)) else {}),
        **engines,
    }
    return StageOutput(out, stats=stats, ui_tables={"responses": out.slice(0, 20).to_pylist()})


def _solved(rewards: np.ndarray) -> float | None:
    """Share of scored answers with reward exactly 1, when the scores are a verifier's (all in
    [0, 1]); None otherwise: a reward model's logit of 1.0 means nothing, and a share of 0.000
    over no scored answer would read as a result."""
    scored = rewards[np.isfinite(rewards)]
    if not scored.size or scored.min() < 0.0 or scored.max() > 1.0:
        return None
    return round(float(np.mean(scored == 1.0)), 4)

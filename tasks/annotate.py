"""Stage ``annotate`` (and ``creator_annotate``): a reward for every response."""

from __future__ import annotations

import time
import warnings
from typing import Annotated, Any

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, model_validator

from eva_core.informativeness import reward_matrix
from tasks.backends.protocols import prompt_columns, stats_of
from tasks.backends.python import Builds
from tasks.backends.ray_cluster import RayJob, run_on_ray
from tasks.backends.reward import RewardBackend
from tasks.context import StageContext, StageOutput, check_failures, finite_mean, share
from tasks.generate import ROLLOUT_COLUMNS
from tasks.stage import StageError, stage

ANNOTATED_COLUMNS = (*ROLLOUT_COLUMNS, "rewards")
# Past this, a gap (max - min), a sum or a mean of rewards can overflow float64 into inf or NaN,
# which then reaches informativeness, the sampling weights and the manifests.
MAX_ABS_REWARD = 1e150


class AnnotateConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    reward: Annotated[RewardBackend | None, Builds("a reward model", ("score",))] = Field(
        default=None,
        description="The reward model, by kind: sequence_classifier (Skywork/ArmoRM-style RM; "
        "the paper's is RLHFlow/ArmoRM-Llama3-8B-v0.1 with trust_remote_code and output: "
        "score), vllm_pooling, callable (package.module:function), pairwise (LLM judge win "
        "rate), verifiable (a verifier against known answers, majority-vote labels for the "
        "rest), instruction_following (IFEval's checkers on each prompt's instructions), "
        "python (an object of yours). Required: a run without one is refused.",
    )
    max_unscored_share: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="Fail the stage when more than this share of prompts got no finite reward "
        "at all (a reward model or judge that is down); fewer are counted in the stats.",
    )
    fail_on_no_signal: bool = Field(
        default=False,
        description="Fail when every scored prompt's rewards are all equal (no preference "
        "signal, nothing to learn); by default this is reported and the run goes on.",
    )
    ray: RayJob | None = Field(
        default=None,
        description="Score on a Ray cluster: its workers run `reward` on shards of the "
        "rollouts, with the rewards in-process scoring gives wherever a response's score does "
        "not depend on its batch-mates (the world's verifier; see README). None: in this "
        "process.",
    )

    @model_validator(mode="after")
    def _cluster_reads_text(self) -> AnnotateConfig:
        reads = getattr(self.reward, "prompt_columns", None)
        if self.ray is not None and reads:
            raise ValueError(
                "ray: a cluster's workers get each prompt's text and responses only, and this "
                f"reward also reads its {', '.join(reads)}: leave ray out"
            )
        return self


# 2: counts the truncated responses and their mean reward beside the finished ones'.
@stage("annotate", version=2, inputs={"rollouts": ROLLOUT_COLUMNS}, outputs=ANNOTATED_COLUMNS)
def annotate(ctx: StageContext, config: AnnotateConfig, rollouts: pa.Table) -> StageOutput:
    started = time.perf_counter()  # load included, as in every stage's backend_seconds
    prompts = rollouts.column("prompt").to_pylist()
    responses = rollouts.column("responses").to_pylist()
    if config.reward is None:  # refused before the run started (flows.inputs)
        raise StageError(f"{ctx.artifact}: no reward model", field="annotate.reward")
    if config.ray is not None:
        counts = [len(rs) for rs in responses]
        values, cluster = run_on_ray(ctx, config.ray, "annotate", "rollouts", config.reward, counts)
        rewards = values["reward"]
        backend: dict[str, Any] = {}
    else:
        model = config.reward.load()
        rewards = model.score(prompts, responses, ctx.progress, **prompt_columns(model, rollouts))
        backend, cluster = stats_of(model), {}
    seconds = time.perf_counter() - started
    flat = np.array([r for rs in rewards for r in rs], dtype=np.float64)
    _check_magnitude(ctx.artifact, flat, [len(rs) for rs in rewards])
    out = rollouts.append_column("rewards", pa.array(rewards, pa.list_(pa.float64())))
    finite = flat[np.isfinite(flat)]
    matrix = reward_matrix(out.column("rewards"))
    scored = np.isfinite(matrix).any(axis=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN rows: counted as unscored
        tied = scored & (np.nanmax(matrix, axis=1) == np.nanmin(matrix, axis=1))
    n = len(matrix)
    check_failures(
        ctx.artifact, int(n - scored.sum()), n, "all rewards NaN (unscored)",
        config.max_unscored_share, "annotate.max_unscored_share", counts=backend,
    )  # fmt: skip
    if config.fail_on_no_signal and n and tied.sum() == scored.sum():
        raise StageError(
            f"{ctx.artifact}: every scored prompt's rewards are equal ({int(tied.sum())} of {n}):"
            " no preference signal (annotate.fail_on_no_signal)"
        )
    finished = np.array([f for fs in rollouts.column("finished").to_pylist() for f in fs], bool)
    truncated = int((~finished).sum())
    stats = {
        "responses": int(flat.size), "unscored": int(flat.size - finite.size),
        "unscored_prompts": int(n - scored.sum()), "tied_prompts": int(tied.sum()),
        "mean_reward": finite_mean(flat),
        # Whether the reward tells a cut-off answer from a finished one: their mean rewards.
        "truncated": truncated, "truncated_share": share(truncated, int(flat.size)),
        "mean_reward_finished": finite_mean(flat[finished]),
        "mean_reward_truncated": finite_mean(flat[~finished]),
        "backend_seconds": round(seconds, 3),
        # The reward model's own counts (failures, too-long conversations, unreadable verdicts;
        # on a Ray cluster they stay with its workers), or the Ray job that scored.
        **({"backend": backend} if backend else {}),
        **cluster,
    }  # fmt: skip
    return StageOutput(out, stats=stats)


def _check_magnitude(artifact: str, flat: np.ndarray, counts: list[int]) -> None:
    """A ``StageError`` naming the first reward that is infinite or beyond ``MAX_ABS_REWARD``
    (NaN is fine: an unscored response)."""
    bad = np.flatnonzero(np.abs(np.nan_to_num(flat, nan=0.0)) > MAX_ABS_REWARD)
    if not bad.size:
        return
    first = int(bad[0])
    prompt = int(np.searchsorted(np.cumsum(counts), first, side="right"))
    response = first - (sum(counts[:prompt]))
    raise StageError(
        f"{artifact}: reward {flat[first]:g} (prompt {prompt}, response {response}; "
        f"{bad.size} such): rewards must be finite and within ±{MAX_ABS_REWARD:g}, so that "
        "their gaps, sums and means stay numbers",
        field="annotate.reward",
        hint="scale the reward, or return NaN for a response it cannot score",
    )

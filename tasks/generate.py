"""Stage ``generate`` (and ``creator_generate``): N responses per prompt from the current policy.

The creator samples on X_{t-1} to measure informativeness; the solver samples on X_t to build
preference pairs. Both use the same stage with the same backend; only the artifact differs.
"""

from __future__ import annotations

import time

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, model_validator

from eva_core.schema import PROMPT_COLUMNS
from tasks.backends.generate import GenerationBackend, length_cap
from tasks.backends.generate.transformers import TransformersGeneration
from tasks.backends.protocols import Generations, close_after, engine_stats, stats_of
from tasks.backends.ray_cluster import RayJob, run_on_ray
from tasks.backends.ray_job import CLUSTER_BACKENDS
from tasks.context import StageContext, StageOutput, share
from tasks.stage import MODEL, stage

# ``finished``: per response, whether the policy ended it before the length cap (False: cut at
# the cap, truncated; ``tasks.backends.protocols.Generations``).
ROLLOUT_COLUMNS = (*PROMPT_COLUMNS, "responses", "finished")
# Above this share of truncated responses, a stage and the run's summary warn, naming the cap.
TRUNCATED_WARNING_SHARE = 0.1


class GenerateConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    n: int = Field(
        default=6,
        ge=2,
        description="Responses per prompt (paper: 6); at least 2, since a prompt's "
        "informativeness and its pair compare the best response with the worst.",
    )
    backend: GenerationBackend = Field(
        default_factory=TransformersGeneration,
        description="transformers (CPU/GPU), ctranslate2 (fast on CPU, int8; CUDA too), vllm "
        "(in-process, GPU env), openai (any "
        "OpenAI-compatible endpoint: vllm serve, sglang, a hosted API), or served (starts "
        "`vllm serve` from its own env on this stage's checkpoint, reused by the next stage that "
        "samples it).",
    )
    ray: RayJob | None = Field(
        default=None,
        description="Run this stage as a job on a Ray cluster: its workers run `backend` "
        "(transformers; vllm through Ray Data LLM) on shards of the prompts, with the same "
        "outputs as in this process. None: in this process.",
    )

    @model_validator(mode="after")
    def _cluster_backend(self) -> GenerateConfig:
        if self.ray is not None and self.backend.kind not in CLUSTER_BACKENDS:
            raise ValueError(
                f"ray: a cluster's workers run the transformers or vllm backend, not "
                f"{self.backend.kind!r} (that one already runs elsewhere: leave ray out)"
            )
        return self


@stage(
    "generate",
    # 2: records whether each response finished (``finished``) and counts the truncated.
    version=2,
    inputs={"prompts": PROMPT_COLUMNS, "policy": MODEL},
    outputs=ROLLOUT_COLUMNS,
)
def generate(ctx: StageContext, config: GenerateConfig, prompts: pa.Table) -> StageOutput:
    texts = prompts.column("prompt").to_pylist()
    # backend_seconds spans load to close: everything the backend does, nothing eva does.
    started = time.perf_counter()
    cluster: dict[str, object] = {}
    requests, engines = None, {}
    if config.ray is not None:
        values, cluster = run_on_ray(
            ctx, config.ray, "generate", "prompts", config.backend, [config.n] * len(texts),
            n=config.n, model="policy",
        )  # fmt: skip
        generations = Generations(values["response"], values["finished"])
    else:
        with close_after(config.backend.load(ctx.model_dir("policy"))) as generator:
            generations = generator.generate(texts, config.n, ctx.seed, ctx.progress)
            requests = stats_of(generator) or None  # HTTP backends count their requests
            engines = engine_stats(generator)  # served: 0 when an earlier stage's server was reused
    seconds = time.perf_counter() - started
    responses = generations.texts
    out = prompts.append_column("responses", pa.array(responses, pa.list_(pa.string())))
    out = out.append_column("finished", pa.array(generations.finished, pa.list_(pa.bool_())))
    chars = sum(len(r) for rs in responses for r in rs)
    distinct = sum(len(set(rs)) for rs in responses) / max(len(responses), 1)
    truncated = generations.truncated()
    warn_truncated(ctx, "generate.backend", config.backend, truncated, len(texts) * config.n)
    stats = {
        "prompts": len(texts), "responses": len(texts) * config.n,
        "truncated": truncated, "truncated_share": share(truncated, len(texts) * config.n),
        "backend_seconds": round(seconds, 3), "response_chars": chars,
        "mean_distinct_responses": round(distinct, 3),
        **({"backend": requests} if requests is not None else {}),
        **engines,
        **cluster,
    }  # fmt: skip
    return StageOutput(out, stats=stats)


def warn_truncated(
    ctx: StageContext, field: str, backend: object, truncated: int, total: int
) -> None:
    """One warning line when more than ``TRUNCATED_WARNING_SHARE`` of ``total`` responses ran
    into the backend's length cap, naming the field that sets it."""
    if not total or truncated / total <= TRUNCATED_WARNING_SHARE:
        return
    name, cap = length_cap(backend)
    ctx.log.warning(
        f"{ctx.artifact}: {truncated} of {total} responses ({truncated / total:.0%}) were cut at "
        f"{field}.{name} ({cap}) before the policy ended them: raise it, or they score as "
        "unfinished answers (a truncated response is never the chosen side of a pair unless "
        "pairs.truncated says so)"
    )

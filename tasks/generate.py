"""Stage ``generate`` (and ``creator_generate``): N responses per prompt from the current policy.

The creator samples on X_{t-1} to measure informativeness; the solver samples on X_t to build
preference pairs. Both use the same stage with the same backend; only the artifact differs.
"""

from __future__ import annotations

import time

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, model_validator

from eva_core.schema import PROMPT_COLUMNS
from tasks.backends.generate import GenerationBackend
from tasks.backends.generate.transformers import TransformersGeneration
from tasks.backends.protocols import close_after, engine_stats, stats_of
from tasks.backends.ray_cluster import RayJob, run_on_ray
from tasks.backends.ray_job import CLUSTER_BACKENDS
from tasks.context import StageContext, StageOutput
from tasks.stage import MODEL, stage

ROLLOUT_COLUMNS = (*PROMPT_COLUMNS, "responses")


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
        description="transformers (CPU/GPU), vllm (in-process, GPU env), openai (any "
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
    version=1,
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
        responses, cluster = run_on_ray(
            ctx, config.ray, "generate", "prompts", config.backend, [config.n] * len(texts),
            n=config.n, model="policy",
        )  # fmt: skip
    else:
        with close_after(config.backend.load(ctx.model_dir("policy"))) as generator:
            responses = generator.generate(texts, config.n, ctx.seed, ctx.progress)
            requests = stats_of(generator) or None  # HTTP backends count their requests
            engines = engine_stats(generator)  # served: 0 when an earlier stage's server was reused
    seconds = time.perf_counter() - started
    out = prompts.append_column("responses", pa.array(responses, pa.list_(pa.string())))
    chars = sum(len(r) for rs in responses for r in rs)
    distinct = sum(len(set(rs)) for rs in responses) / max(len(responses), 1)
    stats = {
        "prompts": len(texts), "responses": len(texts) * config.n,
        "backend_seconds": round(seconds, 3), "response_chars": chars,
        "mean_distinct_responses": round(distinct, 3),
        **({"backend": requests} if requests is not None else {}),
        **engines,
        **cluster,
    }  # fmt: skip
    return StageOutput(out, stats=stats)

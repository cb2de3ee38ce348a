"""Rollouts from any OpenAI-compatible server (``vllm serve``, SGLang, TGI, a hosted API).

This is the GPU path that keeps vLLM out of eva's environment: vLLM pins torch, transformers
and fastapi versions that cannot coexist with prefect 3.8, so the policy is served from its own
environment and the stage talks to it over HTTP.

Requests go through ``eva_runtime.llm_client`` (concurrency, retries, the API key, request
counts). Every prompt gets a seed derived from ``(seed, prompt index)`` alone, so rollouts do not
depend on concurrency, scheduling or retries.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from eva_runtime.errors import EvaError
from eva_runtime.llm_client import LLMBatchError, LLMClient, LLMRequestError
from eva_runtime.llm_config import LLMClientConfig
from eva_runtime.seeds import derive_seed as derive_seed  # a prompt's request seed
from tasks.backends.protocols import Generations, Progress, no_progress

# Keys the backend sets itself; extra_body may not override them (it would silently change what
# the config hash claims was sampled).
_MANAGED_KEYS = frozenset(
    {"model", "messages", "prompt", "n", "seed", "temperature", "top_p", "max_tokens", "stream"}
)


class GenerationError(EvaError, RuntimeError):
    """Some prompts got no responses after every retry; no partial output is returned, because
    a response-less prompt would silently skew rewards and pairs downstream."""

    def __init__(self, message: str, failed: dict[int, str]):
        super().__init__(message)
        self.failed = failed  # prompt index -> last error


class OpenAIGeneration(BaseModel):
    """Sample responses from an OpenAI-compatible HTTP endpoint (e.g. ``vllm serve``)."""

    # 2: each response says whether it finished before the length cap (``Generations``).
    version: ClassVar[int] = 2  # bump when a change can change what it computes
    libraries: ClassVar[tuple[str, ...]] = ()

    model_config = ConfigDict(extra="forbid")

    kind: Literal["openai"] = "openai"
    llm: LLMClientConfig = Field(
        default_factory=LLMClientConfig,
        description="Endpoint, key, concurrency, timeout and retries; llm.model None = the "
        "checkpoint directory given to the stage, which is the name `vllm serve DIR` serves it "
        "under.",
    )
    endpoint: Literal["chat", "completions"] = Field(
        default="chat",
        description='"chat" lets the server apply the chat template; "completions" sends the '
        "raw prompt text.",
    )
    system_prompt: str | None = Field(default=None, description="Chat only: a system message.")
    temperature: float = Field(default=0.7, ge=0.0, description="eva's default 0.7.")
    top_p: float = Field(default=0.9, gt=0.0, le=1.0, description="eva's default 0.9.")
    max_tokens: int = Field(default=1024, ge=1, description="Response length cap in tokens.")
    n_per_request: bool = Field(
        default=True,
        description="Ask for all n samples in one request (`n`); false = n requests of one "
        "sample each, seeded seed+j as vLLM seeds the samples of one request.",
    )
    extra_body: dict[str, Any] = Field(
        default_factory=dict,
        description="More request fields, e.g. vLLM's top_k or stop; not the managed ones.",
    )

    @model_validator(mode="after")
    def _check(self) -> OpenAIGeneration:
        if self.system_prompt is not None and self.endpoint != "chat":
            raise ValueError("system_prompt needs endpoint='chat'")
        if clash := sorted(_MANAGED_KEYS & set(self.extra_body)):
            raise ValueError(f"extra_body may not set {clash}: they are config fields")
        return self

    def load(self, model_dir: str) -> OpenAIGenerator:
        """A generator for the model served as ``llm.model`` (default: ``model_dir``); a named
        API key variable that is unset raises ``LLMConfigError`` here, before any request."""
        return OpenAIGenerator(self, LLMClient(self.llm, default_model=model_dir))


class OpenAIGenerator:
    """A served policy that satisfies the ``Generator`` protocol."""

    def __init__(self, config: OpenAIGeneration, client: LLMClient):
        self.config = config
        self.client = client
        self.model = client.model

    def __repr__(self) -> str:
        return f"OpenAIGenerator(model={self.model!r}, base_url={self.config.llm.base_url!r})"

    def close(self) -> None:
        self.client.close()

    def stats(self) -> dict[str, int]:
        """The client's request counts since load (requests, retries, failures, tokens)."""
        return self.client.stats()

    def _request(self, prompt: str, n: int, seed: int) -> list[tuple[str, bool]]:
        """``n`` samples, each with whether it finished (any ``finish_reason`` but
        ``"length"``, the server's word for an answer cut at ``max_tokens``)."""
        cfg = self.config
        sampling: dict[str, Any] = {**cfg.extra_body, "n": n, "seed": seed}
        sampling.update(temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=cfg.max_tokens)
        if cfg.endpoint == "chat":
            system = [{"role": "system", "content": cfg.system_prompt}] if cfg.system_prompt else []
            message = [*system, {"role": "user", "content": prompt}]
            reply = self.client.chat_reply(message, **sampling)
        else:
            reply = self.client.completion_reply(prompt, **sampling)
        if len(reply.texts) != n:
            raise LLMRequestError(
                f"asked for n={n} samples, got {len(reply.texts)}: if the server ignores `n`, "
                "set n_per_request=false"
            )
        return [(t, r != "length") for t, r in zip(reply.texts, reply.finish_reasons, strict=True)]

    def generate(
        self, prompts: Sequence[str], n: int, seed: int, progress: Progress = no_progress
    ) -> Generations:
        """``n`` responses per prompt, in sample order, each with whether it finished; raises
        ``GenerationError`` if any prompt still fails after its retries (in-flight work
        finishes, nothing new starts)."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        # (prompt index, first sample index, samples) per request
        jobs = [(i, 0, n) for i in range(len(prompts))]
        if not self.config.n_per_request:
            jobs = [(i, j, 1) for i in range(len(prompts)) for j in range(n)]

        def request(job: tuple[int, int, int]) -> list[tuple[str, bool]]:
            i, j, count = job
            return self._request(prompts[i], count, derive_seed(seed, i) + j)

        try:
            texts = self.client.map(request, jobs, progress)
        except LLMBatchError as exc:
            failed: dict[int, str] = {}
            for k in sorted(exc.failed):
                failed.setdefault(jobs[k][0], exc.failed[k])
            first = min(failed)
            raise GenerationError(
                f"generation via {self.config.llm.base_url} stopped: {len(failed)} prompt(s) "
                f"failed ({exc.completed} of {len(jobs)} requests were complete); first: prompt "
                f"{first}: {failed[first]}",
                failed,
            ) from exc
        results = [[""] * n for _ in prompts]
        finished = [[True] * n for _ in prompts]
        for (i, j, count), got in zip(jobs, texts, strict=True):
            results[i][j : j + count] = [text for text, _ in got]
            finished[i][j : j + count] = [done for _, done in got]
        return Generations(results, finished)

"""Rewrite chosen responses before training (eva paper, appendix H.2.1).

An optional solver-side step: an LLM behind any OpenAI-compatible endpoint rewrites each chosen
response "for helpfulness and depth at similar length". A rewrite is used only when it came back,
is not empty, and its length is within ``[min_length_ratio, max_length_ratio]`` of the original
(characters); otherwise the original is kept, so a flaky or verbose rewriter degrades to the
plain pairs instead of failing the stage or inflating response length, which DPO rewards.

Requests go through ``eva_runtime.llm_client``: the API key is read when the rewriter is
loaded from the variable *named* by ``llm.api_key_env`` (never part of the config, whose dump
lands in manifests), and the request counts join the stage's stats as ``rewrite_*``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from eva_runtime.llm_client import LLMClient, LLMRequestError
from eva_runtime.llm_config import NamedLLMConfig
from tasks.backends.protocols import Progress, no_progress

_log = logging.getLogger(__name__)

DEFAULT_TEMPLATE = (
    "Below is an instruction and a response to it. Rewrite the response to be more helpful and "
    "to go into more depth, while keeping it about the same length as the original. Keep what "
    "is correct, fix what is wrong, and do not mention that it was rewritten. Reply with the "
    "rewritten response only.\n\n### Instruction\n{prompt}\n\n### Response\n{response}"
)


class RewriterConfig(BaseModel):
    """Where and how to rewrite chosen responses."""

    version: ClassVar[int] = 1  # bump when a change can change what it computes
    libraries: ClassVar[tuple[str, ...]] = ()

    model_config = ConfigDict(frozen=True, extra="forbid")

    llm: NamedLLMConfig = Field(
        description="Endpoint, model (required), key, concurrency, timeout and retries."
    )
    template: str = Field(
        default=DEFAULT_TEMPLATE, description="User message; {prompt} and {response} are filled."
    )
    temperature: float = Field(default=0.7, ge=0)
    max_tokens: int | None = Field(default=None, ge=1, description="Cap on rewrite tokens.")
    min_length_ratio: float = Field(default=0.5, gt=0)
    max_length_ratio: float = Field(default=2.0, gt=0)

    @field_validator("template")
    @classmethod
    def _has_placeholders(cls, value: str) -> str:
        for name in ("{prompt}", "{response}"):
            if name not in value:
                raise ValueError(f"template must contain {name}")
        return value

    def load(self) -> Rewriter:
        return Rewriter(self)


@dataclass
class RewriteResult:
    """The responses to train on and what happened to each original."""

    responses: list[str]
    rewritten: int = 0
    failed: int = 0  # no usable answer after retries (HTTP error, timeout, bad body)
    empty: int = 0
    length_rejected: int = 0
    requests: dict[str, int] = field(default_factory=dict)  # the client's counts

    def stats(self) -> dict[str, int]:
        return {
            "rewrite_rewritten": self.rewritten,
            "rewrite_kept_failed": self.failed,
            "rewrite_kept_empty": self.empty,
            "rewrite_kept_length": self.length_rejected,
            **{f"rewrite_{k}": v for k, v in self.requests.items()},
        }


class Rewriter:
    def __init__(self, config: RewriterConfig):
        self.config = config
        self.client = LLMClient(config.llm)  # a missing API key raises here

    def close(self) -> None:
        self.client.close()

    def rewrite(
        self, prompts: Sequence[str], responses: Sequence[str], progress: Progress = no_progress
    ) -> RewriteResult:
        """Rewrite every response (in parallel, order kept); never raises for one bad answer."""
        if len(prompts) != len(responses):
            raise ValueError(f"{len(prompts)} prompts for {len(responses)} responses")
        cfg = self.config
        before = self.client.stats()
        answers = self.client.map(
            lambda i: self._request(prompts[i], responses[i]), range(len(prompts)), progress
        )
        result = RewriteResult(responses=list(responses))
        for i, (original, answer) in enumerate(zip(responses, answers, strict=True)):
            if answer is None:
                result.failed += 1
            elif not answer.strip():
                result.empty += 1
            elif not (
                cfg.min_length_ratio * len(original)
                <= len(answer.strip())
                <= cfg.max_length_ratio * len(original)
            ):
                result.length_rejected += 1
            else:
                result.responses[i] = answer.strip()
                result.rewritten += 1
        result.requests = self.client.stats_since(before)
        if result.rewritten < len(prompts):
            _log.warning("rewriter kept some originals: %s", result.stats())
        return result

    def _request(self, prompt: str, response: str) -> str | None:
        """The rewrite, or None once retries are spent or the failure is not transient."""
        cfg = self.config
        message = cfg.template.replace("{prompt}", prompt).replace("{response}", response)
        sampling: dict[str, object] = {"temperature": cfg.temperature}
        if cfg.max_tokens is not None:
            sampling["max_tokens"] = cfg.max_tokens
        try:
            texts = self.client.chat([{"role": "user", "content": message}], **sampling)
        except LLMRequestError as exc:
            _log.debug("rewriter request failed: %s", exc)
            return None
        return texts[0] if texts else None

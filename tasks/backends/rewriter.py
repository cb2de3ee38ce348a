"""Rewrite chosen responses before training (eva paper, appendix H.2.1).

An optional solver-side step: an LLM behind any OpenAI-compatible endpoint rewrites each chosen
response "for helpfulness and depth at similar length". A rewrite is used only when it came back,
is not empty, and its length is within ``[min_length_ratio, max_length_ratio]`` of the original
(characters); otherwise the original is kept, so a flaky or verbose rewriter degrades to the
plain pairs instead of failing the stage or inflating response length, which DPO rewards.

The API key is read at call time from the environment variable *named* by ``api_key_env``: the
key itself is never part of the config (whose dump lands in manifests) nor logged.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
from pydantic import BaseModel, ConfigDict, Field, field_validator

from tasks.backends.protocols import Progress, no_progress

_log = logging.getLogger(__name__)

DEFAULT_TEMPLATE = (
    "Below is an instruction and a response to it. Rewrite the response to be more helpful and "
    "to go into more depth, while keeping it about the same length as the original. Keep what "
    "is correct, fix what is wrong, and do not mention that it was rewritten. Reply with the "
    "rewritten response only.\n\n### Instruction\n{prompt}\n\n### Response\n{response}"
)
_RETRY_STATUS = {408, 409, 425, 429}  # plus every 5xx: transient by HTTP's own definition


class RewriterConfig(BaseModel):
    """Where and how to rewrite chosen responses."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    base_url: str = Field(description="OpenAI-compatible API root, e.g. http://host:8000/v1.")
    model: str = Field(description="Model name sent with every request.")
    api_key_env: str | None = Field(
        default=None, description="Name of the environment variable holding the API key."
    )
    template: str = Field(
        default=DEFAULT_TEMPLATE, description="User message; {prompt} and {response} are filled."
    )
    temperature: float = Field(default=0.7, ge=0)
    max_tokens: int | None = Field(default=None, ge=1, description="Cap on rewrite tokens.")
    timeout_s: float = Field(default=60.0, gt=0, description="Per-request timeout.")
    max_retries: int = Field(default=3, ge=0, description="Retries after a transient failure.")
    retry_backoff_s: float = Field(default=1.0, ge=0, description="First retry delay; doubles.")
    concurrency: int = Field(default=8, ge=1, description="Requests in flight at once.")
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

    def stats(self) -> dict[str, int]:
        return {
            "rewrite_rewritten": self.rewritten,
            "rewrite_kept_failed": self.failed,
            "rewrite_kept_empty": self.empty,
            "rewrite_kept_length": self.length_rejected,
        }


class Rewriter:
    def __init__(self, config: RewriterConfig):
        self.config = config

    def rewrite(
        self, prompts: Sequence[str], responses: Sequence[str], progress: Progress = no_progress
    ) -> RewriteResult:
        """Rewrite every response (in parallel, order kept); never raises for one bad answer."""
        if len(prompts) != len(responses):
            raise ValueError(f"{len(prompts)} prompts for {len(responses)} responses")
        cfg = self.config
        headers = {}
        if cfg.api_key_env is not None:
            key = os.environ.get(cfg.api_key_env)
            if not key:
                raise ValueError(f"rewriter: environment variable {cfg.api_key_env} is not set")
            headers["Authorization"] = f"Bearer {key}"
        result = RewriteResult(responses=list(responses))
        done, lock = 0, threading.Lock()

        def one(i: int, client: httpx.Client) -> None:
            nonlocal done
            answer = self._request(client, prompts[i], responses[i])
            with lock:
                original = responses[i]
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
                done += 1
                progress(done / len(prompts))

        # httpx.Client is thread-safe; one connection pool sized to the concurrency.
        limits = httpx.Limits(max_connections=cfg.concurrency)
        with (
            httpx.Client(
                base_url=cfg.base_url, headers=headers, timeout=cfg.timeout_s, limits=limits
            ) as client,
            ThreadPoolExecutor(max_workers=cfg.concurrency) as pool,
        ):
            list(pool.map(lambda i: one(i, client), range(len(prompts))))
        if result.rewritten < len(prompts):
            _log.warning("rewriter kept some originals: %s", result.stats())
        return result

    def _request(self, client: httpx.Client, prompt: str, response: str) -> str | None:
        """The rewrite, or None once retries are spent or the failure is not transient."""
        cfg = self.config
        message = cfg.template.replace("{prompt}", prompt).replace("{response}", response)
        body: dict[str, object] = {
            "model": cfg.model,
            "messages": [{"role": "user", "content": message}],
            "temperature": cfg.temperature,
        }
        if cfg.max_tokens is not None:
            body["max_tokens"] = cfg.max_tokens
        for attempt in range(cfg.max_retries + 1):
            if attempt:
                time.sleep(cfg.retry_backoff_s * 2 ** (attempt - 1))
            try:
                reply = client.post("chat/completions", json=body)
            except httpx.TransportError as exc:  # timeouts, refused connections, resets
                _log.debug("rewriter request failed (%s), attempt %d", type(exc).__name__, attempt)
                continue
            if reply.status_code in _RETRY_STATUS or reply.status_code >= 500:
                continue
            if reply.status_code >= 400:
                return None
            try:
                content = reply.json()["choices"][0]["message"]["content"]
            except (ValueError, KeyError, IndexError, TypeError):
                return None
            return content if isinstance(content, str) else None
        return None

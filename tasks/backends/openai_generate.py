"""Rollouts from any OpenAI-compatible server (``vllm serve``, SGLang, TGI, a hosted API).

This is the GPU path that keeps vLLM out of eva's environment: vLLM pins torch, transformers
and fastapi versions that cannot coexist with prefect 3.8, so the policy is served from its own
environment and the stage talks to it over HTTP.

Requests run on a thread pool (at most ``concurrency`` in flight); a sync client avoids fighting
over an event loop with Prefect, which runs sync tasks in worker threads. Every prompt gets a
seed derived from ``(seed, prompt index)`` alone, so rollouts do not depend on concurrency,
scheduling or retries. The API key is read from the environment at load time and lives only in
the loaded generator's HTTP headers: never in the config, so never in manifests or config hashes.
"""

from __future__ import annotations

import hashlib
import os
import random
import threading
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field, model_validator

from tasks.backends.protocols import Progress, no_progress

# Keys the backend sets itself; extra_body may not override them (it would silently change what
# the config hash claims was sampled).
_MANAGED_KEYS = frozenset(
    {"model", "messages", "prompt", "n", "seed", "temperature", "top_p", "max_tokens", "stream"}
)


def derive_seed(seed: int, prompt_index: int) -> int:
    """A 30-bit per-prompt seed. vLLM seeds sample ``j`` of an ``n > 1`` request with
    ``seed + j``; 30 bits leave room for that below 2**31 (servers that parse int32 accept it)."""
    digest = hashlib.blake2b(f"{seed}:{prompt_index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x3FFFFFFF


class GenerationError(RuntimeError):
    """Some prompts got no responses after every retry; no partial output is returned, because
    a response-less prompt would silently skew rewards and pairs downstream."""

    def __init__(self, message: str, failed: dict[int, str]):
        super().__init__(message)
        self.failed = failed  # prompt index -> last error


class _RequestFailed(Exception):
    """One request failed for good (retries exhausted, or an error that retrying cannot fix)."""


class _Aborted(Exception):
    """Another prompt already failed for good: stop retrying, the stage will fail anyway."""


class OpenAIGeneration(BaseModel):
    """Sample responses from an OpenAI-compatible HTTP endpoint (e.g. ``vllm serve``)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["openai"] = "openai"
    base_url: str = Field(
        default="http://127.0.0.1:8000/v1", description="API root, `vllm serve`'s by default."
    )
    model: str | None = Field(
        default=None,
        description="Served model name; None = the checkpoint directory given to the stage, "
        "which is the name `vllm serve DIR` serves it under.",
    )
    api_key_env: str | None = Field(
        default="OPENAI_API_KEY",
        description="Environment variable holding the API key (read at load time, never "
        "stored). Unset or None = no Authorization header.",
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
    concurrency: int = Field(default=16, ge=1, description="Most requests in flight at once.")
    timeout_s: float = Field(default=120.0, gt=0, description="Per-request timeout in seconds.")
    max_retries: int = Field(
        default=4,
        ge=0,
        description="Retries after a timeout, connection error, 429 or 5xx (not other 4xx).",
    )
    backoff_s: float = Field(
        default=1.0, ge=0, description="First retry delay; doubles each retry, with jitter."
    )
    max_backoff_s: float = Field(default=30.0, ge=0, description="Cap on one retry delay.")
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
        """A generator for the model served as ``self.model`` (default: ``model_dir``)."""
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return OpenAIGenerator(self, self.model or model_dir, headers)


class OpenAIGenerator:
    """A served policy that satisfies the ``Generator`` protocol."""

    def __init__(self, config: OpenAIGeneration, model: str, headers: dict[str, str]):
        self.config = config
        self.model = model
        self._headers = headers  # may hold the key: keep it out of repr and error messages
        self._path = "chat/completions" if config.endpoint == "chat" else "completions"

    def __repr__(self) -> str:
        return f"OpenAIGenerator(model={self.model!r}, base_url={self.config.base_url!r})"

    def _body(self, prompt: str, n: int, seed: int) -> dict[str, Any]:
        cfg = self.config
        body: dict[str, Any] = {**cfg.extra_body, "model": self.model, "n": n, "seed": seed}
        body.update(temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=cfg.max_tokens)
        if cfg.endpoint == "chat":
            system = [{"role": "system", "content": cfg.system_prompt}] if cfg.system_prompt else []
            body["messages"] = [*system, {"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        return body

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        cfg = self.config
        # "Equal jitter": half fixed, half random, so clients that failed together spread out
        # without any of them retrying almost at once.
        delay = min(cfg.max_backoff_s, cfg.backoff_s * 2**attempt) * random.uniform(0.5, 1.0)
        if retry_after is not None:  # the server knows best, within our cap
            delay = max(delay, min(retry_after, cfg.max_backoff_s))
        return delay

    def _post(
        self, client: httpx.Client, body: dict[str, Any], abort: threading.Event
    ) -> list[str]:
        """One request with retries; returns the choices' texts in ``index`` order."""
        cfg = self.config
        for attempt in range(cfg.max_retries + 1):
            if abort.is_set():
                raise _Aborted
            retry_after = None
            try:
                resp = client.post(self._path, json=body)
            except httpx.TimeoutException:
                error = f"timed out after {cfg.timeout_s:g} s"
            except httpx.TransportError as exc:  # connect/read errors, dropped connections
                error = f"{type(exc).__name__}: {exc}"
            else:
                if resp.status_code == 200:
                    return _texts(resp, body["n"], cfg.endpoint)
                error = f"HTTP {resp.status_code}: {_detail(resp)}"
                if resp.status_code != 429 and resp.status_code < 500:
                    raise _RequestFailed(f"{error} (not retried)")
                retry_after = _retry_after(resp)
            if attempt == cfg.max_retries:
                raise _RequestFailed(f"{error} (gave up after {attempt + 1} attempts)")
            if abort.wait(self._delay(attempt, retry_after)):
                raise _Aborted
        raise AssertionError("unreachable")

    def generate(
        self, prompts: Sequence[str], n: int, seed: int, progress: Progress = no_progress
    ) -> list[list[str]]:
        """``n`` responses per prompt, in sample order; raises ``GenerationError`` if any
        prompt still fails after its retries (in-flight work finishes, nothing new starts)."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        cfg = self.config
        # (prompt index, first sample index, samples) per request
        jobs = [(i, 0, n) for i in range(len(prompts))]
        if not cfg.n_per_request:
            jobs = [(i, j, 1) for i in range(len(prompts)) for j in range(n)]
        results = [[""] * n for _ in prompts]
        missing = [n] * len(prompts)  # samples still to come, per prompt
        failed: dict[int, str] = {}
        done = 0
        abort = threading.Event()  # per call: a generator may serve several stages at once
        limits = httpx.Limits(max_connections=cfg.concurrency, max_keepalive_connections=None)
        client = httpx.Client(
            base_url=cfg.base_url, headers=self._headers, timeout=cfg.timeout_s, limits=limits
        )
        with client, ThreadPoolExecutor(cfg.concurrency, thread_name_prefix="openai-gen") as pool:
            pending: dict[Future[list[str]], tuple[int, int, int]] = {}
            queue = iter(jobs)
            try:
                while True:
                    # Submit lazily: at most `concurrency` futures exist, so a million-prompt
                    # stage does not allocate a million futures, and a failure stops the rest.
                    while len(pending) < cfg.concurrency and not failed:
                        job = next(queue, None)
                        if job is None:
                            break
                        i, j, count = job
                        body = self._body(prompts[i], count, derive_seed(seed, i) + j)
                        pending[pool.submit(self._post, client, body, abort)] = job
                    if not pending:
                        break
                    finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                    for future in finished:
                        i, j, count = pending.pop(future)
                        try:
                            results[i][j : j + count] = future.result()
                        except _Aborted:
                            continue
                        except _RequestFailed as exc:
                            failed.setdefault(i, str(exc))
                            abort.set()
                            continue
                        missing[i] -= count
                        if missing[i] == 0:
                            done += 1
                            progress(done / len(prompts))  # on this thread, never a worker
            finally:
                abort.set()  # an interrupt or failure: workers stop retrying
        if failed:
            first = min(failed)
            raise GenerationError(
                f"generation via {cfg.base_url} stopped: {len(failed)} prompt(s) failed "
                f"({done} of {len(prompts)} were complete); first: prompt {first}: "
                f"{failed[first]}",
                failed,
            )
        return results


def _texts(resp: httpx.Response, n: int, endpoint: str) -> list[str]:
    try:
        choices = sorted(resp.json()["choices"], key=lambda c: c.get("index", 0))
        if endpoint == "chat":
            # content is null for a refusal or an empty turn: that is an (empty) answer.
            texts = [c["message"].get("content") or "" for c in choices]
        else:
            texts = [c.get("text") or "" for c in choices]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise _RequestFailed(f"malformed response ({exc!r}): {resp.text[:200]!r}") from exc
    if len(texts) != n:
        raise _RequestFailed(
            f"asked for n={n} samples, got {len(texts)}: if the server ignores `n`, set "
            "n_per_request=false"
        )
    return texts


def _detail(resp: httpx.Response) -> str:
    """The server's error message (vLLM says why, e.g. the prompt exceeds max_model_len)."""
    try:
        error = resp.json().get("error")
        message = error.get("message") if isinstance(error, dict) else error
        if message:
            return str(message)[:300]
    except (ValueError, AttributeError):
        pass
    return resp.text[:300] or resp.reason_phrase


def _retry_after(resp: httpx.Response) -> float | None:
    try:
        return float(resp.headers["retry-after"])
    except (KeyError, ValueError):
        return None  # absent, or an HTTP date: fall back to our own backoff

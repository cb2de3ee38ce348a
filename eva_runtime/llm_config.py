"""Where an OpenAI-compatible endpoint is and how to reach it: the ``llm:`` block every
LLM-backed backend takes, the helpers that turn it into a model name and request headers, and
``redact``, which keeps the key out of every text the client shows.

Kept apart from the client (``eva_runtime.llm_client``) so that code which only validates or
inspects configs (``flows.inputs`` checks every key before a run writes anything) needs no HTTP
client. What it guarantees:

- one config shape and one set of defaults for every endpoint: generation, judges, the rewriter
  and both LLM evolvers, distilabel's included, since its requests go through the same client;
- the API key is read from the variable *named* by ``api_key_env``, when asked for, and is never
  a config field: never in manifests, config hashes or reprs. A named variable that is unset or
  empty is an ``LLMConfigError`` (one line naming the variable), before any request is sent;
- ``redact`` cuts the key, and anything shaped like a secret (bearer tokens, header values,
  ``sk-...`` keys), out of text the client shows;
- ``NamedLLMConfig`` for users that have no checkpoint to fall back on, so a missing model fails
  when the config is validated rather than at the first request.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from typing import Annotated
from urllib.parse import quote, urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from eva_runtime.errors import ConfigError

# Requests failed for good in a row (timeouts, refused or dropped connections, 408, 429, 5xx)
# after which an endpoint counts as down: each already spent its retries (seconds of backoff), so
# three in a row with no answer between them is an endpoint that is down or refuses everything,
# not a blip or one bad prompt.
BREAKER_FAILURES = 3


class LLMClientConfig(BaseModel):
    """Where an OpenAI-compatible endpoint is and how to talk to it (not what to sample)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    base_url: str = Field(
        default="http://127.0.0.1:8000/v1",
        description="API root, e.g. https://api.openai.com/v1; `vllm serve`'s by default.",
    )
    model: str | None = Field(
        default=None,
        description="Model name sent with every request. None: the generation backends ask for "
        "the stage's checkpoint directory (the name `vllm serve DIR` serves it under); every "
        "other user needs it set.",
    )
    api_key_env: str | None = Field(
        default=None,
        description="Name of the environment variable holding the API key (read when the "
        "client is built, never stored); it must then be set and non-empty. None: no key, "
        "for local servers.",
    )
    concurrency: int = Field(default=16, ge=1, description="Most requests in flight at once.")
    timeout_s: float = Field(
        default=120.0,
        gt=0,
        description="Wall-clock limit on one attempt of a request, whole: connecting, sending, "
        "waiting and reading (a server sending a byte now and then cannot stretch it); a "
        "timed-out attempt is retried.",
    )
    max_retries: int = Field(
        default=4,
        ge=0,
        description="Retries after a timeout, dropped connection, 408, 429 or 5xx (not after "
        "another 4xx).",
    )
    backoff_s: float = Field(
        default=1.0, ge=0, description="First retry delay; doubles each retry, with jitter."
    )
    max_backoff_s: float = Field(
        default=30.0,
        ge=0,
        description="Cap on one retry delay, Retry-After included: a server asking for longer "
        "is retried after this many seconds (logged once).",
    )
    breaker_failures: int | None = Field(
        default=BREAKER_FAILURES,
        ge=1,
        # Keyed only when set (tasks/keys.py): the cache keys of stages that hold an endpoint
        # config written before the field existed hold.
        json_schema_extra={"key": "unless default"},
        description="The endpoint is down once this many requests in a row failed for good "
        "(retries spent) on timeouts, refused or dropped connections, 408, 429 or 5xx while it "
        "answered nothing else: the client then stops, and every later request fails at once. "
        "null: never.",
    )

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        # Refused when the config is read: httpx would only say so at the first request, and
        # a typo would otherwise pass for an endpoint that is down.
        parts = urlsplit(value.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("not an http(s) URL with a host, e.g. http://127.0.0.1:8000/v1")
        return value.strip()


def _model_is_set(config: LLMClientConfig) -> LLMClientConfig:
    if not config.model:
        raise ValueError("model: required here, the name the endpoint serves the model under")
    return config


# For users that have no checkpoint to fall back on: the missing model fails at validation.
NamedLLMConfig = Annotated[LLMClientConfig, AfterValidator(_model_is_set)]


class LLMConfigError(ConfigError):
    """The client cannot be built from its config: the key's variable is unset, or no model."""


def api_key(config: LLMClientConfig) -> str | None:
    """The key from the variable named by ``api_key_env`` (None when it names none)."""
    if config.api_key_env is None:
        return None
    key = os.environ.get(config.api_key_env, "").strip()
    if not key:
        raise LLMConfigError(
            f"llm.api_key_env: environment variable {config.api_key_env} is unset or empty; "
            "export the key, or set llm.api_key_env to null for a server without one"
        )
    return key


def auth_headers(config: LLMClientConfig) -> dict[str, str]:
    """The request headers that carry the key ({} without one)."""
    key = api_key(config)
    return {"Authorization": f"Bearer {key}"} if key else {}


def model_name(config: LLMClientConfig, default: str | None = None) -> str:
    """The model to request: ``config.model``, else ``default`` (a checkpoint directory)."""
    name = config.model or default
    if not name:
        raise LLMConfigError("llm.model: no model name; set it to the endpoint's model")
    return name


REDACTED = "[redacted]"
# Secrets by their shape, in text eva did not write (an error body, an exception): the value of
# an Authorization or API-key header or parameter whatever its scheme (first, so that its scheme
# goes with it), a bearer token, an OpenAI-style key. A value never starts with "[", so text
# already redacted stays as it is.
_SECRET_SHAPES = (
    re.compile(
        r"(?i)((?:proxy-)?authorization|api[-_]?key)(['\"]?\s*[:=]\s*['\"]?)"
        r"(?:(?:bearer|basic|token)\s+)?[^\s'\",;&{}\[\]]+"
    ),
    re.compile(r"(?i)(\bbearer\s+)[\w.~+/=-]+"),
    re.compile(r"(?<![\w-])sk-[\w-]{8,}"),
)


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with each of ``secrets`` (as is, JSON-escaped or URL-quoted, as a body or a URL
    may carry it) and every secret-shaped value (see ``_SECRET_SHAPES``) replaced by
    ``[redacted]``. The one place the client turns what it was told into text it shows."""
    forms = {form for s in secrets if s for form in (s, json.dumps(s)[1:-1], quote(s, safe=""))}
    for form in sorted(forms, key=len, reverse=True):  # a longer form may contain a shorter
        text = text.replace(form, REDACTED)
    for shape in _SECRET_SHAPES:
        text = shape.sub(lambda m: "".join(g for g in m.groups() if g) + REDACTED, text)
    return text

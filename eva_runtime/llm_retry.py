"""When the LLM client (``eva_runtime.llm_client``) retries a request, how long it waits, and when
it stops retrying altogether: the retry policy and the circuit breaker.

- Retried: timeouts, dropped connections, 408, 429 and 5xx (``retried``); never another 4xx,
  which no retry fixes (a bad key, an unknown model, a prompt over the context length).
- Each retry waits ``backoff_s * 2**attempt`` with jitter, capped by ``max_backoff_s``, and
  never less than the server's ``Retry-After`` up to that cap; a longer one is logged once a
  client, with the cap (``Backoff``).
- The breaker (``Breaker``): once ``breaker_failures`` requests in a row spent their retries (on
  timeouts, refused or dropped connections, 408, 429 or 5xx) while the endpoint answered nothing
  else (no 2xx, no other 4xx) meanwhile, it is down or refuses everything. That request and
  every later one (retries in flight included) raise ``LLMEndpointDown``, one line naming the
  endpoint and what it last answered. It is no ``LLMRequestError``, so no caller that tolerates
  a failed request (an empty rewrite, a lost comparison) swallows it: a dead endpoint ends the
  stage after about ``(max_retries + 1) * (timeout_s + max_backoff_s)`` seconds, times
  ``breaker_failures / concurrency`` rounded up, instead of spending every request's retries.
"""

from __future__ import annotations

import logging
import random
import threading

import httpx

from eva_runtime.errors import EvaError
from eva_runtime.llm_config import LLMClientConfig

_log = logging.getLogger(__name__)

# Answers that are no answer: the server (or a proxy) is up but serves nothing. Retried, and for
# the breaker the same as no answer at all, so a quota that refuses every request stops the stage.
REFUSED_STATUS = frozenset({408, 429})

BREAKER_HINT = "start or fix the server; llm.breaker_failures sets how many failures stop it"
REFUSED_HINT = (
    "the endpoint refuses every request (a rate limit or a spent quota): wait, lower "
    "llm.concurrency or raise the quota; llm.breaker_failures sets how many failures stop it"
)
TIMEOUT_HINT = (
    "start or fix the server, or raise llm.timeout_s if its answers are only slow; "
    "llm.breaker_failures sets how many failures stop it"
)


class LLMEndpointDown(EvaError, RuntimeError):
    """The circuit breaker is open: the endpoint is down (see the module docstring)."""


def retried(status: int) -> bool:
    """An HTTP error status worth another attempt: 408, 429 or 5xx (no retry fixes another
    4xx)."""
    return status in REFUSED_STATUS or status >= 500


def retry_after(resp: httpx.Response) -> float | None:
    """The seconds the server's ``Retry-After`` asks for, None when it names none."""
    try:
        return max(0.0, float(resp.headers["retry-after"]))
    except (KeyError, ValueError):
        return None  # absent, or an HTTP date: fall back to our own backoff


class Backoff:
    """How long a retry waits. Thread-safe."""

    def __init__(self, config: LLMClientConfig):
        self.config = config
        self._lock = threading.Lock()
        self._capped_said = False  # a Retry-After over max_backoff_s was logged (once a client)

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """The wait before retry ``attempt + 1``, in seconds."""
        cfg = self.config
        # "Equal jitter": half fixed, half random, so clients that failed together spread out
        # without any of them retrying almost at once.
        delay = min(cfg.max_backoff_s, cfg.backoff_s * 2**attempt) * random.uniform(0.5, 1.0)
        if retry_after is not None:  # the server knows best, within our cap
            delay = max(delay, min(retry_after, cfg.max_backoff_s))
            if retry_after > cfg.max_backoff_s:
                self._say_capped(retry_after)
        return delay

    def _say_capped(self, retry_after: float) -> None:
        """Log, once a client, that a Retry-After was cut to ``max_backoff_s``: an hour's wait
        asked of every request would otherwise be silently shortened, or stall the stage."""
        with self._lock:
            if self._capped_said:
                return
            self._capped_said = True
        cfg = self.config
        stop = (
            f"stops once llm.breaker_failures = {cfg.breaker_failures} requests in a row were "
            "refused"
            if cfg.breaker_failures is not None
            else "retries every request (llm.breaker_failures is null)"
        )
        _log.warning(
            "%s asks to wait %g s before a retry (Retry-After); eva waits at most "
            "llm.max_backoff_s = %g s, and %s", cfg.base_url, retry_after, cfg.max_backoff_s, stop,
        )  # fmt: skip


class Breaker:
    """The circuit breaker of one client (see the module docstring). Thread-safe."""

    def __init__(self, config: LLMClientConfig):
        self.config = config
        self._lock = threading.Lock()
        # Answers so far (any status below 500: the server is up), requests that failed for good
        # in a row with no answer at all while they were retrying, the verdict.
        self.answers = 0
        self._down_streak = 0
        self._down: str | None = None  # the breaker's message once open
        self._down_hint = BREAKER_HINT  # what to do about it, by what the endpoint last did
        self._tripped = threading.Event()  # wakes retries waiting out a backoff

    def check(self) -> None:
        """Raise ``LLMEndpointDown`` once the breaker is open."""
        if self._down is not None:
            raise LLMEndpointDown(self._down, field="llm.base_url", hint=self._down_hint)

    def answered(self) -> None:
        """The endpoint answered (a 2xx, or a 4xx it refused this request with): it is up."""
        with self._lock:
            self.answers += 1
            self._down_streak = 0

    def failed_for_good(
        self, error: str, answers_before: int, timed_out: bool, status: int | None
    ) -> None:
        """A request spent its retries on timeouts, refused or dropped connections, 408, 429 or
        5xx. It counts towards the breaker only if the endpoint answered nothing at all while it
        retried (``answers`` was ``answers_before`` when it started: a prompt the server fails
        on, or one too long to finish in time, while it answers others, is no outage); the
        breaker opens at ``breaker_failures`` in a row, and this request reports it."""
        cfg = self.config
        with self._lock:
            if self.answers == answers_before:
                self._down_streak += 1
            limit = cfg.breaker_failures
            if self._down is None and limit is not None and self._down_streak >= limit:
                self._down = (
                    f"{cfg.base_url} is down or refuses every request: {self._down_streak} "
                    f"requests in a row failed after {cfg.max_retries + 1} attempts each, and "
                    f"it answered nothing else meanwhile; last: {error}"
                )
                if timed_out:
                    self._down_hint = TIMEOUT_HINT
                elif status in REFUSED_STATUS:
                    self._down_hint = REFUSED_HINT
        if self._down is not None:
            self._tripped.set()
            self.check()

    def wait(self, seconds: float) -> None:
        """Wait out a backoff of ``seconds``, cut short when the breaker opens meanwhile."""
        self._tripped.wait(seconds)

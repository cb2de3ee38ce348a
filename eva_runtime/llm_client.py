"""The one OpenAI-compatible HTTP client every LLM-backed backend uses (``vllm serve``, SGLang,
TGI, a hosted API): policy rollouts, the pairwise and complexity judges, the chosen-response
rewriter, the paper evolver, and distilabel's tasks through the adapter in
``eva_runtime.distilabel_llm``. Its config, the key lookup and the model name live in
``eva_runtime.llm_config``.

It is synchronous and runs requests on threads: a sync client avoids fighting over an event loop
with Prefect, which runs sync tasks in worker threads. What it guarantees, for every caller:

- at most ``concurrency`` requests in flight per client, whatever threads call it;
- retries after timeouts, dropped connections, 408, 429 and 5xx (never after another 4xx, which
  no retry fixes: a bad key, an unknown model, a prompt over the context length), each delayed
  by ``backoff_s * 2**attempt`` with jitter, capped by ``max_backoff_s``, and never sooner than
  the server's ``Retry-After``;
- the API key is read from the variable *named* by ``api_key_env`` when the client is built and
  lives only in its HTTP headers: never in the config, so never in manifests or config hashes.
  A named variable that is unset or empty is an error then, before any request is sent;
- one set of counts (``stats()``): HTTP requests sent, retries, requests that failed for good,
  and prompt/completion tokens from each answer's ``usage``;
- a request that fails for good raises ``LLMRequestError``, which says whether it was transient
  (retries spent), a timeout, or a configuration error (401/403/404) no later request can avoid;
- a circuit breaker: once ``breaker_failures`` requests in a row failed for good on a refused or
  dropped connection or a 5xx, and the endpoint answered nothing (no status below 500) while any
  of them retried, the endpoint is down. That request
  and every later one (retries in flight included) raise ``LLMEndpointDown``, one line naming
  the endpoint and what it last answered. It is no ``LLMRequestError``, so no caller that
  tolerates a failed request (an empty rewrite, a lost comparison) swallows it: the stage fails
  in seconds instead of spending every request's retries against a dead server.
"""

from __future__ import annotations

import hashlib
import random
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, NamedTuple, TypeVar

import httpx

from eva_runtime.errors import EvaError
from eva_runtime.llm_config import LLMClientConfig, auth_headers, model_name

T = TypeVar("T")
R = TypeVar("R")

# A fraction done in [0, 1]; the same shape as the stages' ``Progress`` (this layer imports none
# of theirs).
Progress = Callable[[float], None]

STATS = ("requests", "retries", "failures", "prompt_tokens", "completion_tokens")
# Errors of the endpoint's configuration (key, permissions, model or URL): every request will hit
# them, so callers that tolerate a failed request still stop on these.
CONFIG_STATUS = frozenset({401, 403, 404})


BREAKER_HINT = "start or fix the server; llm.breaker_failures sets how many failures stop it"


def no_progress(_: float) -> None:
    """Default progress sink."""


class LLMRequestError(EvaError, RuntimeError):
    """One request failed for good: its retries are spent (``transient``; ``timed_out`` when the
    last attempt timed out), or retrying cannot fix it (another 4xx, a malformed answer).
    ``status`` is the last HTTP status, if any."""

    def __init__(
        self,
        message: str,
        status: int | None = None,
        transient: bool = False,
        *,
        timed_out: bool = False,
    ):
        super().__init__(message)
        self.status = status
        self.transient = transient
        self.timed_out = timed_out

    @property
    def config_error(self) -> bool:
        return self.status in CONFIG_STATUS


class LLMBatchError(EvaError, RuntimeError):
    """``LLMClient.map`` stopped: ``failed`` maps item index -> error, ``completed`` counts the
    items that finished before the stop."""

    def __init__(self, message: str, failed: dict[int, str], completed: int):
        super().__init__(message)
        self.failed = failed
        self.completed = completed


class LLMEndpointDown(EvaError, RuntimeError):
    """The circuit breaker is open: the endpoint is down (see the module docstring)."""


class _Aborted(Exception):
    """Another item of the same ``map`` failed: stop retrying, the batch fails anyway."""


class Reply(NamedTuple):
    """One answer: its choices' texts in ``index`` order ("" for null content), how many had
    null content (a refusal or an empty turn), and the tokens its ``usage`` reports (0 if none)."""

    texts: list[str]
    nulls: int
    prompt_tokens: int
    completion_tokens: int


class LLMClient:
    """Thread-safe; ``close()`` drops its connections."""

    def __init__(self, config: LLMClientConfig, default_model: str | None = None):
        self.config = config
        self.model = model_name(config, default_model)
        headers = auth_headers(config)  # the only place the key lives: keep it out of repr
        limits = httpx.Limits(max_connections=config.concurrency, max_keepalive_connections=None)
        self._http = httpx.Client(
            base_url=config.base_url, headers=headers, timeout=config.timeout_s, limits=limits
        )
        # Bounds requests in flight even when callers bring their own threads.
        self._slots = threading.BoundedSemaphore(config.concurrency)
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(STATS, 0)
        self._local = threading.local()  # the abort event of the ``map`` a thread works for
        # The breaker: answers so far (any status below 500: the server is up), requests that
        # failed for good in a row with no answer at all while they were retrying, the verdict.
        self._answers = 0
        self._down_streak = 0
        self._down: str | None = None  # the breaker's message once open
        self._tripped = threading.Event()  # wakes retries waiting out a backoff

    def __repr__(self) -> str:
        return f"LLMClient(model={self.model!r}, base_url={self.config.base_url!r})"

    def close(self) -> None:
        self._http.close()

    def stats(self) -> dict[str, int]:
        """Counts since the client was built: requests sent (retries included), retries,
        requests that failed for good, prompt and completion tokens."""
        with self._lock:
            return dict(self._counts)

    def stats_since(self, before: dict[str, int]) -> dict[str, int]:
        return {k: v - before.get(k, 0) for k, v in self.stats().items()}

    def chat(self, messages: list[dict[str, str]], **sampling: Any) -> list[str]:
        """The texts of a chat completion's choices, in ``index`` order ("" for null content)."""
        return self.chat_reply(messages, **sampling).texts

    def completions(self, prompt: str, **sampling: Any) -> list[str]:
        """The texts of a (raw prompt) completion's choices, in ``index`` order."""
        return self.completion_reply(prompt, **sampling).texts

    def chat_reply(self, messages: list[dict[str, str]], **sampling: Any) -> Reply:
        """A chat completion as a ``Reply`` (texts, null contents, the answer's tokens)."""
        answer = self.post("chat/completions", {**sampling, "messages": messages})
        return self._reply(answer, lambda c: (c["message"] or {}).get("content"))

    def completion_reply(self, prompt: str, **sampling: Any) -> Reply:
        """A (raw prompt) completion as a ``Reply``."""
        answer = self.post("completions", {**sampling, "prompt": prompt})
        return self._reply(answer, lambda c: c.get("text"))

    def answers(
        self, prompts: Sequence[str], seed: int | None = None, **sampling: Any
    ) -> list[str]:
        """One user-message chat per prompt, concurrently; "" where a request failed for good
        (counted in ``stats``), except configuration errors (401/403/404), which raise. With a
        ``seed``, each request carries ``content_seed(seed, prompt)``."""

        def one(prompt: str) -> str:
            extra = {} if seed is None else {"seed": content_seed(seed, prompt)}
            try:
                texts = self.chat([{"role": "user", "content": prompt}], **sampling, **extra)
            except LLMRequestError as exc:
                if exc.config_error:
                    raise
                return ""
            return texts[0] if texts else ""

        return self.map(one, prompts)

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` (plus the model) with retries; the answer's JSON object."""
        cfg, body = self.config, {**body, "model": self.model}
        abort: threading.Event | None = getattr(self._local, "abort", None)
        answers_before = self._answers
        for attempt in range(cfg.max_retries + 1):
            if abort is not None and abort.is_set():
                raise _Aborted
            self._check_breaker()
            status, retry_after, timed_out = None, None, False
            self._count(requests=1)
            try:
                with self._slots:
                    resp = self._http.post(path, json=body)
            except httpx.TimeoutException:
                error, timed_out = f"timed out after {cfg.timeout_s:g} s", True
            except httpx.TransportError as exc:  # refused, reset or dropped connections
                error = f"{type(exc).__name__}: {exc}"
            else:
                status = resp.status_code
                if status < 500:
                    self._answered()
                if resp.is_success:
                    return self._parsed(resp)
                error = f"HTTP {status}: {_detail(resp)}"
                if status not in (408, 429) and status < 500:
                    self._count(failures=1)
                    raise LLMRequestError(f"{error} (not retried)", status)
                retry_after = _retry_after(resp)
            if attempt == cfg.max_retries:
                self._count(failures=1)
                message = f"{error} (gave up after {attempt + 1} attempts)"
                if not timed_out and status not in (408, 429):  # refused, dropped or 5xx
                    self._failed_for_good(error, answers_before)
                raise LLMRequestError(message, status, transient=True, timed_out=timed_out)
            self._count(retries=1)
            delay = self._delay(attempt, retry_after)
            if abort is not None and abort.wait(delay):
                raise _Aborted
            if abort is None:
                self._tripped.wait(delay)  # cut short when the breaker opens meanwhile
        raise AssertionError("unreachable")

    def _check_breaker(self) -> None:
        if self._down is not None:
            raise LLMEndpointDown(self._down, field="llm.base_url", hint=BREAKER_HINT)

    def _answered(self) -> None:
        with self._lock:
            self._answers += 1
            self._down_streak = 0

    def _failed_for_good(self, error: str, answers_before: int) -> None:
        """A request spent its retries on a refused or dropped connection or a 5xx. It counts
        towards the breaker only if the endpoint answered nothing at all while it retried (a
        prompt the server fails on while it answers others is no outage); the breaker opens
        at ``breaker_failures`` in a row, and this request reports it."""
        limit = self.config.breaker_failures
        with self._lock:
            if self._answers == answers_before:
                self._down_streak += 1
            if self._down is None and limit is not None and self._down_streak >= limit:
                self._down = (
                    f"{self.config.base_url} is down: {self._down_streak} requests in a row "
                    f"failed after {self.config.max_retries + 1} attempts each, and it answered "
                    f"nothing meanwhile; last: {error}"
                )
        if self._down is not None:
            self._tripped.set()
            self._check_breaker()

    def map(
        self, fn: Callable[[T], R], items: Sequence[T], progress: Progress = no_progress
    ) -> list[R]:
        """``fn`` over ``items`` on ``concurrency`` threads, results in item order. An
        ``LLMRequestError`` out of ``fn`` stops the batch: nothing new starts, calls in flight
        stop retrying, and ``LLMBatchError`` names every failed item; any other exception
        propagates after the same stop. ``progress`` runs on the calling thread."""
        results: list[Any] = [None] * len(items)
        failed: dict[int, str] = {}
        crash: BaseException | None = None
        done = 0
        abort = threading.Event()  # per call: one client may serve several stages at once

        def run(i: int) -> R:
            self._local.abort = abort
            try:
                return fn(items[i])
            finally:
                self._local.abort = None

        width = self.config.concurrency
        with ThreadPoolExecutor(width, thread_name_prefix="llm") as pool:
            pending: dict[Future[R], int] = {}
            queue = iter(range(len(items)))
            try:
                while True:
                    # Submit lazily: at most `concurrency` futures exist, so a million prompts
                    # do not allocate a million futures, and a failure stops the rest.
                    while len(pending) < width and not failed and crash is None:
                        i = next(queue, None)
                        if i is None:
                            break
                        pending[pool.submit(run, i)] = i
                    if not pending:
                        break
                    finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                    for future in finished:
                        i = pending.pop(future)
                        try:
                            results[i] = future.result()
                        except _Aborted:
                            continue
                        except LLMRequestError as exc:
                            failed[i] = str(exc)
                            abort.set()
                            continue
                        except Exception as exc:
                            crash = crash or exc
                            abort.set()
                            continue
                        done += 1
                        progress(done / len(items))
            finally:
                abort.set()  # an interrupt or a failure: workers stop retrying
        if crash is not None:
            raise crash
        if failed:
            first = min(failed)
            raise LLMBatchError(
                f"requests to {self.config.base_url} stopped: {len(failed)} of {len(items)} "
                f"failed ({done} were complete); first: item {first}: {failed[first]}",
                failed,
                done,
            )
        return results

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        cfg = self.config
        # "Equal jitter": half fixed, half random, so clients that failed together spread out
        # without any of them retrying almost at once.
        delay = min(cfg.max_backoff_s, cfg.backoff_s * 2**attempt) * random.uniform(0.5, 1.0)
        if retry_after is not None:  # the server knows best, within our cap
            delay = max(delay, min(retry_after, cfg.max_backoff_s))
        return delay

    def _count(self, **deltas: int) -> None:
        with self._lock:
            for key, value in deltas.items():
                self._counts[key] += value

    def _parsed(self, resp: httpx.Response) -> dict[str, Any]:
        try:
            answer = resp.json()
            if not isinstance(answer, dict):
                raise TypeError(f"a JSON {type(answer).__name__}, not an object")
        except (ValueError, TypeError) as exc:
            self._count(failures=1)
            message = f"malformed response ({exc!r}): {resp.text[:200]!r}"
            raise LLMRequestError(message, resp.status_code) from exc
        prompt, completion = _tokens(answer)
        self._count(prompt_tokens=prompt, completion_tokens=completion)
        return answer

    def _reply(self, answer: dict[str, Any], text: Callable[[Any], Any]) -> Reply:
        try:
            choices = sorted(answer["choices"], key=lambda c: c.get("index", 0))
            texts = [text(c) for c in choices]
            if bad := [t for t in texts if t is not None and not isinstance(t, str)]:
                raise TypeError(f"choice text is a {type(bad[0]).__name__}")
        except (KeyError, TypeError, AttributeError) as exc:
            self._count(failures=1)
            raise LLMRequestError(f"malformed response ({exc!r}): {str(answer)[:200]!r}") from exc
        # null content is a refusal or an empty turn: that is an (empty) answer, counted.
        return Reply([t or "" for t in texts], texts.count(None), *_tokens(answer))


def content_seed(seed: int, content: str) -> int:
    """A request seed from the message itself, so it depends on neither batch position nor
    retries; 30 bits, which servers that parse int32 accept."""
    digest = hashlib.blake2b(f"{seed}:{content}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x3FFFFFFF


def _tokens(answer: dict[str, Any]) -> tuple[int, int]:
    """Prompt and completion tokens from the answer's ``usage`` (0 where it has none)."""
    usage = answer.get("usage")
    if not isinstance(usage, dict):
        return 0, 0
    return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)


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
        return max(0.0, float(resp.headers["retry-after"]))
    except (KeyError, ValueError):
        return None  # absent, or an HTTP date: fall back to our own backoff

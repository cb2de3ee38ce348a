"""The one OpenAI-compatible HTTP client every LLM-backed backend uses (``vllm serve``, SGLang,
TGI, a hosted API): policy rollouts, the pairwise and complexity judges, the chosen-response
rewriter, the paper evolver, and distilabel's tasks through the adapter in
``eva_runtime.distilabel_llm``. Its config, the key lookup and the model name live in
``eva_runtime.llm_config``; when it retries and when it stops, in ``eva_runtime.llm_retry``.

It is synchronous and runs requests on threads: a sync client avoids fighting over an event loop
with Prefect, which runs sync tasks in worker threads. What it guarantees, for every caller:

- at most ``concurrency`` requests in flight per client, whatever threads call it;
- each attempt ends within ``timeout_s`` of wall time, whole (connect, send, wait, read): httpx's
  own timeouts bound each socket operation only, so a server that trickles a byte a second would
  hold a request forever; here the caller waits for the attempt's thread until the deadline, and
  the attempt cuts its own timeouts to the time it has left (``LLMClient._attempt``);
- retries after timeouts, dropped connections, 408, 429 and 5xx, never after another 4xx, with
  a backoff that heeds the server's ``Retry-After`` (``eva_runtime.llm_retry``);
- the API key is read from the variable *named* by ``api_key_env`` when the client is built and
  lives only in its HTTP headers: never in the config, so never in manifests or config hashes.
  A named variable that is unset or empty is an error then, before any request is sent. Every
  text the client makes from an answer or an exception (errors it raises, lines it logs) passes
  through ``eva_runtime.llm_config.redact``, since some proxies echo the request's headers in an
  error body;
- one set of counts (``stats()``): HTTP requests sent, retries, requests that failed for good,
  and prompt/completion tokens from each answer's ``usage``;
- a request that fails for good raises ``LLMRequestError``, which says whether it was transient
  (retries spent), a timeout, or a configuration error (401/403/404) no later request can avoid;
- a circuit breaker: once ``breaker_failures`` requests in a row spent their retries while the
  endpoint answered nothing else, that request and every later one raise ``LLMEndpointDown``,
  which no caller that tolerates a failed request swallows (``eva_runtime.llm_retry``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, NamedTuple, TypeVar

import httpx

from eva_runtime.errors import EvaError
from eva_runtime.llm_config import LLMClientConfig, api_key, auth_headers, model_name, redact
from eva_runtime.llm_retry import Backoff, Breaker, retried, retry_after
from eva_runtime.seeds import content_seed as content_seed  # a request's seed

_log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

# A fraction done in [0, 1]; the same shape as the stages' ``Progress`` (this layer imports none
# of theirs).
Progress = Callable[[float], None]

STATS = ("requests", "retries", "failures", "prompt_tokens", "completion_tokens")
# Errors of the endpoint's configuration (key, permissions, model or URL): every request will hit
# them, so callers that tolerate a failed request still stop on these.
CONFIG_STATUS = frozenset({401, 403, 404})
# The longest text a server said that an error quotes (vLLM says why, e.g. max_model_len).
DETAIL_CHARS = 300


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


class _Aborted(Exception):
    """Another item of the same ``map`` failed: stop retrying, the batch fails anyway."""


class Reply(NamedTuple):
    """One answer: its choices' texts in ``index`` order ("" for null content), how many had
    null content (a refusal or an empty turn), the tokens its ``usage`` reports (0 if none), and
    each choice's ``finish_reason`` (``"length"``: cut at ``max_tokens``; None where the server
    gives none)."""

    texts: list[str]
    nulls: int
    prompt_tokens: int
    completion_tokens: int
    finish_reasons: list[str | None]


class LLMClient:
    """Thread-safe; ``close()`` drops its connections."""

    def __init__(self, config: LLMClientConfig, default_model: str | None = None):
        self.config = config
        self.model = model_name(config, default_model)
        headers = auth_headers(config)  # the only place the key is sent from: keep it out of repr
        # The key as sent, kept to be cut out of whatever an endpoint echoes back (``redact``).
        self._secrets = tuple(filter(None, [api_key(config)]))
        limits = httpx.Limits(max_connections=config.concurrency, max_keepalive_connections=None)
        # httpx's timeout bounds each operation and the wait for a pooled connection; each
        # request also sets its own, the time its attempt has left (``_attempt``).
        self._http = httpx.Client(
            base_url=config.base_url, headers=headers, timeout=config.timeout_s, limits=limits
        )
        # Bounds requests in flight even when callers bring their own threads.
        self._slots = threading.BoundedSemaphore(config.concurrency)
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(STATS, 0)
        self._local = threading.local()  # the abort event of the ``map`` a thread works for
        self._backoff = Backoff(config)
        self._breaker = Breaker(config)

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

    def probe(self, timeout_s: float = 10.0) -> tuple[str | None, list[str] | None]:
        """One GET of the endpoint's model list, with the key and no retry: why it cannot be
        used (None when it answered) and the model ids it lists (None when it lists none).

        For checks before a run (``flows.inputs``): no connection, a timeout, a gateway's 502,
        503 or 504 (a proxy with nothing behind it) or a 401/403 for the key are reasons; any
        other answer, a server without ``/models`` included, is an endpoint that is up. Not
        counted in ``stats``: it is no request of a stage."""
        try:
            resp = self._http.get("models", timeout=min(timeout_s, self.config.timeout_s))
        except httpx.HTTPError as exc:
            said = self._text(exc, DETAIL_CHARS)
            return f"cannot be reached ({type(exc).__name__}: {said})", None
        status = resp.status_code
        if status in (401, 403) or status in (502, 503, 504):
            said = self._text(_detail(resp), DETAIL_CHARS)
            what = "refuses the key" if status < 500 else "answers no model"
            return f"{what} (HTTP {status}: {said})", None
        try:
            listed = resp.json().get("data") if resp.is_success else None
            ids = [str(m["id"]) for m in listed] if isinstance(listed, list) else None
        except (ValueError, AttributeError, KeyError, TypeError):
            ids = None  # a list in another shape: it answered, which is what is asked
        return None, ids or None

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
        answers_before = self._breaker.answers
        for attempt in range(cfg.max_retries + 1):
            if abort is not None and abort.is_set():
                raise _Aborted
            self._breaker.check()
            status, asked_wait, timed_out = None, None, False
            self._count(requests=1)
            try:
                # The deadline starts once a slot is ours: waiting for one is no server's fault.
                with self._slots:
                    resp = self._attempt(path, body)
            except httpx.TimeoutException:
                error, timed_out = f"timed out after {cfg.timeout_s:g} s", True
            except httpx.TransportError as exc:  # refused, reset or dropped connections
                error = f"{type(exc).__name__}: {self._text(exc)}"
            except httpx.RequestError as exc:  # a body it cannot decode: no retry fixes that
                self._count(failures=1)
                raise LLMRequestError(f"{type(exc).__name__}: {self._text(exc)}") from None
            else:
                status = resp.status_code
                if resp.is_success:
                    self._breaker.answered()
                    return self._parsed(resp)
                error = f"HTTP {status}: {self._text(_detail(resp), DETAIL_CHARS)}"
                if not retried(status):
                    self._breaker.answered()  # up: it refused this request, and would others
                    self._count(failures=1)
                    raise LLMRequestError(f"{error} (not retried)", status)
                asked_wait = retry_after(resp)
            if attempt == cfg.max_retries:
                self._count(failures=1)
                self._breaker.failed_for_good(error, answers_before, timed_out, status)
                message = f"{error} (gave up after {attempt + 1} attempts)"
                raise LLMRequestError(message, status, transient=True, timed_out=timed_out)
            self._count(retries=1)
            delay = self._backoff.delay(attempt, asked_wait)
            _log.debug(
                "%s %s: %s; retry %d of %d in %.2f s",
                cfg.base_url, path, error, attempt + 1, cfg.max_retries, delay,
            )  # fmt: skip
            if abort is not None and abort.wait(delay):
                raise _Aborted
            if abort is None:
                self._breaker.wait(delay)  # cut short when the breaker opens meanwhile
        raise AssertionError("unreachable")

    def _attempt(self, path: str, body: dict[str, Any]) -> httpx.Response:
        """One POST of ``body`` to ``path``, its answer read whole, within ``timeout_s`` of wall
        time: past that it raises httpx's ``TimeoutException``, which ``post`` counts as a
        timeout (retried; counted by the breaker).

        httpx's ``Timeout`` bounds each connect, each socket write, each socket read and the
        wait for a pooled connection on its own; nothing bounds their sum, and httpx's sync
        client has no total timeout. A server that sends one byte a second, of its status line,
        its headers or its body, answers every read in time and would hold the request for as
        long as it likes. So the exchange (``_exchange``) runs on a thread of its own, and the
        caller waits for it until the deadline and no longer, whatever the server does (a
        name lookup that hangs included, which no httpx timeout bounds either).

        The exchange bounds itself as well, so that it frees its connection soon after the
        caller gave up: each of its waits (for a pooled connection, to connect, to send, each
        read) is bounded by the time the attempt had left when it was sent, and it stops
        reading the body at the first chunk past the deadline. One phase escapes: httpcore
        reads the *head* of an answer (status line and headers, 1xx answers included) in one
        loop, each read under the read timeout the request started with, and no public httpx
        or httpcore API reaches into that loop; so a server that trickles its head keeps the
        exchange's thread and connection until it stops or falls silent for a read timeout.
        The caller has moved on by then; the pool's ``concurrency`` connections bound how many
        such exchanges there can be, and once all are held, later attempts time out waiting
        for a connection, so the breaker still stops the stage."""
        seconds = self.config.timeout_s
        until = time.monotonic() + seconds
        answer: Future[httpx.Response] = Future()

        def exchange() -> None:
            try:
                answer.set_result(self._exchange(path, body, until))
            except BaseException as exc:  # the caller's to raise, or to drop once it gave up
                answer.set_exception(exc)

        # A daemon: an exchange held by a trickling server never keeps the process alive.
        threading.Thread(target=exchange, name="llm-request", daemon=True).start()
        if not wait([answer], timeout=seconds).done:
            raise httpx.TimeoutException(f"no whole answer within {seconds:g} s")
        return answer.result()

    def _exchange(self, path: str, body: dict[str, Any], until: float) -> httpx.Response:
        """The HTTP exchange of an attempt that must end at ``until`` (``time.monotonic()``):
        every httpx timeout of the request (connect, write, read, the wait for a pooled
        connection) is the time left when it is sent, and the body is read chunk by chunk with
        the deadline checked between chunks, the connection dropped once it passed. Returns the
        answer with its body read (and decoded, as ``Response.read`` does)."""
        left = until - time.monotonic()
        if left <= 0:
            raise httpx.TimeoutException("the attempt's deadline (llm.timeout_s) passed")
        request = self._http.build_request("POST", path, json=body, timeout=left)
        response = self._http.send(request, stream=True)
        try:
            raw = bytearray()
            for chunk in response.iter_raw():  # each read within the read timeout (``left``)
                raw += chunk
                if time.monotonic() >= until:
                    message = "the attempt's deadline (llm.timeout_s) passed mid-answer"
                    raise httpx.ReadTimeout(message, request=request)
        finally:
            response.close()  # a body left unread: the connection is dropped, not reused
        extensions = {k: v for k, v in response.extensions.items() if k != "network_stream"}
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            content=bytes(raw),  # decoded here by Content-Encoding, as httpx reads a body
            request=request,
            extensions=extensions,
        )

    def _text(self, said: object, limit: int | None = None) -> str:
        """What an endpoint or an exception said, as text fit to show: redacted (``redact``),
        then cut to ``limit`` characters, in that order, so no cut leaves half a key."""
        return redact(str(said), self._secrets)[:limit]

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
            message = f"malformed response ({exc!r}): {self._text(resp.text, 200)!r}"
            raise LLMRequestError(message, resp.status_code) from exc
        prompt, completion = _tokens(answer)
        self._count(prompt_tokens=prompt, completion_tokens=completion)
        return answer

    def _reply(self, answer: dict[str, Any], text: Callable[[Any], Any]) -> Reply:
        try:
            choices = sorted(answer["choices"], key=lambda c: c.get("index", 0))
            texts = [text(c) for c in choices]
            reasons = [c.get("finish_reason") for c in choices]
            if bad := [t for t in texts if t is not None and not isinstance(t, str)]:
                raise TypeError(f"choice text is a {type(bad[0]).__name__}")
        except (KeyError, TypeError, AttributeError) as exc:
            self._count(failures=1)
            message = f"malformed response ({exc!r}): {self._text(answer, 200)!r}"
            raise LLMRequestError(message) from exc
        # null content is a refusal or an empty turn: that is an (empty) answer, counted.
        finish = [r if isinstance(r, str) else None for r in reasons]
        return Reply([t or "" for t in texts], texts.count(None), *_tokens(answer), finish)


def _tokens(answer: dict[str, Any]) -> tuple[int, int]:
    """Prompt and completion tokens from the answer's ``usage`` (0 where it has none)."""
    usage = answer.get("usage")
    if not isinstance(usage, dict):
        return 0, 0
    return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)


def _detail(resp: httpx.Response) -> str:
    """The server's error message (vLLM says why, e.g. the prompt exceeds max_model_len),
    whole: the caller redacts it before it cuts it."""
    try:
        error = resp.json().get("error")
        message = error.get("message") if isinstance(error, dict) else error
        if message:
            return str(message)
    except (ValueError, AttributeError):
        pass
    return resp.text or resp.reason_phrase

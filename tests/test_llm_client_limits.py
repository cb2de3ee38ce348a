"""The LLM client's limits, against a real local server that misbehaves on purpose: a key the
server echoes in an error body never reaches a raised message or a log line; a server that
trickles its answer, one that never answers, and one that asks to come back in an hour all end
the caller in one line within seconds (the deadline per attempt, the breaker counting timeouts
and 429s, Retry-After capped and said once); and so does an online segment whose evolver's
endpoint trickles."""

from __future__ import annotations

import logging
import secrets
import time
from typing import Any

import numpy as np
import pytest

from eva_runtime.llm_client import LLMBatchError, LLMClient, LLMRequestError
from eva_runtime.llm_config import LLMClientConfig, redact
from eva_runtime.llm_retry import REFUSED_HINT, TIMEOUT_HINT, LLMEndpointDown
from tasks.backends.evolve.paper import PaperTemplateEvolver
from tasks.online_loop import OnlineLoop
from tests.support.openai_server import OpenAICompatibleServer
from tests.test_backend_evolve_paper import rewrite
from tests.test_online_loop import Fetcher, TextReward, creator, trained

HELLO = [{"role": "user", "content": "hello"}]
PROMPTS = [f"prompt {i}" for i in range(200)]
KEY_ENV = "EVA_TEST_LIMITS_KEY"


def client(server: OpenAICompatibleServer, **fields: Any) -> LLMClient:
    config = {"base_url": server.base_url, "model": "tiny", "backoff_s": 0.01, **fields}
    return LLMClient(LLMClientConfig(**config))


@pytest.fixture
def key(monkeypatch: pytest.MonkeyPatch) -> str:
    """A key of no known shape: only the client's own copy of it can find it in a text."""
    value = f"evakey{secrets.token_hex(16)}"
    monkeypatch.setenv(KEY_ENV, value)
    return value


def test_redact_replaces_secrets_and_leaves_other_text():
    said = (
        '{"headers": {"Authorization": "Bearer tok.abc/123=", "x-api-key": "k-9f8e7d"}} '
        "retry with sk-proj-AbCdEf123456_x or Bearer zz9; url ?api_key=q1w2e3&model=m "
        "mine: MYKEY%2F1 and MYKEY/1"
    )
    out = redact(said, ["MYKEY/1"])
    for secret in ("tok.abc", "k-9f8e7d", "sk-proj", "zz9", "q1w2e3", "MYKEY"):
        assert secret not in out, secret
    assert '"Authorization": "[redacted]"' in out and "Bearer [redacted];" in out
    assert "&model=m" in out and "mine: [redacted] and [redacted]" in out
    assert redact(out, ["MYKEY/1"]) == out  # redacted text stays as it is
    plain = (
        "HTTP 400: prompt too long for task-scheduler (max_model_len 4096); "
        "llm.api_key_env: unset; Authorization failed; sk-learn"
    )
    assert redact(plain) == plain


@pytest.mark.parametrize("status", [401, 500])
def test_a_key_echoed_in_an_error_body_is_in_no_message_and_no_log(
    status: int, key: str, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.DEBUG)  # every logger, httpx's and httpcore's included
    with OpenAICompatibleServer(fail=lambda request: ("echo_key", status)) as server:
        llm = client(server, api_key_env=KEY_ENV, max_retries=1, concurrency=1)
        with pytest.raises(LLMRequestError) as one:
            llm.chat(HELLO)
        with pytest.raises((LLMBatchError, LLMEndpointDown)) as batch:
            llm.answers(PROMPTS)
        sent = server.requests[0]["headers"]["Authorization"]
    assert sent == f"Bearer {key}"  # the server had the key to echo
    messages = [str(one.value), one.value.line(), str(batch.value), caplog.text]
    assert all("[redacted]" in text for text in messages[:3])
    for text in messages:
        assert "evakey" not in text  # not even the part a cut at 300 characters would keep
    if status == 500:  # retried (logged), then the breaker quotes the last error
        assert isinstance(batch.value, LLMEndpointDown)
        assert "retry 1 of 1" in caplog.text and "credential [redacted" in caplog.text
    else:  # a 401 is a configuration error: the batch stops at once, naming it
        assert isinstance(batch.value, LLMBatchError) and "Authorization: [redacted]" in messages[2]


@pytest.mark.parametrize("mode", ["trickle", "trickle_body"])
def test_a_trickling_answer_is_cut_at_the_deadline(mode: str):
    """A byte every 0.2 s (its ~300 bytes would take a minute) is within httpx's read timeout of
    1 s at every read; the attempt still ends at timeout_s, as a timeout, head or body."""
    with OpenAICompatibleServer(fail=lambda request: (mode, 0.2)) as server:
        llm = client(server, timeout_s=1.0, max_retries=0)
        started = time.monotonic()
        with pytest.raises(LLMRequestError, match=r"timed out after 1 s") as info:
            llm.chat(HELLO)
        elapsed = time.monotonic() - started
    assert 0.9 < elapsed < 3 and info.value.timed_out and info.value.status is None


def test_the_deadline_holds_on_a_reused_connection():
    """Against HTTP/1.1 the second request goes over the first one's pooled connection, as to
    vLLM, and is cut all the same."""
    calls: list[int] = []

    def second_trickles(request: dict[str, Any]) -> tuple[str, float] | None:
        calls.append(1)
        return ("trickle_body", 0.2) if len(calls) == 2 else None

    with OpenAICompatibleServer(fail=second_trickles, keep_alive=True) as server:
        llm = client(server, timeout_s=1.0, max_retries=0, concurrency=1)
        assert llm.chat(HELLO) == ["reply 0 to: hello"]
        time.sleep(1.2)  # the pooled connection outlives the first request's deadline
        started = time.monotonic()
        with pytest.raises(LLMRequestError, match="timed out"):
            llm.chat(HELLO)
        # The whole timeout_s from this request's start: the deadline is the request's, not
        # the connection's (that one had passed during the sleep).
        assert 0.9 < time.monotonic() - started < 3
        assert server.requests[0]["client_port"] == server.requests[1]["client_port"]
        assert llm.chat(HELLO) == ["reply 0 to: hello"]  # a new connection after the cut


def test_a_head_trickled_without_end_holds_one_connection_and_the_breaker_still_opens():
    """The one phase an attempt cannot cut short itself: httpcore reads an answer's head in one
    loop. Its caller still leaves at the deadline; the exchange keeps the only connection, so
    the later attempts time out waiting for it, and the breaker stops the batch."""
    with OpenAICompatibleServer(fail=lambda request: ("trickle", 0.2)) as server:
        llm = client(server, timeout_s=0.3, max_retries=1, concurrency=1)
        started = time.monotonic()
        with pytest.raises(LLMEndpointDown, match=r"timed out after 0\.3 s"):
            llm.answers(PROMPTS)
        assert time.monotonic() - started < 5
        assert len(server.requests) == 1  # no later attempt got the connection


def test_timeouts_open_the_breaker_after_breaker_failures_requests():
    with OpenAICompatibleServer(fail=lambda request: ("hang", 0)) as server:
        llm = client(server, timeout_s=0.3, max_retries=1, concurrency=1, breaker_failures=3)
        started = time.monotonic()
        with pytest.raises(LLMEndpointDown) as info:
            llm.answers(PROMPTS)  # a caller that turns a failed request into "" for the rest
        elapsed = time.monotonic() - started
        sent = len(server.requests)
    # One thread: 3 requests of 2 attempts each timed out, then it stopped (no failure-share
    # line after all 200 prompts' timeouts).
    assert sent == 3 * 2 and llm.stats()["failures"] == 3
    assert elapsed < 5
    line = info.value.line()
    assert "\n" not in line and line.startswith("llm.base_url: ")
    assert "3 requests in a row failed after 2 attempts each" in line
    assert "timed out after 0.3 s" in line and info.value.hint == TIMEOUT_HINT


def test_a_retry_after_of_an_hour_is_capped_said_once_and_opens_the_breaker(
    caplog: pytest.LogCaptureFixture,
):
    caplog.set_level(logging.WARNING, logger="eva_runtime.llm_retry")
    with OpenAICompatibleServer(fail=lambda request: ("retry_after", 3600)) as server:
        llm = client(server, max_backoff_s=0.1, max_retries=2, concurrency=1)
        started = time.monotonic()
        with pytest.raises(LLMEndpointDown) as info:
            llm.answers(PROMPTS)
        elapsed = time.monotonic() - started
        times = [r["time"] for r in server.requests]
    assert len(times) == 3 * 3 and elapsed < 5  # 3 requests (the breaker) of 3 attempts
    waits = [times[i + 1] - times[i] for i in range(9) if i % 3 != 2]  # within each request
    assert min(waits) >= 0.09  # the cap, waited, not the hour
    assert "HTTP 429: injected rate limit" in info.value.line() and info.value.hint == REFUSED_HINT
    capped = [r.getMessage() for r in caplog.records if "Retry-After" in r.getMessage()]
    assert len(capped) == 1  # once a client, not once a retry
    assert "wait 3600 s" in capped[0] and "llm.max_backoff_s = 0.1 s" in capped[0]


def test_an_endpoint_that_answers_between_timeouts_is_not_down():
    """Prompts too slow to finish while the others answer: timeouts count only in a row."""

    def slow_ones(request: dict[str, Any]) -> tuple[str, float] | None:
        return ("hang", 0) if request["messages"][-1]["content"] == "slow" else None

    with OpenAICompatibleServer(fail=slow_ones) as server:
        llm = client(server, timeout_s=0.3, max_retries=0, concurrency=1, breaker_failures=2)
        out = llm.answers(["a", "slow", "b", "slow", "c"])
        assert out == ["reply 0 to: a", "", "reply 0 to: b", "", "reply 0 to: c"]
        with pytest.raises(LLMEndpointDown, match="2 requests in a row"):
            llm.answers(["slow", "slow", "d"])
        assert len(server.requests) == 5 + 2


def test_a_dead_evolver_ends_an_online_segment():
    """``eva online``'s evolver runs in a worker thread the step waits for (lag 0): against an
    endpoint that trickles, the step raises the breaker's line within seconds instead of
    waiting forever."""
    with OpenAICompatibleServer(rewrite, fail=lambda request: ("trickle", 0.2)) as server:
        llm = LLMClientConfig(base_url=server.base_url, model="tiny", timeout_s=0.5, max_retries=0)
        evolver = PaperTemplateEvolver(llm=llm, scorer="length").load()
        loop = OnlineLoop(creator(40, evolver, 0, size=100, n_new=2), TextReward())
        batch = Fetcher(loop, 4)()
        started = time.monotonic()
        with pytest.raises(LLMEndpointDown, match=r"timed out after 0\.5 s"):
            trained(loop, batch, np.tile([1.0, 0.0], (4, 1)))
        assert time.monotonic() - started < 5

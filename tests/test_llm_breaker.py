"""The LLM client's circuit breaker, against a real local server answering 500 and a port nobody
listens on: a dead endpoint stops the caller after a bounded number of requests and seconds, in
one line naming the endpoint and what it answered; a server that still answers now and then
never trips it. And a base_url that is no URL is refused when the config is read."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import pytest

from eva_runtime.errors import ConfigError
from eva_runtime.llm_client import LLMClient
from eva_runtime.llm_config import BREAKER_FAILURES, LLMClientConfig
from eva_runtime.llm_retry import LLMEndpointDown
from flows.config import load_config
from tasks.keys import keyed_config
from tests.support.openai_server import OpenAICompatibleServer

PROMPTS = [f"prompt {i}" for i in range(200)]


def client(base_url: str, **fields: Any) -> LLMClient:
    config = {"base_url": base_url, "model": "tiny", "backoff_s": 0.01, "concurrency": 4}
    return LLMClient(LLMClientConfig(**{**config, **fields}))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_server_answering_500_is_cut_short_and_named():
    with OpenAICompatibleServer(fail=lambda request: ("status", 500)) as server:
        llm = client(server.base_url, max_retries=2)
        started = time.monotonic()
        with pytest.raises(LLMEndpointDown) as info:
            llm.answers(PROMPTS)  # a caller that turns a failed request into "" for the rest
        elapsed = time.monotonic() - started
        sent = len(server.requests)
        # 3 requests failed for good (3 attempts each) trip it; at most those 3, the ones they
        # made room for and the 4 in flight were ever started: 7 x 3 attempts, not 200 x 3.
        assert 3 * 3 <= sent <= (3 + 4) * 3
        assert elapsed < 5
        line = info.value.line()
        assert "\n" not in line and line.startswith("llm.base_url: ")
        assert server.base_url in line and "HTTP 500" in line
        assert "3 requests in a row failed after 3 attempts each" in line
        # Open for good: a later request fails at once without reaching the server.
        with pytest.raises(LLMEndpointDown):
            llm.chat([{"role": "user", "content": "again"}])
        assert len(server.requests) == sent


def test_a_port_nobody_listens_on_is_cut_short_and_named():
    url = f"http://127.0.0.1:{free_port()}/v1"
    llm = client(url, max_retries=4, breaker_failures=2, concurrency=1)
    started = time.monotonic()
    with pytest.raises(LLMEndpointDown) as info:
        llm.answers(PROMPTS)
    # One thread: exactly 2 requests of 5 attempts each, then it stops.
    assert llm.stats()["requests"] == 2 * 5 and llm.stats()["failures"] == 2
    assert time.monotonic() - started < 5
    assert url in info.value.line() and "ConnectError" in info.value.line()


def test_an_endpoint_that_still_answers_now_and_then_never_trips_it():
    count, lock = [0], threading.Lock()

    def every_third_answers(request: dict[str, Any]) -> tuple[str, float] | None:
        with lock:
            count[0] += 1
            return None if count[0] % 3 == 0 else ("status", 503)

    with OpenAICompatibleServer(fail=every_third_answers) as server:
        llm = client(server.base_url, max_retries=0, concurrency=1)
        answers = llm.answers(PROMPTS[:12])
    # Two failures, one answer, over and over: never 3 in a row.
    assert [bool(a) for a in answers] == [False, False, True] * 4
    assert llm.stats()["failures"] == 8


def test_breaker_off_and_its_default_stays_out_of_keys():
    assert "breaker_failures" not in keyed_config(LLMClientConfig())  # old cache keys hold
    assert keyed_config(LLMClientConfig(breaker_failures=5))["breaker_failures"] == 5
    assert LLMClientConfig().breaker_failures == BREAKER_FAILURES == 3
    with OpenAICompatibleServer(fail=lambda request: ("status", 500)) as server:
        llm = client(server.base_url, max_retries=0, concurrency=1, breaker_failures=None)
        assert llm.answers(PROMPTS[:10]) == [""] * 10  # null: every request is tried
        assert len(server.requests) == 10


@pytest.mark.parametrize("url", ["not-a-url", "ftp://host/v1", "http:///v1", "127.0.0.1:8000"])
def test_a_base_url_that_is_no_http_url_is_refused_in_one_line(url):
    with pytest.raises(ConfigError) as info:
        load_config("configs/own-model.yaml", [f"evolve.evolver.llm.base_url={url}"])
    line = info.value.line()
    assert line.startswith("evolve.evolver.llm.base_url: not an http(s) URL with a host")
    assert "\n" not in line and repr(url) in line


def test_distilabel_tasks_over_the_client_stop_too():
    """EvolInstruct's requests go through ``ClientLLM``, which turns a failed request into ""
    for its task: the breaker is no failed request, so the batch stops instead."""
    from eva_runtime.distilabel_llm import ClientLLM

    with OpenAICompatibleServer(fail=lambda request: ("status", 502)) as server:
        llm = ClientLLM.over(client(server.base_url, max_retries=1))
        chats = [[{"role": "user", "content": p}] for p in PROMPTS]
        with pytest.raises(LLMEndpointDown, match="HTTP 502"):
            llm.generate(chats)
        assert len(server.requests) <= (3 + 4) * 2
        assert llm.counts["error_502"] == 2  # the 2 that failed for good before it opened

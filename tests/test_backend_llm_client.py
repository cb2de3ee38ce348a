"""The shared OpenAI-compatible client against a real local HTTP server that answers from a
script (``serve``, tests/conftest.py), so every count below is computed by hand from the
script."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from eva_runtime.llm_client import LLMBatchError, LLMClient, LLMRequestError
from eva_runtime.llm_config import LLMClientConfig, LLMConfigError, NamedLLMConfig
from tests.support.openai_server import OpenAICompatibleServer, Step, numbered


@pytest.fixture
def serve_defaults() -> dict[str, Any]:
    return {"respond": numbered}  # "answer N" from the N-th request: which attempt answered


def client(server: OpenAICompatibleServer, **fields: Any) -> LLMClient:
    config = {"base_url": server.base_url, "model": "tiny", "backoff_s": 0.01, **fields}
    return LLMClient(LLMClientConfig(**config))


HELLO = [{"role": "user", "content": "hello"}]


def test_a_503_then_a_200_is_retried_once_and_counted(serve):
    server = serve(Step(503), Step(200, usage=(5, 7)))
    llm = client(server)
    assert llm.chat(HELLO, temperature=0.0) == ["answer 1"]
    assert llm.stats() == {
        "requests": 2, "retries": 1, "failures": 0, "prompt_tokens": 5, "completion_tokens": 7,
    }  # fmt: skip
    assert server.bodies[0] == server.bodies[1] == {
        "temperature": 0.0, "messages": HELLO, "model": "tiny",
    }  # fmt: skip


def test_a_400_is_not_retried(serve):
    server = serve(Step(400))
    llm = client(server, max_retries=3)
    with pytest.raises(LLMRequestError, match=r"HTTP 400: scripted 400 \(not retried\)") as info:
        llm.chat(HELLO)
    assert info.value.status == 400 and not info.value.transient
    assert len(server.times) == 1
    assert llm.stats() == {
        "requests": 1, "retries": 0, "failures": 1, "prompt_tokens": 0, "completion_tokens": 0,
    }  # fmt: skip


def test_retries_run_out_on_5xx_and_timeouts(serve):
    server = serve(Step(500), Step(502), Step(503))
    llm = client(server, max_retries=2)
    with pytest.raises(LLMRequestError, match=r"HTTP 503.*gave up after 3 attempts") as info:
        llm.chat(HELLO)
    assert info.value.transient and len(server.times) == 3
    assert llm.stats()["retries"] == 2 and llm.stats()["failures"] == 1
    slow = serve(Step(delay=1.0), Step(408), Step(200))  # a timeout, then 408: both retried
    assert client(slow, timeout_s=0.2, max_retries=2).chat(HELLO) == ["answer 2"]


def test_retry_after_is_honoured_within_the_cap(serve):
    server = serve(Step(429, headers={"Retry-After": "0.3"}), Step(200))
    client(server, backoff_s=0.001).chat(HELLO)
    assert server.times[1] - server.times[0] >= 0.3
    # A Retry-After beyond max_backoff_s waits max_backoff_s: the cap is ours.
    server = serve(Step(503, headers={"Retry-After": "30"}), Step(200))
    started = time.monotonic()
    client(server, backoff_s=0.001, max_backoff_s=0.2).chat(HELLO)
    assert server.times[1] - server.times[0] >= 0.2 and time.monotonic() - started < 5


def test_tokens_are_summed_from_usage(serve):
    server = serve(Step(usage=(3, 4)), Step(usage=(10, 20)), Step(usage=None))
    llm = client(server)
    for _ in range(3):
        llm.chat(HELLO)
    assert llm.stats()["prompt_tokens"] == 13 and llm.stats()["completion_tokens"] == 24
    assert llm.stats()["requests"] == 3


def test_a_missing_key_fails_at_build_with_one_line_and_no_request(serve, monkeypatch):
    server = serve()
    config = LLMClientConfig(base_url=server.base_url, model="m", api_key_env="EVA_TEST_LLM_KEY")
    for value in (None, ""):
        if value is None:
            monkeypatch.delenv("EVA_TEST_LLM_KEY", raising=False)
        else:
            monkeypatch.setenv("EVA_TEST_LLM_KEY", value)
        with pytest.raises(LLMConfigError) as info:
            LLMClient(config)
        message = str(info.value)
        assert "\n" not in message
        assert "EVA_TEST_LLM_KEY" in message and "llm.api_key_env" in message
    assert server.times == []
    monkeypatch.setenv("EVA_TEST_LLM_KEY", "sk-secret-42")
    llm = LLMClient(config)
    llm.chat(HELLO)
    assert server.headers[0]["Authorization"] == "Bearer sk-secret-42"
    assert "sk-secret" not in repr(llm) + repr(config) + config.model_dump_json()
    # No key variable: no Authorization header at all (a local server).
    client(server).chat(HELLO)
    assert "Authorization" not in server.headers[1]


def test_concurrency_is_capped_for_map_and_for_callers_threads(serve):
    server = serve(delay=0.1)
    llm = client(server, concurrency=3)
    seen: list[float] = []
    out = llm.map(
        lambda i: llm.chat([{"role": "user", "content": str(i)}])[0], range(9), seen.append
    )
    assert sorted(out) == [f"answer {n}" for n in range(9)]  # every item, each answered once
    assert server.max_in_flight == 3  # at most, and used
    assert seen == sorted(seen) and seen[-1] == 1.0 and len(seen) == 9
    server = serve(delay=0.1)
    llm = client(server, concurrency=2)
    threads = [threading.Thread(target=llm.chat, args=(HELLO,)) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert server.max_in_flight == 2 and len(server.times) == 6


def test_map_stops_at_the_first_failure_and_names_it(serve):
    server = serve(Step(), Step(401), delay=0.0)
    llm = client(server, concurrency=1)
    with pytest.raises(LLMBatchError, match=r"first: item 1: HTTP 401") as info:
        llm.map(lambda i: llm.chat(HELLO), range(5))
    assert info.value.failed.keys() == {1} and info.value.completed == 1
    assert len(server.times) == 2  # nothing new started after the failure


def test_answers_turn_failures_into_empty_text_but_stop_on_config_errors(serve):
    server = serve(Step(), Step(400), Step())
    llm = client(server, concurrency=1, max_retries=0)
    assert llm.answers(["a", "b", "c"], seed=7, max_tokens=50) == ["answer 0", "", "answer 2"]
    seeds = [b["seed"] for b in server.bodies]
    assert seeds[0] != seeds[1] and all(b["max_tokens"] == 50 for b in server.bodies)
    with pytest.raises(LLMBatchError, match="HTTP 404"):
        client(serve(Step(404)), max_retries=0).answers(["a"])


def test_config_defaults_and_validation():
    config = LLMClientConfig()
    assert (config.api_key_env, config.concurrency, config.max_retries) == (None, 16, 4)
    assert (config.backoff_s, config.max_backoff_s, config.timeout_s) == (1.0, 30.0, 120.0)
    with pytest.raises(ValidationError):
        LLMClientConfig(concurrency=0)
    with pytest.raises(ValidationError):
        LLMClientConfig(retries=3)  # type: ignore[call-arg]  # extra="forbid"
    with pytest.raises(LLMConfigError, match=r"llm\.model"):
        LLMClient(config)  # no model and no default to fall back on
    with pytest.raises(ValidationError, match="model: required"):
        TypeAdapter(NamedLLMConfig).validate_python({"base_url": "http://x/v1"})


def test_a_reply_counts_null_content_and_tokens_and_a_timeout_says_so(serve):
    server = serve(Step(null=True, usage=(4, 0)), Step(usage=None))
    llm = client(server)
    assert llm.chat_reply(HELLO) == ([""], 1, 4, 0, ["stop"])
    assert llm.chat_reply(HELLO) == (["answer 1"], 0, 0, 0, ["stop"])
    # An answer cut at max_tokens says so in its finish reason.
    assert llm.chat_reply(HELLO, max_tokens=3) == (["ans"], 0, 1, 1, ["length"])
    slow = serve(Step(delay=1.0))
    with pytest.raises(LLMRequestError, match="timed out") as info:
        client(slow, timeout_s=0.2, max_retries=0).chat(HELLO)
    assert info.value.timed_out and info.value.transient and info.value.status is None
    with pytest.raises(LLMRequestError) as info:
        client(serve(Step(503)), max_retries=0).chat(HELLO)
    assert not info.value.timed_out and info.value.status == 503

"""eva_runtime.distilabel_llm.ClientLLM: a distilabel LLM whose requests go through eva's
LLMClient, against a real local OpenAI-compatible HTTP server: what it sends (sampling, ``n``,
per-content seeds), what it returns (distilabel's generations and statistics), what it does not
send (``SKIP``), and that a stock distilabel task runs over it."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from eva_runtime.distilabel_llm import SKIP, ClientLLM, failure_key
from eva_runtime.llm_client import LLMBatchError, LLMClient, LLMRequestError, content_seed
from eva_runtime.llm_config import LLMClientConfig
from tests.support.openai_server import OpenAICompatibleServer


def client(server: OpenAICompatibleServer, **fields: Any) -> LLMClient:
    config = {"base_url": server.base_url, "model": "tiny", "backoff_s": 0.01, **fields}
    return LLMClient(LLMClientConfig(**config))


def chat(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_generate_sends_through_the_client_and_returns_distilabels_shape():
    with OpenAICompatibleServer() as server:
        eva = client(server)
        llm = ClientLLM.over(eva, seed=5, temperature=0.3, max_new_tokens=70)
        llm.load()
        assert llm.model_name == "tiny"
        out = llm.generate(
            [chat("a"), chat(SKIP), "raw b", chat("a")], num_generations=2, **llm.generation_kwargs
        )
    assert out[0] == {
        "generations": ["reply 0 to: a", "reply 1 to: a"],
        "statistics": {"input_tokens": [1], "output_tokens": [1]},
    }
    assert out[1] == {
        "generations": ["", ""], "statistics": {"input_tokens": [0], "output_tokens": [0]},
    }  # fmt: skip
    assert out[2]["generations"] == ["reply 0 to: raw b", "reply 1 to: raw b"]
    assert out[3] == out[0]
    paths = sorted(r["path"] for r in server.requests)
    assert paths == ["/v1/chat/completions"] * 2 + ["/v1/completions"]  # SKIP is not sent
    for request in server.requests:
        body = request["body"]
        text = body["messages"][-1]["content"] if "messages" in body else body["prompt"]
        assert body["seed"] == content_seed(5, text)  # from the content, not the position
        assert (body["n"], body["max_tokens"], body["temperature"]) == (2, 70, 0.3)
        assert "stop" not in body
    assert llm.counts == {"requests": 3, "skipped_after_failure": 1}
    assert eva.stats()["requests"] == 3 and eva.stats()["prompt_tokens"] == 3


def test_generation_kwargs_are_named_for_distilabels_validation():
    """distilabel validates generation_kwargs against generate's signature: named parameters,
    no **kwargs; each documented."""
    with OpenAICompatibleServer() as server:
        llm = ClientLLM.over(client(server))
        with warnings.catch_warnings(action="ignore"):
            names = llm.runtime_parameters_names["generation_kwargs"]
            info = llm.get_runtime_parameters_info()
    assert names == {"max_new_tokens": True, "temperature": True, "top_p": True, "stop": True}
    keys = next(i for i in info if i["name"] == "generation_kwargs")["keys"]
    assert all(k.get("description") for k in keys)


def test_failures_are_empty_and_counted_configuration_errors_raise():
    def fail(request: dict[str, Any]) -> tuple[str, float] | None:
        content = request["messages"][-1]["content"]
        return {"bad": ("status", 400), "down": ("status", 503), "gone": ("status", 404)}.get(
            content
        )

    with OpenAICompatibleServer(fail=fail) as server:
        llm = ClientLLM.over(client(server, max_retries=1))
        out = llm.generate([chat("ok"), chat("bad"), chat("down")])
        assert [o["generations"] for o in out] == [["reply 0 to: ok"], [""], [""]]
        assert llm.counts == {"requests": 3, "error_400": 1, "error_503": 1}
        with pytest.raises(LLMBatchError, match="HTTP 404"):
            llm.generate([chat("gone")])


def test_a_stock_distilabel_task_runs_over_it():
    with warnings.catch_warnings(action="ignore"):
        from distilabel.steps.tasks import TextGeneration

        with OpenAICompatibleServer() as server:
            task = TextGeneration(llm=ClientLLM.over(client(server), max_new_tokens=90))
            task.load()
            rows = next(task.process([{"instruction": "hello"}]))
    assert rows[0]["generation"] == "reply 0 to: hello" and rows[0]["model_name"] == "tiny"
    assert server.requests[0]["body"]["max_tokens"] == 90


def test_failure_keys():
    assert failure_key(LLMRequestError("t", None, True, timed_out=True)) == "timeout"
    assert failure_key(LLMRequestError("s", 503, True)) == "error_503"
    assert failure_key(LLMRequestError("c", None, True)) == "error_connection"
    assert failure_key(LLMRequestError("m", 200)) == "error_malformed"
    assert failure_key(LLMRequestError("m")) == "error_malformed"

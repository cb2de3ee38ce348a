"""The OpenAI-compatible backend against a real local HTTP server, failures injected."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from eva_runtime.llm_config import LLMClientConfig, LLMConfigError
from eva_world import world
from tasks.backends.generate import GenerationBackend
from tasks.backends.generate.openai import (
    GenerationError,
    OpenAIGeneration,
    OpenAIGenerator,
    derive_seed,
)
from tasks.backends.generate.transformers import TransformersGeneration
from tasks.backends.generate.vllm import VLLMGeneration
from tasks.backends.protocols import Generator
from tests.support.openai_server import Fail, OpenAICompatibleServer

PROMPTS = [f"{a}+{b}=" for a in range(4) for b in range(5)]


def seeded(prompt: str, index: int, request: dict[str, Any]) -> str:
    """Like vLLM: sample ``index`` of a request is drawn with ``seed + index``."""
    rng = random.Random(f"{prompt}|{request['seed'] + index}|{request['temperature']}")
    return "".join(rng.choice("0123456789") for _ in range(6))


@pytest.fixture
def serve_defaults() -> dict[str, Any]:
    return {"respond": seeded}  # the servers ``serve`` starts (tests/conftest.py) sample


LLM_FIELDS = set(LLMClientConfig.model_fields)


def load(server: OpenAICompatibleServer, **overrides: Any) -> OpenAIGenerator:
    """A generator on ``server``; overrides of client fields go under ``llm``."""
    llm = {"base_url": server.base_url, "backoff_s": 0.01}
    llm |= {k: v for k, v in overrides.items() if k in LLM_FIELDS}
    fields = {k: v for k, v in overrides.items() if k not in LLM_FIELDS}
    return OpenAIGeneration(llm=llm, **fields).load("/ckpt/policy")


def prompt_of(request: dict[str, Any]) -> str:
    return request["messages"][-1]["content"] if "messages" in request else request["prompt"]


def fail_when(prompt: str, action: tuple[str, float], times: int | None = None) -> Fail:
    """Inject ``action`` for requests about ``prompt``, the first ``times`` times (None: always)."""
    seen = [0]
    lock = threading.Lock()

    def fail(request: dict[str, Any]) -> tuple[str, float] | None:
        if prompt_of(request) != prompt:
            return None
        with lock:
            seen[0] += 1
            return action if times is None or seen[0] <= times else None

    return fail


def test_n_responses_per_prompt_in_order_with_progress(serve):
    server = serve()
    gen = load(server)
    assert isinstance(gen, Generator)
    seen: list[float] = []
    got = gen.generate(PROMPTS, n=3, seed=5, progress=seen.append)
    out = got.texts
    assert got.truncated() == 0  # every answer of 6 characters fits max_tokens 1024
    assert len(out) == len(PROMPTS) and all(len(r) == 3 and len(set(r)) == 3 for r in out)
    by_prompt = {prompt_of(r["body"]): r["body"] for r in server.requests}
    for prompt, responses in zip(PROMPTS, out, strict=True):
        body = by_prompt[prompt]
        assert responses == [seeded(prompt, k, body) for k in range(3)]
        assert body["seed"] == derive_seed(5, PROMPTS.index(prompt))
        assert body["n"] == 3 and body["model"] == "/ckpt/policy"  # the served checkpoint name
        assert (body["temperature"], body["top_p"], body["max_tokens"]) == (0.7, 0.9, 1024)
    assert len(server.requests) == len(PROMPTS)  # one request per prompt
    assert server.requests[0]["path"] == "/v1/chat/completions"
    assert seen == sorted(seen) and seen[-1] == 1.0 and len(seen) == len(PROMPTS)


def test_seeded_results_do_not_depend_on_concurrency_or_request_split(serve):
    server = serve()
    first = load(server, concurrency=8).generate(PROMPTS, n=4, seed=1)
    assert load(server, concurrency=1).generate(PROMPTS, n=4, seed=1) == first
    # n requests of one sample, seeded seed + j, give what one n-sample request gives.
    split = load(server, n_per_request=False, concurrency=3)
    before = len(server.requests)
    assert split.generate(PROMPTS, n=4, seed=1) == first
    assert len(server.requests) - before == 4 * len(PROMPTS)
    other = load(server).generate(PROMPTS, n=4, seed=2)
    assert sum(a != b for a, b in zip(first.texts, other.texts, strict=True)) == len(PROMPTS)


def test_concurrency_limit_is_respected_and_used(serve):
    server = serve(fail=lambda request: ("sleep", 0.05))
    out = load(server, concurrency=3).generate(PROMPTS, n=2, seed=0)
    assert len(out.texts) == len(PROMPTS)
    assert server.max_in_flight == 3


def test_retries_a_503_then_succeeds(serve):
    server = serve(fail=fail_when("2+3=", ("status", 503), times=2))
    gen = load(server)
    out = gen.generate(PROMPTS, n=2, seed=0)
    # The client's counts: 20 prompts + 2 retries; the test server reports 1 + 1 tokens a 200.
    assert gen.stats() == {
        "requests": 22, "retries": 2, "failures": 0, "prompt_tokens": 20, "completion_tokens": 20,
    }  # fmt: skip
    attempts = [r for r in server.requests if prompt_of(r["body"]) == "2+3="]
    assert len(attempts) == 3
    assert all(r["body"] == attempts[0]["body"] for r in attempts)  # same seed on every retry
    assert out == load(server).generate(PROMPTS, n=2, seed=0)  # and the same answers as clean


def test_retries_429_and_dropped_connections_count_as_retryable(serve):
    server = serve(fail=fail_when("0+0=", ("status", 429), times=1))
    load(server).generate(PROMPTS[:3], n=1, seed=0)
    assert sum(prompt_of(r["body"]) == "0+0=" for r in server.requests) == 2
    # Nothing listening: connection refused, retried, then a clear error.
    dead = OpenAIGeneration(
        llm={"base_url": "http://127.0.0.1:9/v1", "max_retries": 1, "backoff_s": 0.01}
    )
    with pytest.raises(GenerationError, match=r"prompt 0: ConnectError.*after 2 attempts"):
        dead.load("m").generate(["1+1="], n=1, seed=0)


def test_timeouts_are_retried_a_bounded_number_of_times_then_raise(serve):
    server = serve(fail=fail_when("1+1=", ("sleep", 1.0)))
    gen = load(server, timeout_s=0.2, max_retries=2, concurrency=2)
    started = time.monotonic()
    with pytest.raises(GenerationError) as info:
        gen.generate(PROMPTS, n=2, seed=0)
    assert time.monotonic() - started < 5
    assert list(info.value.failed) == [PROMPTS.index("1+1=")]
    message = str(info.value)
    assert "1 prompt(s) failed" in message and "timed out after 0.2 s" in message
    assert "gave up after 3 attempts" in message
    assert sum(prompt_of(r["body"]) == "1+1=" for r in server.requests) == 3  # max_retries + 1


def test_a_400_is_not_retried_and_stops_new_work(serve):
    server = serve(fail=fail_when("0+1=", ("status", 400)))
    with pytest.raises(GenerationError, match=r"prompt 1: HTTP 400: injected failure") as info:
        load(server, concurrency=1).generate(PROMPTS, n=1, seed=0)
    assert "not retried" in str(info.value)
    assert sum(prompt_of(r["body"]) == "0+1=" for r in server.requests) == 1
    assert len(server.requests) == 2  # concurrency 1: prompt 0, then the failure, then stop


def test_api_key_is_sent_from_the_env_and_never_kept_in_the_config(serve, monkeypatch):
    server = serve()
    monkeypatch.setenv("EVA_TEST_KEY", "sk-very-secret")
    config = OpenAIGeneration(llm={"base_url": server.base_url, "api_key_env": "EVA_TEST_KEY"})
    gen = config.load("m")
    gen.generate(["1+2="], n=1, seed=0)
    assert server.requests[-1]["headers"]["Authorization"] == "Bearer sk-very-secret"
    for text in (repr(config), str(config.model_dump()), config.model_dump_json(), repr(gen)):
        assert "sk-very-secret" not in text
    # A named variable that is unset fails at load, before any request.
    monkeypatch.delenv("EVA_TEST_KEY")
    sent = len(server.requests)
    with pytest.raises(LLMConfigError, match=r"llm\.api_key_env: environment variable EVA_TEST"):
        config.load("m")
    assert len(server.requests) == sent
    # No variable named (the default): no Authorization header, for a local server.
    OpenAIGeneration(llm={"base_url": server.base_url}).load("m").generate(["1+2="], 1, seed=0)
    assert "Authorization" not in server.requests[-1]["headers"]


def test_completions_endpoint_and_chat_options(serve):
    server = serve()
    gen = load(server, endpoint="completions", model="served-name", extra_body={"top_k": 5})
    out = gen.generate(["3+4="], n=2, seed=0)
    request = server.requests[-1]
    assert request["path"] == "/v1/completions" and "messages" not in request["body"]
    assert request["body"]["prompt"] == "3+4=" and request["body"]["model"] == "served-name"
    assert request["body"]["top_k"] == 5
    assert out.texts == [[seeded("3+4=", k, request["body"]) for k in range(2)]]
    load(server, system_prompt="Answer reversed.").generate(["3+4="], n=1, seed=0)
    assert server.requests[-1]["body"]["messages"] == [
        {"role": "system", "content": "Answer reversed."},
        {"role": "user", "content": "3+4="},
    ]


def test_config_validation():
    with pytest.raises(ValidationError, match="system_prompt needs endpoint='chat'"):
        OpenAIGeneration(endpoint="completions", system_prompt="x")
    with pytest.raises(ValidationError, match=r"extra_body may not set \['n', 'seed'\]"):
        OpenAIGeneration(extra_body={"seed": 1, "n": 2})
    with pytest.raises(ValidationError):
        OpenAIGeneration(llm={"concurrency": 0})
    with pytest.raises(ValidationError, match="concurrency"):
        OpenAIGeneration(concurrency=4)  # a client field belongs under llm
    with pytest.raises(ValueError, match="n must be >= 1"):
        OpenAIGeneration().load("m").generate(["x"], n=0, seed=0)


def test_backend_union_picks_the_config_by_kind():
    adapter = TypeAdapter(GenerationBackend)
    openai = adapter.validate_python({"kind": "openai", "llm": {"base_url": "http://h:1/v1"}})
    assert isinstance(openai, OpenAIGeneration) and openai.llm.base_url == "http://h:1/v1"
    assert isinstance(adapter.validate_python({"kind": "vllm"}), VLLMGeneration)
    # No kind: a transformers config, as every config written before the union was.
    legacy = adapter.validate_python({"max_new_tokens": 10})
    assert isinstance(legacy, TransformersGeneration) and legacy.max_new_tokens == 10
    assert adapter.validate_python(openai) is openai
    kinds = "expected one of 'transformers', 'ctranslate2', 'vllm', 'openai'"
    with pytest.raises(ValidationError, match=kinds):
        adapter.validate_python({"kind": "tgi"})
    with pytest.raises(ValidationError, match="max_new_tokens"):
        adapter.validate_python({"kind": "openai", "max_new_tokens": 5})  # a transformers field


def test_world_answers_flow_through_to_the_verifier(serve):
    """A served 'policy' that solves world prompts on sample 0 and slips on the others."""

    def solver(prompt: str, index: int, request: dict[str, Any]) -> str:
        answer = world.solve(prompt)
        return answer if index == 0 else answer[:-1] + str((int(answer[-1]) + index) % 10)

    server = serve(respond=solver)
    prompts = ["12+34=", "53-17=", "999+1="]
    out = load(server).generate(prompts, n=3, seed=0).texts
    rewards = [[world.reward(p, r) for r in rs] for p, rs in zip(prompts, out, strict=True)]
    assert all(rs[0] == 1.0 and max(rs[1:]) < 1.0 for rs in rewards)


@pytest.mark.parametrize("n_per_request", [True, False])
def test_an_answer_cut_at_max_tokens_is_marked_truncated(serve, n_per_request: bool):
    # The server's finish_reason "length" (an answer cut at max_tokens) marks a response
    # truncated; "stop" finished. Here a server whose answers never end, then one whose
    # answers end at 6 characters, under a cap of 5 and of 8.
    endless = serve(respond=lambda prompt, index, request: "and so on " * 1000)
    got = load(endless, max_tokens=5, n_per_request=n_per_request).generate(PROMPTS[:3], 2, 0)
    assert got.texts == [["and s", "and s"]] * 3 and got.truncated() == 6
    short = serve()
    cut = load(short, max_tokens=5, n_per_request=n_per_request).generate(PROMPTS[:2], 2, 0)
    assert cut.finished == [[False, False]] * 2 and all(len(t) == 5 for rs in cut.texts for t in rs)
    room = load(short, max_tokens=8, n_per_request=n_per_request).generate(PROMPTS[:2], 2, 0)
    assert room.finished == [[True, True]] * 2 and all(len(t) == 6 for rs in room.texts for t in rs)

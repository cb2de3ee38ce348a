"""The chosen-response rewriter against a real local OpenAI-compatible HTTP server."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest
from pydantic import ValidationError

from eva_runtime.llm_config import LLMClientConfig, LLMConfigError
from eva_world.tiny_lm import (
    TinyModelConfig,
    build_char_tokenizer,
    build_tiny_model,
    save_checkpoint,
)
from tasks.backends.train.dpo import DPOSolverConfig
from tasks.backends.train.rewriter import RewriterConfig
from tasks.train import TrainConfig, train
from tests.support.openai_server import OpenAICompatibleServer


def _rewrite(prompt: str, index: int, request: dict[str, Any]) -> str:
    """Answers by the original response's name: the behaviours a real rewriter shows."""
    original = prompt.rsplit("### Response\n", 1)[1]
    return {
        "empty": "   ",
        "verbose": "v" * 100,  # 14x the original
        "terse": "t",  # under half the original
    }.get(original, f"better {original}")


LLM_FIELDS = set(LLMClientConfig.model_fields)


def _config(server: OpenAICompatibleServer, **kw: Any) -> RewriterConfig:
    """A rewriter on ``server``; client fields in ``kw`` go under ``llm``."""
    llm = {"base_url": server.base_url, "model": "tiny", "backoff_s": 0.0}
    llm |= {k: v for k, v in kw.items() if k in LLM_FIELDS}
    return RewriterConfig(llm=llm, **{k: v for k, v in kw.items() if k not in LLM_FIELDS})


def test_rewrites_within_the_length_band_and_keeps_the_rest():
    originals = ["first answer", "empty", "verbose", "terse", "second answer"]
    with OpenAICompatibleServer(respond=_rewrite) as server:
        seen: list[float] = []
        result = _config(server).load().rewrite([f"q{i}" for i in range(5)], originals, seen.append)
    assert result.responses == [
        "better first answer",
        "empty",
        "verbose",
        "terse",
        "better second answer",
    ]
    assert result.stats() == {
        "rewrite_rewritten": 2,
        "rewrite_kept_failed": 0,
        "rewrite_kept_empty": 1,
        "rewrite_kept_length": 2,
        # The client's counts: 5 requests answered, 1 + 1 tokens each from the test server.
        "rewrite_requests": 5,
        "rewrite_retries": 0,
        "rewrite_failures": 0,
        "rewrite_prompt_tokens": 5,
        "rewrite_completion_tokens": 5,
    }
    assert sorted(seen) == seen and seen[-1] == 1.0
    # Requests run concurrently, so find q0's rather than assuming it arrived first.
    (first,) = [r for r in server.requests if "q0" in r["body"]["messages"][0]["content"]]
    body = first["body"]
    assert body["model"] == "tiny" and body["messages"][0]["role"] == "user"
    assert "Authorization" not in first["headers"]


def test_transient_failures_are_retried_then_given_up():
    calls: dict[str, int] = {}
    lock = threading.Lock()

    def fail(request: dict[str, Any]) -> tuple[str, float] | None:
        content = request["messages"][0]["content"]
        with lock:
            calls[content] = calls.get(content, 0) + 1
            n = calls[content]
        if "flaky" in content:
            return ("status", 503) if n == 1 else None  # recovers on the retry
        if "down" in content:
            return ("status", 500)
        if "bad" in content:
            return ("status", 400)  # not transient: no retry
        return None

    with OpenAICompatibleServer(respond=_rewrite, fail=fail) as server:
        result = (
            _config(server, max_retries=2)
            .load()
            .rewrite(["flaky", "down", "bad"], ["an answer here"] * 3)
        )
    assert result.responses == ["better an answer here", "an answer here", "an answer here"]
    assert (result.rewritten, result.failed) == (1, 2)
    # flaky 2 + down 3 + bad 1 requests; retries: flaky 1, down 2; down and bad failed.
    assert (result.requests["requests"], result.requests["retries"]) == (6, 3)
    assert result.requests["failures"] == 2
    per_prompt = {
        k.split("### Response")[0].split("### Instruction\n")[1].strip(): v
        for k, v in calls.items()
    }
    assert per_prompt == {"flaky": 2, "down": 3, "bad": 1}


def test_a_timeout_keeps_the_original():
    with OpenAICompatibleServer(respond=_rewrite, fail=lambda r: ("sleep", 1.0)) as server:
        result = _config(server, timeout_s=0.2, max_retries=1).load().rewrite(["q"], ["answer"])
    assert (result.responses, result.failed, len(server.requests)) == (["answer"], 1, 2)


def test_concurrency_is_bounded():
    with OpenAICompatibleServer(respond=_rewrite, fail=lambda r: ("sleep", 0.1)) as server:
        result = _config(server, concurrency=3).load().rewrite(["q"] * 9, ["some answer"] * 9)
    assert result.rewritten == 9
    assert 1 < server.max_in_flight <= 3


def test_api_key_comes_from_the_environment_and_is_never_stored(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("EVA_TEST_REWRITER_KEY", "sk-secret")
    with OpenAICompatibleServer(respond=_rewrite) as server:
        config = _config(server, api_key_env="EVA_TEST_REWRITER_KEY")
        config.load().rewrite(["q"], ["answer"])
        assert server.requests[0]["headers"]["Authorization"] == "Bearer sk-secret"
        assert "sk-secret" not in config.model_dump_json()
        monkeypatch.delenv("EVA_TEST_REWRITER_KEY")
        with pytest.raises(LLMConfigError, match="EVA_TEST_REWRITER_KEY is unset or empty"):
            config.load()  # at load, before any request
        assert len(server.requests) == 1
    with pytest.raises(ValidationError, match="response"):
        RewriterConfig(llm={"model": "m"}, template="only {prompt}")


def test_train_stage_rewrites_chosen_and_reports_counts(tmp_path: Path):
    policy = tmp_path / "policy"
    tok = build_char_tokenizer("0123456789+-=:abcdefghijrtv ")
    save_checkpoint(build_tiny_model(TinyModelConfig(), tok, seed=0), tok, str(policy))
    prompts = [f"{a}+{b}=" for a in range(4) for b in range(2)]
    chosen = ["abc"] * 7 + ["empty"]
    seen: list[float] = []
    ctx = SimpleNamespace(
        log=logging.getLogger("test"),  # the stage logs its batch layout
        scratch=str(tmp_path / "scratch"),
        seed=0,
        progress=seen.append,
        model_dir=lambda _: str(policy),
    )
    pairs = pa.table({"prompt": prompts, "chosen": chosen, "rejected": ["ghij"] * 8})
    with OpenAICompatibleServer(respond=lambda p, i, r: "abd" if p.endswith("abc") else "") as srv:
        config = TrainConfig(
            solver=DPOSolverConfig(learning_rate=1e-3, num_train_epochs=1, effective_batch_size=4),
            rewrite_chosen=_config(srv),
        )
        out = train.fn(ctx, config, pairs=pairs)
    assert out.stats["rewrite_rewritten"] == 7 and out.stats["rewrite_kept_empty"] == 1
    assert out.stats["steps"] == 2 and len(srv.requests) == 8
    assert out.stats["rewrite_requests"] == 8 and out.stats["rewrite_failures"] == 0
    assert seen == sorted(seen) and seen[-1] == 1.0 and any(f <= 0.1 for f in seen)

"""The pairwise reward and its LLM judge, against a real OpenAI-compatible HTTP server."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
from pydantic import ValidationError

from eva_runtime.errors import ConfigError
from eva_runtime.llm_config import LLMConfigError
from tasks.backends.protocols import RewardModel
from tasks.backends.reward.pairwise import (
    LLMPairwiseJudge,
    LLMPairwiseJudgeConfig,
    PairwiseJudge,
    PairwiseReward,
    PairwiseScorer,
    parse_verdict,
)
from tests.support.openai_server import OpenAICompatibleServer

PAIR = re.compile(r"\[Response A\]\n(.*)\n\n\[Response B\]\n(.*)\n\nWhich", re.DOTALL)


def _pair(prompt: str) -> tuple[str, str]:
    match = PAIR.search(prompt)
    assert match, prompt
    return match.group(1), match.group(2)


def prefer_longer(prompt: str, index: int, request: dict[str, Any]) -> str:
    a, b = _pair(prompt)
    return "A" if len(a) > len(b) else "B" if len(b) > len(a) else "tie"


def _reward(server: OpenAICompatibleServer, **llm: Any) -> PairwiseScorer:
    both = llm.pop("both_orders", True)
    llm = {"base_url": server.base_url, "model": "judge", "backoff_s": 0.01, **llm}
    return PairwiseReward.model_validate({"judge": {"llm": llm}, "both_orders": both}).load()


def _judge(base_url: str, **config: Any) -> LLMPairwiseJudgeConfig:
    return LLMPairwiseJudgeConfig(llm={"base_url": base_url, "model": "judge"}, **config)


def test_parse_verdict():
    for text, p in [("A", 1.0), (" b.", 0.0), ("Tie", 0.5), ("Response A is better", 1.0),
                    ("[[B]]", 0.0), ("After thought: [[A]]", 1.0), ("equal", 0.5)]:  # fmt: skip
        assert parse_verdict(text) == p, text
    for text in ["", None, "I cannot decide", "Both are fine", "AB"]:
        assert math.isnan(parse_verdict(text)), text


def test_scores_are_mean_win_rates_that_order_the_responses():
    with OpenAICompatibleServer(prefer_longer) as server:
        rm = _reward(server)
        assert isinstance(rm, RewardModel) and isinstance(rm.judge, PairwiseJudge)
        seen: list[float] = []
        out = rm.score(["q1", "q2"], [["aa", "a", "aaaa", "aaa"], ["xy", "x"]], seen.append)
        assert out == [[1 / 3, 0.0, 1.0, 2 / 3], [1.0, 0.0]]
        # N(N-1) calls per prompt with both orders: 12 + 2.
        assert len(server.requests) == 14 and rm.stats()["comparisons"] == 14
        assert seen[-1] == 1.0 and seen == sorted(seen)
        rm.score(["q3"], [["b", "bb"]])  # a second call adds to the counts since load
        assert rm.stats()["comparisons"] == 16 and rm.stats()["judge_requests"] == 16
        body = server.requests[0]["body"]
        assert body["model"] == "judge" and body["temperature"] == 0.0
        assert server.requests[0]["path"] == "/v1/chat/completions"


def test_both_orders_cancels_position_bias():
    always_a = lambda prompt, i, req: "A"  # noqa: E731 - a judge that only sees positions
    with OpenAICompatibleServer(always_a) as server:
        assert _reward(server).score(["q"], [["x", "yy", "zzz"]]) == [[0.5, 0.5, 0.5]]
        one_order = _reward(server, both_orders=False).score(["q"], [["x", "yy", "zzz"]])
        assert one_order == [[1.0, 0.5, 0.0]]  # whoever comes first wins: the bias shows


def test_identical_responses_tie_without_a_call_and_singletons_are_nan():
    with OpenAICompatibleServer(prefer_longer) as server:
        rm = _reward(server)
        out = rm.score(["q", "lonely"], [["same", "same", "longer"], ["only"]])
        assert out[0] == [0.25, 0.25, 1.0] and math.isnan(out[1][0])
        assert len(server.requests) == 4  # (same, longer) twice, in both orders
        with pytest.raises(ConfigError, match="at least 2 responses") as e:
            rm.score(["q"], [["one"]])
        assert e.value.field == "annotate.reward" and "generate.n" in (e.value.hint or "")


def test_retries_503_and_timeouts_then_succeeds():
    calls = {"n": 0}

    def flaky(request: dict[str, Any]) -> tuple[str, float] | None:
        calls["n"] += 1
        if calls["n"] in (1, 2):
            return ("status", 503)
        return ("sleep", 1.0) if calls["n"] == 3 else None

    with OpenAICompatibleServer(prefer_longer, fail=flaky) as server:
        rm = _reward(server, timeout_s=0.3, concurrency=1)
        assert rm.score(["q"], [["a", "bb"]]) == [[0.0, 1.0]]
        assert len(server.requests) == 5  # 2 comparisons + 2 answered 503 + 1 timed out
        assert rm.stats()["failed"] == 0


def test_failures_past_the_retries_are_nan_and_all_failing_raises():
    def fail_on_c(request: dict[str, Any]) -> tuple[str, float] | None:
        return ("status", 503) if "ccc" in request["messages"][0]["content"] else None

    with OpenAICompatibleServer(prefer_longer, fail=fail_on_c) as server:
        # The judge fails one response every time: off, the client's breaker would stop it.
        rm = _reward(server, max_retries=1, breaker_failures=None)
        out = rm.score(["q"], [["a", "bb", "ccc"]])
        assert out[0][:2] == [0.0, 1.0] and math.isnan(out[0][2])
        # 2 comparisons answered, 4 tried twice: 10 requests, 4 retries; 1 + 1 tokens an answer.
        assert rm.stats() == {
            "comparisons": 6, "failed": 4, "unparseable": 0, "judge_requests": 10,
            "judge_retries": 4, "judge_failures": 4, "judge_prompt_tokens": 2,
            "judge_completion_tokens": 2,
        }  # fmt: skip
        assert len(server.requests) == 2 + 4 * 2  # each failing call tried twice
        with pytest.raises(RuntimeError, match="no usable verdict"):
            rm.score(["q"], [["a", "ccc"]])


def test_unparseable_verdicts_are_left_out_of_the_mean():
    def confused_by_z(prompt: str, index: int, request: dict[str, Any]) -> str:
        return "Hard to say." if "z" in _pair(prompt) else prefer_longer(prompt, index, request)

    with OpenAICompatibleServer(confused_by_z) as server:
        rm = _reward(server)
        out = rm.score(["q"], [["a", "bb", "z"]])
        assert out[0][:2] == [0.0, 1.0] and math.isnan(out[0][2])
        assert rm.stats()["unparseable"] == 4


def test_client_errors_fail_at_once():
    with OpenAICompatibleServer(prefer_longer, fail=lambda r: ("status", 401)) as server:
        with pytest.raises(RuntimeError, match="HTTP 401"):
            _reward(server, concurrency=1).score(["q"], [["a", "bb"]])
        assert len(server.requests) == 1


def test_concurrency_is_bounded():
    with OpenAICompatibleServer(prefer_longer, fail=lambda r: ("sleep", 0.05)) as server:
        _reward(server, concurrency=3).score(["q"], [["a", "bb", "ccc", "dddd"]])
        assert server.max_in_flight == 3


def test_api_key_comes_from_the_environment_and_is_never_stored(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("JUDGE_KEY", "sk-secret-123")
    with OpenAICompatibleServer(prefer_longer) as server:
        config = LLMPairwiseJudgeConfig(
            llm={"base_url": server.base_url, "model": "judge", "api_key_env": "JUDGE_KEY"}
        )
        judge = config.load()
        assert judge.compare("q", "long", "s") == 1.0
        assert server.requests[0]["headers"]["Authorization"] == "Bearer sk-secret-123"
        assert "sk-secret" not in repr(judge) + config.model_dump_json() + repr(config)
        judge.close()
    monkeypatch.delenv("JUDGE_KEY")
    with pytest.raises(LLMConfigError, match="api_key_env: environment variable JUDGE_KEY"):
        config.load()


def test_template_must_have_its_placeholders():
    with pytest.raises(ValidationError, match="template"):
        _judge("http://x/v1", template="{prompt} {response_a}")
    with pytest.raises(ValidationError, match="template"):
        _judge("http://x/v1", template="{prompt}{response_a}{oops}")
    custom = "Q: {prompt}\nA: {response_a}\nB: {response_b}\n{{json}}? A or B"
    assert isinstance(_judge("http://x/v1", template=custom).load(), LLMPairwiseJudge)
    with pytest.raises(ValidationError, match="model: required"):
        PairwiseReward.model_validate({"judge": {"llm": {"base_url": "http://x/v1"}}})

"""distilabel EvolInstruct/EvolComplexity/SelfInstruct as eva's evolver, over a real local
OpenAI-compatible HTTP server: chains, seeded mutation choice, failures that must not stop the
stage (empty answers, refusals, 503s, timeouts), configuration errors that must, and requests
that obey eva's client (its retries, backoff, Retry-After cap, timeout and counts)."""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import pytest

from eva_core.evolution import evolved_records
from eva_core.schema import seed_records
from eva_runtime.errors import EvaError
from eva_runtime.llm_client import LLMBatchError
from eva_runtime.llm_config import LLMConfigError
from tasks.backends.evolve.distilabel import (
    DistilabelEvolver,
    DistilabelRewriter,
    mutation_templates,
)
from tasks.backends.protocols import Evolver
from tests.support.openai_server import OpenAICompatibleServer

MUTATION_TEMPLATES = mutation_templates("evol_instruct")

PROMPTS = [
    "Write a poem about the sea.",
    "Explain gravity.",
    "Sort a list in Python.",
    "Plan a trip to Rome.",
    "What is a prime number?",
    "Summarize the French revolution.",
]
_GIVEN = re.compile(r"#(?:The )?Given Prompt#:\n(.*?)\n#(?:Rewritten|Created) Prompt#:", re.S)


def mutation_of(content: str) -> str:
    """Which distilabel template a request was built from (its text before the prompt)."""
    names = [n for n, t in MUTATION_TEMPLATES.items() if content.startswith(t.split("<PROMPT>")[0])]
    assert len(names) == 1, content[:300]
    return names[0]


def given(content: str) -> str:
    m = _GIVEN.search(content)
    assert m, content[:300]
    return m.group(1)


def rewrite(prompt: str, index: int, request: dict[str, Any]) -> str:
    """A rewriter that echoes the template's label, as models do; output depends on input only."""
    return f"#Rewritten Prompt#:\n{given(prompt)} +{mutation_of(prompt)[:4].lower()}"


def load(server: OpenAICompatibleServer, **overrides: Any) -> DistilabelRewriter:
    llm = {"base_url": server.base_url, "model": "tiny", "timeout_s": 1, "max_retries": 1}
    llm |= overrides.pop("llm", {})
    return DistilabelEvolver(**{"llm": llm, **overrides}).load()


def contents(server: OpenAICompatibleServer) -> list[str]:
    return [r["body"]["messages"][-1]["content"] for r in server.requests]


def test_four_link_chains_use_all_five_templates(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-secret")
    with OpenAICompatibleServer(rewrite) as server:
        ev = load(server, llm={"api_key_env": "OPENAI_API_KEY"})
        assert isinstance(ev, Evolver) and "sk-test" not in repr(ev)
        out = ev.evolve(PROMPTS, [None] * len(PROMPTS), 4, seed=3)
    assert len(server.requests) == 4 * len(PROMPTS)
    seen = [mutation_of(c) for c in contents(server)]
    assert sorted(set(seen)) == sorted(MUTATION_TEMPLATES)  # all five, BREADTH included
    body = server.requests[0]["body"]
    assert body["temperature"] == 0.88 and body["max_tokens"] == 1024
    assert {k.lower(): v for k, v in server.requests[0]["headers"].items()}[
        "authorization"
    ] == "Bearer sk-test-secret"
    assert "sk-test" not in str(DistilabelEvolver(llm={"model": "m"}).model_dump())
    for parent, rewrites in zip(PROMPTS, out, strict=True):
        assert [m.split(":")[2] for _, m in rewrites] == [
            "chain-1",
            "chain-2",
            "chain-3",
            "chain-4",
        ]
        # A chain: link k rewrites link k-1 (distilabel strips the "Prompt#:" label itself),
        # and the method names the template that was really sent.
        previous = parent
        for text, method in rewrites:
            sent = [c for c in contents(server) if given(c) == previous]
            assert len(sent) == 1 and method.split(":")[1] == mutation_of(sent[0]).lower()
            assert text.startswith(previous + " +")
            previous = text
    table, stats = evolved_records(seed_records(PROMPTS), out, iteration=1)
    assert stats.kept == 24 and table.column("depth").to_pylist() == [1] * 24
    assert ev.stats() == {"requests": 24}


def test_mutation_choice_is_seeded_and_independent_of_batching():
    def run(seed: int, batch_size: int) -> tuple[list[Any], list[str]]:
        with OpenAICompatibleServer(rewrite) as server:
            out = load(server, batch_size=batch_size).evolve(PROMPTS, [None] * 6, 3, seed)
        return out, sorted(contents(server))

    first, sent = run(11, 64)
    again, sent_again = run(11, 64)
    assert first == again and sent == sent_again  # the same requests, the same rewrites
    one_by_one, _ = run(11, 1)
    assert one_by_one == first  # a prompt's draws do not depend on its batch neighbours
    other, _ = run(12, 64)
    assert [m for r in other for _, m in r] != [m for r in first for _, m in r]


def test_failures_are_counted_not_raised():
    """Per prompt: empty answer, refusal, one 503 then fine, a server slower than the timeout."""
    lock, failed_once = threading.Lock(), set()

    def respond(prompt: str, index: int, request: dict[str, Any]) -> str:
        if "empty me" in prompt:
            return ""
        if "refuse me" in prompt:
            return "I'm sorry, I can't help with that."
        return rewrite(prompt, index, request)

    def fail(request: dict[str, Any]) -> tuple[str, float] | None:
        content = request["messages"][-1]["content"]
        if "slow me" in content:
            return ("sleep", 2.5)
        with lock:
            if "flaky me" in content and content not in failed_once:
                failed_once.add(content)
                return ("status", 503)
        return None

    prompts = ["fine me", "empty me", "refuse me", "flaky me", "slow me"]
    started = time.monotonic()
    with OpenAICompatibleServer(respond, fail) as server:
        ev = load(server)
        out = ev.evolve(prompts, [None] * 5, 4, seed=0)
    assert time.monotonic() - started < 20
    assert [len(r) for r in out] == [4] * 5
    _, stats = evolved_records(seed_records(prompts), out, iteration=1)
    assert stats.kept == 8  # fine me and flaky me: four links each
    # empty: 4 (empty me) + 3 (links after the refusal) + 4 (slow me); nothing rewrites junk.
    assert stats.dropped == {
        "empty": 11, "refusal": 1, "too_long": 0, "same_as_parent": 0, "unrelated": 0,
        "duplicate": 0, "heldout": 0,
    }  # fmt: skip
    # Each link of flaky me answers 503 once, then 200 on the client's retry. Requests: fine 4,
    # flaky 4 x 2, empty 1, refuse 1, slow 1 + 1 retry; the links after a failure are not sent.
    assert len(server.requests) == 16
    assert ev.stats() == {
        "requests": 11, "timeout": 1, "skipped_after_failure": 9,
    }  # fmt: skip


def test_a_missing_key_fails_at_load_and_settings_reach_the_client(monkeypatch):
    monkeypatch.delenv("EVA_TEST_EVOLVE_KEY", raising=False)
    with OpenAICompatibleServer(rewrite) as server:
        with pytest.raises(LLMConfigError, match="EVA_TEST_EVOLVE_KEY is unset or empty"):
            load(server, llm={"api_key_env": "EVA_TEST_EVOLVE_KEY"})
        assert server.requests == []
        # The settings reach eva's client as configured (no whole-second rounding), and
        # distilabel's LLM sends through that client.
        ev = load(server, llm={"timeout_s": 1.5, "max_retries": 3}, seed_requests=True)
        llm = ev._llm(seed=4)
        assert llm.client is ev.client and llm.model_name == "tiny"
        assert (ev.client.config.base_url, ev.client.config.timeout_s) == (server.base_url, 1.5)
        assert ev.client.config.max_retries == 3
        ev.evolve(["a prompt"], [None], 1, seed=4)
        assert isinstance(server.requests[0]["body"]["seed"], int)
        # No key variable: no Authorization header at all, as for every eva client.
        assert "authorization" not in {k.lower() for k in server.requests[0]["headers"]}


def test_configuration_errors_stop_the_stage():
    with OpenAICompatibleServer(rewrite, lambda r: ("status", 401)) as server:
        with pytest.raises(LLMBatchError, match=r"HTTP 401: injected failure \(not retried\)"):
            load(server).evolve(["a prompt"], [None], 2, seed=0)
        assert len(server.requests) == 1  # 401 is not retried


def test_evol_complexity_has_no_breadth_and_self_instruct_pads_failures():
    with OpenAICompatibleServer(rewrite) as server:
        out = load(server, task="evol_complexity").evolve(PROMPTS, [None] * 6, 4, seed=3)
    assert {mutation_of(c) for c in contents(server)} <= set(MUTATION_TEMPLATES) - {"BREADTH"}
    assert all(m.startswith("evol_complexity:") for r in out for _, m in r)

    def lines(prompt: str, index: int, request: dict[str, Any]) -> str:
        return "" if "Explain" in prompt else "Query one?\nQuery two?\n\nQuery three?"

    with OpenAICompatibleServer(lines) as server:
        out = load(server, task="self_instruct").evolve(PROMPTS[:2], [None] * 2, 4, seed=0)
    assert len(server.requests) == 2 and all(
        "Develop 4 user queries" in c for c in contents(server)
    )
    queries = ["Query one?", "Query two?", "Query three?", ""]
    assert [t for t, _ in out[0]] == queries  # one per non-empty line, padded to four
    assert [m for _, m in out[0]][2:] == ["self_instruct:3", "self_instruct:failed"]
    assert out[1] == [("", "self_instruct:failed")] * 4


def test_a_503_is_retried_with_eva_backoff_and_counted_by_the_client():
    """One 503, then 200: retried once after eva's backoff (``backoff_s`` 1.2 with equal jitter:
    at least 0.6 s, where the openai library would wait at most 0.5 s), and the client counts
    both HTTP requests, the retry and the tokens; the evolver counts one request."""
    failed: list[str] = []

    def fail(request: dict[str, Any]) -> tuple[str, float] | None:
        if not failed:
            failed.append(request["messages"][-1]["content"])
            return ("status", 503)
        return None

    with OpenAICompatibleServer(rewrite, fail) as server:
        ev = load(server, llm={"backoff_s": 1.2, "max_retries": 2})
        out = ev.evolve(["a prompt"], [None], 1, seed=0)
    assert out[0][0][0].startswith("a prompt +")
    assert len(server.requests) == 2
    assert 0.6 <= server.requests[1]["time"] - server.requests[0]["time"] < 3
    assert ev.client.stats() == {
        "requests": 2, "retries": 1, "failures": 0, "prompt_tokens": 1, "completion_tokens": 1,
    }  # fmt: skip
    assert ev.stats() == {"requests": 1}


def test_retry_after_is_capped_by_max_backoff_and_retries_run_out():
    """A 429 asking for 30 s waits ``max_backoff_s`` (eva's cap; the openai library would wait
    the 30 s); a server that keeps answering 503 costs max_retries + 1 attempts, then ""."""
    calls: list[int] = []

    def fail(request: dict[str, Any]) -> tuple[str, float] | None:
        calls.append(1)
        return ("retry_after", 30) if len(calls) == 1 else None

    started = time.monotonic()
    with OpenAICompatibleServer(rewrite, fail) as server:
        ev = load(server, llm={"backoff_s": 0.01, "max_backoff_s": 0.3})
        ev.evolve(["a prompt"], [None], 1, seed=0)
    assert time.monotonic() - started < 5
    assert server.requests[1]["time"] - server.requests[0]["time"] >= 0.3
    assert ev.client.stats()["retries"] == 1

    with OpenAICompatibleServer(rewrite, lambda r: ("status", 503)) as server:
        ev = load(server, llm={"backoff_s": 0.01, "max_retries": 2})
        out = ev.evolve(["a prompt"], [None], 3, seed=0)
    assert [t for t, _ in out[0]] == ["", "", ""]  # the chain stops after its failed link
    assert len(server.requests) == 3  # one link, 1 + 2 retries; the others are not sent
    assert ev.stats() == {"requests": 1, "error_503": 1, "skipped_after_failure": 2}
    assert ev.client.stats()["failures"] == 1


def test_stats_count_every_evolve_call_since_load():
    with OpenAICompatibleServer(rewrite) as server:
        ev = load(server)
        ev.evolve(PROMPTS[:2], [None] * 2, 2, seed=0)
        assert ev.stats() == {"requests": 4}
        ev.evolve(PROMPTS[2:3], [None], 3, seed=1)
    assert ev.stats() == {"requests": 7}  # the second call's 3 add to the first's 4


def test_a_fractional_timeout_applies_and_is_counted():
    """timeout_s 0.4 against a server that takes 0.8 s: a timeout (distilabel's own client took
    whole seconds and would have waited for the answer)."""
    with OpenAICompatibleServer(rewrite, lambda r: ("sleep", 0.8)) as server:
        ev = load(server, llm={"timeout_s": 0.4, "max_retries": 0})
        out = ev.evolve(["a prompt"], [None], 2, seed=0)
    assert [t for t, _ in out[0]] == ["", ""] and len(server.requests) == 1
    assert ev.stats() == {"requests": 1, "timeout": 1, "skipped_after_failure": 1}
    assert ev.client.stats()["failures"] == 1


@pytest.mark.parametrize("status", [401, 403, 404])
def test_a_configuration_error_stops_every_task_at_once(status: int):
    """401/403/404 are not retried, whatever max_retries, and stop the evolver after the first
    answer: nothing new is sent (concurrency 1), and the error is one EvaError line."""
    for task in ("evol_instruct", "self_instruct"):
        with OpenAICompatibleServer(rewrite, lambda r: ("status", status)) as server:
            ev = load(server, task=task, llm={"max_retries": 3, "concurrency": 1})
            with pytest.raises(LLMBatchError, match=f"HTTP {status}") as info:
                ev.evolve(PROMPTS, [None] * len(PROMPTS), 3, seed=0)
        assert isinstance(info.value, EvaError) and "\n" not in str(info.value)
        assert len(server.requests) == 1
        assert ev.client.stats()["retries"] == 0


def test_concurrency_null_content_and_client_errors():
    """At most ``concurrency`` requests in flight; null content and a 400 are "" (counted),
    without stopping the others."""

    def respond(prompt: str, index: int, request: dict[str, Any]) -> Any:
        return None if "null me" in given(prompt) else rewrite(prompt, index, request)

    def fail(request: dict[str, Any]) -> tuple[str, float] | None:
        return ("status", 400) if "bad me" in request["messages"][-1]["content"] else ("sleep", 0.1)

    prompts = ["null me", "bad me", *PROMPTS]
    with OpenAICompatibleServer(respond, fail) as server:
        ev = load(server, llm={"concurrency": 2, "max_retries": 3})
        out = ev.evolve(prompts, [None] * len(prompts), 1, seed=0)
    assert server.max_in_flight == 2
    assert [t for t, _ in out[0]] == [""] and [t for t, _ in out[1]] == [""]
    assert all(r[0][0].startswith(p + " +") for p, r in zip(PROMPTS, out[2:], strict=True))
    assert ev.stats() == {"requests": 8, "no_content": 1, "error_400": 1}
    assert len(server.requests) == 8  # a 400 is not retried


def test_only_a_chains_first_in_depth_link_is_held_to_its_parents_topic():
    from tasks.backends.evolve.distilabel import DistilabelRewriter

    keeps = DistilabelRewriter.keeps_topic
    assert keeps("evol_instruct:constraints:chain-1") and keeps("evol_complexity:deepening:chain-1")
    assert not keeps("evol_instruct:breadth:chain-1")  # a new prompt by design
    assert not keeps("evol_instruct:constraints:chain-2")  # rewrites link 1, not the parent
    assert not keeps("self_instruct:1") and not keeps("self_instruct:failed")

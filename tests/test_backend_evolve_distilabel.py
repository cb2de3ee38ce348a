"""distilabel EvolInstruct/EvolComplexity/SelfInstruct as eva's evolver, over a real local
OpenAI-compatible HTTP server: chains, seeded mutation choice, and failures that must not stop
the stage (empty answers, refusals, 503s, timeouts)."""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import openai
import pytest

from eva_core.evolution import evolved_records
from eva_core.schema import seed_records
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
        "empty": 11, "refusal": 1, "too_long": 0, "same_as_parent": 0, "duplicate": 0,
        "heldout": 0,
    }  # fmt: skip
    # Each link of flaky me answers 503 once, then 200 on the client's retry. Requests: fine 4,
    # flaky 4 x 2, empty 1, refuse 1, slow 1 + 1 retry; the links after a failure are not sent.
    assert len(server.requests) == 16
    assert ev.stats() == {
        "requests": 11, "timeout": 1, "skipped_after_failure": 9,
    }  # fmt: skip


def test_a_missing_key_fails_at_load_and_settings_reach_distilabel(monkeypatch):
    monkeypatch.delenv("EVA_TEST_EVOLVE_KEY", raising=False)
    with OpenAICompatibleServer(rewrite) as server:
        with pytest.raises(LLMConfigError, match="EVA_TEST_EVOLVE_KEY is unset or empty"):
            load(server, llm={"api_key_env": "EVA_TEST_EVOLVE_KEY"})
        assert server.requests == []
        # No key variable: a placeholder local servers ignore; the client settings are handed
        # over as distilabel takes them (a whole-second timeout, rounded up).
        ev = load(server, llm={"timeout_s": 1.5, "max_retries": 3}, seed_requests=True)
        llm = ev._llm(seed=4)
        assert (llm.base_url, llm.model, llm.timeout, llm.max_retries) == (
            server.base_url, "tiny", 2, 3,
        )  # fmt: skip
        assert llm.api_key.get_secret_value() == "EMPTY"
        ev.evolve(["a prompt"], [None], 1, seed=4)
        assert isinstance(server.requests[0]["body"]["seed"], int)


def test_configuration_errors_stop_the_stage():
    with OpenAICompatibleServer(rewrite, lambda r: ("status", 401)) as server:
        with pytest.raises(openai.AuthenticationError):
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

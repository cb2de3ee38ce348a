"""The paper's rewriting strategies and the best-of-N tree, over a real local OpenAI-compatible
server: seeded strategy choice, beam selection by a scorer, the LLM judge as default scorer."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from eva_core.evolution import evolved_records
from eva_core.schema import seed_records
from eva_runtime.errors import ConfigError
from tasks.backends.evolve import EvolverBackend
from tasks.backends.evolve.paper import IN_BREADTH, IN_DEPTH, STRATEGIES, PaperTemplateEvolver
from tasks.backends.protocols import Evolver
from tasks.evolve import EvolveConfig
from tests.support.openai_server import OpenAICompatibleServer

PROMPTS = ["Write a haiku.", "Explain tides.", "Sort numbers.", "Name a planet."]
_GIVEN = re.compile(r"#Given Prompt#:\n(.*?)\n#(Rewritten|Created) Prompt#:$", re.S)


def strategy_of(request: str) -> str:
    """Which strategy a request carries (each template quotes its method text)."""
    found = [s for s, m in {**IN_DEPTH, **IN_BREADTH}.items() if m in request]
    assert len(found) == 1, request[:400]
    return found[0]


def rewrite(prompt: str, index: int, request: dict[str, Any]) -> str:
    if prompt.startswith("You are an expert judge"):  # the LLM complexity judge
        return "Complexity: 7\nQuality: 8"
    m = _GIVEN.search(prompt)
    assert m, prompt[:300]
    # Answer as a careless model would: echoing the frame's label, which post-processing strips.
    return f"#{m.group(2)} Prompt#:\n{m.group(1)} [{strategy_of(prompt)}]"


def load(server: OpenAICompatibleServer, **overrides: Any) -> Any:
    llm = {"base_url": server.base_url, "model": "tiny", "timeout_s": 2, "max_retries": 0}
    return PaperTemplateEvolver(**{"llm": llm, "scorer": "length", **overrides}).load()


def sent(server: OpenAICompatibleServer) -> list[str]:
    return [r["body"]["messages"][-1]["content"] for r in server.requests]


def test_one_rewrite_per_strategy_of_the_parent():
    with OpenAICompatibleServer(rewrite) as server:
        ev = load(server)
        assert isinstance(ev, Evolver)
        out = ev.evolve(PROMPTS, [None] * 4, 4, seed=5)
    assert len(server.requests) == 16 and ev.stats()["scored"] == 0  # no selection needed
    for parent, rewrites in zip(PROMPTS, out, strict=True):
        methods = [m for _, m in rewrites]
        assert len(set(methods)) == 4 and all(
            m.removeprefix("paper:") in STRATEGIES for m in methods
        )
        for text, method in rewrites:  # a tree: every rewrite is of the parent itself
            strategy = method.removeprefix("paper:")
            label = "Rewritten" if strategy in IN_DEPTH else "Created"
            assert text == f"#{label} Prompt#:\n{parent} [{strategy}]"
    # Appendix F's two frames: in-depth strategies ask a Prompt Rewriter for a harder prompt of
    # about the same length; in-breadth ones ask a Prompt Creator for a new one; each request
    # carries exactly one prompt (mix, too, brings in another domain, not another prompt).
    for request in sent(server):
        depth = strategy_of(request) in IN_DEPTH
        assert ("expert Prompt Rewriter" in request) == depth
        assert ("expert Prompt Creator" in request) == (not depth)
        assert ("CHALLENGING" in request) == depth and "real person's prompt" in request
        assert len(_GIVEN.findall(request)) == 1 and request.count("#Given Prompt#:\n") == 1
    table, stats = evolved_records(seed_records(PROMPTS), out, iteration=1)
    assert stats.kept == 16 and stats.cleaned == 16  # the echoed label was stripped
    assert not any(p.startswith("#") for p in table.column("prompt").to_pylist())


def test_strategy_choice_is_seeded():
    def run(seed: int) -> tuple[list[Any], list[str]]:
        with OpenAICompatibleServer(rewrite) as server:
            out = load(server).evolve(PROMPTS, [None] * 4, 3, seed)
        return out, sorted(sent(server))

    assert run(9) == run(9)
    assert run(9)[0] != run(10)[0]
    with OpenAICompatibleServer(rewrite) as server:
        alone = load(server).evolve(PROMPTS[:1], [None], 3, seed=9)[0]
    # A prompt's draws depend on the seed and its index, not on the rest of the batch.
    assert [m for _, m in alone] == [m for _, m in run(9)[0][0]]


def test_best_of_n_tree_keeps_the_top_scored_and_recurses():
    calls: list[Sequence[str]] = []

    def by_length(texts: Sequence[str]) -> list[float]:
        calls.append(list(texts))
        return [float(len(t)) for t in texts]

    with OpenAICompatibleServer(rewrite) as server:
        cfg = PaperTemplateEvolver(
            llm={"base_url": server.base_url, "model": "tiny"},
            strategies_per_seed=3,
            keep_best=2,
            depth=2,
        )
        ev = cfg.load(scorer=by_length)
        out = ev.evolve(PROMPTS[:2], [None] * 2, 2, seed=1)
    # level 1: 1 node x 3 per prompt; level 2: 2 kept nodes x 3 per prompt.
    assert len(server.requests) == 2 * (3 + 6)
    assert [len(c) for c in calls] == [6, 12]  # one scorer call per level, for both prompts
    for rewrites, level2 in zip(out, (calls[1][:6], calls[1][6:]), strict=True):
        assert len(rewrites) == 2 and all(m.count(">") == 1 for _, m in rewrites)
        best = sorted((len(t) for t in level2), reverse=True)[:2]
        assert sorted((len(t.split("\n", 1)[1]) for t, _ in rewrites), reverse=True) == best


def test_failures_fill_the_beam_only_when_nothing_better_is_left():
    def respond(prompt: str, index: int, request: dict[str, Any]) -> str:
        if "Explain tides." in prompt:
            return "I'm sorry, I can't do that."
        return rewrite(prompt, index, request)

    with OpenAICompatibleServer(respond) as server:
        ev = load(server, strategies_per_seed=4, keep_best=2)
        out = ev.evolve(PROMPTS[:2], [None] * 2, 2, seed=0)
    assert all("sorry" not in t for t, _ in out[0])
    assert [t for t, _ in out[1]] == ["I'm sorry, I can't do that."] * 2
    _, stats = evolved_records(seed_records(PROMPTS[:2]), out, iteration=1)
    assert stats.kept == 2 and stats.dropped["refusal"] == 2


def test_unknown_strategies_are_refused_when_the_config_is_read():
    from flows.config import validate_config

    evolver = {"kind": "paper", "llm": {"model": "m"}, "strategies": ["persona", "telepathy"]}
    with pytest.raises(ConfigError, match=r"unknown \['telepathy'\]") as e:
        validate_config({"evolve": {"evolver": evolver}})
    assert e.value.field == "evolve.evolver.strategies"
    with pytest.raises(ConfigError, match="none given") as e:
        validate_config({"evolve": {"evolver": {**evolver, "strategies": []}}})


def test_stats_count_every_evolve_call_since_load():
    with OpenAICompatibleServer(rewrite) as server:
        ev = load(server, scorer="judge", strategies_per_seed=3, keep_best=1)
        ev.evolve(PROMPTS[:1], [None], 1, seed=0)
        first = ev.stats()
        ev.evolve(PROMPTS[1:3], [None] * 2, 1, seed=1)
    assert first["requests"] == first["judge_requests"] == first["generated"] == 3
    # The second call's 6 rewrites and 6 verdicts add to the first's.
    stats = ev.stats()
    assert stats["requests"] == stats["judge_requests"] == stats["generated"] == 9
    assert stats["scored"] == 9 and stats["judge_failures"] == 0


def test_default_scorer_is_the_llm_judge():
    with OpenAICompatibleServer(rewrite) as server:
        ev = load(server, scorer="judge", strategies_per_seed=3, keep_best=1)
        out = ev.evolve(PROMPTS[:1], [None], 1, seed=0)
    assert ev.stats()["judge_requests"] == 3 and ev.stats()["requests"] == 3
    judged = [c for c in sent(server) if c.startswith("You are an expert judge")]
    assert len(judged) == 3 and len(out[0]) == 1  # ties (7 + 8 each) keep the first drawn
    judge_bodies = [r["body"] for r in server.requests if "expert judge" in str(r["body"])]
    assert all(b["temperature"] == 0.0 for b in judge_bodies)


def test_config_union_and_validation():
    cfg = EvolveConfig.model_validate({"evolver": {"kind": "paper", "llm": {"model": "m"}}})
    assert isinstance(cfg.evolver, PaperTemplateEvolver) and cfg.evolver.depth == 1
    assert EvolveConfig().evolver is None  # the rewriter is the user's to name
    with pytest.raises(ValidationError):
        EvolveConfig.model_validate({"evolver": {"kind": "nope"}})
    with pytest.raises(ValidationError, match=r"unknown \['telepathy'\]; choose from"):
        PaperTemplateEvolver(llm={"model": "m"}, strategies=("persona", "telepathy"))
    parsed = TypeAdapter(EvolverBackend).validate_python(
        {"kind": "distilabel", "task": "self_instruct", "llm": {"model": "m"}}
    )
    assert parsed.kind == "distilabel" and parsed.temperature == 0.88
    with pytest.raises(ValidationError, match="temperature"):
        PaperTemplateEvolver.model_validate({"llm": {"model": "m", "temperature": 0.5}})


def test_evolve_stage_runs_an_llm_evolver_and_reports_its_requests(tmp_path: Path):
    from tasks.context import RunContext, StageContext
    from tasks.evolve import evolve

    run = RunContext(root=str(tmp_path), run="t", seed=0)
    ctx = StageContext(run, 1, "evolve", 4, {}, str(tmp_path), run.store(), lambda _: None)
    with OpenAICompatibleServer(rewrite) as server:
        llm = {"base_url": server.base_url, "model": "tiny"}
        config = EvolveConfig.model_validate(
            {"num_evolutions": 2, "evolver": {"kind": "paper", "llm": llm, "scorer": "length"}}
        )
        out = evolve.fn(ctx, config, subset=seed_records(PROMPTS), heldout=seed_records(["x"]))
    assert out.table.num_rows == 8 and set(out.table.column("depth").to_pylist()) == {1}
    assert out.stats["kept"] == 8 and out.stats["cleaned"] == 8
    assert out.stats["backend"] == {
        "requests": 8, "retries": 0, "failures": 0, "prompt_tokens": 8, "completion_tokens": 8,
        "generated": 8, "scored": 0,
    }  # fmt: skip
    assert all(m.startswith("paper:") for m in out.table.column("evolve_method").to_pylist())


STORY = "Write a short story about a dragon who guards a library of forgotten books."


def test_an_in_depth_rewrite_that_drops_the_parents_topic_is_not_kept():
    # A rewriter that answers every request with the same generic line (seen with a local
    # model): in-depth rewrites of a story prompt that share none of its words are dropped as
    # unrelated; in-breadth ones may leave the topic; a prompt of too few words is not judged.
    def generic(prompt: str, index: int, request: dict[str, Any]) -> str:
        return "Explain step by step."

    parents = [STORY, "Sort numbers."]
    with OpenAICompatibleServer(generic) as server:
        ev = load(server, strategies=("constraints", "deepening", "shift-out"))
        out = ev.evolve(parents, [None] * 2, 3, seed=0)
    assert [sorted(m for _, m in r) for r in out] == [
        ["paper:constraints", "paper:deepening", "paper:shift-out"]
    ] * 2
    table, stats = evolved_records(
        seed_records(parents), out, iteration=1, keeps_topic=ev.keeps_topic, min_shared_words=1
    )
    # Story: 2 in-depth children unrelated, the shift-out one kept; "Sort numbers." (2 words)
    # is not judged, and its children repeat the kept text (duplicates).
    assert stats.dropped["unrelated"] == 2 and stats.dropped["duplicate"] == 3
    assert table.column("evolve_method").to_pylist() == ["paper:shift-out"]
    _, off = evolved_records(seed_records(parents), out, iteration=1, keeps_topic=ev.keeps_topic)
    assert off.dropped["unrelated"] == 0  # min_shared_words 0: off
    assert ev.keeps_topic("paper:constraints>deepening") and not ev.keeps_topic(
        "paper:constraints>persona"
    )

"""The online loop: a slow API evolver overlaps with training instead of stalling it; rewards are
recorded by row, whatever layout the trainer passes them in; a resumed loop serves the batches an
uninterrupted one does.

The trainer is played by a loop that fetches one mini-batch from the TRL bridge's dataset (as
torch's data loader does, through ``datasets``' batched fetch), "trains" for a fixed time, scores
its samples through the bridge's reward wrapper and ends the step as the bridge's callback does;
the evolver is the paper's template evolver against a real local OpenAI-compatible server that
answers slowly. (TRL's own trainers drive the same loop in tests/test_online_skip_tied.py.)
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from eva_core.creator import Creator
from eva_core.schema import seed_records
from tasks.backends.evolve.paper import PaperTemplateEvolver
from tasks.backends.protocols import no_progress
from tasks.online_loop import BufferConfig, OnlineLoop, rewriter_of
from tests.support.openai_server import OpenAICompatibleServer
from tests.test_backend_evolve_paper import rewrite

DELAY = 0.4  # seconds the server takes per request
STEP = 3 * DELAY  # a training step: longer than an evolution, with room for a loaded machine


class TextReward:
    """A reward model for scripted samples: each sample's text is its reward."""

    def score(
        self, prompts: Sequence[str], responses: Sequence[Sequence[str]], progress=no_progress
    ):
        return [[float(text) for text in row] for row in responses]


class Fetcher:
    """The trainer's data loader over the bridge's dataset: batches of ``k`` slots in order,
    ``generations`` rows a prompt (RLOO/GRPO's layout)."""

    def __init__(self, loop: OnlineLoop, k: int, generations: int = 1):
        self.dataset = loop.feed.dataset(slots=1 << 12)
        self.k, self.generations, self.next = k, generations, 0

    def __call__(self) -> list[dict[str, Any]]:
        slots = [s for s in range(self.next, self.next + self.k) for _ in range(self.generations)]
        self.next += self.k
        return self.dataset.__getitems__(slots)


def trained(
    loop: OnlineLoop, batch: list[dict[str, Any]], rewards: np.ndarray, halves: bool = False
) -> None:
    """One training step on ``batch`` (one row a prompt): score its samples in RLOO/GRPO's
    layout (each prompt's samples together) or online DPO's (the batch once per sample) through
    the bridge's reward wrapper, then end the step as the bridge's callback does."""
    if halves:
        order = [(i, j) for j in range(rewards.shape[1]) for i in range(len(batch))]
    else:
        order = [(i, j) for i in range(len(batch)) for j in range(rewards.shape[1])]
    reward = loop.feed.recording(
        lambda prompts, completions, eva_row, **_: loop.score(eva_row, prompts, completions)
    )
    flat = reward(
        prompts=[batch[i]["prompt"] for i, _ in order],
        completions=[repr(float(rewards[i, j])) for i, j in order],
        eva_row=[batch[i]["eva_row"] for i, _ in order],
    )
    assert flat == [float(rewards[i, j]) for i, j in order]
    loop.feed.observe()


def slow_rewrite(prompt: str, index: int, request: dict[str, Any]) -> str:
    time.sleep(DELAY)
    return rewrite(prompt, index, request)  # the given prompt, tagged with its strategy


def seeds(n: int) -> list[dict[str, Any]]:
    return seed_records([f"question {i}?" for i in range(n)]).to_pylist()


def creator(n: int, evolver: Any = None, lag: int = 0, **settings: Any) -> Creator:
    pool = ThreadPoolExecutor(max_workers=1)
    return BufferConfig(**settings).creator(seeds(n), 0, evolver, pool, evolve_lag=lag)


def run(server: OpenAICompatibleServer, lag: int, steps: int = 4) -> OnlineLoop:
    llm = {"base_url": server.base_url, "model": "tiny", "timeout_s": 10}
    evolver = PaperTemplateEvolver(llm=llm, scorer="length").load()
    loop = OnlineLoop(creator(40, evolver, lag, size=100, n_new=2), TextReward())
    fetch = Fetcher(loop, 4)
    for step in range(steps):
        batch = fetch()
        time.sleep(STEP)  # the training step
        rewards = np.tile([1.0, 0.0], (4, 1)) * (np.arange(4)[:, None] + 1 + step) / 10
        trained(loop, batch, rewards)
    loop.close()
    return loop


def test_evolution_overlaps_training_with_lag_and_costs_are_counted() -> None:
    with OpenAICompatibleServer(slow_rewrite) as server:
        waited = run(server, lag=0)
        overlapped = run(server, lag=1)
    # lag 0 waits for every evolution; lag 1 finds it done after the next training step.
    assert waited.stats.evolve_wait_seconds > 3 * 0.5 * DELAY
    assert overlapped.stats.evolve_wait_seconds < 0.5 * waited.stats.evolve_wait_seconds
    for source in (waited, overlapped):
        assert source.stats.evolve_seconds >= 4 * DELAY * 0.9  # the evolver's own time
        assert source.report()["parents"] == 8 and source.report()["children_added"] == 16
    # The same children enter B either way; only the step at which they do differs.
    kids = [
        sorted(e.record["prompt"] for e in s.creator.buffer.entries) for s in (waited, overlapped)
    ]
    assert kids[0] == kids[1] and all(k.startswith("question") for k in kids[0])
    first = {r["prompt_id"]: r for r in waited.log}
    entry = waited.creator.buffer.entries[0].record
    assert entry["depth"] == first[entry["parent_id"]]["depth"] + 1
    assert entry["evolve_method"].startswith("paper:")


def test_rewards_are_recorded_by_row_whatever_the_layout() -> None:
    # 3 seeds, 4 prompts a step: the first batch holds one prompt twice (a refill from D).
    rewards = np.array([[0.1, 0.9], [0.5, 0.5], [0.2, 0.4], [0.7, 0.3]])
    logs = []
    for halves in (False, True):
        loop = OnlineLoop(creator(3, evolve=False), TextReward())
        batch = Fetcher(loop, 4)()
        assert len({r["prompt_id"] for r in batch}) == 3
        trained(loop, batch, rewards, halves=halves)
        logs.append(loop.log)
    assert [r["rewards"] for r in logs[0]] == rewards.tolist()  # in draw order
    assert logs[0] == logs[1]


def test_a_step_that_scored_part_of_a_batch_is_refused() -> None:
    loop = OnlineLoop(creator(20, evolve=False), TextReward())
    first = Fetcher(loop, 2)()
    record = loop.feed.recording(lambda prompts, completions, **_: [1.0] * len(prompts))
    record(prompts=[first[0]["prompt"]], completions=["1.0"], eva_row=[first[0]["eva_row"]])
    with pytest.raises(RuntimeError, match="a step ended with 1 of draw 0's 2 prompts scored"):
        loop.feed.observe()  # one of the batch's two prompts was never scored


def test_a_resumed_loop_serves_the_batches_drawn_ahead_first() -> None:
    """A trainer that prefetches one batch, stopped after 3 steps and resumed from the saved
    state, trains on the batches an uninterrupted one trains on, and ends in the same state.

    (With evolve_lag 0. With a lag, a segment's end joins the evolutions still running, so
    their children enter B a step earlier than in one long segment: segments are fixed by the
    config, and a run resumes from a finished segment, so that is still exact.)"""

    def train(loop: OnlineLoop, steps: int) -> list[list[str]]:
        fetch = Fetcher(loop, 2)
        ahead = fetch()
        out = []
        for _ in range(steps):
            batch, ahead = ahead, fetch()  # the loader fetches one batch ahead
            drawn = int(batch[0]["eva_row"].split(":")[0])  # the batch's draw index
            rewards = np.random.default_rng(drawn).random((2, 3))
            trained(loop, batch, rewards)
            out.append([r["prompt"] for r in batch])
        loop.close()
        return out

    class Tagger:  # evolves by tagging: children are named after their parent and step
        def evolve(self, prompts, categories, n, seed):
            return [[(f"{p} /{seed % 1000}.{j}", "tag") for j in range(n)] for p in prompts]

    def new(state: dict[str, Any] | None = None) -> OnlineLoop:
        if state is None:
            return OnlineLoop(
                creator(10, Tagger(), size=6, n_new=2, n_new_bootstrap=1), TextReward()
            )
        made = Creator.from_state(seeds(10), state["creator"], rewriter=rewriter_of(Tagger()))
        return OnlineLoop(made, TextReward(), state=state)

    whole = new()
    batches = train(whole, 8)
    head = new()
    first = train(head, 3)
    saved = json.loads(json.dumps(head.state()))
    assert len(saved["pending"]) == 1  # drawn ahead, not trained
    resumed = new(saved)
    assert first + train(resumed, 5) == batches
    assert [r["prompt"] for r in resumed.log[:2]] == [
        r["prompt"] for r in saved["pending"][0]["records"]
    ]
    assert head.log + resumed.log == whole.log
    assert resumed.state() == whole.state()
    assert any(r["from_buffer"] for r in whole.log)  # children were trained on


def test_a_segment_past_the_budget_stops_naming_the_budget(tmp_path) -> None:
    # `eva stage online --iteration 3` of a 2-step budget, or a budget lowered since: the
    # segment refuses in one line naming online.budget instead of a bare ValueError.
    from tasks.context import RunContext, StageContext
    from tasks.online import STATE_FILE, OnlineConfig, online
    from tasks.stage import StageError

    seeds = seed_records(["1+2=", "3+4=", "5+6=", "7+1="])
    config = OnlineConfig.model_validate({
        "reward": {"kind": "callable", "function": "eva_world.world:reward"},
        "buffer": {"evolve": False}, "solver": {"prompts_per_step": 2}, "steps_per_segment": 1,
    })  # fmt: skip
    creator = config.buffer.creator(seeds.to_pylist(), 0, None, executor=ThreadPoolExecutor(1))
    policy = tmp_path / "policy"
    policy.mkdir()
    state = {"creator": creator.state(), "trained_steps": config.total_steps(4)}
    (policy / STATE_FILE).write_text(json.dumps(state))
    run = RunContext(root=str(tmp_path / "runs"), run="t", seed=0)
    ctx = StageContext(run, 3, "online", 0, {}, str(tmp_path), run.store(), lambda _: None)
    ctx.model_dir = lambda name: str(policy)  # type: ignore[method-assign]
    with pytest.raises(StageError, match=r"segment 3: the budget was used up .*2 of 2 steps") as e:
        online.fn(ctx, config, seeds, seeds.select(["prompt_id"]))
    assert e.value.field == "online.budget" and "raise online.budget" in (e.value.hint or "")

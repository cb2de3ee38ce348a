"""The online prompt source: a slow API evolver overlaps with training instead of stalling it.

The trainer is played by a loop that takes one mini-batch from the stream, "trains" for a
fixed time and hands rewards back, as TRL's reward function does; the evolver is the paper's
template evolver against a real local OpenAI-compatible server that answers slowly.
"""

from __future__ import annotations

import time
from itertools import islice
from typing import Any

import numpy as np

from eva_core.buffer import BufferSettings, PromptBuffer
from eva_core.schema import seed_records
from tasks.backends.evolve.paper import PaperTemplateEvolver
from tasks.backends.online_source import OnlinePromptSource
from tests.support.openai_server import OpenAICompatibleServer
from tests.test_backend_evolve_paper import rewrite

DELAY = 0.4  # seconds the server takes per request
STEP = 3 * DELAY  # a training step: longer than an evolution, with room for a loaded machine


def slow_rewrite(prompt: str, index: int, request: dict[str, Any]) -> str:
    time.sleep(DELAY)
    return rewrite(prompt, index, request)  # the given prompt, tagged with its strategy


def run(server: OpenAICompatibleServer, lag: int, steps: int = 4) -> OnlinePromptSource:
    llm = {"base_url": server.base_url, "model": "tiny", "timeout_s": 10}
    evolver = PaperTemplateEvolver(llm=llm, scorer="length").load()
    seeds = seed_records([f"question {i}?" for i in range(40)]).to_pylist()
    buffer = PromptBuffer(seeds, BufferSettings(size=100, n_new=2), seed=0)
    source = OnlinePromptSource(buffer, 4, evolver, evolve_lag=lag)
    stream = source.records()
    for step in range(steps):
        batch = [r["prompt"] for r in islice(stream, 4)]
        time.sleep(STEP)  # the training step
        rewards = np.tile([1.0, 0.0], (4, 1)) * (np.arange(4)[:, None] + 1 + step) / 10
        source.feedback(batch, rewards)
    source.close()
    return source


def test_evolution_overlaps_training_with_lag_and_costs_are_counted() -> None:
    with OpenAICompatibleServer(slow_rewrite) as server:
        waited = run(server, lag=0)
        overlapped = run(server, lag=1)
    # lag 0 waits for every evolution; lag 1 finds it done after the next training step.
    assert waited.stats.evolve_wait_seconds > 3 * 0.5 * DELAY
    assert overlapped.stats.evolve_wait_seconds < 0.5 * waited.stats.evolve_wait_seconds
    for source in (waited, overlapped):
        assert source.stats.evolve_seconds >= 4 * DELAY * 0.9  # the evolver's own time
        assert source.stats.parents == 8 and source.stats.children_added == 16
    # The same children enter B either way; only the step at which they do differs.
    kids = [sorted(e.record["prompt"] for e in s.buffer.entries) for s in (waited, overlapped)]
    assert kids[0] == kids[1] and all(k.startswith("question") for k in kids[0])
    first = {r["prompt_id"]: r for r in waited.log}
    entry = waited.buffer.entries[0].record
    assert entry["depth"] == first[entry["parent_id"]]["depth"] + 1
    assert entry["evolve_method"].startswith("paper:")

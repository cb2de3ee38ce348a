"""The online buffer: phases switch when the paper says, batches mix as it says, B keeps its
size, and a state round-trip resumes the exact sequence of batches."""

from __future__ import annotations

import json

import numpy as np
import pytest

from eva_core.buffer import PromptBuffer
from eva_core.informativeness import informativeness
from eva_core.schema import prompt_id
from tasks.online_loop import BufferConfig


def settings(**overrides) -> dict:
    """The buffer's knobs: the config's defaults (the paper's), with ``overrides``."""
    return BufferConfig(**overrides).model_dump(exclude={"skip_tied"})  # the creator's, not B's


def rec(text: str, depth: int = 0, parent: str | None = None) -> dict:
    pid = prompt_id(text)
    return {
        "prompt_id": pid,
        "prompt": text,
        "source": "seed" if parent is None else "evolved",
        "parent_id": parent,
        "root_id": pid,
        "depth": depth,
        "iteration": 0,
        "evolve_method": None,
        "category": "add",
    }


def seeds(n: int) -> list[dict]:
    return [rec(f"s{i}") for i in range(n)]


def parents(buf: PromptBuffer, rewards: np.ndarray) -> tuple[list[int], np.ndarray]:
    """The rows to evolve and every row's informativeness, as the creator computes them."""
    info = informativeness(np.asarray(rewards, dtype=np.float64), buf.metric)
    return buf.top_rows(info), info


def feed(buf: PromptBuffer, batch, rewards: np.ndarray, tag: str) -> list[str]:
    """Evolve the chosen parents into named children, as a caller (the online trainer) does."""
    rows, info = parents(buf, rewards)
    kids, prio = [], []
    for r in rows:
        parent = batch.records[r]
        for j in range(buf.children_per_parent):
            text = f"{parent['prompt']}/{tag}{j}"
            kids.append(rec(text, parent["depth"] + 1, parent["prompt_id"]))
            prio.append(info[r])
    buf.add_children(kids, prio)
    return [k["prompt"] for k in kids]


def test_warmup_adds_only_children_of_the_top_half_then_mixup_starts_at_size():
    # |D| = 20, batch 4, size 8: each warm-up step adds 2 parents x 4 children = 8.
    buf = PromptBuffer(seeds(20), **settings(size=8, n_new=4), seed=0)
    batch = buf.draw(4)
    assert batch.phase == "warmup" and batch.from_buffer == [False] * 4
    # Rewards: row 2 has the widest max-mean gap, then row 0; rows 1 and 3 are flat.
    rewards = np.array([[1.0, 0.5], [0.3, 0.3], [1.0, 0.0], [0.7, 0.7]])
    rows, info = parents(buf, rewards)
    assert rows == [2, 0]
    np.testing.assert_allclose(info, [0.25, 0.0, 0.5, 0.0])
    kids = feed(buf, batch, rewards, "a")
    assert len(buf.entries) == 8 and len(kids) == 8
    assert {e.record["prompt"] for e in buf.entries} == set(kids)  # parents are not added
    assert [e.priority for e in buf.entries] == [0.5] * 4 + [0.25] * 4  # inherited
    nxt = buf.draw(4)
    assert nxt.phase == "mixup" and nxt.from_buffer == [True, True, False, False]


def test_mixup_batches_are_half_buffer_and_eviction_keeps_size_dropping_oldest():
    buf = PromptBuffer(seeds(40), **settings(size=8, n_new=4), seed=1)
    feed(buf, buf.draw(4), np.array([[1.0, 0.0]] * 4), "w")  # fills B to 8
    oldest = [e.record["prompt"] for e in buf.entries]
    batch = buf.draw(4)
    assert batch.phase == "mixup" and sum(batch.from_buffer) == 2
    assert len(buf.entries) == 6  # the two drawn from B are popped
    kids = feed(buf, batch, np.array([[1.0, 0.0]] * 4), "m")
    assert len(kids) == 8 and len(buf.entries) == 8 and buf.evicted == 6
    kept = {e.record["prompt"] for e in buf.entries}
    assert kept == set(kids)  # all six survivors of warm-up were older than any child
    assert not kept & set(oldest)


def test_bootstrap_starts_when_seeds_run_out_and_keeps_buffer_level():
    buf = PromptBuffer(seeds(5), **settings(size=4, n_new=4, n_new_bootstrap=2), seed=2)
    flat_gap = np.array([[1.0, 0.0]] * 2)
    feed(buf, buf.draw(2), flat_gap, "w")  # 1 parent x 4 children: B full, 3 seeds left
    assert buf.seeds_left == 3
    for left in (2, 1, 0):  # mix-up: one prompt from B, one from D, each step
        batch = buf.draw(2)
        assert batch.phase == "mixup" and batch.from_buffer == [True, False]
        assert buf.seeds_left == left
        feed(buf, batch, flat_gap, f"m{left}")
    b = buf.draw(2)
    assert b.phase == "bootstrap" and b.from_buffer == [True, True]
    assert buf.children_per_parent == 2
    feed(buf, b, flat_gap, "b")  # 1 parent x 2 children replace the 2 popped
    assert len(buf.entries) == 4
    assert buf.budget == pytest.approx(10 / 5)


def test_weighted_draw_prefers_high_priority_and_never_picks_zero_while_positive_remain():
    buf = PromptBuffer(seeds(1), **settings(size=100), seed=3)
    kids = [rec(f"k{i}") for i in range(10)]
    buf.add_children(kids, [0.0] * 5 + [1.0] * 5)
    buf.phase = "bootstrap"
    buf.cursor = 1  # D exhausted
    drawn = [r["prompt"] for r in buf.draw(5).records]
    assert sorted(drawn) == [f"k{i}" for i in range(5, 10)]
    # Over many seeds, a 9:1 priority is drawn first about 90% of the time.
    first = 0
    for s in range(400):
        b = PromptBuffer(seeds(1), **settings(size=10), seed=s, phase="bootstrap", cursor=1)
        b.add_children([rec("hi"), rec("lo")], [0.9, 0.1])
        first += b.draw(1).records[0]["prompt"] == "hi"
    assert 0.85 < first / 400 < 0.95


def test_an_empty_buffer_after_the_seeds_run_out_refills_from_d_at_random():
    # D smaller than a batch, children not in yet: the batch is completed from D again.
    buf = PromptBuffer(seeds(3), **settings(size=10), seed=0)
    first = buf.draw(4)
    assert len(first.records) == 4 and buf.refilled == 1 and buf.seeds_left == 0
    assert len({r["prompt"] for r in first.records}) == 3  # all of D, then one again
    second = buf.draw(4)
    assert second.phase == "bootstrap" and buf.refilled == 5


def test_duplicate_children_are_skipped():
    buf = PromptBuffer(seeds(2), **settings(size=10), seed=0)
    buf.add_children([rec("a"), rec("a"), rec("b")], [1.0, 1.0, 1.0])
    assert [e.record["prompt"] for e in buf.entries] == ["a", "b"]


def test_no_evolution_is_the_plain_baseline_with_epochs_over_seeds():
    buf = PromptBuffer(seeds(5), **settings(evolve=False), seed=4)
    seen = [r["prompt"] for _ in range(5) for r in buf.draw(2).records]
    assert buf.phase == "seed" and buf.entries == []
    assert sorted(seen[:5]) == [f"s{i}" for i in range(5)]  # first epoch covers D once
    assert buf.epoch == 1 and buf.budget == 2.0
    buf.draw(2)
    rows, _ = parents(buf, np.ones((2, 2)))
    assert rows == []


def test_state_round_trips_through_json_and_resumes_the_same_batches():
    def run(buf: PromptBuffer, steps: int) -> list[list[str]]:
        out = []
        for _ in range(steps):
            batch = buf.draw(4)
            out.append([r["prompt"] for r in batch.records])
            g = np.random.default_rng(buf.step).random((4, 3))
            feed(buf, batch, g, f"t{buf.step}")
        return out

    knobs = settings(size=12, n_new=3, n_new_bootstrap=2)
    uninterrupted = PromptBuffer(seeds(30), **knobs, seed=9)
    whole = run(uninterrupted, 20)
    first = PromptBuffer(seeds(30), **knobs, seed=9)
    head = run(first, 7)
    saved = json.loads(json.dumps(first.state()))
    # The checkpoint's format: the knobs under "settings", in the order they have always had.
    assert list(saved["settings"]) == [
        "size", "ratio_evol", "top_fraction", "n_new", "n_new_bootstrap", "metric", "evolve"
    ]  # fmt: skip
    restored = PromptBuffer.from_state(seeds(30), saved)
    tail = run(restored, 13)
    assert head + tail == whole
    assert restored.phase == "bootstrap"  # 20 steps crossed every phase
    assert restored.state() == uninterrupted.state()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"ratio_evol": 1.5}, "ratio_evol"),
        ({"size": 0}, "size"),
        ({"n_new": -1}, "n_new"),
        ({"top_fraction": 0.0}, "top_fraction"),
    ],
)
def test_bad_settings_name_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BufferConfig(**kwargs)

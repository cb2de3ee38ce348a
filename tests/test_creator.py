"""eva_core.creator: the creator a trainer pulls prompts from and reports rewards to.

Values are worked by hand from the buffer's rules (eva_core.buffer): a_avg = max - mean, the top
half of each observed set are parents, a child starts at its parent's reading as priority.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from eva_core.creator import Creator
from eva_core.creator_records import as_records
from eva_core.predicted import TiePosterior

SEEDS = [f"What is {i} plus {i}?" for i in range(8)]


def tagger(parents: list[dict[str, Any]], n: int, seed: int) -> list[list[str]]:
    """Children named after their parent: '<parent> (v<j>)'."""
    return [[f"{p['prompt']} (v{j})" for j in range(n)] for p in parents]


def test_observe_scores_picks_parents_and_children_inherit_priority() -> None:
    creator = Creator(SEEDS, rewriter=tagger, size=4, top_fraction=0.5, n_new=2, seed=0)
    drawn = creator.draw(4)
    assert len(drawn) == 4 and not any(r["from_buffer"] for r in drawn)
    rewards = [[1.0, 0.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]
    seen = creator.observe((r["prompt_id"], x) for r, x in zip(drawn, rewards, strict=True))
    # a_avg = max - mean: 2/3, 0, 1/3, 0; the top half (2 of 4) are rows 0 and 2.
    assert seen.informativeness == pytest.approx([2 / 3, 0.0, 1 / 3, 0.0])
    assert seen.parents == [0, 2] and seen.joined == 4
    entries = {e.record["prompt"]: e.priority for e in creator.buffer.entries}
    assert entries == pytest.approx({
        f"{drawn[0]['prompt']} (v0)": 2 / 3, f"{drawn[0]['prompt']} (v1)": 2 / 3,
        f"{drawn[2]['prompt']} (v0)": 1 / 3, f"{drawn[2]['prompt']} (v1)": 1 / 3,
    })  # fmt: skip
    child = creator.buffer.entries[0].record
    assert child["parent_id"] == drawn[0]["prompt_id"] and child["depth"] == 1
    # B is full (4 = size): mix-up draws half of the next batch from B.
    nxt = creator.draw(4)
    assert sum(r["from_buffer"] for r in nxt) == 2 and creator.buffer.phase == "mixup"


def test_groups_may_arrive_in_any_order_and_only_for_drawn_prompts() -> None:
    creator = Creator(SEEDS, seed=1)  # no rewriter: the plain baseline
    a, b = creator.draw(2)
    seen = creator.observe([(b["prompt_id"], [0.0, 1.0]), (a["prompt_id"], [0.5, 0.5])])
    assert seen.prompt_ids == [b["prompt_id"], a["prompt_id"]] and seen.parents == []
    with pytest.raises(ValueError, match="was not drawn"):
        creator.observe([(a["prompt_id"], [1.0])])  # observed already
    assert creator.stats.observed == 2 and creator.stats.tied == 1


def test_a_resumed_creator_draws_and_evolves_as_an_uninterrupted_one() -> None:
    def play(creator: Creator, steps: int, start: int = 0) -> list[list[str]]:
        out = []
        for step in range(start, start + steps):
            batch = creator.draw(3)
            rng = np.random.default_rng(step)
            creator.observe((r["prompt_id"], rng.random(4).tolist()) for r in batch)
            out.append([r["prompt"] for r in batch])
        return out

    options: dict[str, Any] = dict(rewriter=tagger, size=5, n_new=2, n_new_bootstrap=1)
    whole = Creator(SEEDS, **options)
    batches = play(whole, 9)
    head = Creator(SEEDS, **options)
    first = play(head, 4)
    pending = head.draw(3)  # drawn before the save, observed after it
    saved = json.loads(json.dumps(head.state()))
    resumed = Creator.from_state(SEEDS, saved, rewriter=tagger)
    rng = np.random.default_rng(4)
    resumed.observe((r["prompt_id"], rng.random(4).tolist()) for r in pending)
    assert [*first, [r["prompt"] for r in pending], *play(resumed, 4, start=5)] == batches
    assert resumed.state() == whole.state()
    with pytest.raises(ValueError, match="rewriter"):
        Creator.from_state(SEEDS, saved)  # it evolved; resuming without a rewriter would not


def test_a_slow_rewriter_overlaps_with_lag_and_joins_at_a_fixed_step() -> None:
    calls: list[int] = []

    def counting(parents: list[dict[str, Any]], n: int, seed: int) -> list[list[str]]:
        calls.append(seed)
        return tagger(parents, n, seed)

    with ThreadPoolExecutor(1) as pool:
        creator = Creator(SEEDS, rewriter=counting, size=50, executor=pool, evolve_lag=1)
        batch = creator.draw(4)
        first = creator.observe((r["prompt_id"], [0.0, 1.0]) for r in batch)
        assert first.joined == 0  # observation 0's children join at observation 1
        batch = creator.draw(4)
        second = creator.observe((r["prompt_id"], [0.0, 1.0]) for r in batch)
        assert second.joined == 8 and len(creator.buffer.entries) == 8
        creator.flush()
    assert len(calls) == 2 and len(creator.buffer.entries) == 16
    with pytest.raises(ValueError, match="executor"):
        Creator(SEEDS, rewriter=tagger, evolve_lag=1)


def test_seed_rows_keep_their_columns_and_children_inherit_only_named_ones() -> None:
    rows = [{"prompt": p, "data_source": "gsm", "answer": str(2 * i)} for i, p in enumerate(SEEDS)]
    creator = Creator(rows, rewriter=tagger, inherit=["data_source"], size=50)
    batch = creator.draw(2)
    assert {r["answer"] for r in batch} <= {str(2 * i) for i in range(8)}
    creator.observe((r["prompt_id"], [0.0, 1.0]) for r in batch)
    child = creator.buffer.entries[0].record
    assert child["data_source"] == "gsm" and "answer" not in child
    with pytest.raises(ValueError, match="seed row 1 has no text 'prompt'"):
        as_records([{"prompt": "a"}, {"question": "b"}])
    with pytest.raises(ValueError, match="empty"):
        Creator([])


def test_a_draw_costs_the_batch_not_the_pool() -> None:
    """D's shuffle is computed once per pass: drawing 100 batches from 200,000 prompts makes one
    permutation, not 100 (before: a permutation of D per draw, 0.76 CPU-s at 1M prompts)."""
    creator = Creator([f"q{i}" for i in range(200_000)], seed=3)
    creator.draw(64)
    shuffle = creator.buffer._shuffle
    for _ in range(99):
        creator.draw(64)
    assert creator.buffer._shuffle is shuffle
    assert creator.buffer.cursor == 6400


def test_tie_posterior_by_hand() -> None:
    ties = TiePosterior(threshold=0.7, decay=0.9, explore=0.0)
    assert not ties.skip("a")  # never read: P(tie) = 1/2
    ties.read("a", True)
    assert ties.p_tie("a") == pytest.approx(2 / 3) and not ties.skip("a")
    ties.read("a", True)  # ties = 0.9 * 1 + 1 = 1.9: P = 2.9 / 3.9
    assert ties.p_tie("a") == pytest.approx(2.9 / 3.9) and ties.skip("a")
    ties.read("a", False)  # ties 1.71, other 1: P = 2.71 / 4.71
    assert ties.p_tie("a") == pytest.approx(2.71 / 4.71) and not ties.skip("a")
    always = TiePosterior(explore=1.0)
    always.read("b", True), always.read("b", True)
    assert not always.skip("b")  # exploring every time


def test_skipped_prompts_are_replaced_before_rollout() -> None:
    """The plain baseline over 4 prompts, 2 a step: after two passes in which prompts 0 and 1
    tied every time, the third pass skips them and draws from the next pass in their place;
    the batch stays full."""
    prompts = ["p0", "p1", "p2", "p3"]
    creator = Creator(prompts, skip_tied=TiePosterior(explore=0.0), seed=0)
    flat = {"p0", "p1"}
    for _ in range(4):  # two passes over D
        batch = creator.draw(2)
        creator.observe((r["prompt_id"], [1.0, 1.0] if r["prompt"] in flat else [0.0, 1.0])
                        for r in batch)  # fmt: skip
    assert creator.stats.skipped == 0
    drawn = [r["prompt"] for _ in range(2) for r in creator.draw(2)]
    assert len(drawn) == 4 and set(drawn) == {"p2", "p3"}
    assert creator.stats.skipped >= 2


def test_when_nothing_is_left_to_draw_skipped_prompts_are_trained_after_all() -> None:
    creator = Creator(["p0", "p1"], rewriter=tagger, size=1, n_new=0, n_new_bootstrap=0,
                      skip_tied=TiePosterior(explore=0.0))  # fmt: skip
    ties = creator.ties
    assert ties is not None
    for prompt in ("p0", "p1"):
        ties.read(creator.buffer.seeds[["p0", "p1"].index(prompt)]["prompt_id"], True)
        ties.read(creator.buffer.seeds[["p0", "p1"].index(prompt)]["prompt_id"], True)
    drawn = creator.draw(2)  # both skipped, B empty, D spent: they are drawn anyway
    assert sorted(r["prompt"] for r in drawn) == ["p0", "p1"] and creator.stats.skipped == 0


def test_released_prompts_are_forgotten_and_counted() -> None:
    creator = Creator(SEEDS, seed=0)
    a, b = creator.draw(2)
    assert creator.release([a["prompt_id"], "never-drawn"]) == 1
    assert list(creator.outstanding) == [b["prompt_id"]] and creator.stats.released == 1
    with pytest.raises(ValueError, match="was not drawn"):
        creator.observe([(a["prompt_id"], [1.0, 0.0])])


def test_state_keeps_evolutions_not_joined_yet_and_a_resume_reruns_them() -> None:
    """With lag 1, saving right after an observation holds its evolution's inputs; the resumed
    creator joins the same children at the same observation as an uninterrupted one."""

    def run(split: bool) -> list[str]:
        creator = Creator(SEEDS, rewriter=tagger, size=50, evolve_lag=1,
                          executor=ThreadPoolExecutor(1))  # fmt: skip
        batch = creator.draw(4)
        creator.observe((r["prompt_id"], [0.0, 1.0]) for r in batch)
        if split:
            saved = json.loads(json.dumps(creator.state()))
            assert len(saved["evolutions"]) == 1 and not creator.buffer.entries
            creator = Creator.from_state(SEEDS, saved, rewriter=tagger,
                                         executor=ThreadPoolExecutor(1))  # fmt: skip
        batch = creator.draw(4)
        seen = creator.observe((r["prompt_id"], [0.0, 1.0]) for r in batch)
        assert seen.joined == 8
        return sorted(e.record["prompt"] for e in creator.buffer.entries)

    assert run(split=True) == run(split=False)


def test_repeated_seeds_are_refused_or_dropped_and_counted() -> None:
    rows = ["What is 1?", "what  is 1?", "What is 2?"]
    with pytest.raises(ValueError, match="row 1: prompt duplicates row 0"):
        Creator(rows)
    creator = Creator(rows, duplicates="drop")
    assert [r["prompt"] for r in creator.buffer.seeds] == ["What is 1?", "What is 2?"]
    assert creator.stats.duplicate_seeds == 1

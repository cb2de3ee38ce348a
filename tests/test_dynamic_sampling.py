"""Dynamic sampling (DAPO) in the online solver: a prompt whose samples' rewards all tie is dropped
from the step and replaced by the buffer's next prompt, sampled and scored in its place; the
counts are exact and the trained batch holds only prompts with signal.

The buffer runs without evolution (the seed phase), so every prompt, first draws and
replacements alike, is the next of D's seeded shuffle: with seed 0 and |D| = 8 that is
2 4 3 6 5 0 1 7, then 1 3 7 6 0 4 2 5. Two prompts a step, two samples each; the data loader
draws batch t+1 before step t samples (``tasks.online_loop``), so step 0's batch is [2, 4],
step 1's [3, 6], batch 2 [1, 7] is drawn (and left pending) before step 1 samples, and step 0's
replacements are the shuffle's 5th and 6th prompts, step 1's the next epoch's.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest
import torch

from eva_core.buffer import PromptBuffer
from eva_core.schema import seed_records
from tasks.backends.protocols import no_progress
from tasks.backends.train.online import OnlineSolverConfig
from tasks.backends.train.online_trainer import splice_groups, train_segment
from tasks.online_loop import BufferConfig, OnlineLoop, pending_batches

PROMPTS = [f"{i}+{i}=" for i in range(8)]


class SplitReward:
    """Every sample of a prompt in ``flat`` gets 0 (no signal); the others 0, 1, 2, ..."""

    def __init__(self, flat: set[int]):
        self.flat = flat

    def score(
        self, prompts: Sequence[str], responses: Sequence[Sequence[str]], progress=no_progress
    ) -> list[list[float]]:
        return [
            [0.0 if PROMPTS.index(p) in self.flat else float(j) for j in range(len(samples))]
            for p, samples in zip(prompts, responses, strict=True)
        ]


def seed_buffer() -> PromptBuffer:
    seeds = seed_records(PROMPTS).to_pylist()
    return BufferConfig(evolve=False).buffer(seeds, seed=0)


def test_splice_replaces_whole_groups_and_repads_each_side() -> None:
    """Group 1 of 3 (2 samples each) replaced: prompts are left-padded, completions right-padded
    to the wider batch; per-sample vectors are spliced; GRPO's token count is recomputed."""
    batch = {
        "prompt_ids": torch.tensor([[7, 1], [7, 1], [2, 2], [2, 2], [3, 3], [3, 3]]),
        "prompt_mask": torch.ones(6, 2, dtype=torch.long),
        "completion_ids": torch.tensor([[5], [6], [5], [5], [6], [5]]),
        "completion_mask": torch.ones(6, 1, dtype=torch.long),
        "advantages": torch.tensor([-1.0, 1.0, 0.0, 0.0, 1.0, -1.0]),
        "num_items_in_batch": torch.tensor(6),
    }
    extra = {
        "prompt_ids": torch.tensor([[4, 4, 4], [4, 4, 4]]),
        "prompt_mask": torch.ones(2, 3, dtype=torch.long),
        "completion_ids": torch.tensor([[8, 9], [8, 0]]),
        "completion_mask": torch.tensor([[1, 1], [1, 0]]),
        "advantages": torch.tensor([0.5, -0.5]),
        "num_items_in_batch": torch.tensor(3),
    }
    out = splice_groups(batch, [1], extra, g=2, pad_id=0)
    assert out["prompt_ids"].tolist() == [
        [0, 7, 1], [0, 7, 1], [4, 4, 4], [4, 4, 4], [0, 3, 3], [0, 3, 3],
    ]  # fmt: skip
    assert out["prompt_mask"][:, 0].tolist() == [0, 0, 1, 1, 0, 0]
    assert out["completion_ids"].tolist() == [[5, 0], [6, 0], [8, 9], [8, 0], [6, 0], [5, 0]]
    assert out["completion_mask"].sum(1).tolist() == [1, 1, 2, 1, 1, 1]
    assert out["advantages"].tolist() == [-1.0, 1.0, 0.5, -0.5, 1.0, -1.0]
    assert int(out["num_items_in_batch"]) == 7
    assert batch["advantages"].tolist()[2:4] == [0.0, 0.0]  # the input is left as it was


def test_off_by_default_and_left_out_of_the_saved_config() -> None:
    assert (
        OnlineSolverConfig().model_dump() == OnlineSolverConfig(max_resample_rounds=2).model_dump()
    )
    assert "dynamic_sampling" not in OnlineSolverConfig().model_dump()
    dumped = OnlineSolverConfig(dynamic_sampling=True, max_resample_rounds=3).model_dump()
    assert dumped["dynamic_sampling"] is True and dumped["max_resample_rounds"] == 3
    with pytest.raises(ValueError, match="rloo or grpo"):
        OnlineSolverConfig(kind="online_dpo", beta=0.1, dynamic_sampling=True)


@pytest.mark.parametrize(
    ("kind", "flat", "trained", "counts"),
    [
        # Step 0: 4 ties -> 5 (ties) -> 0; step 1: 3 ties -> 1. Every trained prompt has signal.
        ("rloo", {3, 4, 5}, [2, 0, 1, 6], dict(dropped_groups=3, replacement_prompts=3,
                                               extra_responses=6, rounds=3, short_steps=0)),
        # Step 1: 3 ties -> 1 (ties) -> 3 (ties, the next epoch's): two rounds spent, the step
        # trains with its tied group (short).
        ("grpo", {1, 3, 4, 5, 7}, [2, 0, 3, 6], dict(dropped_groups=4, replacement_prompts=4,
                                                     extra_responses=8, rounds=4, short_steps=1)),
    ],
)  # fmt: skip
def test_tied_groups_are_replaced_within_the_round_limit_and_counted(
    tmp_path, policy_dir, kind, flat, trained, counts
) -> None:
    config = OnlineSolverConfig(
        kind=kind, learning_rate=1e-3, beta=0.0, num_generations=2, prompts_per_step=2,
        max_completion_length=3, device="cpu", dynamic_sampling=True, max_resample_rounds=2,
    )  # fmt: skip
    buffer = seed_buffer()
    loop = OnlineLoop(buffer, 2, SplitReward(flat), None, dynamic_sampling=True)
    train_segment(config, policy_dir, loop, 2, str(tmp_path / "out"), seed=0)
    loop.close()
    assert [PROMPTS.index(row["prompt"]) for row in loop.log] == trained
    assert [row["step"] for row in loop.log] == [0, 0, 1, 1]
    for row in loop.log:
        tied = PROMPTS.index(row["prompt"]) in flat
        assert row["rewards"] == ([0.0, 0.0] if tied else [0.0, 1.0])
    assert loop.stats.as_dict()["dynamic_sampling"] == counts
    assert loop.stats.trained_prompts == 4
    # D's draws: 3 batches of 2 (one pending) and the replacements.
    assert buffer.resampled == counts["replacement_prompts"]
    assert buffer.consumed == 6 + counts["replacement_prompts"]
    assert [PROMPTS.index(r["prompt"]) for r in loop.pending[0].records] == [1, 7]


def test_without_it_nothing_is_replaced_or_reported(tmp_path, policy_dir) -> None:
    config = OnlineSolverConfig(
        learning_rate=1e-3, beta=0.0, num_generations=2, prompts_per_step=2,
        max_completion_length=3, device="cpu",
    )  # fmt: skip
    loop = OnlineLoop(seed_buffer(), 2, SplitReward({3, 4, 5}), None)
    train_segment(config, policy_dir, loop, 2, str(tmp_path / "out"), seed=0)
    loop.close()
    assert [PROMPTS.index(row["prompt"]) for row in loop.log] == [2, 4, 3, 6]
    assert "dynamic_sampling" not in loop.stats.as_dict()
    assert loop.buffer.resampled == 0 and "resampled" not in loop.buffer.state()


def test_a_resumed_segment_replaces_exactly_as_an_uninterrupted_one(tmp_path, policy_dir) -> None:
    """Two segments of 2 steps draw and replace the prompts one segment of 4 steps does: the
    replacements' draws are part of the buffer's saved state."""
    config = OnlineSolverConfig(
        learning_rate=1e-3, beta=0.0, num_generations=2, prompts_per_step=2,
        max_completion_length=3, device="cpu", dynamic_sampling=True,
    )  # fmt: skip
    flat = {3, 4, 5}
    whole = OnlineLoop(seed_buffer(), 2, SplitReward(flat), None, dynamic_sampling=True)
    train_segment(config, policy_dir, whole, 4, str(tmp_path / "whole"), seed=0)
    whole.close()

    first = OnlineLoop(seed_buffer(), 2, SplitReward(flat), None, dynamic_sampling=True)
    train_segment(config, policy_dir, first, 2, str(tmp_path / "first"), seed=0)
    first.close()
    state = json.loads(json.dumps(first.state()))
    seeds = seed_records(PROMPTS).to_pylist()
    second = OnlineLoop(
        PromptBuffer.from_state(seeds, state["buffer"]), 2, SplitReward(flat), None,
        pending=pending_batches(state), dynamic_sampling=True,
    )  # fmt: skip
    train_segment(config, str(tmp_path / "first"), second, 2, str(tmp_path / "second"), seed=0)
    second.close()

    def trained(loop: OnlineLoop) -> list[tuple[int, int]]:
        return [(row["step"], PROMPTS.index(row["prompt"])) for row in loop.log]

    assert trained(first) + trained(second) == trained(whole)
    assert second.buffer.state() == whole.buffer.state()
    # Steps 0, 1 as above (batch 2 = [1, 7] drawn before step 1 samples, its replacement 1 the
    # next epoch's first: 1 3 7 6 0 4 2 5); batch 3 = [3, 7] is drawn before step 2 and batch
    # 4 = [6, 0] before step 3; step 2 trains [1, 7] as drawn; step 3's 3 ties -> 4 (ties) -> 2.
    assert trained(whole) == [(0, 2), (0, 0), (1, 1), (1, 6), (2, 1), (2, 7), (3, 2), (3, 7)]
    counts = [
        loop.stats.as_dict()["dynamic_sampling"]["dropped_groups"] for loop in (first, second)
    ]
    assert counts == [3, 2]


def test_a_spent_buffer_replaces_nothing_and_the_step_stays_short() -> None:
    """Evolution on, D of 2 drawn whole by the first batch and B still empty: the tied group has
    no replacement (never a seed prompt again at random), so it stays in the step, short."""
    seeds = seed_records(PROMPTS[:2]).to_pylist()
    loop = OnlineLoop(
        BufferConfig(size=4).buffer(seeds, seed=0), 2, SplitReward({0}), None,
        dynamic_sampling=True,
    )  # fmt: skip
    stream = loop.prompts()
    batch = [next(stream), next(stream)]
    rows = [p["row"] for p in batch for _ in range(2)]
    loop.score(rows, [p["prompt"] for p in batch for _ in range(2)], ["a"] * 4)
    tied = loop.tied([p["row"] for p in batch])
    assert [PROMPTS.index(p["prompt"]) for p in batch if p["row"] in tied] == [0]
    assert loop.resample(tied) == []
    loop.step_end()
    assert loop.stats.as_dict()["dynamic_sampling"] == dict(
        dropped_groups=0, replacement_prompts=0, extra_responses=0, rounds=0, short_steps=1
    )
    assert loop.buffer.consumed == 2 and loop.buffer.resampled == 0

"""The pre-rollout tie filter in TRL's own RLOO trainer (``online.buffer.skip_tied``): a prompt
whose past groups all tied is skipped before it is sampled, replaced by the next draw, and no
TRL method is overridden. The plain baseline over 4 prompts, 2 a step, 2 samples each: prompts
0 and 1 always tie. After two passes over D (4 steps) both have two tied readings, so the later
steps train only on prompts 2 and 3, and the batches stay full."""

from __future__ import annotations

import json
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from eva_core.creator import Creator
from eva_core.schema import seed_records
from tasks.backends.protocols import no_progress
from tasks.backends.train.online import OnlineSolverConfig
from tasks.backends.train.online_trainer import train_segment
from tasks.keys import keyed_config
from tasks.online_loop import BufferConfig, OnlineLoop

PROMPTS = [f"{i}+{i}=" for i in range(4)]
FLAT = {0, 1}


class SplitReward:
    """Prompts in FLAT: every sample 0 (no signal); the others 0, 1, 2, ..."""

    def score(
        self, prompts: Sequence[str], responses: Sequence[Sequence[str]], progress=no_progress
    ) -> list[list[float]]:
        return [
            [0.0 if PROMPTS.index(p) in FLAT else float(j) for j in range(len(samples))]
            for p, samples in zip(prompts, responses, strict=True)
        ]


CONFIG = OnlineSolverConfig(
    kind="rloo", learning_rate=1e-3, beta=0.0, num_generations=2, prompts_per_step=2,
    max_completion_length=3, device="cpu",
)  # fmt: skip


def new_creator(skip: bool) -> Creator:
    seeds = seed_records(PROMPTS).to_pylist()
    config = BufferConfig(evolve=False, skip_tied=skip)
    return config.creator(seeds, 0, None, ThreadPoolExecutor(1))


def test_tied_prompts_are_skipped_before_rollout_in_trls_trainer(tmp_path, policy_dir) -> None:
    loop = OnlineLoop(new_creator(True), SplitReward())
    train_segment(CONFIG, policy_dir, loop, 7, str(tmp_path / "out"), seed=0)
    loop.close()
    trained = [PROMPTS.index(row["prompt"]) for row in loop.log]
    # Two passes over D know nothing yet: [2 0] [1 3], [3 0] [2 1]. Batch 4 is drawn while step
    # 3 trains (the loader fetches one batch ahead), before prompt 1's second tied reading, so
    # it is [2 1]; from then on 0 and 1 are skipped and replaced by the next draws, except once
    # in 5 skip decisions, where the posterior explores (prompt 1 in the last step).
    assert trained == [2, 0, 1, 3, 3, 0, 2, 1, 2, 1, 3, 2, 1, 3]
    ties = loop.creator.ties
    assert ties is not None and ties.decisions == 5 and loop.report()["skipped"] == 4
    # Skipped prompts were never sampled: every trained row has its own rewards, none are lost.
    assert all(len(row["rewards"]) == 2 for row in loop.log)


def test_without_the_filter_nothing_is_skipped(tmp_path, policy_dir) -> None:
    loop = OnlineLoop(new_creator(False), SplitReward())
    train_segment(CONFIG, policy_dir, loop, 4, str(tmp_path / "out"), seed=0)
    loop.close()
    assert sorted(PROMPTS.index(r["prompt"]) for r in loop.log) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert loop.report()["skipped"] == 0
    assert "skip_tied" not in keyed_config(BufferConfig())  # old cache keys hold


def test_a_resumed_segment_skips_exactly_as_an_uninterrupted_one(tmp_path, policy_dir) -> None:
    whole = OnlineLoop(new_creator(True), SplitReward())
    train_segment(CONFIG, policy_dir, whole, 7, str(tmp_path / "whole"), seed=0)
    whole.close()
    first = OnlineLoop(new_creator(True), SplitReward())
    train_segment(CONFIG, policy_dir, first, 4, str(tmp_path / "first"), seed=0)
    first.close()
    state = json.loads(json.dumps(first.state()))
    creator = Creator.from_state(seed_records(PROMPTS).to_pylist(), state["creator"])
    second = OnlineLoop(creator, SplitReward(), state=state)
    train_segment(CONFIG, str(tmp_path / "first"), second, 3, str(tmp_path / "second"), seed=0)
    second.close()

    def trained(loop: OnlineLoop) -> list[tuple[int, str]]:
        return [(row["step"], row["prompt"]) for row in loop.log]

    assert trained(first) + trained(second) == trained(whole)
    assert second.creator.state() == whole.creator.state()

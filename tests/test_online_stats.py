"""A segment's policy-gradient statistics, hand-computed: the spread of RLOO's leave-one-out
advantages, KL and entropy over the steps, and no surrogate loss that is 0 by construction."""

from __future__ import annotations

import math

import pytest

from tasks.backends.train.online_trainer import segment_stats


def test_segment_stats_from_rewards_and_logged_rows() -> None:
    rows = [
        {"step": 1.0, "loss": -0.0, "kl": 0.02, "entropy": 1.5},
        {"step": 2.0, "loss": 0.0, "kl": 0.04, "entropy": float("nan")},
    ]
    # Prompt 1: rewards 1, 0, 0 -> advantages 1 - 0, 0 - 0.5, 0 - 0.5 = 1, -0.5, -0.5.
    # Prompt 2: all tied -> 0, 0, 0. Prompt 3: one finite sample only, no baseline: skipped.
    rewards = [[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [1.0, float("nan"), float("nan")]]
    stats = segment_stats("rloo", rows, rewards)
    advantages = [1.0, -0.5, -0.5, 0.0, 0.0, 0.0]  # mean 0
    expected = math.sqrt(sum(a * a for a in advantages) / 6)  # sqrt(1.5 / 6) = 0.5
    assert stats == {
        "kl": 0.03,
        "entropy": 1.5,
        "advantage_std": pytest.approx(round(expected, 4)),
    }
    assert "loss" not in stats and expected == 0.5
    assert segment_stats("online_dpo", [{"loss": 0.6}, {"loss": 0.4}], [])["loss"] == 0.5
    assert segment_stats("grpo", [], [[0.0, 1.0]]) == {"advantage_std": 1.0}

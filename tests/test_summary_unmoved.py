"""A checkpoint that did not move is said so, and `solved` is only a verifier's."""

from __future__ import annotations

import numpy as np

from flows.summary import summary_table, unmoved
from tasks.evaluate import _solved


def test_a_checkpoint_with_every_answer_unchanged_is_warned_about() -> None:
    rows = [
        {"iteration": "theta_0", "heldout_score": 0.5},
        {"iteration": 1, "heldout_score": 0.5, "answers_changed": 0.0, "win_vs_theta_0": 0.5},
        {"iteration": 2, "heldout_score": 0.6, "answers_changed": 0.25, "win_vs_theta_0": 0.6},
        {"iteration": 3, "heldout_score": 0.6, "answers_changed": None},  # not evaluated yet
    ]
    (line,) = unmoved(rows)
    assert line.startswith("warning: iteration 1 gives every held-out prompt the same greedy")
    assert "as theta_0" in line and "train.solver.learning_rate" in line
    table = summary_table(rows)
    assert table.splitlines()[0].split()[-2:] == ["answers_changed", "win_vs_theta_0"]
    assert table.splitlines()[-1] == line
    online = [{"segment": "theta_0"}, {"segment": 1, "answers_changed": 0.0}]
    assert "online.solver.learning_rate" in unmoved(online)[0]
    assert unmoved(rows[:1]) == [] and unmoved([]) == []


def test_solved_is_a_verifiers_share_and_nothing_for_a_reward_model() -> None:
    assert _solved(np.array([1.0, 0.0, 0.5, 1.0])) == 0.5
    assert _solved(np.array([1.0, np.nan, 0.0])) == 0.5  # of the scored answers
    assert _solved(np.array([1.0, -2.3, 0.7])) is None  # a reward model's logits
    assert _solved(np.array([1.0, 3.0])) is None
    assert _solved(np.array([np.nan, np.nan])) is None  # nothing scored: no 0.000 to misread

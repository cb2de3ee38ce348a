"""A checkpoint that did not move is said so, as is a large share of answers cut at the length
cap; `solved` is only a verifier's."""

from __future__ import annotations

import numpy as np

from flows.summary import summary_table
from flows.summary_warnings import unmoved
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


def test_an_iteration_without_a_pair_says_why_not_to_raise_the_learning_rate() -> None:
    from flows.summary_warnings import SKIPPED

    why = {"with no finished answer to choose (pairs.truncated)": 10, "tied": 2}
    rows = [
        {"iteration": "theta_0"},
        {"iteration": 1, "prompts": 12, "pairs": 0, SKIPPED: why, "answers_changed": 0.0},
        {"iteration": 2, "prompts": 12, "pairs": 3, SKIPPED: {"tied": 9}, "answers_changed": 0.0},
    ]
    no_pair, unmoved_line = unmoved(rows)
    assert no_pair == (
        "warning: iteration 1 had no preference pair to train on (of its 12 prompts: 10 with no "
        "finished answer to choose (pairs.truncated), 2 tied), so its policy is theta_0's (eva "
        "show --iteration 1 --stage pairs)"
    )
    assert unmoved_line.startswith("warning: iteration 2 gives every held-out prompt the same")


def test_solved_is_a_verifiers_share_and_nothing_for_a_reward_model() -> None:
    assert _solved(np.array([1.0, 0.0, 0.5, 1.0])) == 0.5
    assert _solved(np.array([1.0, np.nan, 0.0])) == 0.5  # of the scored answers
    assert _solved(np.array([1.0, -2.3, 0.7])) is None  # a reward model's logits
    assert _solved(np.array([1.0, 3.0])) is None
    assert _solved(np.array([np.nan, np.nan])) is None  # nothing scored: no 0.000 to misread


def test_a_large_truncated_share_is_warned_about_naming_the_cap() -> None:
    from flows.summary_warnings import CAPS, truncation_lines

    caps = {
        "truncated": "generate.backend.max_new_tokens (64)",
        "heldout_truncated": "evaluate.generation.max_new_tokens (64)",
    }
    rows = [
        {"iteration": "theta_0", "heldout_truncated": 0.5, CAPS: caps},
        {"iteration": 1, "truncated": 0.1, "heldout_truncated": 0.0, CAPS: caps},  # at the line
        {"iteration": 2, "truncated": 0.88, "heldout_truncated": None, CAPS: caps},
    ]
    first, second = truncation_lines(rows)
    assert first.startswith("warning: 88% of the samples of iteration 2 were cut at ")
    assert "generate.backend.max_new_tokens (64) before the policy ended them" in first
    assert second.startswith("warning: 50% of the held-out answers of iteration theta_0 ")
    assert "evaluate.generation.max_new_tokens (64)" in second
    rows[2]["heldout_truncated"] = 0.75  # several checkpoints: one line, their range
    assert truncation_lines(rows)[1].startswith(
        "warning: 50%-75% of the held-out answers of iterations theta_0, 2 were cut at "
    )
    assert summary_table(rows).splitlines()[-2:] == truncation_lines(rows)
    online = [{"segment": 1, "truncated": 0.3}]  # no caps known: said plainly
    assert "cut at the length cap" in truncation_lines(online)[0]


def test_the_truncation_warning_says_what_the_runs_own_training_does_with_cut_samples() -> None:
    from flows.summary_warnings import (
        CAPS,
        PAIRED_AS,
        TRAINED,
        online_training_of_cut,
        truncation_lines,
    )
    from tasks.backends.train.online import OnlineSolverConfig

    def line(trained: str | None) -> str:
        caps = {"truncated": "the cap (8)", "heldout_truncated": "the cap (8)", TRAINED: trained}
        rows = [{"iteration": 1, "truncated": 0.9, "heldout_truncated": 0.9, CAPS: caps}]
        samples, heldout = truncation_lines(rows)
        assert heldout.endswith("raise it (cut answers score as unfinished)")
        return samples

    assert line(PAIRED_AS["reject_only"]).endswith(
        "(cut answers score as unfinished; they are never trained as the chosen side)"
    )
    assert "as the chosen side too (pairs.truncated: allow)" in line(PAIRED_AS["allow"])
    assert line(None).endswith("raise it (cut answers score as unfinished)")  # yours: unsaid
    said = [
        online_training_of_cut(OnlineSolverConfig(kind=kind, **option))
        for kind, option in [
            ("rloo", {}), ("grpo", {"mask_truncated_completions": False}),
            ("online_dpo", {"beta": 0.1}),
            ("online_dpo", {"beta": 0.1, "missing_eos_penalty": None}),
            ("online_dpo", {"beta": 0.1, "missing_eos_penalty": 2.5}),
        ]
    ]  # fmt: skip
    assert said == [
        "they train nothing (online.solver.mask_truncated_completions)",
        "they train as finished ones (online.solver.mask_truncated_completions: false)",
        "a finished one is always chosen over a cut one, but a pair of two cut ones still "
        "trains, as online DPO cannot mask it",
        "they are chosen by reward alone (online.solver.missing_eos_penalty: null)",
        "their reward is lowered by online.solver.missing_eos_penalty (2.5)",
    ]

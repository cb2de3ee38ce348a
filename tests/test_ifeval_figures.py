"""IFEval's four figures, from the instruction-following reward's counts, against hand-computed
values: strict and loose checks, prompt- and instruction-level."""

from __future__ import annotations

import pytest

from flows.evaluate_run import ifeval_figures, ifeval_table

pytest.importorskip("if_verifiable")


def test_strict_and_loose_counts_give_ifevals_four_figures() -> None:
    from tasks.backends.reward.instruction_following import InstructionFollowingReward

    reward = InstructionFollowingReward().load()
    quoted, lower = (
        ["startend:quotation"],
        ["change_case:english_lowercase", "punctuation:no_comma"],
    )
    got = reward.score(
        ["p1", "p2", "p3"],
        # 1: quoted only after its first line: strict no, loose yes (IFEval's loose check drops
        # the first line). 2: lowercase, no comma: both. 3: a comma: lowercase only.
        [['Sure!\n"rain falls"'], ["rain falls softly"], ["rain falls, softly"]],
        instruction_id_list=[quoted, lower, lower],
        kwargs=[[{}], [{}, {}], [{}, {}]],
    )
    assert got == [[0.0], [1.0], [0.5]]
    figures = ifeval_figures(reward.stats(), prompts=3)
    # Strict: prompts 1 of 3 (the second), instructions 3 of 5; loose: prompts 2 of 3,
    # instructions 4 of 5.
    expected = {"prompt_strict": 1 / 3, "instruction_strict": 3 / 5,
                "prompt_loose": 2 / 3, "instruction_loose": 4 / 5}  # fmt: skip
    assert figures == pytest.approx(expected)
    row = {"checkpoint": "theta_0", "prompts": 3, "score": 0.5, "reward": reward.stats(),
           "truncated_share": 0.0, "unscored": 0}  # fmt: skip
    lines = ifeval_table([row]).splitlines()
    assert lines[2] == "| theta_0 | 0.500 | 0.333 | 0.600 | 0.667 | 0.800 | 0.000 | 0 |"


def test_a_reward_without_instruction_counts_has_no_figures() -> None:
    assert ifeval_figures({"responses": 3}, prompts=3) is None
    assert ifeval_figures({"instructions_given": 2}, prompts=0) is None

"""The answer-blind study's label checks (bench.labels), on hand-made rollouts (no run)."""

from __future__ import annotations

import math

import pytest

from bench.labels import chosen_correct, inherited_accuracy, label_check, threshold_sweep
from eva_core.schema import prompt_id

NAN = math.nan
PROMPTS = ["1+2=", "5+5=", "9+9=", "r:ab=", "r:abc="]
RESPONSES = [
    ["3", "4"],  # known answer "3"
    ["01", "01", "01", "1", "", ""],  # majority "01" (3 of 6): the true answer
    ["18", "18", "18", "81", "", ""],  # majority "18" (3 of 6): wrong, the truth is "81"
    ["ab", "ba"],  # a tie: dropped
    ["abc", "abc", "abc", "cba", "", ""],  # majority "abc": wrong, the careless copy
]
# The rewards the stage stored, by hand: against "3", "01", "18", nothing, "abc".
STORED = [
    [1.0, 0.0],
    [1.0, 1.0, 1.0, 0.0, 0.0, 0.0],
    [1.0, 1.0, 1.0, 0.0, 0.0, 0.0],
    [NAN, NAN],
    [1.0, 1.0, 1.0, 1 / 3, 0.0, 0.0],  # "cba" vs "abc": the middle letter only
]
KNOWN = {prompt_id("1+2="): "3"}


def test_label_check_recomputes_the_labels_and_scores_them_against_the_truth() -> None:
    got = label_check(PROMPTS, RESPONSES, STORED, KNOWN, 0.5)
    assert got == {
        "prompts": 5, "known": 1, "majority": 3, "dropped": 1, "reproduced": True,
        "label_accuracy": round(1 / 3, 4),  # "01" right; "18" and "abc" wrong
        "dropped_share": 0.25,  # 1 of the 4 unknown prompts
        # "abc" is the careless answer of "r:abc=" (a copy); "18" is not 9+9's ("8": no carry).
        "wrong_careless": 0.5,
        # Per labelled response |label reward - true reward|: 0 for every "5+5=" response;
        # "9+9=": "18" x3 (1 vs 0), "81" (0 vs 1), "" x2: 4; "r:abc=": "abc" x3 (1 vs 1/3),
        # "cba" (1/3 vs 1), "" x2: 8/3. Over 18 responses.
        "reward_error": round((4 + 8 / 3) / 18, 4),
        "by_category": {
            "add": {"unknown": 2, "dropped_share": 0.0, "label_accuracy": 0.5},
            "rev": {"unknown": 2, "dropped_share": 0.5, "label_accuracy": 0.0},
        },
    }  # fmt: skip
    # Stored rewards the labels do not give are caught.
    tampered = [row[:] for row in STORED]
    tampered[2][3] = 1.0
    assert not label_check(PROMPTS, RESPONSES, tampered, KNOWN, 0.5)["reproduced"]
    # At 4/6 no child is labelled: accuracy undefined, every unknown prompt dropped.
    strict = label_check(PROMPTS, RESPONSES, STORED, KNOWN, 4 / 6)
    assert strict["label_accuracy"] is None and strict["dropped_share"] == 1.0


def test_threshold_sweep_over_the_unknown_prompts() -> None:
    sweep = threshold_sweep(PROMPTS, RESPONSES, KNOWN, 6)
    assert [r["threshold"] for r in sweep] == ["1/6", "2/6", "3/6", "4/6", "5/6", "6/6"]
    # At 3/6: "01", "18" and "abc" are labelled (3 of the 4 unknown prompts), one right; the
    # "r:ab=" tie never is. From 4/6 on nothing is labelled.
    assert sweep[2] == {"threshold": "3/6", "labelled": 0.75, "label_accuracy": round(1 / 3, 4)}
    assert sweep[3] == {"threshold": "4/6", "labelled": 0.0, "label_accuracy": None}


def test_pair_and_inheritance_shares() -> None:
    assert chosen_correct(["1+2=", "5+5="], ["3", "10"]) == 0.5  # "10" is unreversed: wrong
    assert chosen_correct([], []) is None
    # "2+1=" keeps "1+2="'s answer "3"; "1+3=" does not; "r:ba=" answers "ab", not "ba".
    assert inherited_accuracy(
        ["2+1=", "1+3=", "r:ba="], ["1+2=", "1+2=", "r:ab="]
    ) == pytest.approx(round(1 / 3, 4))

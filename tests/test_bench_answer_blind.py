"""bench.answer_blind's label checks and report, on hand-made rollouts (no run)."""

from __future__ import annotations

import math

import pytest

from bench.answer_blind import (
    chosen_correct,
    inherited_accuracy,
    label_check,
    threshold_sweep,
)
from bench.answer_blind_report import report
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


def _it(score: float, **more: object) -> dict[str, object]:
    return {"score": score, "pairs": 320, "chosen_correct": 1.0, "children": 10,
            "inherited_accuracy": 0.0, "cat_add": score, **more}  # fmt: skip


def test_report_pairs_the_arms_by_seed() -> None:
    check = {"prompts": 4, "known": 1, "majority": 2, "dropped": 1, "reproduced": True,
             "label_accuracy": 0.5, "dropped_share": 0.25, "wrong_careless": 1.0,
             "reward_error": 0.1, "by_category": {"add": {"unknown": 3, "dropped_share": 0.25,
             "label_accuracy": 0.5}}}  # fmt: skip
    results = {
        s: {
            "theta_1": {"score": 0.5, "cat_add": 0.5},
            "exact": {"topup": 1.0, "iterations": [_it(e1), _it(e2)]},
            "blind": {
                "topup": 1.5,
                "iterations": [_it(b1, annotate=check), _it(b2, annotate=check)],
            },
        }
        for s, (e1, e2, b1, b2) in {"0": (0.6, 0.7, 0.5, 0.6), "1": (0.6, 0.8, 0.6, 0.6)}.items()
    }
    md = report(results, 60.0, "python -m bench.answer_blind --seeds 0 1", 0.5)
    # Seed 0: Δ it1 = 0.5 - 0.6, Δ it2 = 0.6 - 0.7; seed 1: 0.0 and -0.2.
    assert "| 0 | 0.500 | 0.600 | 0.500 | -0.100 | 0.700 | 0.600 | -0.100 | x1.0/x1.5 |" in md
    # Mean ± sd of the paired Δ it2 over seeds: -0.15 ± 0.0707.
    assert "| mean | 0.500 ± 0.000 | 0.600 ± 0.000 | 0.550 ± 0.071 | -0.050 ± 0.071 |" in md
    assert "-0.150 ± 0.071 | - |" in md
    assert (
        "| 1 | annotate | 2.000 ± 0.000 | 0.500 ± 0.000 | 0.250 ± 0.000 | 1.000 ± 0.000 | "
        "0.100 ± 0.000 | yes |"
    ) in md
    assert "| 2 | add | 3.000 ± 0.000 | 0.250 ± 0.000 | 0.500 ± 0.000 |" in md
    # Per-category held-out scores; pairs on majority labels only exist in the blind arm.
    assert "| blind it2 | 0.600 ± 0.000 |" in md
    assert "| 1 | exact | 320.000 ± 0.000 | - | 1.000 ± 0.000 |" in md

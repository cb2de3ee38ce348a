"""bench.answer_sources: majority-vote labels for evolved children, scored against the world."""

from __future__ import annotations

import math

import pytest

from bench.answer_sources import children, fraction, measure
from eva_world import world

# "12+39=": 51 -> "15", careless (carries dropped) "14"; "r:abc=": "cba", careless "abc";
# "53-17=": 36 -> "63", careless (borrows dropped) "64".
KIDS = ["12+39=", "r:abc=", "53-17="]
SAMPLES = [
    ["14", "14", "14", "14", "15", "15"],  # careless majority at 4/6
    ["cba", "cba", "cba", "cba", "cba", "abc"],  # correct majority at 5/6
    ["63", "63", "64", "64", "1", "2"],  # tie: no label
]


def _row(rows: list[dict], label: str, cat: str) -> dict:
    return next(r for r in rows if r["label"] == label and r["category"] == cat)


def test_measure_scores_labels_against_the_world() -> None:
    assert [world.solve(k) for k in KIDS] == ["15", "cba", "63"]
    assert [world.careless_answer(k) for k in KIDS] == ["14", "abc", "64"]
    rows = measure(KIDS, SAMPLES, [("4/6", 4 / 6), ("5/6", 5 / 6)])
    assert len(rows) == 2 * 4  # every threshold x (all + three categories)
    every = _row(rows, "4/6", "all")
    assert every["children"] == 3 and every["kept"] == 2
    assert every["kept_share"] == pytest.approx(2 / 3)
    assert every["label_accuracy"] == pytest.approx(0.5)  # rev right, add wrong
    assert every["wrong_careless"] == 1.0  # the wrong label is the careless answer
    assert every["majority_accuracy"] == pytest.approx(1 / 3)  # the tie labels nothing
    assert every["any_correct"] == 1.0
    assert every["dropped"] == {
        "children": 3, "kept": 2, "dropped_uncertain": 0, "dropped_tied": 1,
        "dropped_unanswered": 0,
    }  # fmt: skip
    add = _row(rows, "4/6", "add")
    assert (add["kept"], add["label_accuracy"]) == (1, 0.0)
    sub = _row(rows, "4/6", "sub")
    assert sub["kept"] == 0 and math.isnan(sub["label_accuracy"])
    strict = _row(rows, "5/6", "all")
    assert (strict["kept"], strict["label_accuracy"]) == (1, 1.0)
    assert math.isnan(strict["wrong_careless"])  # no kept label is wrong


def test_children_are_distinct_world_prompts_and_fractions_parse() -> None:
    kids, methods = children(20, 4, seed=0)
    assert len(kids) == len(set(kids)) > 20
    assert all(world.parse(k) is not None for k in kids)
    assert set(methods) <= set(world.EVOLVE_METHODS)
    assert fraction("4/6") == pytest.approx(2 / 3) and fraction("0.5") == 0.5

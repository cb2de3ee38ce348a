"""The judge's arithmetic, pure: Arena-Hard verdicts read strictly, games scored both ways, the
win rate with ties half and its bootstrap interval, against values worked out by hand."""

from __future__ import annotations

import math

import pytest

from eva_core.verdicts import (
    LABELS,
    consistent,
    count_labels,
    game_score,
    parse_verdict,
    prompt_score,
)
from eva_core.winrate import bootstrap_interval, mean_score


@pytest.mark.parametrize("label", LABELS)
def test_each_label_of_the_scale_is_read_where_it_stands(label: str) -> None:
    assert parse_verdict(f"[[{label}]]") == label
    assert (
        parse_verdict(f"A is right, B misses a step.\n\nMy final verdict is: [[{label}]]") == label
    )
    assert parse_verdict(f"[[{label}]] as said: [[{label}]]") == label  # repeated, one label


@pytest.mark.parametrize(
    "judgment",
    [
        None,
        "",
        "A>B",  # no brackets: Arena-Hard reads none
        "[A>B]",
        "[[ A>B ]]",  # not the label as the scale writes it
        "[[A<B]]",  # in the scale's characters, but no label of it
        "[[tie]]",
        "[[A>B]] ... on reflection [[B>A]]",  # two different labels: no verdict
        "1. [[A>>B]] 2. [[A>B]] 3. [[A=B]] 4. [[B>A]] 5. [[B>>A]]",  # the scale echoed back
        "Assistant A is better.",
    ],
)
def test_anything_else_is_unparseable_never_a_guess(judgment: str | None) -> None:
    assert parse_verdict(judgment) is None


def test_a_game_scores_the_policy_by_where_its_answer_stood() -> None:
    # The policy shown as A: A's labels are its own.
    assert [game_score(x, True) for x in LABELS] == [1.0, 1.0, 0.5, 0.0, 0.0]
    # The policy shown as B: the same labels read the other way.
    assert [game_score(x, False) for x in LABELS] == [0.0, 0.0, 0.5, 1.0, 1.0]
    assert math.isnan(game_score(None, True)) and math.isnan(game_score(None, False))


def test_a_prompt_scores_the_mean_of_its_usable_games() -> None:
    assert prompt_score("A>B", "B>A") == 1.0  # won both orders
    assert prompt_score("B>>A", "A>B") == 0.0  # lost both
    assert prompt_score("A=B", "A=B") == 0.5  # tied both
    assert prompt_score("B>A", "A=B") == (0.0 + 0.5) / 2
    # A judge that always prefers the first answer: one win, one loss.
    assert prompt_score("A>B", "A>B") == 0.5
    assert prompt_score("B>>A", "B>>A") == 0.5  # and one that prefers the second
    assert prompt_score("A>>B", None) == 1.0  # one game unparseable: the other counts
    assert math.isnan(prompt_score(None, None))


def test_consistency_is_the_same_winner_in_both_orders() -> None:
    assert consistent("A>B", "B>>A") is True  # the policy won both: strong or slight
    assert consistent("A=B", "A=B") is True
    assert consistent("A>B", "A>B") is False  # the position won, not an answer
    assert consistent("A>B", None) is None


def test_labels_are_counted_with_the_unparseable_ones() -> None:
    counts = count_labels(["A>B", "A>B", "A=B", None, "B>>A", None])
    assert counts == {"A>>B": 0, "A>B": 2, "A=B": 1, "B>A": 0, "B>>A": 1, "unparseable": 2}


def test_the_win_rate_counts_ties_half_and_leaves_unjudged_prompts_out() -> None:
    # Two wins, one tie, one loss, one prompt with no usable verdict: (1 + 1 + 0.5 + 0) / 4.
    assert mean_score([1.0, 1.0, 0.5, 0.0, math.nan]) == 0.625
    assert math.isnan(mean_score([math.nan])) and math.isnan(mean_score([]))


def test_the_interval_of_a_set_that_cannot_vary_is_its_value() -> None:
    assert bootstrap_interval([0.75]) == (0.75, 0.75)
    assert bootstrap_interval([1.0, 1.0, 1.0, math.nan]) == (1.0, 1.0)
    low, high = bootstrap_interval([math.nan])
    assert math.isnan(low) and math.isnan(high)


def test_the_interval_is_the_percentiles_of_the_resampled_win_rates() -> None:
    # Two prompts, a loss and a win: a resample's win rate is 0, 0.5 or 1 with probabilities
    # 1/4, 1/2, 1/4. The central 95% runs from the 2.5th to the 97.5th percentile: 0 and 1.
    assert bootstrap_interval([0.0, 1.0], rounds=10_000, seed=3) == (0.0, 1.0)
    # The central 40% (30th to 70th percentile) lies inside the half that is 0.5.
    assert bootstrap_interval([0.0, 1.0], rounds=10_000, confidence=0.4, seed=3) == (0.5, 0.5)


def test_the_interval_is_seeded_and_narrows_with_more_prompts() -> None:
    scores = [1.0, 0.0, 0.5, 1.0, 1.0, 0.0, 0.75, 0.25] * 4
    assert bootstrap_interval(scores, seed=7) == bootstrap_interval(scores, seed=7)
    assert bootstrap_interval(scores, seed=7) != bootstrap_interval(scores, seed=8)
    low, high = bootstrap_interval(scores, seed=7)
    assert low < mean_score(scores) < high
    wide_low, wide_high = bootstrap_interval(scores[:8], seed=7)
    assert wide_high - wide_low > high - low


def test_an_interval_without_a_level_or_a_resample_is_refused() -> None:
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_interval([1.0], confidence=1.0)
    with pytest.raises(ValueError, match="rounds"):
        bootstrap_interval([1.0], rounds=0)

"""Answer sources for evolved prompts (eva_core.answers): majority vote and rewriter answers."""

from __future__ import annotations

import numpy as np
import pytest

from eva_core.answers import (
    MISSING,
    REJECTED,
    UNCHECKED,
    VERIFIED,
    answer_rewards,
    inherited_answers,
    majority_answer,
    majority_answers,
    normalize_answer,
    reference_answer,
    reference_answers,
    status_counts,
)


def test_normalize_collapses_whitespace_and_case() -> None:
    assert normalize_answer("  Forty\t Two \n") == "forty two"
    assert normalize_answer(" \n ") == ""


def test_majority_counts_every_sample_in_the_share() -> None:
    # "42" 3 times, "24" twice, one empty: 3 of 6.
    assert majority_answer(["42", "24", "42", "", "42", "24"]) == ("42", 0.5)
    # Normalization merges " Yes", "yes " and "YES": 3 of 4.
    assert majority_answer([" Yes", "no", "yes ", "YES"]) == ("yes", 0.75)
    assert majority_answer(["a b", "A  b", "a\tB"]) == ("a b", 1.0)


def test_majority_tie_empty_and_no_samples() -> None:
    # Two answers tie at 2 of 5: no label, but the share is reported.
    assert majority_answer(["x", "y", "x", "y", "z"]) == (None, 0.4)
    # Empty answers never win even when they are the most common.
    assert majority_answer(["", " ", "7"]) == ("7", pytest.approx(1 / 3))
    assert majority_answer(["", "  "]) == (None, 0.0)
    assert majority_answer([]) == (None, 0.0)


def test_majority_custom_normalize() -> None:
    # A normalizer that drops a trailing period makes "3." and "3" one answer.
    assert majority_answer(["3.", "3", "4"], normalize=lambda s: s.strip().rstrip(".")) == (
        "3",
        pytest.approx(2 / 3),
    )


def test_batch_threshold_boundary_and_counts() -> None:
    responses = [
        ["a", "a", "a", "a", "b", "c"],  # 4/6
        ["a", "a", "a", "b", "b", "c"],  # 3/6 = 0.5
        ["a", "a", "b", "b", "c", "c"],  # three-way tie at 2/6
        ["", "", "", "", "", ""],  # nothing answered
        ["q"] * 6,  # 6/6
    ]
    vote = majority_answers(responses, threshold=4 / 6)
    assert vote.answers == ["a", "a", None, None, "q"]
    np.testing.assert_allclose(vote.agreement, [4 / 6, 0.5, 2 / 6, 0.0, 1.0])
    assert vote.keep.tolist() == [True, False, False, False, True]
    assert vote.stats.as_dict() == {
        "children": 5,
        "kept": 2,
        "dropped_uncertain": 1,
        "dropped_tied": 1,
        "dropped_unanswered": 1,
    }
    # 0.67 written as a decimal is above 4/6 = 0.6667: the first prompt is now uncertain.
    assert majority_answers(responses, threshold=0.67).keep.tolist() == [
        False, False, False, False, True,
    ]  # fmt: skip
    # At 0.5 the boundary share 3/6 is kept.
    assert majority_answers(responses, threshold=0.5).keep.tolist() == [
        True, True, False, False, True,
    ]  # fmt: skip


@pytest.mark.parametrize("threshold", [0.0, -0.1, 1.01])
def test_batch_rejects_threshold_outside_unit_interval(threshold: float) -> None:
    with pytest.raises(ValueError, match="threshold"):
        majority_answers([["a"]], threshold=threshold)


def _sum_verifier(prompt: str, answer: str) -> bool | None:
    """Judges "a+b=" prompts only; anything else it cannot judge."""
    if "+" not in prompt:
        return None
    a, b = prompt.rstrip("=").split("+")
    return answer.strip() == str(int(a) + int(b))


def test_reference_answer_statuses() -> None:
    assert reference_answer("2+3=", " 5", _sum_verifier) == (" 5", VERIFIED)
    assert reference_answer("2+3=", "6", _sum_verifier) == (None, REJECTED)
    assert reference_answer("write a poem", "roses", _sum_verifier) == ("roses", UNCHECKED)
    assert reference_answer("2+3=", "5") == ("5", UNCHECKED)  # no verifier at all
    assert reference_answer("2+3=", None, _sum_verifier) == (None, MISSING)
    assert reference_answer("2+3=", "  ", _sum_verifier) == (None, MISSING)


def test_reference_answers_batch_keeps_unchecked_only_when_asked() -> None:
    prompts = ["2+3=", "4+4=", "a poem", "1+1="]
    given = ["5", "9", "roses", None]
    answers, statuses, keep = reference_answers(prompts, given, _sum_verifier)
    assert answers == ["5", None, "roses", None]
    assert statuses == [VERIFIED, REJECTED, UNCHECKED, MISSING]
    assert keep.tolist() == [True, False, False, False]
    _, _, keep = reference_answers(prompts, given, _sum_verifier, accept_unchecked=True)
    assert keep.tolist() == [True, False, True, False]
    assert status_counts(statuses) == {VERIFIED: 1, REJECTED: 1, UNCHECKED: 1, MISSING: 1}
    with pytest.raises(ValueError, match="2 prompts but 1 answers"):
        reference_answers(["a", "b"], ["x"])


def test_inherited_answers_band_and_counts() -> None:
    parents = ["42", "7", None, "x", "5"]
    responses = [
        ["42", " 42", "41", "", "40", "42"],  # 3/6 match (whitespace normalized)
        ["7"] * 6,  # 6/6: too easy for high = 5/6
        ["1", "2"],  # parent has no answer
        ["y", "z", "y"],  # 0/3: the rewrite may have changed the answer
        ["5", "6", "6", "6", "6", "6"],  # 1/6: the boundary of low = 1/6 is kept
    ]
    share, keep, stats = inherited_answers(parents, responses, low=1 / 6, high=5 / 6)
    np.testing.assert_allclose(share, [0.5, 1.0, 0.0, 0.0, 1 / 6])
    assert keep.tolist() == [True, False, False, False, True]
    assert stats.as_dict() == {
        "children": 5,
        "kept": 2,
        "dropped_no_parent_answer": 1,
        "dropped_below": 1,
        "dropped_above": 1,
    }
    # high = 1.0 keeps the always-solved child.
    assert inherited_answers(parents, responses, low=1 / 6)[1].tolist() == [
        True, True, False, False, True,
    ]  # fmt: skip
    with pytest.raises(ValueError, match="low <= high"):
        inherited_answers(parents, responses, low=0.9, high=0.5)
    with pytest.raises(ValueError, match="1 answers but 2 response lists"):
        inherited_answers(["a"], [["a"], ["b"]], low=0.0)


def test_answer_rewards_known_majority_and_dropped() -> None:
    def exact(response: str, answer: str) -> float:
        return float(response.strip() == answer)

    responses = [
        ["7", "8", "7"],  # known answer 8: scored against it, not against the majority 7
        ["5", "5", "6"],  # unknown: majority 5 at 2/3 reaches 0.6
        ["1", "2", "3"],  # unknown: three-way tie, dropped
        ["4", "9", ""],  # unknown: tie between 4 and 9 at 1/3, dropped
    ]
    out = answer_rewards(responses, ["8", None, None, None], exact, threshold=0.6)
    assert out.rewards[0] == [0.0, 1.0, 0.0]
    assert out.rewards[1] == [1.0, 1.0, 0.0]
    assert all(np.isnan(out.rewards[2])) and all(np.isnan(out.rewards[3]))
    assert out.labels == ["8", "5", None, None]
    assert out.sources == ["known", "majority", "dropped", "dropped"]
    assert out.counts() == {"known": 1, "majority": 1, "dropped": 2}
    assert (out.stats.children, out.stats.kept, out.stats.dropped_tied) == (3, 1, 2)
    # A stricter threshold drops the 2/3 majority too.
    strict = answer_rewards(responses, ["8", None, None, None], exact, threshold=0.7)
    assert strict.sources[1] == "dropped" and all(np.isnan(strict.rewards[1]))
    with pytest.raises(ValueError, match="2 answers for 4 prompts"):
        answer_rewards(responses, ["8", None], exact, threshold=0.6)

"""eva_core's method pieces against hand-computed values."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pyarrow as pa
import pytest

from eva_core.evolution import evolved_records
from eva_core.informativeness import INVERSE_EPS, METRICS, informativeness, reward_matrix
from eva_core.mixing import mix_prompt_sets
from eva_core.pairs import cap_pairs, choose_pairs, pick
from eva_core.sampling import select_subset, subset_size
from eva_core.schema import normalize_prompt, prompt_id, seed_records

NAN = float("nan")
# Row 0: [0.2, 0.9, 0.5, 0.9]  max .9 min .2 mean .625 second .9
# Row 1: [0.4, 0.4, 0.4, 0.4]  all tied
# Row 2: [1.0, 0.0, 0.5, 0.7]  max 1 min 0 mean .55 second .7
R = np.array([[0.2, 0.9, 0.5, 0.9], [0.4, 0.4, 0.4, 0.4], [1.0, 0.0, 0.5, 0.7]])


@pytest.mark.parametrize(
    ("metric", "expected"),
    [
        ("a_min", [0.7, 0.0, 1.0]),
        ("a_avg", [0.275, 0.0, 0.45]),
        ("a_dis", [0.0, 0.0, 0.3]),
        # var(row0) = (.180625 + .075625 + .015625 + .075625) / 4 = 0.086875
        ("var", [0.086875, 0.0, 0.1325]),
        ("avg", [0.625, 0.4, 0.55]),
        ("inv_avg", [1 / (0.625 + INVERSE_EPS), 1 / (0.4 + INVERSE_EPS), 1 / (0.55 + INVERSE_EPS)]),
        ("inv_a_min", [1 / (0.7 + INVERSE_EPS), 1 / INVERSE_EPS, 1 / (1.0 + INVERSE_EPS)]),
        ("uniform", [1.0, 1.0, 1.0]),
    ],
)
def test_metrics_hand_computed(metric: str, expected: list[float]) -> None:
    np.testing.assert_allclose(informativeness(R, metric), expected, rtol=1e-9)


def test_every_metric_is_covered_and_unknown_rejected() -> None:
    assert set(METRICS) == {
        "a_min",
        "a_avg",
        "a_dis",
        "var",
        "avg",
        "inv_avg",
        "inv_a_min",
        "uniform",
    }
    with pytest.raises(ValueError, match="unknown informativeness metric 'a_max'"):
        informativeness(R, "a_max")


def test_single_sample_nan_and_negative_edge_cases() -> None:
    one = np.array([[0.3], [0.8]])
    for metric in ("a_min", "a_avg", "a_dis", "var"):
        np.testing.assert_array_equal(informativeness(one, metric), [0.0, 0.0])
    # NaNs are ignored; a row with no finite reward is NaN (never sampled) except under uniform.
    r = np.array([[NAN, 0.2, 0.6], [NAN, NAN, NAN], [0.5, NAN, NAN]])
    np.testing.assert_allclose(informativeness(r, "a_min"), [0.4, NAN, 0.0])
    np.testing.assert_allclose(informativeness(r, "a_avg"), [0.2, NAN, 0.0])
    np.testing.assert_allclose(informativeness(r, "uniform"), [1.0, 1.0, 1.0])
    # Negative rewards: means -1 and 1 are shifted by +1 to 0 and 2.
    neg = np.array([[-1.0, -1.0], [1.0, 1.0]])
    np.testing.assert_allclose(informativeness(neg, "avg"), [0.0, 2.0])
    np.testing.assert_allclose(
        informativeness(neg, "inv_avg"), [1 / INVERSE_EPS, 1 / (2 + INVERSE_EPS)]
    )


def test_reward_matrix_ragged_and_fixed() -> None:
    fixed = pa.array([[0.1, 0.2], [0.3, 0.4]], pa.list_(pa.float32()))
    np.testing.assert_allclose(reward_matrix(fixed), [[0.1, 0.2], [0.3, 0.4]], rtol=1e-6)
    ragged = pa.array([[0.1], [0.3, 0.4, 0.5], None], pa.list_(pa.float64()))
    np.testing.assert_allclose(
        reward_matrix(ragged), [[0.1, NAN, NAN], [0.3, 0.4, 0.5], [NAN, NAN, NAN]]
    )


def test_subset_size() -> None:
    assert subset_size(100, 0.25) == 25
    assert subset_size(100, 0.29) == 29  # not 28 from float error
    assert subset_size(3, 0.25) == 1  # at least one
    assert subset_size(0, 0.25) == 0
    with pytest.raises(ValueError, match=r"fraction must be in \(0, 1\], got 1.5"):
        subset_size(10, 1.5)


def test_weighted_sampling_matches_successive_sampling_probabilities() -> None:
    # Weights 1, 2, 3, k = 2. P(item excluded) = P(the other two are drawn first):
    #   excl 0: 2/6*3/4 + 3/6*2/3 = 0.25 + 0.3333 = 0.5833 -> incl 0 = 0.41667
    #   excl 1: 1/6*3/5 + 3/6*1/3 = 0.1 + 0.16667 = 0.26667 -> incl 1 = 0.73333
    #   excl 2: 1/6*2/5 + 2/6*1/4 = 0.06667 + 0.08333 = 0.15 -> incl 2 = 0.85
    w = np.array([1.0, 2.0, 3.0])
    trials = 20000
    counts = np.zeros(3)
    for s in range(trials):
        counts[select_subset(w, 2, "weighted", seed=s).indices] += 1
    np.testing.assert_allclose(counts / trials, [0.41667, 0.73333, 0.85], atol=0.012)


def test_sampling_deterministic_zero_weights_and_methods() -> None:
    w = np.array([0.0, 5.0, 1.0, 0.0, 2.0, NAN])
    a = select_subset(w, 3, "weighted", seed=7)
    b = select_subset(w, 3, "weighted", seed=7)
    np.testing.assert_array_equal(a.indices, b.indices)
    assert set(a.indices) == {1, 2, 4} and a.zero_weight_filled == 0
    # More than the positive weights: the rest come from zero/NaN weights, and it is reported.
    c = select_subset(w, 5, "weighted", seed=1)
    assert set(c.indices[:3]) == {1, 2, 4} and c.zero_weight_filled == 2
    assert len(set(c.indices)) == 5
    # All zero: uniform fallback, reported.
    z = select_subset(np.zeros(10), 4, "weighted", seed=0)
    assert z.fell_back_to_uniform and len(set(z.indices)) == 4
    # Greedy: top-k, ties broken by row order.
    g = select_subset(np.array([1.0, 3.0, 3.0, 2.0]), 2, "greedy", seed=0)
    np.testing.assert_array_equal(g.indices, [1, 2])
    u = select_subset(np.array([1.0, 3.0, 3.0, 2.0]), 4, "uniform", seed=0)
    assert sorted(u.indices) == [0, 1, 2, 3] and not u.fell_back_to_uniform
    with pytest.raises(ValueError, match="unknown sample method 'top'"):
        select_subset(w, 1, "top", seed=0)


def test_temperature_draws_in_proportion_to_a_power_of_the_weights() -> None:
    # k = 1: the first pick's probability is w_i ** (1/T) / sum_j w_j ** (1/T).
    #   T = 0.5: weights 1, 2, 4 -> 1, 4, 16 of 21 = 0.0476, 0.1905, 0.7619
    #   T = 2:   weights 1, 4, 16 -> 1, 2, 4 of 7 = 0.1429, 0.2857, 0.5714
    trials = 20000
    for w, temperature, expected in (
        ([1.0, 2.0, 4.0], 0.5, [0.0476, 0.1905, 0.7619]),
        ([1.0, 4.0, 16.0], 2.0, [0.1429, 0.2857, 0.5714]),
    ):
        counts = np.zeros(3)
        for s in range(trials):
            counts[select_subset(np.array(w), 1, "weighted", s, temperature).indices] += 1
        np.testing.assert_allclose(counts / trials, expected, atol=0.012)
    # T = 1 is the paper's draw, index for index; a weight whose power is below the smallest
    # float still ranks by its weight (1e-3 ** 100 is 1e-300, 1e-3 ** 1e6 is 0 as a float),
    # never as zero weight; a huge one does not overflow.
    w = np.array([0.0, 5.0, 1.0, 0.0, 2.0, NAN])
    np.testing.assert_array_equal(
        select_subset(w, 3, "weighted", 7, 1.0).indices,
        select_subset(w, 3, "weighted", 7).indices,
    )
    for temperature in (0.01, 1e-6):
        sharp = select_subset(np.array([1e-3, 1.0, 10.0]), 3, "weighted", 0, temperature)
        assert list(sharp.indices) == [2, 1, 0] and sharp.zero_weight_filled == 0
    # 1e200 and 5e199 squared overflow; scaled first, they draw 1 : 0.25 (0.8 and 0.2).
    first = [select_subset(np.array([1e200, 5e199]), 2, "weighted", s, 0.5) for s in range(4000)]
    assert all(d.zero_weight_filled == 0 for d in first)
    assert abs(np.mean([d.indices[0] == 0 for d in first]) - 0.8) < 0.025
    with pytest.raises(ValueError, match="temperature must be > 0"):
        select_subset(w, 1, "weighted", 0, 0.0)


def test_a_temperature_sweep_runs_from_greedy_to_uniform_and_never_leaves_them() -> None:
    # A creator's reading as the issue found it: 3,000 prompts, 1,053 of them informative
    # (A_min in 0.01 steps), 750 drawn. Greedy's mean is that of the 750 largest weights; a
    # uniform draw's expected mean is that of all 3,000. Every temperature from 1e-6 to 1e6
    # draws between the two, no less informative as T falls; 1e-6 is greedy itself, 1e6 is
    # uniform over the informative prompts (zero weights are never drawn while one remains).
    rng = np.random.default_rng(0)
    w = np.zeros(3000)
    w[rng.permutation(3000)[:1053]] = np.round(rng.beta(2.0, 2.0, 1053), 2) + 0.01
    k = 750
    greedy = float(np.sort(w)[::-1][:k].mean())
    uniform = float(w.mean())
    informative = float(w[w > 0].mean())
    temperatures = [10.0**e for e in range(-6, 7)]
    means = []
    for temperature in temperatures:
        draws = [select_subset(w, k, "weighted", s, temperature) for s in range(20)]
        assert all(d.zero_weight_filled == 0 for d in draws)
        means.append(float(np.mean([w[d.indices].mean() for d in draws])))
    assert means[0] == pytest.approx(greedy, abs=1e-12)
    assert means[-1] == pytest.approx(informative, abs=0.01)
    assert all(uniform <= m <= greedy + 1e-12 for m in means), means
    assert all(b <= a + 1e-3 for a, b in itertools.pairwise(means)), means


def test_inclusion_frequency_rises_with_weight() -> None:
    w = np.array([0.1, 0.5, 1.0, 2.0, 4.0])
    counts = np.zeros(5)
    for s in range(4000):
        counts[select_subset(w, 2, "weighted", seed=s).indices] += 1
    assert np.all(np.diff(counts) > 0), counts


def test_prompt_ids_normalize() -> None:
    assert normalize_prompt("  Hello\tWORLD \n") == "hello world"
    assert prompt_id("Hello world") == prompt_id(" hello   WORLD ")
    assert prompt_id("12+34=") != prompt_id("12+35=")
    assert len(prompt_id("x")) == 16


def test_seed_records_reject_bad_rows() -> None:
    t = seed_records(["a?", "b?"], ["x", None])
    assert t.column("depth").to_pylist() == [0, 0]
    assert t.column("root_id").to_pylist() == t.column("prompt_id").to_pylist()
    with pytest.raises(ValueError, match="row 1: prompt is empty"):
        seed_records(["a?", "  "])
    with pytest.raises(ValueError, match="row 2: prompt duplicates row 0"):
        seed_records(["Hi", "b", "hi "])


def _evolved(parents: pa.Table) -> pa.Table:
    cands = [
        [(f"{p}!{k}", "deepen") for k in range(4)] for p in parents.column("prompt").to_pylist()
    ]
    return evolved_records(parents, cands, iteration=1)[0]


def test_evolved_lineage_and_drop_counts() -> None:
    parents = seed_records(["p0", "p1"], ["c0", "c1"])
    cands = [
        [("p0 x", "deepen"), ("  ", "deepen"), ("P0", "breadth"), ("I'm sorry, I can't", "m")],
        [("p0 X", "breadth"), ("q" * 50, "deepen"), ("p1 y", "breadth")],
    ]
    table, stats = evolved_records(parents, cands, iteration=3, max_chars=20)
    assert table.column("prompt").to_pylist() == ["p0 x", "p1 y"]
    assert table.column("parent_id").to_pylist() == parents.column("prompt_id").to_pylist()
    assert table.column("depth").to_pylist() == [1, 1]
    assert table.column("iteration").to_pylist() == [3, 3]
    assert table.column("category").to_pylist() == ["c0", "c1"]
    assert stats.candidates == 7 and stats.kept == 2
    assert stats.dropped == {
        "empty": 1,
        "refusal": 1,
        "too_long": 1,
        "same_as_parent": 1,
        "unrelated": 0,
        "duplicate": 1,
        "heldout": 0,
    }
    # Decontamination: a rewrite that is a held-out prompt (after normalization) is dropped.
    held = {prompt_id("P0 X")}
    kept, clean = evolved_records(parents, cands, iteration=3, max_chars=20, exclude_ids=held)
    assert kept.column("prompt").to_pylist() == ["p1 y"]
    assert clean.dropped["heldout"] == 2 and clean.dropped["duplicate"] == 0  # both spellings
    grand, _ = evolved_records(table, [[("z", "m")], []], iteration=4)
    assert grand.column("depth").to_pylist() == [2]
    assert grand.column("root_id").to_pylist() == [parents.column("prompt_id")[0].as_py()]


def test_mix_exact_ratio_dedup_and_determinism() -> None:
    current = seed_records([f"q{i}" for i in range(100)])
    evolved = _evolved(current)  # 400 distinct evolved prompts
    dup = seed_records(["Q5", "q6 "])  # duplicates of current prompts after normalization
    evolved = pa.concat_tables([evolved, dup.cast(evolved.schema)])
    mixed, stats = mix_prompt_sets(current, evolved, ratio_evolved=0.8, seed=3)
    assert mixed.num_rows == 100
    assert (stats.evolved, stats.original) == (80, 20)
    assert stats.dropped_duplicate_of_existing == 2 and stats.evolved_shortfall == 0
    sources = mixed.column("source").to_pylist()
    assert sources.count("evolved") == 80 and sources.count("seed") == 20
    assert len(set(mixed.column("prompt_id").to_pylist())) == 100
    again, _ = mix_prompt_sets(current, evolved, ratio_evolved=0.8, seed=3)
    assert again.equals(mixed)
    sized, s2 = mix_prompt_sets(current, evolved, ratio_evolved=0.75, seed=3, size=40)
    assert (sized.num_rows, s2.evolved, s2.original) == (40, 30, 10)


def test_mix_shortfall_filled_with_originals() -> None:
    current = seed_records([f"q{i}" for i in range(10)])
    evolved = _evolved(current.slice(0, 1))  # only 4 evolved
    mixed, stats = mix_prompt_sets(current, evolved, ratio_evolved=0.8, seed=0)
    assert (stats.evolved, stats.original, stats.evolved_shortfall) == (4, 6, 4)
    assert mixed.num_rows == 10


def test_pairs_best_worst_ties_and_unscored() -> None:
    r = np.array(
        [[0.2, 0.9, 0.5, 0.9], [0.4, 0.4, 0.4, 0.4], [NAN, 0.3, NAN, NAN], [0.0, 1.0, 0.0, 0.5]]
    )
    choice, stats = choose_pairs(r)
    assert choice.rows.tolist() == [0, 3]
    assert choice.chosen.tolist() == [1, 1]  # first of the tied maxima
    assert choice.rejected.tolist() == [0, 0]  # first of the tied minima
    assert (stats.pairs, stats.skipped_tied, stats.skipped_unscored) == (2, 1, 1)
    responses = [["a", "b", "c", "d"], ["e"] * 4, ["f"] * 4, ["g", "h", "i", "j"]]
    assert pick(responses, choice.rows, choice.chosen) == ["b", "h"]
    assert pick(responses, choice.rows, choice.rejected) == ["a", "g"]
    assert math.isclose(float(r[3, 1] - r[3, 0]), 1.0)
    # min_chosen: row 0's best is 0.9, below 1.0, so only row 3 (best 1.0) keeps its pair.
    choice, stats = choose_pairs(r, min_chosen=1.0)
    assert choice.rows.tolist() == [3] and choice.chosen.tolist() == [1]
    assert (stats.pairs, stats.skipped_low_chosen, stats.skipped_tied) == (1, 1, 1)


def test_a_truncated_response_is_never_chosen_by_default() -> None:
    r = np.array(
        [
            [0.2, 0.9, 0.5, 0.8],  # the best (0.9) was cut: chosen is the best finished, 0.8
            [0.1, 0.9, 0.3, 0.3],  # the worst (0.1) was cut: still the rejected side
            [0.2, 0.9, 0.5, 0.7],  # only the worst finished: no finished answer beats another
            [0.5, 0.5, 0.5, 0.5],  # tied whatever finished
            [0.0, 1.0, NAN, NAN],  # every response cut
        ]
    )
    done = np.array(
        [
            [True, False, True, True],
            [False, True, True, True],
            [True, False, False, False],
            [False, False, True, True],
            [False, False, False, False],
        ]
    )
    choice, stats = choose_pairs(r, finished=done)
    assert choice.rows.tolist() == [0, 1]
    assert choice.chosen.tolist() == [3, 1] and choice.rejected.tolist() == [0, 0]
    assert (stats.pairs, stats.skipped_truncated, stats.skipped_tied) == (2, 2, 1)
    assert stats.rejected_truncated == 1  # row 1's rejected 0.1
    # exclude: neither side; row 1 pairs 0.9 with 0.3, row 0 keeps 0.8 against 0.2.
    choice, stats = choose_pairs(r, finished=done, truncated="exclude")
    assert choice.rows.tolist() == [0, 1] and choice.rejected.tolist() == [0, 2]
    assert (stats.pairs, stats.rejected_truncated, stats.skipped_truncated) == (2, 0, 2)
    # allow: by reward alone, as before finished was known.
    choice, stats = choose_pairs(r, finished=done, truncated="allow")
    assert choice.rows.tolist() == [0, 1, 2, 4] and choice.chosen.tolist() == [1, 1, 1, 1]
    assert (stats.pairs, stats.skipped_truncated, stats.skipped_tied) == (4, 0, 1)
    assert stats.rejected_truncated == 2  # rows 1 and 4 reject a cut answer
    assert choose_pairs(r)[0].rows.tolist() == [0, 1, 2, 4]  # finished unknown: all finished
    # min_chosen judges the chosen side: row 0's best finished (0.8) is below 0.85.
    choice, stats = choose_pairs(r, 0.85, finished=done)
    assert choice.rows.tolist() == [1] and stats.skipped_low_chosen == 1
    with pytest.raises(ValueError, match="truncated must be one of"):
        choose_pairs(r, finished=done, truncated="drop")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"finished has shape \(1, 4\)"):
        choose_pairs(r, finished=done[:1])


def test_cap_pairs_seeded_subset_in_row_order() -> None:
    r = np.array([[0.0, 1.0]] * 10)
    choice, _ = choose_pairs(r)
    capped = cap_pairs(choice, 4, seed=5)
    assert len(capped.rows) == 4 and list(capped.rows) == sorted(capped.rows)
    assert list(cap_pairs(choice, 4, seed=5).rows) == list(capped.rows)
    assert cap_pairs(choice, None, seed=5) is choice and cap_pairs(choice, 10, seed=0) is choice


def test_win_rate_counts_ties_half_and_skips_missing_rewards():
    from eva_core.winrate import paired_by_id, win_rate

    # wins at 0 and 3, a tie at 1, a loss at 2, NaN at 4 left out: (1 + 0.5 + 0 + 1) / 4.
    nan = float("nan")
    assert win_rate([1.0, 0.5, 0.0, 0.8, nan], [0.0, 0.5, 1.0, 0.2, 1.0]) == 0.625
    assert math.isnan(win_rate([nan], [1.0]))
    with pytest.raises(ValueError, match="2 rewards against 1 reference"):
        win_rate([1.0, 0.0], [1.0])
    # Aligned on prompt id, whatever the order; ids only one side has are dropped.
    assert paired_by_id(["b", "a", "c"], [1.0, 0.0, 0.3], ["a", "b"], [0.5, 0.2]) == (
        [1.0, 0.0],
        [0.2, 0.5],
    )


def test_unrelated_rewrites_judged_by_shared_content_words() -> None:
    from eva_core.evolution import content_words, unrelated

    story = "Write a short story about a dragon who guards a library of forgotten books."
    assert content_words("What is the answer?") == {"answer"}  # function words do not count
    assert unrelated(story, "Explain step by step.", 1)
    assert not unrelated(story, "Write a story about a dragon in exactly 100 words.", 1)
    assert unrelated(story, "Write a story about a dragon in exactly 100 words.", 4)
    assert not unrelated(story, "Explain step by step.", 0)  # off
    assert not unrelated("12+34=", "9-4=", 1) and not unrelated("r:abcd=", "r:xy=", 1)
    parents = seed_records([story])
    cands = [[("Explain step by step.", "deep"), ("Explain step by step!", "wide")]]
    table, stats = evolved_records(
        parents, cands, 1, keeps_topic=lambda m: m == "deep", min_shared_words=1
    )
    assert table.column("evolve_method").to_pylist() == ["wide"] and stats.dropped["unrelated"] == 1

"""The predicted creator's posterior (eva_core.predicted), against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from eva_core.predicted import (
    HISTORY,
    INHERITED,
    PRIOR,
    measured_rho,
    method_shifts,
    predict_informativeness,
)

NAN = float("nan")


def test_one_reading_is_pulled_to_the_mean_by_rho() -> None:
    # m = 0.5, s^2 = (2 x 0.25^2) / 4 = 0.03125 (readings 0.25 and 0.75, two at the mean).
    recent = np.array([0.25, 0.75, 0.5, 0.5])
    none = np.full(4, NAN)
    p = predict_informativeness(recent, none, none, [None] * 4, rho_prior=0.8)
    # AR(1): m + rho (y - m), sd = s sqrt(1 - rho^2).
    assert p.mean == pytest.approx([0.5 - 0.8 * 0.25, 0.5 + 0.8 * 0.25, 0.5, 0.5])
    assert p.sd == pytest.approx([math.sqrt(0.03125 * (1 - 0.64))] * 4)
    assert p.source == [HISTORY] * 4
    assert (p.rho, p.rho_measured) == (0.8, False)
    # The ranking of readings is kept: the draw's order is previous's.
    assert list(np.argsort(p.mean)) == list(np.argsort(recent, kind="stable"))


def test_two_readings_combine_by_precision() -> None:
    recent = np.array([0.25, 0.75, 0.5, 0.5])
    older = np.array([0.0, NAN, NAN, NAN])
    rho = 0.5
    p = predict_informativeness(recent, older, np.full(4, NAN), [None] * 4, rho_prior=rho)
    m, s2 = 0.5, 0.03125
    w1, w2 = rho**2 / (1 - rho**2), rho**4 / (1 - rho**4)
    dev = (w1 * (0.25 - m) / rho + w2 * (0.0 - m) / rho**2) / (1 + w1 + w2)
    assert p.mean[0] == pytest.approx(m + dev)
    assert p.sd[0] == pytest.approx(math.sqrt(s2 / (1 + w1 + w2)))
    assert p.sd[0] < p.sd[1]  # read twice: more certain


def test_unread_children_inherit_their_parent_shifted_by_method() -> None:
    # Rows 0-1: children read with their parents (method "deepen": child - parent = -0.2, -0.4).
    # Row 2: an unread "deepen" child of a parent read at 0.9; row 3: unread, no parent.
    recent = np.array([0.3, 0.1, NAN, NAN])
    parent = np.array([0.5, 0.5, 0.9, NAN])
    methods = ["deepen", "deepen", "deepen", None]
    assert method_shifts(recent, parent, methods) == pytest.approx({"deepen": -0.3})
    p = predict_informativeness(recent, np.full(4, NAN), parent, methods, rho_prior=0.8)
    assert p.source == [HISTORY, HISTORY, INHERITED, PRIOR]
    assert p.mean[2] == pytest.approx(0.6)
    s = 0.1  # readings 0.3 and 0.1: mean 0.2, sd 0.1
    assert p.sd[2] == pytest.approx(s) and p.sd[3] == pytest.approx(s)
    assert p.mean[3] == pytest.approx(0.2)


def test_rho_is_measured_from_prompts_read_twice() -> None:
    rng = np.random.default_rng(0)
    old = rng.random(200)
    new = 0.6 * old + 0.4 * rng.random(200)
    expected = np.corrcoef(new, old)[0, 1]
    assert measured_rho(new, old, min_pairs=30) == pytest.approx(expected)
    assert measured_rho(new[:10], old[:10], min_pairs=30) is None
    p = predict_informativeness(new, old, np.full(200, NAN), [None] * 200, 0.8, min_pairs=30)
    assert p.rho_measured and p.rho == pytest.approx(expected)
    # Anti-correlated readings are clipped to 0: every prompt predicted at the mean.
    assert measured_rho(new, -old, min_pairs=30) == 0.0


def test_no_spread_and_bad_arguments() -> None:
    same = np.array([0.4, 0.4, NAN])
    p = predict_informativeness(same, np.full(3, NAN), np.full(3, NAN), [None] * 3, 0.8)
    assert list(p.mean) == pytest.approx([0.4, 0.4, 0.4]) and p.source[2] == PRIOR
    with pytest.raises(ValueError, match="rho_prior"):
        predict_informativeness(same, same, same, [None] * 3, 1.0)
    with pytest.raises(ValueError, match="one entry per prompt"):
        predict_informativeness(same, same[:2], same, [None] * 3, 0.5)

"""Row-wise extremes by blocks of rows equal numpy's reductions, NaN and inf included."""

from __future__ import annotations

import numpy as np

from eva_core.informativeness import (
    _BLOCK_VALUES,
    INVERSE_EPS,
    _row_extreme,
    _row_extremes,
    informativeness,
)


def test_blocked_row_extremes_equal_the_reductions() -> None:
    rng = np.random.default_rng(0)
    for n in (1, 2, 6, 7, 64):
        rows = 3 * (_BLOCK_VALUES // n) + 5  # several blocks and a ragged last one
        r = rng.normal(size=(rows, n))
        r[rng.random(r.shape) < 0.05] = np.nan
        r[rng.random(r.shape) < 0.02] = np.inf
        r[rng.random(r.shape) < 0.02] = -np.inf
        for pick, reduce in ((np.maximum, np.max), (np.minimum, np.min)):
            got, want = _row_extreme(r, pick), reduce(r, axis=1)
            assert got.tobytes() == want.tobytes()
    r = rng.random((2 * _BLOCK_VALUES // 6 + 1, 6))
    top, low = _row_extremes(r)
    assert top.tobytes() == r.max(axis=1).tobytes() and low.tobytes() == r.min(axis=1).tobytes()
    gap = r.max(axis=1) - r.min(axis=1)
    assert informativeness(r, "a_min").tobytes() == gap.tobytes()
    assert informativeness(r, "inv_a_min").tobytes() == (1.0 / (gap + INVERSE_EPS)).tobytes()


def test_a_min_fast_path_leaves_non_finite_rows_to_the_general_one() -> None:
    # A NaN, +inf or -inf anywhere sends the matrix through the general path, which ignores
    # non-finite rewards (the gap of 0.1 and 0.6) and gives a row without one NaN.
    for bad in (np.nan, np.inf, -np.inf):
        r = np.array([[0.1, 0.6, bad], [0.2, 0.2, 0.3], [bad, bad, bad]])
        got = informativeness(r, "a_min")
        assert got[0] == 0.6 - 0.1 and got[1] == 0.3 - 0.2 and np.isnan(got[2])

"""Row-wise extremes by blocks of rows equal numpy's reductions, NaN and inf included."""

from __future__ import annotations

import numpy as np

from eva_core.informativeness import _BLOCK_VALUES, _row_extreme, informativeness


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
    assert informativeness(r, "a_min").tobytes() == (r.max(axis=1) - r.min(axis=1)).tobytes()

"""``select_subset`` against the plain version of its weighted draw (one stable sort of keys)."""

from __future__ import annotations

import numpy as np

from eva_core.sampling import _descending, select_subset


def reference_weighted(weights: np.ndarray, k: int, seed: int) -> np.ndarray:
    w = np.asarray(weights, dtype=np.float64)
    rng = np.random.default_rng(seed)
    positive = np.isfinite(w) & (w > 0)
    n_positive = int(positive.sum())
    if n_positive == 0:
        return rng.permutation(len(w))[:k]
    u = rng.random(len(w))
    with np.errstate(divide="ignore", over="ignore"):
        keys = np.where(positive, np.log(u) / np.where(positive, w, 1.0), -np.inf)
    m = min(k, n_positive)
    top = np.argpartition(-keys, m - 1)[:m] if m < len(w) else np.arange(len(w))
    take = top[np.argsort(-keys[top], kind="stable")]
    rest = np.flatnonzero(~positive)
    return np.concatenate([take, rng.permutation(rest)[: k - len(take)]]).astype(np.int64)


def test_descending_is_the_stable_order_with_and_without_ties() -> None:
    cases = [
        np.array([0.3, 0.1, 0.2]),
        np.array([1.0, 2.0, 1.0, 2.0, -np.inf, -np.inf, np.inf]),  # ties: first come first
        np.array([0.5, np.nan, 0.7, np.nan]),
        np.array([]),
        np.random.default_rng(0).random(1000),
        np.random.default_rng(1).integers(0, 5, 200).astype(np.float64),
    ]
    for values in cases:
        assert _descending(values).tolist() == np.argsort(-values, kind="stable").tolist()
    assert _descending(cases[1]).tolist() == [6, 1, 3, 0, 2, 4, 5]


def test_weighted_draw_matches_the_reference() -> None:
    rnd = np.random.default_rng(7)
    for case in range(200):
        n = int(rnd.integers(1, 60))
        w = rnd.choice([0.0, 0.5, 1.0, 2.0, np.nan, -1.0, 1e-310], n) if case % 2 else rnd.random(n)
        k = int(rnd.integers(0, n + 1))
        got = select_subset(w, k, "weighted", seed=case).indices
        assert got.tolist() == reference_weighted(w, k, case).tolist()

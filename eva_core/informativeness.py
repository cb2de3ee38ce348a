"""Informativeness: how much a prompt can teach the current policy (paper section 3.2).

The creator scores each prompt from the N rewards its responses received. The paper's default
offline metric is the reward gap ``a_min = max - min`` (Table 4 shows it beats the others);
``a_avg = max - mean`` is the online default. The rest are the paper's ablations.

All metrics return a non-negative priority per prompt, ready to be used as sampling weights.

Edge cases, decided once here:

* NaN rewards are responses the reward model could not score; they are ignored. A prompt with
  no finite reward gets NaN informativeness (the sampler treats NaN as weight 0), except under
  ``uniform``, which ignores rewards altogether.
* N = 1 (or one finite reward): every gap (``a_min``, ``a_avg``, ``a_dis``) and ``var`` is 0,
  since a single sample shows no spread.
* Ties: ``a_dis`` is max minus the second-largest *sample*, so two samples tied at the top give
  0, as do N identical rewards under every gap metric.
* Negative rewards (reward models are not calibrated to [0, 1]): ``avg`` and ``inv_avg`` shift
  the prompt means of the whole set by ``-min(0, min mean)`` first, so weights stay >= 0 and
  the ordering of prompts is unchanged. Inverses add ``INVERSE_EPS`` so a zero mean or a zero
  gap yields a very large (finite) priority rather than a division by zero.
"""

from __future__ import annotations

from typing import Literal, get_args

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

Metric = Literal["a_min", "a_avg", "a_dis", "var", "avg", "inv_avg", "inv_a_min", "uniform"]
METRICS: tuple[str, ...] = get_args(Metric)
INVERSE_EPS = 1e-6
_BLOCK_VALUES = 1 << 16  # rows x N per block of the row-wise max/min: 512 KiB, within L2


def reward_matrix(rewards: pa.ListArray | pa.ChunkedArray) -> np.ndarray:
    """A (prompts, max N) float64 matrix from a list<float> column; ragged rows NaN-padded."""
    if isinstance(rewards, pa.ChunkedArray):
        rewards = rewards.combine_chunks() if rewards.num_chunks else pa.array([], rewards.type)
    n_prompts = len(rewards)
    if n_prompts == 0:
        return np.zeros((0, 0))
    lengths = pc.list_value_length(rewards).fill_null(0).to_numpy(zero_copy_only=False)
    width = int(lengths.max())
    # flatten() drops null list entries, so the fast path requires none of those.
    values = rewards.flatten().to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
    if rewards.null_count == 0 and (lengths == width).all():
        return values.reshape(n_prompts, width)
    out = np.full((n_prompts, width), np.nan)
    rows = np.repeat(np.arange(n_prompts), lengths)
    cols = np.arange(len(values)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    out[rows, cols] = values
    return out


def informativeness(rewards: np.ndarray, metric: str) -> np.ndarray:
    """Per-prompt priority from a (prompts, N) reward matrix; see the module doc for edge cases."""
    if metric not in METRICS:
        raise ValueError(f"unknown informativeness metric {metric!r}; choose one of {METRICS}")
    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim != 2:
        raise ValueError(f"rewards must be a (prompts, N) matrix, got shape {r.shape}")
    n_prompts = r.shape[0]
    if metric == "uniform":
        return np.ones(n_prompts)
    if metric in ("a_min", "inv_a_min") and r.shape[1]:
        # The paper's default in one pass over the matrix: max and min propagate NaN and keep
        # +-inf, so finite extremes in every row mean every reward is finite, and the general
        # path below would compute exactly these values.
        top, low = _row_extremes(r)
        if np.isfinite(top).all() and np.isfinite(low).all():
            value = top - low
            return 1.0 / (value + INVERSE_EPS) if metric == "inv_a_min" else value
    finite = np.isfinite(r)
    all_finite = bool(finite.all())
    n_valid = np.full(n_prompts, r.shape[1]) if all_finite else finite.sum(axis=1)
    scored = n_valid > 0
    top = _row_extreme(r if all_finite else np.where(finite, r, -np.inf), np.maximum)

    with np.errstate(invalid="ignore", divide="ignore"):
        if metric in ("a_min", "inv_a_min"):
            low = _row_extreme(r if all_finite else np.where(finite, r, np.inf), np.minimum)
            value = top - low
            if metric == "inv_a_min":
                value = 1.0 / (value + INVERSE_EPS)
        elif metric == "a_dis":
            # Second-largest sample; with fewer than two finite rewards the gap is 0.
            filled = r if all_finite else np.where(finite, r, -np.inf)
            if r.shape[1] >= 2:
                second = -np.partition(-filled, 1, axis=1)[:, 1]
                value = np.where(n_valid >= 2, top - second, 0.0)
            else:
                value = np.zeros(n_prompts)
        else:
            mean = _row_mean(r, finite, n_valid, all_finite)
            if metric == "a_avg":
                value = top - mean
            elif metric == "var":
                dev = np.where(finite, r - mean[:, None], 0.0)
                value = (dev * dev).sum(axis=1) / np.maximum(n_valid, 1)
            else:  # avg, inv_avg: shift the set so no mean is negative (see module doc)
                shift = min(0.0, float(np.min(mean[scored]))) if scored.any() else 0.0
                value = mean - shift
                if metric == "inv_avg":
                    value = 1.0 / (value + INVERSE_EPS)
    if all_finite and r.shape[1]:  # every prompt scored: the values as they are
        return value
    return np.where(scored, value, np.nan)


def _row_extreme(r: np.ndarray, pick: np.ufunc) -> np.ndarray:
    """Row-wise max (``np.maximum``) or min of a (prompts, N) matrix, a column at a time within
    blocks of rows that stay in cache: N is small (the paper's 6), and a reduction along a short
    axis is about 4x slower than passes over columns, which in turn are 2-3x slower when each
    pass streams the whole matrix from memory (the creator's CPU path at 1M prompts,
    bench.creator_cpu). Exactly the values ``r.max(axis=1)`` / ``r.min(axis=1)`` give, NaN
    included: every row still folds its columns in order."""
    if r.shape[1] == 0:
        return pick.reduce(r, axis=1)  # raises as max/min of an empty row does
    out = np.empty(r.shape[0], dtype=r.dtype)
    rows = max(1, _BLOCK_VALUES // r.shape[1])
    for start in range(0, r.shape[0], rows):
        block, part = r[start : start + rows], out[start : start + rows]
        np.copyto(part, block[:, 0])
        for j in range(1, r.shape[1]):
            pick(part, block[:, j], out=part)
    return out


def _row_extremes(r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(_row_extreme(r, np.maximum), _row_extreme(r, np.minimum))`` reading each block once."""
    top, low = np.empty(r.shape[0], dtype=r.dtype), np.empty(r.shape[0], dtype=r.dtype)
    rows = max(1, _BLOCK_VALUES // r.shape[1])
    for start in range(0, r.shape[0], rows):
        block = r[start : start + rows]
        high_part, low_part = top[start : start + rows], low[start : start + rows]
        np.copyto(high_part, block[:, 0])
        np.copyto(low_part, block[:, 0])
        for j in range(1, r.shape[1]):
            np.maximum(high_part, block[:, j], out=high_part)
            np.minimum(low_part, block[:, j], out=low_part)
    return top, low


def _row_mean(
    r: np.ndarray, finite: np.ndarray, n_valid: np.ndarray, all_finite: bool
) -> np.ndarray:
    if all_finite:
        return r.mean(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(finite, r, 0.0).sum(axis=1) / n_valid

"""Choosing which prompts the creator evolves (paper section 3.2, "sample a subset").

``weighted`` (the paper's default) draws a subset without replacement with probability
proportional to informativeness, i.e. successive sampling: the first pick is ``w_i / sum(w)``,
the next is proportional among the rest, and so on. It uses Efraimidis-Spirakis keys
(``log(u) / w``, keep the k largest), which give exactly that distribution in O(P) time, so the
creator's CPU path stays fast on millions of prompts.

Weights that are zero, negative or NaN are never drawn while a positive weight remains; if the
subset needs more prompts than have positive weight, the rest are drawn uniformly from the
zero-weight ones (``zero_weight_filled``), and if *every* weight is zero the whole draw is
uniform (``fell_back_to_uniform``). Stages surface both in their stats.

A ``temperature`` T other than 1 draws in proportion to ``w ** (1 / T)`` instead: below 1 it
leans towards the most informative prompts (T -> 0 is ``greedy``), above 1 towards a uniform
draw (T -> infinity is ``uniform``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np

SampleMethod = Literal["weighted", "greedy", "uniform"]
SAMPLE_METHODS: tuple[str, ...] = get_args(SampleMethod)


@dataclass(frozen=True)
class Subset:
    indices: np.ndarray  # positions into the weight vector, in draw order
    fell_back_to_uniform: bool
    zero_weight_filled: int


def subset_size(n_items: int, fraction: float) -> int:
    """Number of prompts to draw: ``floor(fraction * n)``, at least 1 for a non-empty set."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    if n_items == 0:
        return 0
    # The small epsilon keeps 0.29 * 100 from flooring to 28.
    return min(n_items, max(1, math.floor(fraction * n_items + 1e-9)))


def select_subset(
    weights: np.ndarray, k: int, method: str, seed: int, temperature: float = 1.0
) -> Subset:
    """Draw ``k`` distinct indices; deterministic for a given ``seed``. ``temperature``
    sharpens (< 1) or flattens (> 1) the ``weighted`` draw."""
    if method not in SAMPLE_METHODS:
        raise ValueError(f"unknown sample method {method!r}; choose one of {SAMPLE_METHODS}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    w = np.asarray(weights, dtype=np.float64)
    n = len(w)
    if not 0 <= k <= n:
        raise ValueError(f"cannot draw {k} of {n} prompts")
    rng = np.random.default_rng(seed)
    positive = np.isfinite(w) & (w > 0)
    n_positive = int(positive.sum())
    if temperature != 1.0:
        w = tempered(w, temperature)
        positive = np.isfinite(w) & (w > 0)  # a weight that underflowed to 0 is zero weight
        n_positive = int(positive.sum())

    if method == "uniform" or n_positive == 0:
        indices = rng.permutation(n)[:k]
        return Subset(
            indices, fell_back_to_uniform=method != "uniform" and k > 0, zero_weight_filled=0
        )

    if method == "greedy":
        # Highest weight first; ties go to the earlier row so the result is stable.
        order = np.lexsort((np.arange(n), -np.where(positive, w, -np.inf)))
        take = order[: min(k, n_positive)]
    else:
        u = rng.random(n)
        with np.errstate(divide="ignore", over="ignore"):  # log(0), tiny weights: -inf keys
            if n_positive == n:  # the same keys, without two passes of np.where
                keys = np.log(u) / w
            else:
                keys = np.where(positive, np.log(u) / np.where(positive, w, 1.0), -np.inf)
        m = min(k, n_positive)
        top = np.argpartition(-keys, m - 1)[:m] if m < n else np.arange(n)
        take = top[_descending(keys[top])]

    filled = k - len(take)
    if filled > 0:
        rest = np.flatnonzero(~positive)
        take = np.concatenate([take, rng.permutation(rest)[:filled]])
    return Subset(take.astype(np.int64), fell_back_to_uniform=False, zero_weight_filled=filled)


def tempered(weights: np.ndarray, temperature: float) -> np.ndarray:
    """The weights a ``weighted`` draw at ``temperature`` is proportional to: ``w ** (1 / T)``
    for the positive ones, the others as they are. Scaled by the largest first, so that a high
    power cannot overflow (the draw is proportional: the scale does not matter)."""
    w = np.asarray(weights, dtype=np.float64)
    positive = np.isfinite(w) & (w > 0)
    if temperature == 1.0 or not positive.any():
        return w
    scaled = np.where(positive, w, 0.0) / w[positive].max()
    return np.where(positive, scaled ** (1.0 / temperature), w)


def _descending(values: np.ndarray) -> np.ndarray:
    """``np.argsort(-values, kind="stable")``: without ties (or NaN) the order is unique, so
    the several times faster default sort gives the same one; with them, the stable sort."""
    negated = -values
    order = np.argsort(negated)
    ordered = negated[order]
    if len(ordered) and (np.isnan(ordered[-1]) or bool((ordered[1:] == ordered[:-1]).any())):
        return np.argsort(negated, kind="stable")
    return order

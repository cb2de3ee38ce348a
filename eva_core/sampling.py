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
draw among the positive weights (T -> infinity is ``uniform`` over them). Its keys are compared
in log space, so that no power of a weight is ever computed: ``w ** (1 / T)`` underflows to zero
for every weight but the largest at a small T, and a draw made from it would fill up with
zero-weight prompts, the opposite of its limit.
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
        keys = _draw_keys(w, positive, n_positive == n, rng.random(n), temperature)
        m = min(k, n_positive)
        top = np.argpartition(-keys, m - 1)[:m] if m < n else np.arange(n)
        take = top[_descending(keys[top])]

    filled = k - len(take)
    if filled > 0:
        rest = np.flatnonzero(~positive)
        take = np.concatenate([take, rng.permutation(rest)[:filled]])
    return Subset(take.astype(np.int64), fell_back_to_uniform=False, zero_weight_filled=filled)


def _draw_keys(
    w: np.ndarray, positive: np.ndarray, all_positive: bool, u: np.ndarray, temperature: float
) -> np.ndarray:
    """Efraimidis-Spirakis keys of a draw in proportion to ``w ** (1 / T)``: the k largest are
    the draw; -inf where a weight is not positive.

    At T = 1 the key is ``log(u) / w``, the paper's draw as it always was. At any other T the
    key ``log(u) / w ** (1 / T)`` is ranked by a monotone transform of it that never raises a
    weight to a power: ``log(w) / T - log(-log(u))``, multiplied by T where T < 1. Both forms
    stay finite for every positive T (each multiplies by at most 1), so a tiny T ranks by
    ``log(w)`` (greedy, ties at random) and a huge one by ``-log(-log(u))`` (uniform over the
    positive weights), as the limits say."""
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):  # log(0) and u = 0
        if temperature == 1.0:
            if all_positive:  # the same keys, without two passes of np.where
                return np.log(u) / w
            return np.where(positive, np.log(u) / np.where(positive, w, 1.0), -np.inf)
        log_w = np.log(np.where(positive, w, 1.0))
        noise = np.log(-np.log(u))  # +inf where u = 0: that key is -inf, drawn last
        small = temperature < 1.0
        keys = log_w - temperature * noise if small else log_w / temperature - noise
    return keys if all_positive else np.where(positive, keys, -np.inf)


def tempered(weights: np.ndarray, temperature: float) -> np.ndarray:
    """The weights a ``weighted`` draw at ``temperature`` is proportional to: ``w ** (1 / T)``
    for the positive ones, the others as they are; scaled by the largest, and computed as
    ``exp((log w - log max) / T)`` so that neither a tiny nor a huge T over- or underflows
    before it must (a share that is truly below the smallest float is zero)."""
    w = np.asarray(weights, dtype=np.float64)
    positive = np.isfinite(w) & (w > 0)
    if temperature == 1.0 or not positive.any():
        return w
    log_w = np.log(np.where(positive, w, 1.0))
    return np.where(positive, np.exp((log_w - log_w[positive].max()) / temperature), w)


def _descending(values: np.ndarray) -> np.ndarray:
    """``np.argsort(-values, kind="stable")``: without ties (or NaN) the order is unique, so
    the several times faster default sort gives the same one; with them, the stable sort."""
    negated = -values
    order = np.argsort(negated)
    ordered = negated[order]
    if len(ordered) and (np.isnan(ordered[-1]) or bool((ordered[1:] == ordered[:-1]).any())):
        return np.argsort(negated, kind="stable")
    return order

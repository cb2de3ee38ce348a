"""Win rate against reference responses, as Arena-Hard and AlpacaEval report a model.

Each held-out prompt has a policy response and a reference response (the user's baseline model,
here theta_0); a judge says which is better. With a pointwise reward model as the judge the
policy wins a prompt when its reward is higher, and a tie counts half, as both benchmarks count
ties. Prompts where either reward is missing (NaN) are left out rather than counted as losses.

With an LLM judge (``eva_core.verdicts``) each prompt has a score of its own instead (1, 0.5, 0,
or the mean of its two games); the win rate is their mean, with a bootstrap interval over the
prompts.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def win_rate(rewards: Sequence[float], reference: Sequence[float]) -> float:
    """Share of prompts where ``rewards`` beats ``reference`` (ties count 0.5); NaN if no
    prompt has both rewards."""
    r = np.asarray(rewards, dtype=np.float64)
    ref = np.asarray(reference, dtype=np.float64)
    if r.shape != ref.shape:
        raise ValueError(f"{r.size} rewards against {ref.size} reference rewards")
    both = ~(np.isnan(r) | np.isnan(ref))
    if not both.any():
        return float("nan")
    r, ref = r[both], ref[both]
    return float(np.mean((r > ref) + 0.5 * (r == ref)))


def paired_by_id(
    ids: Sequence[str],
    rewards: Sequence[float],
    ref_ids: Sequence[str],
    ref_rewards: Sequence[float],
) -> tuple[list[float], list[float]]:
    """The two reward lists aligned on prompt id (only ids both sides have), so a win rate never
    compares answers to different prompts."""
    ref = dict(zip(ref_ids, ref_rewards, strict=True))
    pairs = [(float(r), float(ref[i])) for i, r in zip(ids, rewards, strict=True) if i in ref]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def mean_score(scores: Sequence[float]) -> float:
    """The win rate of per-prompt scores (1 a win, 0.5 a tie, 0 a loss, or a mean of games):
    their mean over the finite ones; NaN if none is."""
    x = np.asarray(scores, dtype=np.float64)
    x = x[np.isfinite(x)]
    return float(x.mean()) if x.size else float("nan")


def bootstrap_interval(
    scores: Sequence[float], rounds: int = 1000, confidence: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """A percentile bootstrap interval of the win rate: ``rounds`` resamples of the prompts with
    replacement (the prompt is the unit: its two games share a question), the win rate of
    each, and the central ``confidence`` share of them. Non-finite scores are left out first;
    NaNs when none is left. The same ``seed`` gives the same interval."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    x = np.asarray(scores, dtype=np.float64)
    x = x[np.isfinite(x)]
    if not x.size:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(rounds, x.size))].mean(axis=1)
    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = np.percentile(means, [tail, 100.0 - tail])
    return float(low), float(high)

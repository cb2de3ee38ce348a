"""Win rate against reference responses, as Arena-Hard and AlpacaEval report a model.

Each held-out prompt has a policy response and a reference response (the user's baseline model,
here theta_0); a judge says which is better. With a pointwise reward model as the judge the
policy wins a prompt when its reward is higher, and a tie counts half, as both benchmarks count
ties. Prompts where either reward is missing (NaN) are left out rather than counted as losses.
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

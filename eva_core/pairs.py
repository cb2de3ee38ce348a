"""Preference pairs for the solver: best vs worst response by reward (paper section 3.1).

For each prompt, chosen = the highest-reward response and rejected = the lowest. When several
responses share the top (or bottom) reward the first one is taken, so pairs are deterministic.
A prompt whose best and worst rewards tie (or that has fewer than two scored responses) carries
no preference signal and is skipped; the stage counts it.

``min_chosen`` (off by default, not in the paper) also skips prompts whose best response scores
below it. With a verifier as the reward, 1.0 keeps only pairs whose chosen answer is correct:
best-of-N from a weak policy is often still wrong, and DPO then raises the likelihood of the
wrong tokens it shares with nothing in the rejected answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class PairChoice:
    rows: np.ndarray  # prompt rows that produced a pair
    chosen: np.ndarray  # response index of the chosen response, per kept row
    rejected: np.ndarray


@dataclass(frozen=True)
class PairStats:
    prompts: int
    pairs: int
    skipped_tied: int
    skipped_unscored: int  # fewer than two finite rewards
    skipped_low_chosen: int = 0  # best response below min_chosen

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def choose_pairs(
    rewards: np.ndarray, min_chosen: float | None = None
) -> tuple[PairChoice, PairStats]:
    """Best/worst response indices per row of a (prompts, N) reward matrix (NaN = unscored)."""
    r = np.asarray(rewards, dtype=np.float64)
    finite = np.isfinite(r)
    n_valid = finite.sum(axis=1)
    if r.shape[1] == 0:
        empty = np.zeros(0, dtype=np.int64)
        return PairChoice(empty, empty, empty), PairStats(len(r), 0, 0, len(r))
    # argmax/argmin return the first extreme, which is the documented tie rule.
    best = np.argmax(np.where(finite, r, -np.inf), axis=1)
    worst = np.argmin(np.where(finite, r, np.inf), axis=1)
    rows = np.arange(len(r))
    scored = n_valid >= 2
    gap = np.where(scored, r[rows, best] - r[rows, worst], 0.0)
    informative = scored & (gap > 0)
    good = r[rows, best] >= min_chosen if min_chosen is not None else np.ones(len(r), bool)
    keep = informative & good
    stats = PairStats(
        prompts=len(r),
        pairs=int(keep.sum()),
        skipped_tied=int((scored & ~informative).sum()),
        skipped_unscored=int((~scored).sum()),
        skipped_low_chosen=int((informative & ~good).sum()),
    )
    kept = np.flatnonzero(keep)
    return PairChoice(kept, best[kept], worst[kept]), stats


def cap_pairs(choice: PairChoice, max_pairs: int | None, seed: int) -> PairChoice:
    """Keep at most ``max_pairs`` pairs, a seeded uniform subset in row order.

    Comparisons between prompt-set strategies are only fair at the same training budget (the
    same number of pairs and optimizer steps), and strategies differ in how many prompts tie.
    """
    if max_pairs is None or len(choice.rows) <= max_pairs:
        return choice
    keep = np.sort(np.random.default_rng(seed).permutation(len(choice.rows))[:max_pairs])
    return PairChoice(choice.rows[keep], choice.chosen[keep], choice.rejected[keep])


def pick(responses: Sequence[Sequence[str]], rows: np.ndarray, index: np.ndarray) -> list[str]:
    """``responses[row][index]`` for each kept row."""
    return [responses[int(r)][int(i)] for r, i in zip(rows, index, strict=True)]

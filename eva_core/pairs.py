"""Preference pairs for the solver: best vs worst response by reward (paper section 3.1).

For each prompt, chosen = the highest-reward response and rejected = the lowest. When several
responses share the top (or bottom) reward the first one is taken, so pairs are deterministic.
A prompt whose best and worst rewards tie (or that has fewer than two scored responses) carries
no preference signal and is skipped; the stage counts it.

A response cut at the length cap (``finished`` False) is never the chosen side by default
(``truncated="reject_only"``): a solver closes the chosen text with the end-of-turn token, so a
cut-off chosen answer would teach the policy to stop mid-sentence. It may still be the rejected
side, where lowering its likelihood is what is wanted (TRL's online DPO does the same with its
``missing_eos_penalty``): chosen is the best *finished* response, rejected the worst of all. A
prompt that then has no finished response scoring above another is skipped as
``skipped_truncated``. ``"exclude"`` keeps truncated responses out of both sides; ``"allow"``
pairs by reward alone (what eva did before it knew which responses finished).

``min_chosen`` (off by default, not in the paper) also skips prompts whose best response scores
below it. With a verifier as the reward, 1.0 keeps only pairs whose chosen answer is correct:
best-of-N from a weak policy is often still wrong, and DPO then raises the likelihood of the
wrong tokens it shares with nothing in the rejected answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np

TruncatedRule = Literal["reject_only", "exclude", "allow"]
TRUNCATED_RULES: tuple[str, ...] = ("reject_only", "exclude", "allow")


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
    skipped_truncated: int = 0  # a pair by reward, but none under the truncation rule
    rejected_truncated: int = 0  # pairs whose rejected side was cut at the length cap

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def choose_pairs(
    rewards: np.ndarray,
    min_chosen: float | None = None,
    finished: np.ndarray | None = None,
    truncated: TruncatedRule = "reject_only",
) -> tuple[PairChoice, PairStats]:
    """Best/worst response indices per row of a (prompts, N) reward matrix (NaN = unscored).

    ``finished`` (same shape, bool; None: every response finished) says which responses ended
    before the length cap; ``truncated`` is the rule for the others (see the module doc)."""
    if truncated not in TRUNCATED_RULES:
        raise ValueError(f"truncated must be one of {TRUNCATED_RULES}, got {truncated!r}")
    r = np.asarray(rewards, dtype=np.float64)
    if r.shape[1] == 0:
        empty = np.zeros(0, dtype=np.int64)
        return PairChoice(empty, empty, empty), PairStats(len(r), 0, 0, len(r))
    done = np.ones(r.shape, bool) if finished is None else np.asarray(finished, bool)
    if done.shape != r.shape:
        raise ValueError(f"finished has shape {done.shape}, rewards {r.shape}")
    finite = np.isfinite(r)
    rows = np.arange(len(r))
    scored = finite.sum(axis=1) >= 2
    # By reward alone: what a prompt offers at all (tied or not).
    informative = scored & (_best(r, finite) - _worst(r, finite) > 0)
    may_choose = finite if truncated == "allow" else finite & done
    may_reject = finite & done if truncated == "exclude" else finite
    best = np.argmax(np.where(may_choose, r, -np.inf), axis=1)
    worst = np.argmin(np.where(may_reject, r, np.inf), axis=1)
    has_pair = may_choose.any(axis=1) & may_reject.any(axis=1)
    gap = np.where(has_pair, r[rows, best] - r[rows, worst], 0.0)
    paired = informative & has_pair & (gap > 0)
    good = r[rows, best] >= min_chosen if min_chosen is not None else np.ones(len(r), bool)
    keep = paired & good
    kept = np.flatnonzero(keep)
    stats = PairStats(
        prompts=len(r),
        pairs=len(kept),
        skipped_tied=int((scored & ~informative).sum()),
        skipped_unscored=int((~scored).sum()),
        skipped_low_chosen=int((paired & ~good).sum()),
        skipped_truncated=int((informative & ~paired).sum()),
        rejected_truncated=int((~done[kept, worst[kept]]).sum()),
    )
    return PairChoice(kept, best[kept], worst[kept]), stats


def _best(r: np.ndarray, ok: np.ndarray) -> np.ndarray:
    return np.where(ok, r, -np.inf).max(axis=1)


def _worst(r: np.ndarray, ok: np.ndarray) -> np.ndarray:
    return np.where(ok, r, np.inf).min(axis=1)


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

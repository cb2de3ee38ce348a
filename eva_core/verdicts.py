"""An LLM judge's verdicts on two answers, read on Arena-Hard's scale and turned into scores.

Arena-Hard asks its judge for one of five labels, written in double brackets at the end of its
judgment: ``[[A>>B]]`` (A is significantly better), ``[[A>B]]`` (slightly better), ``[[A=B]]``
(a tie), ``[[B>A]]``, ``[[B>>A]]``. Each prompt is judged twice, the policy's answer first (as
A) and then second (as B), so a judge that prefers a position cancels out.

A verdict is read strictly: the judgment must name exactly one of the five labels in brackets
(repeating it is fine; two different labels, a label outside the scale such as ``[[A<B]]`` or
no label at all make the verdict unparseable). An unparseable verdict is no score, never a
guess: it is left out and counted by the caller.

For a win rate, a strong and a slight win both count as a win and a tie as half of one, as
Arena-Hard's and AlpacaEval's win rates count them (Arena-Hard weights a strong verdict three
times only inside its Bradley-Terry fit, which eva does not compute).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

LABELS = ("A>>B", "A>B", "A=B", "B>A", "B>>A")
# What answer A scores in one game, by label.
A_SCORE = {"A>>B": 1.0, "A>B": 1.0, "A=B": 0.5, "B>A": 0.0, "B>>A": 0.0}
TIE = "A=B"

# Anything in double brackets made of the scale's characters: a near miss such as [[A<B]] is
# found, then refused, rather than passed over for another bracket further on.
_BRACKETED = re.compile(r"\[\[([AB<>=]+)\]\]")


def parse_verdict(judgment: str | None) -> str | None:
    """The one label a judgment gives, or None: no label, a bracket outside the scale, or two
    different labels (a judgment that weighs both and names both is no verdict)."""
    if not judgment:
        return None
    found = set(_BRACKETED.findall(judgment))
    if len(found) != 1:
        return None
    (label,) = found
    return label if label in A_SCORE else None


def game_score(label: str | None, policy_first: bool) -> float:
    """The policy's score in one game: 1 a win, 0.5 a tie, 0 a loss; NaN when the verdict is
    unparseable (None). ``policy_first``: the policy's answer was shown as A."""
    if label is None:
        return math.nan
    a = A_SCORE[label]
    return a if policy_first else 1.0 - a


def prompt_score(policy_first: str | None, policy_second: str | None) -> float:
    """The policy's score on one prompt: the mean of its two games' scores (the verdict with
    its answer shown first, then second), over the games whose verdict parsed; NaN if neither
    did."""
    games = [game_score(policy_first, True), game_score(policy_second, False)]
    usable = [g for g in games if not math.isnan(g)]
    return sum(usable) / len(usable) if usable else math.nan


def consistent(policy_first: str | None, policy_second: str | None) -> bool | None:
    """Whether the two games agree on who won (a tie counts as a side): the judge named the same
    answer whichever position it was in. None unless both verdicts parsed. A judge that always
    favours one position is consistent on no prompt it does not see as a tie."""
    first, second = game_score(policy_first, True), game_score(policy_second, False)
    if math.isnan(first) or math.isnan(second):
        return None
    return first == second


def count_labels(labels: Sequence[str | None]) -> dict[str, int]:
    """How often each label was given, and how many verdicts were unparseable."""
    counts = dict.fromkeys(LABELS, 0)
    for label in labels:
        if label is not None:
            counts[label] += 1
    return {**counts, "unparseable": sum(label is None for label in labels)}

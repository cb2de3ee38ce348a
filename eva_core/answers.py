"""Answers for evolved prompts whose reference answer nobody knows (issue 22).

A verifiable reward needs a reference answer per prompt. The built-in world's evolver knows
every answer; an LLM rewriter does not, so an evolved child has to get its answer from
somewhere. Two sources are here, both pure:

* **Majority vote** over the policy's N samples (as SQLM, R-Zero and TTRL label their
  self-generated problems): the most frequent normalized answer, kept only when its share of
  the N samples reaches a threshold. The share counts every sample, empty ones too, so a
  prompt the policy mostly fails to answer cannot reach a high agreement on the few answers it
  gave. A tie for the top answer labels nothing: picking one of two equally supported answers
  would be a coin flip dressed as a label.
* **The rewriter's reference answer**, accepted when a verifier agrees with it; where no
  verifier can judge the prompt it is recorded as unchecked, and the caller decides whether
  unchecked answers count.
* **The parent's answer**, for a rewrite that was asked to keep it (SvS's variational
  problems): the child inherits it, and the policy's samples say whether that is plausible. A
  child none of whose samples reach the inherited answer may have changed it (or be too hard),
  one all of whose samples do teaches nothing; ``inherited_answers`` keeps the children whose
  share of matching samples lies in a band.

Children whose answer is too uncertain are dropped and counted (``AnswerStats``), as
``eva_core.pairs`` counts the prompts it skips.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

# Statuses of a rewriter-given answer.
VERIFIED = "verified"  # the verifier agrees
REJECTED = "rejected"  # the verifier disagrees: the answer is dropped
UNCHECKED = "unchecked"  # no verifier could judge it: kept only if the caller accepts that
MISSING = "missing"  # the rewriter gave no answer
STATUSES = (VERIFIED, REJECTED, UNCHECKED, MISSING)


def normalize_answer(text: str) -> str:
    """Whitespace runs collapsed to one space, ends stripped, lower case."""
    return " ".join(text.split()).lower()


def majority_answer(
    responses: Sequence[str], normalize: Callable[[str], str] = normalize_answer
) -> tuple[str | None, float]:
    """The most frequent normalized answer and its share of all ``len(responses)`` samples.

    Empty answers (after normalizing) never win but count in the share. The answer is None
    when there is no non-empty answer or when two answers tie for the top; the share is then
    the top count's share all the same (0.0 with no answer at all).
    """
    if not responses:
        return None, 0.0
    counts = Counter(a for a in (normalize(r) for r in responses) if a)
    if not counts:
        return None, 0.0
    (top, n), *rest = counts.most_common()
    share = n / len(responses)
    if rest and rest[0][1] == n:
        return None, share
    return top, share


@dataclass(frozen=True)
class AnswerStats:
    children: int
    kept: int
    dropped_uncertain: int  # a unique top answer, below the threshold
    dropped_tied: int  # two answers tie for the top
    dropped_unanswered: int  # no non-empty sample at all

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class MajorityVote:
    answers: list[str | None]  # the majority answer per prompt (None: no unique top answer)
    agreement: np.ndarray  # its share of the prompt's samples, float64
    keep: np.ndarray  # bool: a unique answer with agreement >= threshold
    stats: AnswerStats


def majority_answers(
    responses: Sequence[Sequence[str]],
    threshold: float,
    normalize: Callable[[str], str] = normalize_answer,
) -> MajorityVote:
    """Majority answers for a batch (N responses per prompt) and which reach ``threshold``.

    A prompt is kept when it has a unique top answer whose share is at least ``threshold``
    (the boundary is kept: 4 of 6 reaches 4/6).
    """
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    votes = [majority_answer(rs, normalize) for rs in responses]
    answers = [a for a, _ in votes]
    agreement = np.array([s for _, s in votes], dtype=np.float64)
    has = np.array([a is not None for a in answers], dtype=bool)
    # A share computed as k/N can fall a hair below a threshold written as the same fraction.
    reaches = agreement >= threshold - 1e-9
    keep = has & reaches
    unanswered = agreement == 0.0
    stats = AnswerStats(
        children=len(answers),
        kept=int(keep.sum()),
        dropped_uncertain=int((has & ~reaches).sum()),
        dropped_tied=int((~has & ~unanswered).sum()),
        dropped_unanswered=int(unanswered.sum()),
    )
    return MajorityVote(answers, agreement, keep, stats)


def reference_answer(
    prompt: str,
    answer: str | None,
    verify: Callable[[str, str], bool | None] | None = None,
    normalize: Callable[[str], str] = normalize_answer,
) -> tuple[str | None, str]:
    """A rewriter-given answer and its status; None unless verified or unchecked.

    ``verify(prompt, answer)`` returns True (agrees), False (disagrees) or None (cannot judge
    this prompt). No verifier at all leaves every given answer unchecked.
    """
    if answer is None or not normalize(answer):
        return None, MISSING
    verdict = verify(prompt, answer) if verify is not None else None
    if verdict is None:
        return answer, UNCHECKED
    return (answer, VERIFIED) if verdict else (None, REJECTED)


def reference_answers(
    prompts: Sequence[str],
    answers: Sequence[str | None],
    verify: Callable[[str, str], bool | None] | None = None,
    accept_unchecked: bool = False,
    normalize: Callable[[str], str] = normalize_answer,
) -> tuple[list[str | None], list[str], np.ndarray]:
    """Per prompt: the answer (None when rejected or missing), its status, and a keep mask.

    Verified answers are kept; unchecked ones only with ``accept_unchecked``.
    """
    if len(prompts) != len(answers):
        raise ValueError(f"{len(prompts)} prompts but {len(answers)} answers")
    checked = [
        reference_answer(p, a, verify, normalize) for p, a in zip(prompts, answers, strict=True)
    ]
    statuses = [s for _, s in checked]
    ok = {VERIFIED, UNCHECKED} if accept_unchecked else {VERIFIED}
    keep = np.array([s in ok for s in statuses], dtype=bool)
    return [a for a, _ in checked], statuses, keep


@dataclass(frozen=True)
class InheritStats:
    children: int
    kept: int
    dropped_no_parent_answer: int
    dropped_below: int  # fewer samples match the inherited answer than ``low`` asks
    dropped_above: int  # more than ``high``: solved too reliably to teach anything

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def inherited_answers(
    parent_answers: Sequence[str | None],
    responses: Sequence[Sequence[str]],
    low: float,
    high: float = 1.0,
    normalize: Callable[[str], str] = normalize_answer,
) -> tuple[np.ndarray, np.ndarray, InheritStats]:
    """Per child of an answer-preserving rewrite: the share of its samples that give the
    parent's answer, and a keep mask for ``low <= share <= high`` (both ends kept).

    A share counts every sample, empty ones too; a child whose parent has no answer gets share
    0 and is dropped on its own count.
    """
    if not 0.0 <= low <= high <= 1.0:
        raise ValueError(f"need 0 <= low <= high <= 1, got low={low}, high={high}")
    if len(parent_answers) != len(responses):
        raise ValueError(f"{len(parent_answers)} answers but {len(responses)} response lists")
    target = [normalize(a) if a is not None else "" for a in parent_answers]
    share = np.array(
        [
            sum(normalize(r) == t for r in rs) / len(rs) if t and rs else 0.0
            for t, rs in zip(target, responses, strict=True)
        ],
        dtype=np.float64,
    )
    has = np.array([bool(t) for t in target], dtype=bool)
    # k/N shares against thresholds written as the same fraction: see majority_answers.
    below = share < low - 1e-9
    above = share > high + 1e-9
    keep = has & ~below & ~above
    stats = InheritStats(
        children=len(target),
        kept=int(keep.sum()),
        dropped_no_parent_answer=int((~has).sum()),
        dropped_below=int((has & below).sum()),
        dropped_above=int((has & above).sum()),
    )
    return share, keep, stats


def status_counts(statuses: Sequence[str]) -> dict[str, int]:
    """How many answers have each status (every status named, zeros included)."""
    counts = Counter(statuses)
    return {s: counts.get(s, 0) for s in STATUSES}


@dataclass(frozen=True)
class AnswerRewards:
    rewards: list[list[float]]  # per prompt, one per response; NaN where no answer was used
    labels: list[str | None]  # the answer each prompt was scored against (None: none)
    sources: list[str]  # "known", "majority" or "dropped", per prompt
    stats: AnswerStats  # the majority vote's counts, over the prompts with no known answer

    def counts(self) -> dict[str, int]:
        """Prompts scored against a known answer, a majority label, or dropped."""
        c = Counter(self.sources)
        return {s: c.get(s, 0) for s in ("known", "majority", "dropped")}


def answer_rewards(
    responses: Sequence[Sequence[str]],
    answers: Sequence[str | None],
    verify: Callable[[str, str], float],
    threshold: float,
    normalize: Callable[[str], str] = normalize_answer,
) -> AnswerRewards:
    """Verifiable rewards where some prompts have no reference answer (TTRL's labelling).

    A prompt with a known answer is scored against it, ``verify(response, answer)``. One
    without is labelled by the majority vote of its own N responses when the vote reaches
    ``threshold`` (``majority_answers``), and scored against that label; below it, every
    response gets NaN, which the stages count as unscored (no pair, no informativeness) rather
    than a reward made up from noise.
    """
    if len(responses) != len(answers):
        raise ValueError(f"{len(answers)} answers for {len(responses)} prompts")
    unknown = [i for i, a in enumerate(answers) if a is None]
    vote = majority_answers([responses[i] for i in unknown], threshold, normalize)
    labels: list[str | None] = list(answers)
    sources = ["known"] * len(answers)
    for j, i in enumerate(unknown):
        labels[i] = vote.answers[j] if vote.keep[j] else None
        sources[i] = "majority" if vote.keep[j] else "dropped"
    rewards = [
        [verify(r, label) for r in rs] if label is not None else [float("nan")] * len(rs)
        for rs, label in zip(responses, labels, strict=True)
    ]
    return AnswerRewards(rewards, labels, sources, vote.stats)

"""Predicted informativeness: the creator's scores without a fresh rollout pass (issue 23).

The paper's creator samples X_{t-1} again with theta_{t-1} to score it. Every prompt of X_{t-1}
was already sampled by the solver step that trained theta_{t-1} (with theta_{t-2}), and the
originals it kept from X_{t-2} were sampled once more before that. ``predict_informativeness``
scores each prompt from that history instead, with a posterior that knows how old each reading
is (MoPPS does the same with a Beta posterior over pass rates; this one needs no binary reward):

* A prompt's informativeness is modelled as drifting from one policy to the next: an AR(1)
  process around the set's mean m, with variance s^2 and correlation rho per policy update. A
  reading taken k updates ago then predicts today's value as m + rho^k (y - m), with variance
  s^2 (1 - rho^2k): the older it is, the more it is pulled towards the set's mean, and the
  less certain.
* A prompt read twice (an original kept from X_{t-2}) combines its readings by precision, each
  taken as an independent reading of today's value. The older one is not independent of the
  newer under the model (it adds only its sampling noise), so a twice-read prompt comes out a
  little more certain than it is: the price of a closed form.
* rho is measured, as the correlation between the two readings of the prompts read at both
  ages; with fewer than ``min_pairs`` of them the prior value is used, and the result says so.
* A prompt with no reading (its rollouts unscored) inherits its parent's reading shifted by
  what its evolution method has done so far (mean child minus parent reading, over the children
  read with their parent), with the set's variance as its uncertainty, as eva's online buffer
  lets children inherit their parent's priority. Without a parent reading it gets m.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

HISTORY, INHERITED, PRIOR = "history", "inherited", "prior"


@dataclass(frozen=True)
class Prediction:
    mean: np.ndarray  # predicted informativeness per prompt (>= 0)
    sd: np.ndarray  # its posterior standard deviation
    source: list[str]  # history | inherited | prior, per prompt
    rho: float  # the per-update correlation used
    rho_measured: bool  # measured from prompts read twice (else the prior value)
    shifts: dict[str, float]  # per evolution method: mean child - parent reading


def _moments(values: np.ndarray) -> tuple[float, float]:
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return 0.0, 0.0
    return float(finite.mean()), float(finite.var())


def measured_rho(recent: np.ndarray, older: np.ndarray, min_pairs: int) -> float | None:
    """Correlation of the two readings over prompts read at both ages, clipped to [0, 0.99]
    (a negative or perfect correlation would turn the posterior inside out); None with fewer
    than ``min_pairs`` such prompts or no spread in either reading."""
    both = np.isfinite(recent) & np.isfinite(older)
    if both.sum() < max(min_pairs, 2):
        return None
    a, b = recent[both], older[both]
    if a.std() == 0.0 or b.std() == 0.0:
        return None
    return float(np.clip(np.corrcoef(a, b)[0, 1], 0.0, 0.99))


def method_shifts(
    recent: np.ndarray, parent_older: np.ndarray, methods: Sequence[str | None]
) -> dict[str, float]:
    """Per evolution method, the mean of child reading minus parent reading."""
    out: dict[str, float] = {}
    known = np.isfinite(recent) & np.isfinite(parent_older)
    labels = np.array([m or "" for m in methods], dtype=object)
    for method in sorted({m for m in labels[known] if m}):
        rows = known & (labels == method)
        out[method] = float((recent[rows] - parent_older[rows]).mean())
    return out


def predict_informativeness(
    recent: np.ndarray,
    older: np.ndarray,
    parent_older: np.ndarray,
    methods: Sequence[str | None],
    rho_prior: float,
    min_pairs: int = 30,
) -> Prediction:
    """Today's informativeness of every prompt of X_{t-1}, from its readings.

    Arrays are aligned to X_{t-1}'s rows, NaN where there is no reading: ``recent`` from the
    last solver step (one update old), ``older`` the same prompt's from the step before (two
    updates old), ``parent_older`` its parent's from that step; ``methods`` the evolution
    method that wrote each prompt (None for a seed).
    """
    if not 0.0 <= rho_prior < 1.0:
        raise ValueError(f"rho_prior must be in [0, 1), got {rho_prior}")
    n = len(recent)
    if not len(older) == len(parent_older) == len(methods) == n:
        raise ValueError("recent, older, parent_older and methods must have one entry per prompt")
    m, s2 = _moments(recent)
    rho_hat = measured_rho(recent, older, min_pairs)
    rho = rho_prior if rho_hat is None else rho_hat
    if s2 == 0.0:  # no spread to predict from: every reading is the mean
        mean = np.where(np.isfinite(recent), recent, m)
        source = [HISTORY if np.isfinite(r) else PRIOR for r in recent]
        return Prediction(mean, np.zeros(n), source, rho, rho_hat is not None, {})

    # Precision-weighted posterior: prior N(m, s2), a reading k updates old is m + rho^k (y - m)
    # with variance s2 (1 - rho^2k), i.e. weight rho^2k / (1 - rho^2k) in units of 1 / s2.
    precision = np.ones(n)
    weighted = np.zeros(n)
    for reading, age in ((recent, 1), (older, 2)):
        seen = np.isfinite(reading)
        r2k = rho ** (2 * age)
        w = r2k / (1.0 - r2k)
        # (y - m) / rho^k is the reading's estimate of today's deviation from the mean.
        deviation = np.where(seen, (reading - m) / max(rho**age, 1e-12), 0.0)
        precision += np.where(seen, w, 0.0)
        weighted += np.where(seen, w * deviation, 0.0)
    mean = m + weighted / precision
    sd = np.sqrt(s2 / precision)
    read = np.isfinite(recent) | np.isfinite(older)
    source = [HISTORY if r else PRIOR for r in read]

    shifts = method_shifts(recent, parent_older, methods)
    for i in np.flatnonzero(~read & np.isfinite(parent_older)).tolist():
        mean[i] = parent_older[i] + shifts.get(methods[i] or "", 0.0)
        sd[i] = np.sqrt(s2)
        source[i] = INHERITED
    return Prediction(np.maximum(mean, 0.0), sd, source, rho, rho_hat is not None, shifts)


class TiePosterior:
    """Will every response to this prompt tie? A pre-rollout filter for online training
    (MoPPS's posterior, GRESO's skipping), read from the prompt's own past groups.

    Each prompt keeps a Beta posterior over the chance that its group ties (all finite rewards
    equal, so the group carries no gradient), starting from Beta(1, 1). Every observed group is
    one Bernoulli reading; at each new reading the older ones are discounted by ``decay``,
    because the policy they came from has moved on (MoPPS's forgetting, counted in the prompt's
    own readings so that a prompt seen once per pass over a large set is not forgotten between
    passes). A drawn prompt is skipped when its posterior mean P(tie) is at least ``threshold``,
    except with probability ``explore``, which keeps re-reading skipped prompts so a prompt the
    policy has stopped solving (or started to) is noticed. With the defaults a prompt is skipped
    after two tied groups in a row and never on its first draw (an unread prompt's P(tie) is
    1/2, one tied reading makes it 2/3).

    Only a prompt that has been read can be skipped: evolved prompts and a first pass over the
    seed set are always rolled out.
    """

    def __init__(
        self, threshold: float = 0.7, decay: float = 0.9, explore: float = 0.1, seed: int = 0
    ):
        if not 0.5 < threshold <= 1.0:
            raise ValueError(f"threshold must be in (0.5, 1], got {threshold}")
        if not 0.0 < decay <= 1.0 or not 0.0 <= explore <= 1.0:
            raise ValueError(f"decay must be in (0, 1] and explore in [0, 1]: {decay}, {explore}")
        self.threshold, self.decay, self.explore, self.seed = threshold, decay, explore, seed
        self.counts: dict[str, tuple[float, float]] = {}  # id -> discounted (ties, not ties)
        self.decisions = 0  # skips decided so far (the exploration stream's position)

    def p_tie(self, prompt_id: str) -> float:
        ties, other = self.counts.get(prompt_id, (0.0, 0.0))
        return (1.0 + ties) / (2.0 + ties + other)

    def skip(self, prompt_id: str) -> bool:
        """Whether to skip this drawn prompt before rollout (deterministic given the state)."""
        if prompt_id not in self.counts or self.p_tie(prompt_id) < self.threshold:
            return False
        self.decisions += 1
        explore = np.random.default_rng([self.seed, self.decisions]).random() < self.explore
        return not explore

    def read(self, prompt_id: str, tied: bool) -> None:
        """Record one observed group of ``prompt_id``."""
        ties, other = self.counts.get(prompt_id, (0.0, 0.0))
        self.counts[prompt_id] = (self.decay * ties + tied, self.decay * other + (not tied))

    def state(self) -> dict[str, object]:
        return {
            "settings": [self.threshold, self.decay, self.explore, self.seed],
            "decisions": self.decisions,
            "counts": {k: list(v) for k, v in self.counts.items()},
        }

    @classmethod
    def from_state(cls, state: dict[str, object]) -> TiePosterior:
        out = cls(*state["settings"])  # type: ignore[misc]
        out.decisions = int(state["decisions"])  # type: ignore[call-overload]
        counts: dict[str, list[float]] = state["counts"]  # type: ignore[assignment]
        out.counts = {k: (float(a), float(b)) for k, (a, b) in counts.items()}
        return out

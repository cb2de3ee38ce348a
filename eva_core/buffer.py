"""The prioritized generative buffer of online eva (paper appendix A/B, "online eva").

Offline eva evolves a prompt set once per iteration. Online eva evolves every mini-batch: the
trainer draws each batch from the seed set D and from a buffer B of evolved prompts, scores the
batch's samples, and the most informative prompts of the batch are evolved into children that
enter B. The buffer moves through three phases:

* ``warmup``: every prompt comes from D (in a seeded shuffle, without replacement). After each
  step the top ``top_fraction`` of the batch by informativeness get ``n_new`` children each;
  only the children enter B. Ends when B first holds ``size`` prompts.
* ``mixup``: ``ratio_evol`` of each batch is drawn from B (weighted by priority, without
  replacement, popped as it is drawn), the rest from D. Children of the batch's top prompts
  enter B, and the oldest entries are evicted to keep |B| = ``size``. Ends when D is exhausted.
* ``bootstrap``: every prompt comes from B; the top prompts get ``n_new_bootstrap`` children.
  Trained prompts are popped, so |B| stays level (2 children for each of half the batch).

A child has not been sampled yet, so its priority starts at its parent's informativeness (the
best available guess of how much its neighbourhood of problems still teaches); a buffer entry
is trained on once and popped, so no priority is ever revised in place.

Without evolution (``evolve=False``) the same object is the plain baseline: D is drawn in fresh
seeded shuffles, epoch after epoch, and B stays empty.

Everything here is pure and deterministic: a draw depends only on the state and ``(seed,
step)``, and ``state()`` / ``from_state()`` round-trip through JSON, so an interrupted run
resumes with exactly the batches an uninterrupted run would have drawn.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import KW_ONLY, asdict, dataclass, field
from typing import Any, Literal

import numpy as np

from eva_core.sampling import select_subset

Phase = Literal["warmup", "mixup", "bootstrap", "seed"]
PHASES: tuple[str, ...] = ("warmup", "mixup", "bootstrap", "seed")


# The buffer's knobs, as ``state()`` records them; their defaults and bounds (the paper's online
# settings, appendix A) live in the run's config, ``tasks.online_loop.BufferConfig``.
SETTINGS: tuple[str, ...] = (
    "size",  # |B|
    "ratio_evol",  # share of a mix-up batch drawn from B
    "top_fraction",  # share of each batch whose prompts are evolved
    "n_new",  # children per parent in warm-up and mix-up
    "n_new_bootstrap",  # children per parent in bootstrap
    "metric",  # informativeness
    "evolve",  # False: the plain baseline, B stays empty
)


@dataclass
class Entry:
    """A prompt in B: its record (the prompt schema's fields), priority and arrival order."""

    record: dict[str, Any]
    priority: float
    arrival: int


@dataclass
class Batch:
    """One mini-batch: prompt records in draw order and whether each came from B."""

    records: list[dict[str, Any]]
    from_buffer: list[bool]
    phase: str


@dataclass
class PromptBuffer:
    """D (seed records, consumed through seeded shuffles) and B (evolved entries). The knobs
    (``SETTINGS``) are plain values the caller has validated."""

    seeds: list[dict[str, Any]]
    _: KW_ONLY
    size: int
    ratio_evol: float
    top_fraction: float
    n_new: int
    n_new_bootstrap: int
    metric: str
    evolve: bool
    seed: int = 0
    phase: str = "warmup"
    step: int = 0  # batches drawn so far
    epoch: int = 0  # passes over D started
    cursor: int = 0  # position in this epoch's shuffle of D
    consumed: int = 0  # prompts handed to the trainer, from D and B together
    arrivals: int = 0  # children ever added (orders eviction)
    evicted: int = 0
    refilled: int = 0  # prompts taken from a new pass over D because B was empty
    resampled: int = 0  # prompts drawn to replace prompts without signal (``refill``)
    entries: list[Entry] = field(default_factory=list)
    # This epoch's shuffle of D, computed once per pass (not state: it follows from seed, epoch).
    _shuffle: tuple[int, np.ndarray] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if not self.seeds:
            raise ValueError("the seed set D is empty")
        if not self.evolve and self.phase == "warmup":
            self.phase = "seed"

    # --- drawing ---------------------------------------------------------------------------

    @property
    def budget(self) -> float:
        """Prompts consumed relative to |D| (the paper's 1x, 2x, ... budgets)."""
        return self.consumed / len(self.seeds)

    def _order(self) -> np.ndarray:
        """This epoch's shuffle of D: O(|D|) once per pass, so a draw costs O(batch)."""
        if self._shuffle is None or self._shuffle[0] != self.epoch:
            order = np.random.default_rng([self.seed, self.epoch]).permutation(len(self.seeds))
            self._shuffle = (self.epoch, order)
        return self._shuffle[1]

    def _take_seeds(self, k: int) -> list[dict[str, Any]]:
        """The next k prompts of D's shuffle; a new epoch only for the no-evolution baseline
        (with evolution, D ends once and the bootstrap phase takes over)."""
        out: list[dict[str, Any]] = []
        order = self._order()
        while len(out) < k:
            if self.cursor >= len(self.seeds):
                if self.evolve:
                    break
                self.epoch, self.cursor = self.epoch + 1, 0
                order = self._order()
            take = order[self.cursor : self.cursor + k - len(out)]
            out.extend(self.seeds[int(i)] for i in take)
            self.cursor += len(take)
        return out

    @property
    def seeds_left(self) -> int:
        return len(self.seeds) - self.cursor

    def _take_buffer(self, k: int, stream: tuple[int, ...] = (1,)) -> list[dict[str, Any]]:
        """Pop k entries drawn by priority without replacement (uniform if all are zero)."""
        k = min(k, len(self.entries))
        if k == 0:
            return []
        weights = np.array([e.priority for e in self.entries])
        seed = _mix(self.seed, self.step, *stream)
        picked = select_subset(weights, k, "weighted", seed=seed).indices
        chosen = [self.entries[int(i)] for i in picked]
        gone = {int(i) for i in picked}
        self.entries = [e for i, e in enumerate(self.entries) if i not in gone]
        return [e.record for e in chosen]

    def draw(self, batch_size: int) -> Batch:
        """The next mini-batch; advances the phase when its condition is met."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self._advance_phase()
        if self.phase in ("warmup", "seed"):
            from_b: list[dict[str, Any]] = []
        elif self.phase == "mixup":
            from_b = self._take_buffer(round(self.ratio_evol * batch_size))
        else:
            from_b = self._take_buffer(batch_size)
        from_d = self._take_seeds(batch_size - len(from_b))
        if len(from_b) + len(from_d) < batch_size and self.entries:
            # D ran out inside this batch: the rest comes from B (bootstrap starts next step).
            from_b += self._take_buffer(batch_size - len(from_b) - len(from_d))
        if (short := batch_size - len(from_b) - len(from_d)) > 0:
            # B cannot fill the batch either (children arrive a step late, or the evolver keeps
            # failing): seed prompts drawn again at random fill it, counted so a run can tell.
            rng = np.random.default_rng([self.seed, self.step, 2])
            picks = rng.choice(len(self.seeds), size=short, replace=short > len(self.seeds))
            from_d += [self.seeds[int(i)] for i in picks]
            self.refilled += short
        records = from_b + from_d
        batch = Batch(records, [True] * len(from_b) + [False] * len(from_d), self.phase)
        self.step += 1
        self.consumed += len(records)
        return batch

    def refill(self, k: int) -> Batch:
        """Up to ``k`` prompts to replace, inside the batch being trained, prompts whose samples
        carried no signal (dynamic sampling): from B by priority in the phases that draw from B,
        then the next of D's shuffle. Fewer, or none, when both are spent: a replacement is never
        a seed prompt drawn again at random. Counted in ``consumed`` (they are handed to the
        trainer) and ``resampled``; the draw index ``step`` does not move."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        from_b: list[dict[str, Any]] = []
        if self.phase in ("mixup", "bootstrap"):
            from_b = self._take_buffer(k, stream=(3, self.resampled))
        from_d = self._take_seeds(k - len(from_b))
        records = from_b + from_d
        self.resampled += len(records)
        self.consumed += len(records)
        return Batch(records, [True] * len(from_b) + [False] * len(from_d), self.phase)

    def _advance_phase(self) -> None:
        if not self.evolve:
            return
        if self.phase == "warmup" and len(self.entries) >= self.size:
            self.phase = "mixup"
        if self.phase in ("warmup", "mixup") and self.seeds_left == 0:
            self.phase = "bootstrap"

    # --- feeding back ----------------------------------------------------------------------

    def top_rows(self, info: np.ndarray) -> list[int]:
        """Rows to evolve: the top ``top_fraction`` by informativeness (ties to the earlier
        row, unscored rows last); none without evolution."""
        if not self.evolve or len(info) == 0:
            return []
        k = math.ceil(self.top_fraction * len(info))
        order = np.lexsort((np.arange(len(info)), -np.nan_to_num(info, nan=-np.inf)))
        return [int(i) for i in order[:k]]

    @property
    def children_per_parent(self) -> int:
        return self.n_new_bootstrap if self.phase == "bootstrap" else self.n_new

    def add_children(self, children: Sequence[dict[str, Any]], priorities: Sequence[float]) -> int:
        """Add evolved records (lineage filled in by the caller) with their starting priority;
        evicts the oldest entries beyond ``size`` outside warm-up. Returns how many were evicted.

        A child already in B is skipped, so B never holds one prompt twice."""
        if len(children) != len(priorities):
            raise ValueError(f"{len(priorities)} priorities for {len(children)} children")
        present = {e.record["prompt_id"] for e in self.entries}
        for record, priority in zip(children, priorities, strict=True):
            if record["prompt_id"] in present:
                continue
            present.add(record["prompt_id"])
            value = float(priority) if np.isfinite(priority) else 0.0
            self.entries.append(Entry(dict(record), value, self.arrivals))
            self.arrivals += 1
        over = len(self.entries) - self.size
        if over <= 0 or self.phase == "warmup":
            # Warm-up fills B up to its size and then hands over to mix-up, which trims.
            return 0
        oldest = sorted(range(len(self.entries)), key=lambda i: self.entries[i].arrival)[:over]
        gone = set(oldest)
        self.entries = [e for i, e in enumerate(self.entries) if i not in gone]
        self.evicted += over
        return over

    # --- persistence -----------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """Everything but D itself, JSON-ready; with D, ``from_state`` rebuilds this buffer."""
        return {
            "settings": {name: getattr(self, name) for name in SETTINGS},
            "seed": self.seed,
            "phase": self.phase,
            "step": self.step,
            "epoch": self.epoch,
            "cursor": self.cursor,
            "consumed": self.consumed,
            "arrivals": self.arrivals,
            "evicted": self.evicted,
            "refilled": self.refilled,
            **({"resampled": self.resampled} if self.resampled else {}),
            "entries": [asdict(e) for e in self.entries],
        }

    @classmethod
    def from_state(cls, seeds: list[dict[str, Any]], state: dict[str, Any]) -> PromptBuffer:
        fields = {k: v for k, v in state.items() if k not in ("settings", "entries")}
        entries = [Entry(**e) for e in state["entries"]]
        return cls(seeds, **state["settings"], entries=entries, **fields)

    def composition(self) -> dict[str, Any]:
        """B by category and by depth, and its priority spread: what a segment reports."""
        cats: dict[str, int] = {}
        depths: dict[str, int] = {}
        for e in self.entries:
            cats[str(e.record.get("category"))] = cats.get(str(e.record.get("category")), 0) + 1
            depths[str(e.record.get("depth"))] = depths.get(str(e.record.get("depth")), 0) + 1
        p = np.array([e.priority for e in self.entries]) if self.entries else np.zeros(0)
        return {
            "size": len(self.entries),
            "categories": dict(sorted(cats.items())),
            "depths": dict(sorted(depths.items(), key=lambda kv: int(kv[0]))),
            "priority_mean": float(p.mean()) if p.size else 0.0,
            "priority_zero_share": float((p <= 0).mean()) if p.size else 0.0,
        }


def _mix(*parts: int) -> int:
    """One 63-bit seed from several integers (numpy's SeedSequence, which mixes them well)."""
    return int(np.random.SeedSequence(list(parts)).generate_state(2, np.uint64)[0] >> 1)

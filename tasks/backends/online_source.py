"""The online trainer's prompt source: eva's buffer in, rewards back, evolution alongside.

An online trainer (TRL's RLOO or GRPO) asks for prompts one mini-batch at a time and scores
its samples with a reward function. ``OnlinePromptSource`` sits on both ends:

* ``records()`` is the trainer's prompt stream: it draws a mini-batch from the buffer
  (``eva_core.buffer``) whenever the trainer needs one, and remembers it as *pending*;
* ``feedback(prompts, rewards)`` is called from inside the reward function with the batch's
  (prompt x sample) rewards: it checks they belong to the oldest pending batch, logs the batch,
  picks the most informative prompts and submits their evolution;
* evolution runs in a worker thread and is *joined* ``evolve_lag`` steps later, so a slow API
  evolver overlaps with that many training steps instead of stalling each one, while the step
  at which children enter the buffer stays fixed (a resumed run draws the same batches).

Trainers prefetch: accelerate's data loader draws batch t+1 before step t trains. Batches that
were drawn but not trained when a segment ends are part of the saved state and are served
first by the next segment, so nothing is lost or trained twice.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from eva_core.buffer import Batch, PromptBuffer
from eva_core.evolution import EvolveStats, clean_rewrite, evolved_records
from eva_core.schema import PROMPT_SCHEMA
from tasks.backends.protocols import Evolver

# Children's records and starting priorities, the evolution's stats, seconds and failed parents.
_Evolved = tuple[list[dict[str, Any]], list[float], EvolveStats, float, int]


@dataclass
class SourceStats:
    """What a segment reports about prompt flow and evolution cost."""

    steps: int = 0
    trained_prompts: int = 0
    from_buffer: int = 0
    parents: int = 0
    failed_parents: int = 0  # parents the evolver returned nothing usable for
    children_added: int = 0
    evicted: int = 0
    evolve_seconds: float = 0.0  # time the evolver worked (in the worker thread)
    evolve_wait_seconds: float = 0.0  # time training waited for it
    dropped: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["evolve_seconds"] = round(self.evolve_seconds, 3)
        out["evolve_wait_seconds"] = round(self.evolve_wait_seconds, 3)
        return out


class OnlinePromptSource:
    """Feeds a trainer from a ``PromptBuffer`` and evolves what its rewards single out."""

    def __init__(
        self,
        buffer: PromptBuffer,
        prompts_per_step: int,
        evolver: Evolver | None,
        *,
        pending: Sequence[Batch] = (),
        max_chars: int | None = None,
        exclude_ids: frozenset[str] = frozenset(),
        categorize: Callable[[str], str | None] | None = None,
        evolve_lag: int = 1,
    ):
        if prompts_per_step < 1:
            raise ValueError(f"prompts_per_step must be >= 1, got {prompts_per_step}")
        if evolve_lag < 0:
            raise ValueError(f"evolve_lag must be >= 0, got {evolve_lag}")
        self.buffer = buffer
        self.prompts_per_step = prompts_per_step
        self.evolver = evolver
        self.pending: deque[Batch] = deque(pending)
        self.max_chars = max_chars
        self.exclude_ids = exclude_ids
        self.categorize = categorize
        self.evolve_lag = evolve_lag
        self.stats = SourceStats()
        self.log: list[dict[str, Any]] = []  # one row per trained prompt
        self._evolutions: deque[tuple[int, Future[_Evolved]]] = deque()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="eva-evolve")

    # --- the trainer's side --------------------------------------------------------------

    def records(self) -> Iterator[dict[str, Any]]:
        """The prompt stream, one mini-batch at a time; batches left pending by the last
        segment come first."""
        served = 0
        while True:
            if served < len(self.pending):
                batch = self.pending[served]
            else:
                batch = self.buffer.draw(self.prompts_per_step)
                self.pending.append(batch)
            served += 1
            for record in batch.records:
                yield {"prompt": record["prompt"], "prompt_id": record["prompt_id"]}

    def feedback(self, prompts: Sequence[str], rewards: np.ndarray) -> None:
        """Rewards of the oldest pending batch, one row per prompt (its samples' rewards)."""
        if not self.pending:
            raise RuntimeError("rewards arrived for a batch that was never drawn")
        batch = self.pending.popleft()
        expected = [r["prompt"] for r in batch.records]
        if list(prompts) != expected:
            raise RuntimeError(
                "the trainer scored prompts in another order than they were drawn: "
                f"{list(prompts)[:3]} vs {expected[:3]}"
            )
        step = self.buffer.step - len(self.pending) - 1  # the draw index of this batch
        rows, info = self.buffer.parents(batch, rewards)
        for i, record in enumerate(batch.records):
            self.log.append({
                **record,
                "step": step,
                "phase": batch.phase,
                "from_buffer": batch.from_buffer[i],
                "rewards": [float(x) for x in rewards[i]],
                "informativeness": float(info[i]),
                "evolved": i in rows,
            })  # fmt: skip
        self.stats.steps += 1
        self.stats.trained_prompts += len(batch.records)
        self.stats.from_buffer += sum(batch.from_buffer)
        if rows and self.evolver is not None:
            parents = [batch.records[i] for i in rows]
            priorities = [float(info[i]) for i in rows]
            n = self.buffer.children_per_parent
            future = self._pool.submit(self._evolve, parents, priorities, n, step)
            self._evolutions.append((step, future))
            self.stats.parents += len(parents)
        # Children of the evolution submitted evolve_lag steps ago join now; with lag 0 this
        # waits for the one just submitted.
        self._join(step - self.evolve_lag)

    # --- evolution -----------------------------------------------------------------------

    def _evolve(
        self, parents: list[dict[str, Any]], priorities: list[float], n: int, step: int
    ) -> _Evolved:
        assert self.evolver is not None
        started = time.perf_counter()
        seed = self.buffer.seed * 1_000_003 + step
        raw = self.evolver.evolve(
            [p["prompt"] for p in parents], [p.get("category") for p in parents], n, seed
        )
        failed = sum(not any(clean_rewrite(text) for text, _ in rewrites) for rewrites in raw)
        table = pa.Table.from_pylist(parents, schema=PROMPT_SCHEMA)
        children, stats = evolved_records(
            table, raw, step, self.max_chars, self.categorize, exclude_ids=self.exclude_ids
        )
        by_parent = dict(zip((p["prompt_id"] for p in parents), priorities, strict=True))
        records = children.to_pylist()
        seconds = time.perf_counter() - started
        return records, [by_parent[r["parent_id"]] for r in records], stats, seconds, failed

    def _join(self, upto: int) -> None:
        """Add the children of every evolution submitted at a step <= ``upto``, in order."""
        while self._evolutions and self._evolutions[0][0] <= upto:
            _, future = self._evolutions.popleft()
            waited = time.perf_counter()
            records, priorities, stats, seconds, failed = future.result()
            self.stats.failed_parents += failed
            self.stats.evolve_wait_seconds += time.perf_counter() - waited
            self.stats.evolve_seconds += seconds
            self.stats.evicted += self.buffer.add_children(records, priorities)
            self.stats.children_added += len(records)
            for reason, count in stats.dropped.items():
                self.stats.dropped[reason] = self.stats.dropped.get(reason, 0) + count

    def close(self) -> None:
        """Join every outstanding evolution (its children belong to this segment's state)."""
        self._join(self.buffer.step)
        self._pool.shutdown(wait=True)

    # --- persistence ---------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        return {
            "buffer": self.buffer.state(),
            "pending": [
                {"records": b.records, "from_buffer": b.from_buffer, "phase": b.phase}
                for b in self.pending
            ],
        }


def pending_batches(state: dict[str, Any]) -> list[Batch]:
    return [Batch(b["records"], b["from_buffer"], b["phase"]) for b in state.get("pending", [])]

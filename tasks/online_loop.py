"""The online loop of eva (paper appendix A/B), one optimizer step at a time:

1. draw    a mini-batch of prompts from the prioritized generative buffer (``eva_core.buffer``);
2. sample  the trainer samples responses to each prompt (TRL's RLOO, GRPO or online DPO);
3. score   the reward model scores the responses;
4. update  once the step has trained, the batch's rewards give each prompt's informativeness;
5. evolve  the batch's most informative prompts are rewritten, in a worker thread;
6. join    their children enter the buffer ``evolve_lag`` steps later, so a slow API evolver
           overlaps with that many training steps, while the step at which children join stays
           fixed (a resumed run draws the same batches).

``OnlineLoop`` knows no trainer. It offers the three points a trainer drives: ``prompts()``, the
prompt stream (1); ``score()``, the reward function (3); ``step_end()``, called when an optimizer
step has finished (4-6). ``tasks.backends.train.online`` plugs them into TRL.

Scores are recorded by *row*, a key each streamed prompt carries (its batch's draw index and its
position), never by the position a trainer passes a completion in, so any layout works (RLOO and
GRPO pass a prompt's samples together, online DPO the batch twice); ``step_end`` checks that the
rows scored since the last step are exactly those of the batch the step trained on.

Timing: the trainer's data loader prefetches one batch, so batch t+1 is drawn before step t
trains and batch t+2 only when step t+1 starts; the buffer updated at the end of step t is the
one batch t+2 is drawn from. Batches drawn but not trained when a segment ends are part of the
saved state and are served first by the next segment, so nothing is lost or trained twice.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from eva_core.buffer import Batch, PromptBuffer
from eva_core.evolution import EvolveStats, clean_rewrite, evolved_records
from eva_core.informativeness import Metric
from eva_core.schema import PROMPT_SCHEMA
from tasks.backends.protocols import Evolver, RewardModel


class BufferConfig(BaseModel):
    """The prioritized generative buffer; defaults are the paper's online settings."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    evolve: bool = Field(
        default=True, description="false: plain online RL on D (the RLOO baseline), no buffer."
    )
    size: int = Field(default=3200, ge=1, description="|B| (paper: 3200).")
    ratio_evol: float = Field(
        default=0.5, ge=0.0, le=1.0, description="Share of a mix-up batch drawn from B."
    )
    top_fraction: float = Field(
        default=0.5, gt=0.0, le=1.0, description="Share of each batch whose prompts are evolved."
    )
    n_new: int = Field(default=4, ge=0, description="Children per parent in warm-up and mix-up.")
    n_new_bootstrap: int = Field(default=2, ge=0, description="Children per parent in bootstrap.")
    metric: Metric = Field(default="a_avg", description="Informativeness (online: max - mean).")

    def buffer(self, seeds: list[dict[str, Any]], seed: int) -> PromptBuffer:
        """A fresh buffer over the seed records."""
        return PromptBuffer(seeds, **self.model_dump(), seed=seed)


@dataclass
class LoopStats:
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
    # Dynamic sampling's counts (``OnlineLoop.resample``); None when it is off, and then not
    # reported, so a segment's stats read as they always have.
    dynamic_sampling: dict[str, int] | None = None

    def as_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        if self.dynamic_sampling is None:
            del out["dynamic_sampling"]
        out["evolve_seconds"] = round(self.evolve_seconds, 3)
        out["evolve_wait_seconds"] = round(self.evolve_wait_seconds, 3)
        return out


# Children's records and starting priorities, the evolution's stats, seconds and failed parents.
_Evolved = tuple[list[dict[str, Any]], list[float], EvolveStats, float, int]


def row_key(step: int, position: int) -> str:
    """The row a streamed prompt carries: its batch's draw index and its position there."""
    return f"{step}:{position}"


class OnlineLoop:
    """Draws the trainer's batches from a ``PromptBuffer``, scores its samples, and feeds the
    rewards back: the buffer learns each prompt's informativeness, the top prompts evolve."""

    def __init__(
        self,
        buffer: PromptBuffer,
        prompts_per_step: int,
        reward: RewardModel,
        evolver: Evolver | None,
        *,
        pending: Sequence[Batch] = (),
        max_chars: int | None = None,
        exclude_ids: frozenset[str] = frozenset(),
        categorize: Callable[[str], str | None] | None = None,
        evolve_lag: int = 1,
        dynamic_sampling: bool = False,
    ):
        if prompts_per_step < 1:
            raise ValueError(f"prompts_per_step must be >= 1, got {prompts_per_step}")
        if evolve_lag < 0:
            raise ValueError(f"evolve_lag must be >= 0, got {evolve_lag}")
        self.buffer = buffer
        self.prompts_per_step = prompts_per_step
        self.reward = reward
        self.evolver = evolver
        self.pending: deque[Batch] = deque(pending)  # drawn, not trained yet, oldest first
        self.max_chars = max_chars
        self.exclude_ids = exclude_ids
        self.categorize = categorize
        self.evolve_lag = evolve_lag
        self.stats = LoopStats()
        if dynamic_sampling:
            self.stats.dynamic_sampling = dict.fromkeys(
                ("dropped_groups", "replacement_prompts", "extra_responses", "rounds",
                 "short_steps"), 0,
            )  # fmt: skip
        self._rows: dict[int, list[str]] = {}  # draw index -> its rows, once one was replaced
        self._replacements: set[str] = set()  # rows of prompts drawn as replacements
        self.log: list[dict[str, Any]] = []  # one row per trained prompt
        self._scores: dict[str, list[float]] = {}  # row -> its samples' rewards, this step
        self._evolutions: deque[tuple[int, Future[_Evolved]]] = deque()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="eva-evolve")

    @property
    def _oldest_pending(self) -> int:
        """The draw index of ``pending[0]`` (of the next batch drawn, when none is pending)."""
        return self.buffer.step - len(self.pending)

    # --- 1. draw ---------------------------------------------------------------------------

    def prompts(self) -> Iterator[dict[str, Any]]:
        """The trainer's prompt stream, one mini-batch at a time, each prompt with its row;
        batches left pending by the last segment come first."""
        step = self._oldest_pending
        while True:
            if step == self.buffer.step:
                self.pending.append(self.buffer.draw(self.prompts_per_step))
            if step < self._oldest_pending:
                raise RuntimeError(f"batch {step} was trained before it was streamed")
            batch = self.pending[step - self._oldest_pending]
            for i, record in enumerate(batch.records):
                yield {
                    "prompt": record["prompt"],
                    "prompt_id": record["prompt_id"],
                    "row": row_key(step, i),
                }
            step += 1

    # --- 3. score --------------------------------------------------------------------------

    def score(
        self, rows: Sequence[str], prompts: Sequence[str], completions: Sequence[str]
    ) -> list[float]:
        """One reward per completion; ``rows[j]`` is the row ``completions[j]`` answers. Each
        row's samples are scored together (as the reward model expects) and recorded."""
        if not len(rows) == len(prompts) == len(completions):
            raise ValueError(
                f"{len(rows)} rows, {len(prompts)} prompts, {len(completions)} samples"
            )
        samples: dict[str, list[int]] = {}  # row -> its completions' positions, in order
        for j, row in enumerate(rows):
            samples.setdefault(row, []).append(j)
        if again := [row for row in samples if row in self._scores]:
            raise RuntimeError(f"rows {again[:3]} were scored twice within one step")
        scores = self.reward.score(
            [prompts[js[0]] for js in samples.values()],
            [[completions[j] for j in js] for js in samples.values()],
        )
        flat = [math.nan] * len(rows)
        for (row, js), row_scores in zip(samples.items(), scores, strict=True):
            values = [float(x) for x in np.asarray(row_scores, dtype=np.float64)]
            if len(values) != len(js):
                raise RuntimeError(f"row {row}: {len(values)} rewards for {len(js)} samples")
            self._scores[row] = values
            for j, value in zip(js, values, strict=True):
                flat[j] = value
        return flat

    # --- 3b. dynamic sampling (DAPO) ------------------------------------------------------------

    def _batch_rows(self, step: int) -> list[str]:
        """The rows of batch ``step`` as it stands (replacements take their dropped row's place)."""
        batch = self.pending[step - self._oldest_pending]
        return self._rows.get(step) or [row_key(step, i) for i in range(len(batch.records))]

    def tied(self, rows: Sequence[str]) -> list[str]:
        """Those of the scored ``rows`` whose samples carry no signal: their finite rewards are
        all equal (the rule of ``tied_prompts``; a row with no finite reward is unscored, not
        tied, and left for the unscored check)."""
        out = []
        for row in rows:
            finite = [r for r in self._scores[row] if math.isfinite(r)]
            if finite and max(finite) == min(finite):
                out.append(row)
        return out

    def resample(self, rows: Sequence[str]) -> list[tuple[str, dict[str, Any]]]:
        """Dynamic sampling: replace ``rows`` of the batch being trained (tied, see ``tied``)
        with prompts drawn from the buffer (``PromptBuffer.refill``): each replacement takes its
        row's place in the batch, under a row of its own, and the dropped row's rewards are
        forgotten. Returns (dropped row, replacement prompt) pairs; fewer than ``rows`` when the
        buffer is spent (the rest stay in the batch)."""
        assert self.stats.dynamic_sampling is not None, "dynamic sampling is off"
        if not rows:
            return []
        step = self._oldest_pending
        batch = self.pending[0]
        current = self._batch_rows(step)
        if missing := [row for row in rows if row not in current or row not in self._scores]:
            raise RuntimeError(f"rows {missing[:3]} are not scored rows of batch {step}")
        drawn = self.buffer.refill(len(rows))
        counts = self.stats.dynamic_sampling
        counts["rounds"] += bool(drawn.records)  # rounds that sampled replacements
        counts["replacement_prompts"] += len(drawn.records)
        swaps = []
        for j, (row, record) in enumerate(zip(rows, drawn.records, strict=False)):
            position = current.index(row)
            new_row = row_key(step, len(batch.records) + len(self._replacements_of(step)) + j)
            dropped = self._scores.pop(row)
            if row in self._replacements:
                counts["extra_responses"] += len(dropped)
            batch.records[position] = record
            batch.from_buffer[position] = drawn.from_buffer[j]
            current[position] = new_row
            swaps.append((row, {"prompt": record["prompt"], "prompt_id": record["prompt_id"],
                                "row": new_row}))  # fmt: skip
        self._replacements.update(swap["row"] for _, swap in swaps)
        counts["dropped_groups"] += len(swaps)
        self._rows[step] = current
        return swaps

    def _replacements_of(self, step: int) -> list[str]:
        prefix = f"{step}:"
        return [row for row in self._replacements if row.startswith(prefix)]

    # --- 4. update, 5. evolve, 6. join -----------------------------------------------------

    def step_end(self) -> None:
        """The step trained on the oldest pending batch: feed its rewards to the buffer, evolve
        its most informative prompts, and join the children due at this step."""
        if not self.pending:
            raise RuntimeError("a step ended before its batch was drawn")
        step = self._oldest_pending
        rows = self._batch_rows(step)
        batch = self.pending.popleft()
        self._rows.pop(step, None)
        if sorted(self._scores) != sorted(rows):
            raise RuntimeError(
                f"the step that trained batch {step} ended, but the rows scored since the last "
                f"step are {sorted(self._scores)[:4]}, not {rows[:4]}"
            )
        per_row = [self._scores.pop(row) for row in rows]
        if (counts := self.stats.dynamic_sampling) is not None:
            mine = self._replacements_of(step)
            counts["extra_responses"] += sum(
                len(r) for row, r in zip(rows, per_row, strict=True) if row in self._replacements
            )
            self._replacements.difference_update(mine)
            finite = [[x for x in r if math.isfinite(x)] for r in per_row]
            counts["short_steps"] += any(f and max(f) == min(f) for f in finite)
        if len({len(r) for r in per_row}) != 1:
            raise RuntimeError(
                f"step {step}: rows have {sorted({len(r) for r in per_row})} samples"
            )
        rewards = np.array(per_row, dtype=np.float64)  # (prompt x sample), in draw order
        parents, info = self.buffer.parents(batch, rewards)  # the top ones and everyone's score
        for i, record in enumerate(batch.records):
            self.log.append({
                **record,
                "step": step,
                "phase": batch.phase,
                "from_buffer": batch.from_buffer[i],
                "rewards": [float(x) for x in rewards[i]],
                "informativeness": float(info[i]),
                "evolved": i in parents,
            })  # fmt: skip
        self.stats.steps += 1
        self.stats.trained_prompts += len(batch.records)
        self.stats.from_buffer += sum(batch.from_buffer)
        if parents and self.evolver is not None:
            chosen = [batch.records[i] for i in parents]
            priorities = [float(info[i]) for i in parents]
            n = self.buffer.children_per_parent
            future = self._pool.submit(self._evolve, chosen, priorities, n, step)
            self._evolutions.append((step, future))
            self.stats.parents += len(chosen)
        # Children of the evolution submitted evolve_lag steps ago join now; with lag 0 this
        # waits for the one just submitted.
        self._join(step - self.evolve_lag)

    def _evolve(
        self, parents: list[dict[str, Any]], priorities: list[float], n: int, step: int
    ) -> _Evolved:
        """In the worker thread: ``n`` children per parent, each starting at its parent's
        informativeness as priority."""
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

    # --- the segment's end -----------------------------------------------------------------

    def close(self) -> None:
        """Join every outstanding evolution (its children belong to this segment's state)."""
        self._join(self.buffer.step)
        self._pool.shutdown(wait=True)

    def state(self) -> dict[str, Any]:
        """The buffer and the batches drawn but not trained, JSON-ready."""
        return {
            "buffer": self.buffer.state(),
            "pending": [
                {"records": b.records, "from_buffer": b.from_buffer, "phase": b.phase}
                for b in self.pending
            ],
        }


def pending_batches(state: dict[str, Any]) -> list[Batch]:
    """The batches a saved ``state()`` left pending."""
    return [Batch(b["records"], b["from_buffer"], b["phase"]) for b in state.get("pending", [])]

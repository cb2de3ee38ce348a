"""The online loop of eva (paper appendix A/B), one optimizer step at a time:

1. draw    a mini-batch of prompts from the creator (``eva_core.creator.Creator``);
2. sample  the trainer samples responses to each prompt (TRL's RLOO, GRPO or online DPO);
3. score   the reward model scores the responses;
4. observe once the step has trained, the batch's rewards go back to the creator, which scores
           each prompt's informativeness, evolves the most informative ones (in a worker thread)
           and joins their children ``evolve_lag`` steps later, so a slow API evolver overlaps
           with that many training steps while the step at which children join stays fixed (a
           resumed run draws the same batches).

``OnlineLoop`` knows no trainer. It offers the three points a trainer drives: ``prompts()``, the
prompt stream (1); ``score()``, the reward function (3); ``step_end()``, called when an optimizer
step has finished (4). ``tasks.backends.train.online`` plugs them into TRL's public seams.

Scores are recorded by *row*, a key each streamed prompt carries (its batch's draw index and its
position), never by the position a trainer passes a completion in, so any layout works (RLOO and
GRPO pass a prompt's samples together, online DPO the batch twice); ``step_end`` checks that the
rows scored since the last step are exactly those of the batch the step trained on.

Timing: the trainer's data loader prefetches one batch, so batch t+1 is drawn before step t
trains and batch t+2 only when step t+1 starts; the creator updated at the end of step t is the
one batch t+2 is drawn from. Batches drawn but not trained when a segment ends are part of the
saved state and are served first by the next segment, so nothing is lost or trained twice.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from eva_core.creator import Creator
from eva_core.creator_records import Record
from eva_core.informativeness import Metric
from eva_core.predicted import TiePosterior
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
    # Keyed only when set (tasks/keys.py): the keys of segments cached before it existed hold.
    skip_tied: bool = Field(
        default=False,
        json_schema_extra={"key": "unless default"},
        description="Pre-rollout filter: skip a drawn prompt whose own past groups predict that "
        "all its responses will tie (eva_core.predicted.TiePosterior: after two tied groups in "
        "a row, re-read 1 time in 10) and draw another in its place; counted as `skipped`.",
    )

    def creator(
        self,
        seeds: list[dict[str, Any]],
        seed: int,
        evolver: Evolver | None,
        executor: ThreadPoolExecutor,
        **options: Any,
    ) -> Creator:
        """A fresh creator over the seed records, evolving with ``evolver`` in ``executor``."""
        return Creator(
            seeds,
            rewriter=rewriter_of(evolver) if self.evolve and evolver is not None else None,
            **self.model_dump(exclude={"evolve", "skip_tied"}),
            seed=seed,
            skip_tied=TiePosterior(seed=seed) if self.skip_tied else None,
            executor=executor,
            **options,
        )


def rewriter_of(evolver: Evolver) -> Callable[[list[Record], int, int], Any]:
    """A pipeline evolver as the creator's rewriter callable."""

    def rewrite(parents: list[Record], n: int, seed: int) -> Any:
        return evolver.evolve(
            [p["prompt"] for p in parents], [p.get("category") for p in parents], n, seed
        )

    return rewrite


@dataclass
class Batch:
    """One mini-batch as the trainer was given it: its draw index, prompt records and the
    buffer's phase when it was drawn."""

    step: int
    records: list[Record]
    phase: str


@dataclass
class LoopStats:
    """What a segment reports about prompt flow (the creator's own counts are beside it)."""

    steps: int = 0
    trained_prompts: int = 0
    from_buffer: int = 0
    completions: int = 0  # scored for the trained batches
    truncated: int = 0  # of them, cut at max_completion_length (they train nothing by default)
    evolve_seconds: float = 0.0  # time the evolver worked (in the worker thread)
    evolve_wait_seconds: float = 0.0  # time training waited for the creator at step ends

    def as_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["truncated_share"] = (
            round(self.truncated / self.completions, 4) if self.completions else 0.0
        )
        out["evolve_seconds"] = round(self.evolve_seconds, 3)
        out["evolve_wait_seconds"] = round(self.evolve_wait_seconds, 3)
        return out


def row_key(step: int, position: int) -> str:
    """The row a streamed prompt carries: its batch's draw index and its position there."""
    return f"{step}:{position}"


class OnlineLoop:
    """Streams the creator's batches to a trainer, scores their samples, and observes each
    trained batch: the trainer's step, then ``observe``, then ``draw``."""

    def __init__(
        self,
        creator: Creator,
        prompts_per_step: int,
        reward: RewardModel,
        *,
        pending: Sequence[Batch] = (),
        drawn: int = 0,
    ):
        if prompts_per_step < 1:
            raise ValueError(f"prompts_per_step must be >= 1, got {prompts_per_step}")
        self.creator = creator
        self.prompts_per_step = prompts_per_step
        self.reward = reward
        self.pending: deque[Batch] = deque(pending)  # drawn, not trained yet, oldest first
        self.drawn = drawn  # batches drawn so far (the next batch's draw index)
        self.stats = LoopStats()
        self.log: list[dict[str, Any]] = []  # one row per trained prompt
        self._scores: dict[str, list[float]] = {}  # row -> its samples' rewards, this step
        self._finished: dict[str, list[bool]] = {}  # row -> whether each sample finished
        if creator.rewriter is not None:  # time the evolver where it works
            self._rewriter = creator.rewriter
            creator.rewriter = self._timed_rewrite

    def _timed_rewrite(self, parents: list[Record], n: int, seed: int) -> Any:
        started = time.perf_counter()
        try:
            return self._rewriter(parents, n, seed)
        finally:
            self.stats.evolve_seconds += time.perf_counter() - started

    # --- 1. draw ---------------------------------------------------------------------------

    def prompts(self) -> Iterator[dict[str, Any]]:
        """The trainer's prompt stream, one mini-batch at a time, each prompt with its row;
        batches left pending by the last segment come first."""
        step = self.pending[0].step if self.pending else self.drawn  # draw index to stream
        while True:
            if step == self.drawn:
                records = self.creator.draw(self.prompts_per_step)
                if len(records) != self.prompts_per_step:
                    raise RuntimeError(f"the creator ran dry: {len(records)} prompts drawn")
                self.pending.append(Batch(self.drawn, records, self.creator.buffer.phase))
                self.drawn += 1
            if step < self.pending[0].step:
                raise RuntimeError(f"batch {step} was trained before it was streamed")
            batch = self.pending[step - self.pending[0].step]
            for i, record in enumerate(batch.records):
                yield {
                    "prompt": record["prompt"],
                    "prompt_id": record["prompt_id"],
                    "row": row_key(batch.step, i),
                }
            step += 1

    # --- 3. score --------------------------------------------------------------------------

    def score(
        self,
        rows: Sequence[str],
        prompts: Sequence[str],
        completions: Sequence[str],
        finished: Sequence[bool] | None = None,
    ) -> list[float]:
        """One reward per completion; ``rows[j]`` is the row ``completions[j]`` answers and
        ``finished[j]`` whether it ended before the length cap (None: all did). Each row's
        samples are scored together (as the reward model expects) and recorded."""
        if finished is None:
            finished = [True] * len(completions)
        if not len(rows) == len(prompts) == len(completions) == len(finished):
            raise ValueError(
                f"{len(rows)} rows, {len(prompts)} prompts, {len(completions)} samples, "
                f"{len(finished)} finished flags"
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
        flat = [float("nan")] * len(rows)
        for (row, js), row_scores in zip(samples.items(), scores, strict=True):
            values = [float(x) for x in np.asarray(row_scores, dtype=np.float64)]
            if len(values) != len(js):
                raise RuntimeError(f"row {row}: {len(values)} rewards for {len(js)} samples")
            self._scores[row] = values
            self._finished[row] = [bool(finished[j]) for j in js]
            for j, value in zip(js, values, strict=True):
                flat[j] = value
        return flat

    # --- 4. observe ------------------------------------------------------------------------

    def step_end(self) -> None:
        """The step trained on the oldest pending batch: hand its groups to the creator."""
        if not self.pending:
            raise RuntimeError("a step ended before its batch was drawn")
        batch = self.pending.popleft()
        rows = [row_key(batch.step, i) for i in range(len(batch.records))]
        if sorted(self._scores) != sorted(rows):
            raise RuntimeError(
                f"the step that trained batch {batch.step} ended, but the rows scored since the "
                f"last step are {sorted(self._scores)[:4]}, not {rows[:4]}"
            )
        per_row = [self._scores.pop(row) for row in rows]
        done = [self._finished.pop(row) for row in rows]
        if len({len(r) for r in per_row}) != 1:
            raise RuntimeError(
                f"step {batch.step}: rows have {sorted({len(r) for r in per_row})} samples"
            )
        waited = time.perf_counter()
        seen = self.creator.observe(
            (r["prompt_id"], rewards) for r, rewards in zip(batch.records, per_row, strict=True)
        )
        self.stats.evolve_wait_seconds += time.perf_counter() - waited
        parents = set(seen.parents)
        for i, (record, rewards) in enumerate(zip(batch.records, per_row, strict=True)):
            self.stats.completions += len(rewards)
            self.stats.truncated += done[i].count(False)
            self.log.append({
                **{k: v for k, v in record.items() if k != "from_buffer"},
                "step": batch.step,
                "phase": batch.phase,
                "from_buffer": record["from_buffer"],
                "rewards": [float(x) for x in rewards],
                "finished": done[i],
                "informativeness": seen.informativeness[i],
                "evolved": i in parents,
            })  # fmt: skip
        self.stats.steps += 1
        self.stats.trained_prompts += len(batch.records)
        self.stats.from_buffer += sum(r["from_buffer"] for r in batch.records)

    # --- the segment's end -----------------------------------------------------------------

    def close(self) -> None:
        """Join every outstanding evolution (its children belong to this segment's state)."""
        self.creator.flush()

    def state(self) -> dict[str, Any]:
        """The creator and the batches drawn but not trained, JSON-ready."""
        return {
            "creator": self.creator.state(),
            "drawn": self.drawn,
            "pending": [
                {"step": b.step, "records": b.records, "phase": b.phase} for b in self.pending
            ],
        }

    def report(self) -> dict[str, Any]:
        """The loop's and the creator's counts, as a segment's stats."""
        counts = self.creator.stats.__dict__
        keep = ("parents", "failed_parents", "evicted", "dropped", "skipped")
        return {
            **self.stats.as_dict(),
            **{k: counts[k] for k in keep},
            "children_added": counts["children"],
        }


def pending_batches(state: dict[str, Any]) -> list[Batch]:
    """The batches a saved ``state()`` left pending."""
    return [Batch(b["step"], b["records"], b["phase"]) for b in state.get("pending", [])]

"""The online loop of eva (paper appendix A/B), one optimizer step at a time:

1. draw    a mini-batch of prompts from the creator (``eva_core.creator.Creator``);
2. sample  the trainer samples responses to each prompt (TRL's RLOO, GRPO or online DPO);
3. score   the reward model scores the responses;
4. observe once the step has trained, the batch's rewards go back to the creator, which scores
           each prompt's informativeness, evolves the most informative ones (in a worker thread)
           and joins their children ``evolve_lag`` steps later, so a slow API evolver overlaps
           with that many training steps while the step at which children join stays fixed (a
           resumed run draws the same batches).

Drawing and observing are the TRL bridge's, ``eva_adapters.trl.CreatorFeed``, the one piece of
code that connects TRL to the creator (a user's own TRL script uses the same): its dataset draws
a batch when the trainer's loader fetches one, its reward wrapper records each completion's
reward under its prompt's row, its callback observes each step's groups. ``OnlineLoop`` adds
what a segment of ``eva online`` needs around it: ``score()``, the reward function's body (the
run's reward model over each prompt's samples together, and whether each sample finished), and
the segment's log and counts, kept as the bridge observes each batch.

Timing: the trainer's data loader fetches one batch ahead, so batch t+1 is drawn before step t
trains and batch t+2 only when step t+1 starts; the creator updated at the end of step t is the
one batch t+2 is drawn from. Batches drawn but not trained when a segment ends are part of the
saved state and are served first by the next segment, so nothing is lost or trained twice.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from eva_core.creator import Creator, Observation
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

    reads = getattr(evolver, "prompt_columns", ())  # an instruction evolver: each parent's

    def rewrite(parents: list[Record], n: int, seed: int) -> Any:
        return evolver.evolve(
            [p["prompt"] for p in parents], [p.get("category") for p in parents], n, seed,
            **{c: [p.get(c) for p in parents] for c in reads},
        )  # fmt: skip

    return rewrite


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


class OnlineLoop:
    """A segment's scoring and log around the TRL bridge (module doc): ``feed`` is the
    ``CreatorFeed`` a trainer is built with, ``score`` its reward function's body. ``state``: a
    previous segment's saved ``state()``, whose creator ``creator`` was built from."""

    def __init__(
        self, creator: Creator, reward: RewardModel, *, state: Mapping[str, Any] | None = None
    ):
        from eva_adapters.trl import CreatorFeed  # the trainer's libraries: not to read a config

        self.creator = creator
        self.reward = reward
        self.stats = LoopStats()
        self.log: list[dict[str, Any]] = []  # one row per trained prompt
        self._finished: dict[str, list[bool]] = {}  # row -> whether each sample finished
        # The columns the reward reads beside the text (an instruction-following reward: each
        # prompt's instructions) stream with each prompt; TRL hands them to the reward function.
        self.reads: tuple[str, ...] = tuple(getattr(reward, "prompt_columns", ()))
        self.feed = CreatorFeed(creator, columns=self.reads, on_observed=self._trained)
        if state:
            self.feed.load_state(dict(state), creator=False)
        observe = self.feed.observe

        def timed_observe() -> int:  # the time a step end waits for the creator
            started = time.perf_counter()
            try:
                return observe()
            finally:
                self.stats.evolve_wait_seconds += time.perf_counter() - started

        self.feed.observe = timed_observe  # type: ignore[method-assign]
        if creator.rewriter is not None:  # time the evolver where it works
            self._rewriter = creator.rewriter
            creator.rewriter = self._timed_rewrite

    def _timed_rewrite(self, parents: list[Record], n: int, seed: int) -> Any:
        started = time.perf_counter()
        try:
            return self._rewriter(parents, n, seed)
        finally:
            self.stats.evolve_seconds += time.perf_counter() - started

    @property
    def pending(self) -> Sequence[Any]:
        """The batches drawn and not trained yet (the bridge's ``Draw``s)."""
        return self.feed.pending

    # --- 3. score --------------------------------------------------------------------------

    def score(
        self,
        rows: Sequence[str],
        prompts: Sequence[str],
        completions: Sequence[str],
        finished: Sequence[bool] | None = None,
        **columns: Sequence[Any],
    ) -> list[float]:
        """One reward per completion; ``rows[j]`` is the row ``completions[j]`` answers and
        ``finished[j]`` whether it ended before the length cap (None: all did); ``columns``,
        the prompt columns the reward reads, one value per completion. Each row's samples are
        scored together (as the reward model expects); the bridge records them."""
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
        if again := [row for row in samples if row in self._finished]:
            raise RuntimeError(f"rows {again[:3]} were scored twice within one step")
        if missing := [c for c in self.reads if c not in columns]:
            raise RuntimeError(f"the trainer passed no {missing} to the reward that reads them")
        read: dict[str, Any] = {
            c: [columns[c][js[0]] for js in samples.values()] for c in self.reads
        }
        scores = self.reward.score(
            [prompts[js[0]] for js in samples.values()],
            [[completions[j] for j in js] for js in samples.values()],
            **read,
        )
        flat = [float("nan")] * len(rows)
        for (row, js), row_scores in zip(samples.items(), scores, strict=True):
            values = [float(x) for x in np.asarray(row_scores, dtype=np.float64)]
            if len(values) != len(js):
                raise RuntimeError(f"row {row}: {len(values)} rewards for {len(js)} samples")
            self._finished[row] = [bool(finished[j]) for j in js]
            for j, value in zip(js, values, strict=True):
                flat[j] = value
        return flat

    # --- 4. observed: the segment's log ----------------------------------------------------

    def _trained(self, draw: Any, per_row: list[list[float]], seen: Observation) -> None:
        """The bridge observed a trained batch (``draw``): log its prompts and count them."""
        done = [self._finished.pop(row) for row in draw.rows()]
        if len({len(r) for r in per_row}) != 1:
            raise RuntimeError(
                f"step {draw.index}: rows have {sorted({len(r) for r in per_row})} samples"
            )
        parents = set(seen.parents)
        for i, (record, rewards) in enumerate(zip(draw.records, per_row, strict=True)):
            self.stats.completions += len(rewards)
            self.stats.truncated += done[i].count(False)
            self.log.append({
                **{k: v for k, v in record.items() if k != "from_buffer"},
                "step": draw.index,
                "phase": draw.phase,
                "from_buffer": record["from_buffer"],
                "rewards": [float(x) for x in rewards],
                "finished": done[i],
                "informativeness": seen.informativeness[i],
                "evolved": i in parents,
            })  # fmt: skip
        self.stats.steps += 1
        self.stats.trained_prompts += len(draw.records)
        self.stats.from_buffer += sum(r["from_buffer"] for r in draw.records)

    # --- the segment's end -----------------------------------------------------------------

    def close(self) -> None:
        """Join every outstanding evolution (its children belong to this segment's state)."""
        self.creator.flush()

    def state(self) -> dict[str, Any]:
        """The creator and the batches drawn but not trained, JSON-ready."""
        return self.feed.state()

    def report(self) -> dict[str, Any]:
        """The loop's and the creator's counts, as a segment's stats."""
        counts = self.creator.stats.__dict__
        keep = ("parents", "failed_parents", "evicted", "dropped", "skipped")
        return {
            **self.stats.as_dict(),
            **{k: counts[k] for k in keep},
            "children_added": counts["children"],
        }

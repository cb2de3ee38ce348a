"""eva's creator as a prompt source: a trainer pulls prompts from it and reports rewards back.

This is the whole of online eva's creator (paper appendix A/B) behind three calls, with no
trainer, process or network in it, so any RL framework can drive it from its own loop:

    creator = Creator(seed_prompts, rewriter=my_rewriter)
    for step in ...:
        prompts = creator.draw(batch_size)               # before rollout
        groups = trainer.rollout_and_score(prompts)      # the framework's own work
        creator.observe((p["prompt_id"], r) for p, r in groups)   # after the step
    checkpoint["eva"] = creator.state()                  # and Creator.from_state(...) on resume

``observe`` is the paper's creator, in its order: informativeness of each finished group,
the most informative prompts as parents (their reading becomes their children's priority),
evolution by the user's ``rewriter``, and the join of the children into the buffer. The buffer
itself (seed set D, evolved set B, warm-up / mix-up / bootstrap) is ``eva_core.buffer``.

A rewriter is a plain callable ``rewriter(parents, n, seed)``: ``parents`` are prompt records
(dicts with at least ``prompt``, ``prompt_id`` and ``category``), and it returns, per parent, up
to ``n`` rewrites, each a string or a ``(text, method)`` pair. A rewriter that calls an API may
be slow: pass an ``executor`` (any ``concurrent.futures.Executor``) and ``evolve_lag=L``, and
the children of observation t join at observation t + L while the trainer goes on. The step at
which children join is fixed by L, so a resumed run draws the batches an uninterrupted run would.

Seeds may be texts or dicts with a ``prompt``; a dict's other keys (a framework's own columns)
travel with the prompt, and ``inherit`` names those a child copies from its parent (a data
source tag, never a ground truth: a rewritten question has its own answer).

``skip_tied`` turns on the pre-rollout filter (``eva_core.predicted.TiePosterior``): a drawn
prompt whose own past groups predict that every response will tie is skipped before any
response is generated, and another is drawn in its place.

Costs: a draw is O(batch + |B|) (D's shuffle is computed once per pass over D, |B| is bounded
by ``size``); an observation is O(groups) plus the rewriter.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from eva_core.buffer import PromptBuffer
from eva_core.evolution import EvolveStats, clean_rewrite, evolved_records
from eva_core.informativeness import informativeness
from eva_core.predicted import TiePosterior
from eva_core.schema import PROMPT_SCHEMA, prompt_id, seed_records

Record = dict[str, Any]
Rewrite = str | tuple[str, str]
Rewriter = Callable[[list[Record], int, int], Sequence[Sequence[Rewrite]]]


@dataclass
class Observation:
    """What one ``observe`` call did: each group's prompt id and informativeness (in the order
    given), the positions of the groups chosen as parents, and the children that joined the
    buffer during this call."""

    prompt_ids: list[str]
    informativeness: list[float]
    parents: list[int]
    joined: int = 0
    evicted: int = 0


@dataclass
class CreatorStats:
    """Counts over the creator's life (saved with its state)."""

    drawn: int = 0
    observed: int = 0  # groups observed
    tied: int = 0  # observed groups whose finite rewards were all equal
    skipped: int = 0  # drawn prompts the tie filter skipped before rollout
    released: int = 0  # drawn prompts the trainer dropped unfinished (never observed)
    duplicate_seeds: int = 0  # seed rows dropped as repeats (``duplicates="drop"``)
    parents: int = 0
    failed_parents: int = 0  # parents the rewriter returned nothing usable for
    children: int = 0  # children that joined the buffer
    evicted: int = 0
    dropped: dict[str, int] = field(default_factory=dict)  # rewrites dropped, by reason


class Creator:
    """Online eva's creator over a seed set; see the module doc."""

    def __init__(
        self,
        seeds: Sequence[str] | Sequence[Mapping[str, Any]],
        *,
        rewriter: Rewriter | None = None,
        size: int = 3200,
        ratio_evol: float = 0.5,
        top_fraction: float = 0.5,
        n_new: int = 4,
        n_new_bootstrap: int = 2,
        metric: str = "a_avg",
        seed: int = 0,
        evolve_lag: int = 0,
        executor: Executor | None = None,
        skip_tied: TiePosterior | None = None,
        max_chars: int | None = None,
        exclude_ids: frozenset[str] = frozenset(),
        categorize: Callable[[str], str | None] | None = None,
        inherit: Sequence[str] = (),
        duplicates: Literal["refuse", "drop"] = "refuse",
    ):
        if evolve_lag < 0:
            raise ValueError(f"evolve_lag must be >= 0, got {evolve_lag}")
        if evolve_lag and executor is None:
            raise ValueError("evolve_lag > 0 needs an executor to run the rewriter in")
        records = as_records(seeds, duplicates)
        self.buffer = PromptBuffer(
            records, size=size, ratio_evol=ratio_evol, top_fraction=top_fraction, n_new=n_new,
            n_new_bootstrap=n_new_bootstrap, metric=metric, evolve=rewriter is not None,
            seed=seed,
        )  # fmt: skip
        self.rewriter = rewriter
        self.evolve_lag = evolve_lag
        self.executor = executor
        self.ties = skip_tied
        self.max_chars = max_chars
        self.exclude_ids = exclude_ids
        self.categorize = categorize
        self.inherit = tuple(inherit)  # a framework's own columns a child copies from its parent
        self.stats = CreatorStats()
        self.observations = 0  # observe calls so far: the clock evolutions join by
        self.outstanding: dict[str, list[Record]] = {}  # drawn, not observed yet, by id
        self.stats.duplicate_seeds = len(seeds) - len(records)
        # Evolutions not joined yet: (observation, the job's arguments, its future if submitted).
        self._evolutions: deque[tuple[int, tuple[Any, ...], Future[Any] | None]] = deque()
        # draw, observe, release and state may come from different threads of one trainer
        # (a data loader's and a sampler's): each runs whole.
        self._lock = threading.RLock()

    def __getstate__(self) -> dict[str, Any]:
        """Picklable (a framework may ship its dataset, creator inside, to another process):
        the lock is not carried, and a fresh one is made on arrival."""
        state = dict(self.__dict__)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()

    def __len__(self) -> int:
        """Prompts left to draw: D's rest of this pass and B."""
        return self.buffer.seeds_left + len(self.buffer.entries)

    # --- the protocol: each call runs whole, whichever thread makes it ---------------------

    def draw(self, k: int) -> list[Record]:
        """The next ``k`` prompt records for rollout (see ``_draw``)."""
        with self._lock:
            return self._draw(k)

    def observe(self, groups: Iterable[tuple[str, Sequence[float]]]) -> Observation:
        """Feed back finished groups ``(prompt_id, rewards)`` of drawn prompts (``_observe``)."""
        with self._lock:
            return self._observe(groups)

    def release(self, prompt_ids: Iterable[str]) -> int:
        """Forget drawn prompts the trainer will never report (``_release``)."""
        with self._lock:
            return self._release(prompt_ids)

    def flush(self) -> int:
        """Join every outstanding evolution now; returns the children joined."""
        with self._lock:
            return self._join(math.inf)[0]  # type: ignore[arg-type]

    def state(self) -> dict[str, Any]:
        """JSON-ready state. Prompts drawn but not observed are kept, so observing them after
        a resume works; evolutions not joined yet are kept as their inputs and run again by
        ``from_state`` (the children join at the observation they would have)."""
        with self._lock:
            return {
                "buffer": self.buffer.state(),
                "observations": self.observations,
                "evolve_lag": self.evolve_lag,
                "stats": {**self.stats.__dict__},
                "outstanding": [r for drawn in self.outstanding.values() for r in drawn],
                "evolutions": [list(job) for _, job, _ in self._evolutions],
                **({"ties": self.ties.state()} if self.ties is not None else {}),
            }

    # --- draw ------------------------------------------------------------------------------

    def _draw(self, k: int) -> list[Record]:
        """The next ``k`` prompt records for rollout (fewer only if D and B are both spent).
        Prompts the tie filter skips are replaced by further draws; when nothing is left to
        draw, skipped prompts fill the batch after all."""
        batch = self.buffer.draw(k)
        out, skipped = self._keep(batch.records, batch.from_buffer)
        while len(out) < k and (more := self.buffer.refill(k - len(out))).records:
            kept, passed = self._keep(more.records, more.from_buffer)
            out, skipped = out + kept, skipped + passed
        fill = skipped[: k - len(out)]
        out += fill
        self.stats.skipped += len(skipped) - len(fill)
        for record in out:
            self.outstanding.setdefault(record["prompt_id"], []).append(record)
        self.stats.drawn += len(out)
        return out

    def _keep(
        self, records: list[Record], from_buffer: list[bool]
    ) -> tuple[list[Record], list[Record]]:
        """``records`` the tie filter keeps and those it skips, each marked with where it came
        from."""
        kept, skipped = [], []
        for record, buffered in zip(records, from_buffer, strict=True):
            marked = {**record, "from_buffer": buffered}
            if self.ties is not None and self.ties.skip(record["prompt_id"]):
                skipped.append(marked)
            else:
                kept.append(marked)
        return kept, skipped

    # --- observe: the creator's step -------------------------------------------------------

    def _observe(self, groups: Iterable[tuple[str, Sequence[float]]]) -> Observation:
        """Feed back finished groups ``(prompt_id, rewards of its responses)`` of drawn prompts;
        runs the creator (module doc) on them and returns what it did."""
        records, rewards = self._finished(list(groups))
        # 1. informativeness of each group (NaN rewards are unscored responses, ignored).
        info = informativeness(rewards, self.buffer.metric)
        if self.ties is not None:
            for record, row in zip(records, rewards, strict=True):
                self.ties.read(record["prompt_id"], _tied(row))
        self.stats.observed += len(records)
        self.stats.tied += sum(_tied(row) for row in rewards)
        # 2. parents: the top ``top_fraction`` by informativeness; their reading is the priority
        # their children start with (a child has not been sampled yet).
        chosen = self.buffer.top_rows(info)
        parents = [records[i] for i in chosen]
        priorities = [float(info[i]) for i in chosen]
        # 3. evolution, now or in the executor.
        if parents and self.rewriter is not None:
            n = self.buffer.children_per_parent
            seed = self.buffer.seed * 1_000_003 + self.observations
            self._submit((parents, priorities, n, seed, self.observations))
            self.stats.parents += len(parents)
        # 4. join the children due now (with lag 0, the ones just made).
        joined, evicted = self._join(self.observations - self.evolve_lag)
        self.observations += 1
        ids = [r["prompt_id"] for r in records]
        return Observation(ids, info.tolist(), chosen, joined, evicted)

    def _release(self, prompt_ids: Iterable[str]) -> int:
        """Forget drawn prompts the trainer will never report (a rollout aborted unfinished);
        returns how many were outstanding."""
        released = 0
        for pid in prompt_ids:
            if drawn := self.outstanding.get(pid):
                drawn.pop(0)
                released += 1
                if not drawn:
                    del self.outstanding[pid]
        self.stats.released += released
        return released

    def _finished(
        self, groups: list[tuple[str, Sequence[float]]]
    ) -> tuple[list[Record], np.ndarray]:
        """The drawn records the groups answer, and their rewards as a NaN-padded matrix."""
        records = []
        for pid, _ in groups:
            drawn = self.outstanding.get(pid)
            if not drawn:
                raise KeyError(f"prompt {pid!r} was not drawn (or was already observed)")
            records.append(drawn.pop(0))
            if not drawn:
                del self.outstanding[pid]
        width = max((len(r) for _, r in groups), default=0)
        rewards = np.full((len(groups), width), np.nan)
        for i, (_, row) in enumerate(groups):
            rewards[i, : len(row)] = np.asarray(row, dtype=np.float64)
        return records, rewards

    def _evolve(
        self, parents: list[Record], priorities: list[float], n: int, seed: int, at: int
    ) -> tuple[list[Record], list[float], EvolveStats, int]:
        """Children of ``parents`` as prompt records with lineage, each starting at its parent's
        informativeness as priority, made at observation ``at`` (their ``iteration``); and the
        parents the rewriter gave nothing usable."""
        assert self.rewriter is not None
        raw = [[(r, "rewrite") if isinstance(r, str) else r for r in rewrites]
               for rewrites in self.rewriter(parents, n, seed)]  # fmt: skip
        if len(raw) != len(parents):
            raise ValueError(f"the rewriter returned {len(raw)} lists for {len(parents)} parents")
        failed = sum(not any(clean_rewrite(text) for text, _ in rewrites) for rewrites in raw)
        table = pa.Table.from_pylist(
            [{name: p.get(name) for name in PROMPT_SCHEMA.names} for p in parents],
            schema=PROMPT_SCHEMA,
        )
        children, stats = evolved_records(
            table, raw, at, self.max_chars, self.categorize,
            exclude_ids=self.exclude_ids,
        )  # fmt: skip
        by_parent = dict(zip((p["prompt_id"] for p in parents), priorities, strict=True))
        extra = {p["prompt_id"]: {k: p[k] for k in self.inherit if k in p} for p in parents}
        records = [{**extra[r["parent_id"]], **r} for r in children.to_pylist()]
        return records, [by_parent[r["parent_id"]] for r in records], stats, failed

    def _submit(self, job: tuple[Any, ...]) -> None:
        """Queue an evolution to join at its observation + lag; in the executor if there is
        one (else it runs when joined)."""
        future = self.executor.submit(self._evolve, *job) if self.executor else None
        self._evolutions.append((job[-1], job, future))

    def _join(self, upto: int) -> tuple[int, int]:
        """Add the children of every evolution submitted at an observation <= ``upto``."""
        joined = evicted = 0
        while self._evolutions and self._evolutions[0][0] <= upto:
            _, job, future = self._evolutions.popleft()
            done = future.result() if future is not None else self._evolve(*job)
            records, priorities, stats, failed = done
            evicted += self.buffer.add_children(records, priorities)
            joined += len(records)
            self.stats.failed_parents += failed
            for reason, count in stats.dropped.items():
                self.stats.dropped[reason] = self.stats.dropped.get(reason, 0) + count
        self.stats.children += joined
        self.stats.evicted += evicted
        return joined, evicted

    # --- resume ----------------------------------------------------------------------------

    @classmethod
    def from_state(
        cls,
        seeds: Sequence[str] | Sequence[Mapping[str, Any]],
        state: Mapping[str, Any],
        **options: Any,
    ) -> Creator:
        """The creator ``state()`` saved, over the same seeds; ``options`` as for the
        constructor (the rewriter, executor, ...), less the buffer's settings, which are saved."""
        settings = state["buffer"]["settings"]
        if settings["evolve"] != (options.get("rewriter") is not None):
            raise ValueError("the saved creator evolves iff a rewriter is passed; pass the same")
        ties = TiePosterior.from_state(state["ties"]) if "ties" in state else None
        creator = cls(
            seeds,
            **{k: v for k, v in settings.items() if k != "evolve"},
            seed=state["buffer"]["seed"],
            skip_tied=ties,
            **{"evolve_lag": state["evolve_lag"], **options},
        )
        creator.buffer = PromptBuffer.from_state(creator.buffer.seeds, state["buffer"])
        creator.observations = state["observations"]
        creator.stats = CreatorStats(**state["stats"])
        for record in state["outstanding"]:
            creator.outstanding.setdefault(record["prompt_id"], []).append(record)
        for job in state.get("evolutions", []):
            creator._submit(tuple(job))
        return creator


def as_records(
    seeds: Sequence[str] | Sequence[Mapping[str, Any]],
    duplicates: Literal["refuse", "drop"] = "refuse",
) -> list[Record]:
    """Seed prompt records from texts, or from dicts with a ``prompt`` (other keys are kept,
    so a framework's own columns, such as a ground truth, travel with the prompt). A prompt
    that repeats an earlier one after normalization is refused, naming its row, or with
    ``duplicates="drop"`` dropped (the first one is kept)."""
    if not seeds:
        raise ValueError("the seed set is empty")
    rows = [{"prompt": s} if isinstance(s, str) else dict(s) for s in seeds]
    if missing := [i for i, r in enumerate(rows) if not isinstance(r.get("prompt"), str)]:
        raise ValueError(f"seed row {missing[0]} has no text 'prompt'")
    if duplicates == "drop":
        firsts: dict[str, dict[str, Any]] = {}
        for row in rows:
            if row["prompt"].strip():  # an empty prompt is refused below, with its row
                firsts.setdefault(prompt_id(row["prompt"]), row)
        rows = list(firsts.values()) + [r for r in rows if not r["prompt"].strip()]
    table = seed_records([r["prompt"] for r in rows], [r.get("category") for r in rows])
    return [{**row, **record} for row, record in zip(rows, table.to_pylist(), strict=True)]


def _tied(rewards: np.ndarray) -> bool:
    finite = rewards[np.isfinite(rewards)]
    return bool(finite.size) and bool(finite.max() == finite.min())

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

The records the creator takes in and makes are ``eva_core.creator_records``; what it carries
from call to call (its counts, prompts drawn and not observed, evolutions not joined yet) is
``eva_core.creator_state``.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from eva_core.buffer import PromptBuffer
from eva_core.creator_checks import check_options, checked_groups, is_int
from eva_core.creator_records import Evolved, Record, Rewriter, as_records, evolve_children
from eva_core.creator_state import (
    CreatorStats,
    EvolutionQueue,
    Outstanding,
    check_seeds,
    check_state,
    seed_digest,
)
from eva_core.informativeness import informativeness
from eva_core.predicted import TiePosterior


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
        settings: dict[str, Any] = dict(
            size=size, ratio_evol=ratio_evol, top_fraction=top_fraction, n_new=n_new,
            n_new_bootstrap=n_new_bootstrap, metric=metric,
        )  # fmt: skip
        check_options(
            settings, seed=seed, evolve_lag=evolve_lag, executor=executor, rewriter=rewriter,
            max_chars=max_chars, inherit=inherit, duplicates=duplicates,
        )  # fmt: skip
        records = as_records(seeds, duplicates)
        # Which seeds, in which order, a saved state was drawn over (from_state checks it).
        self.seed_digest = seed_digest(records)
        self.buffer = PromptBuffer(records, **settings, evolve=rewriter is not None, seed=seed)
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
        self.outstanding = Outstanding()  # drawn, not observed yet
        self.stats.duplicate_seeds = len(seeds) - len(records)
        self._evolutions = EvolutionQueue()  # submitted, not joined yet
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
            count = self._evolutions.due(math.inf)
            made = self._evolutions.results(count, self._evolve)
            self._evolutions.pop(count)
            return self._join(made)[0]

    def state(self) -> dict[str, Any]:
        """JSON-ready state. Prompts drawn but not observed are kept, so observing them after
        a resume works; evolutions not joined yet are kept as their inputs and run again by
        ``from_state`` (the children join at the observation they would have)."""
        with self._lock:
            return {
                "seeds": {"count": len(self.buffer.seeds), "digest": self.seed_digest},
                "buffer": self.buffer.state(),
                "observations": self.observations,
                "evolve_lag": self.evolve_lag,
                "stats": {**self.stats.__dict__, "dropped": dict(self.stats.dropped)},
                "outstanding": self.outstanding.records(),
                "evolutions": self._evolutions.state(),
                **({"ties": self.ties.state()} if self.ties is not None else {}),
            }

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Resume this creator, in place, at a saved ``state()`` over its own seeds: its options
        (rewriter, executor, ...) stay, what the state holds is replaced (``from_state``)."""
        with self._lock:
            restored = Creator.from_state(
                self.buffer.seeds, state, rewriter=self.rewriter, executor=self.executor,
                max_chars=self.max_chars, exclude_ids=self.exclude_ids,
                categorize=self.categorize, inherit=self.inherit,
            )  # fmt: skip
            vars(self).update({k: v for k, v in vars(restored).items() if k != "_lock"})

    # --- draw ------------------------------------------------------------------------------

    def _draw(self, k: int) -> list[Record]:
        """The next ``k`` prompt records for rollout (fewer only if D and B are both spent).
        Prompts the tie filter skips are replaced by further draws; when nothing is left to
        draw, skipped prompts fill the batch after all."""
        if not is_int(k) or k < 1:
            raise ValueError(f"draw takes a number of prompts >= 1, got {k!r}")
        batch = self.buffer.draw(k)
        out, skipped = self._keep(batch.records, batch.from_buffer)
        while len(out) < k and (more := self.buffer.refill(k - len(out))).records:
            kept, passed = self._keep(more.records, more.from_buffer)
            out, skipped = out + kept, skipped + passed
        fill = skipped[: k - len(out)]
        out += fill
        self.stats.skipped += len(skipped) - len(fill)
        self.outstanding.add(out)
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
        runs the creator (module doc) on them and returns what it did. All or nothing: every
        group is checked and every evolution due now has run before anything changes, so a bad
        group or a rewriter that raises leaves the creator as it was."""
        ids, rewards = checked_groups(list(groups), self.outstanding.count)
        if not ids:  # no group finished: nothing to read, and the evolution clock stays
            return Observation([], [], [])
        records = self.outstanding.peek(ids)
        # 1. informativeness of each group (NaN rewards are unscored responses, ignored).
        info = informativeness(rewards, self.buffer.metric)
        tied = [_tied(row) for row in rewards]
        # 2. parents: the top ``top_fraction`` by informativeness; their reading is the priority
        # their children start with (a child has not been sampled yet; an unscored parent's 0).
        chosen = self.buffer.top_rows(info)
        parents = [records[i] for i in chosen]
        priorities = [float(info[i]) if np.isfinite(info[i]) else 0.0 for i in chosen]
        job = None
        if parents and self.rewriter is not None:
            n = self.buffer.children_per_parent
            seed = self.buffer.seed * 1_000_003 + self.observations
            job = (parents, priorities, n, seed, self.observations)
        # 3. evolution: what is due now (this observation's own with lag 0) runs first.
        due = self._evolutions.due(self.observations - self.evolve_lag)
        made = self._evolutions.results(due, self._evolve)
        if job is not None and self.evolve_lag == 0:
            made.append(self._run(job))
        # 4. nothing can fail from here on: take the groups, queue a lagged evolution, join.
        for pid, row_tied in zip(ids, tied, strict=True):
            self.outstanding.take(pid)
            if self.ties is not None:
                self.ties.read(pid, row_tied)
        self.stats.observed += len(records)
        self.stats.tied += sum(tied)
        if job is not None:
            self.stats.parents += len(parents)
            if self.evolve_lag:
                self._evolutions.submit(job, self._evolve, self.executor)
        self._evolutions.pop(due)
        joined, evicted = self._join(made)
        self.observations += 1
        return Observation(ids, info.tolist(), chosen, joined, evicted)

    def _release(self, prompt_ids: Iterable[str]) -> int:
        """Forget drawn prompts the trainer will never report (a rollout aborted unfinished);
        returns how many were outstanding."""
        if isinstance(prompt_ids, str):
            raise ValueError(f"release takes a list of prompt ids, got the text {prompt_ids!r}")
        released = sum(self.outstanding.take(pid) is not None for pid in prompt_ids)
        self.stats.released += released
        return released

    def _evolve(
        self, parents: list[Record], priorities: list[float], n: int, seed: int, at: int
    ) -> Evolved:
        """The rewriter's children of ``parents`` (``evolve_children``). The rewriter is read
        when the evolution runs: a trainer may wrap it after construction (to time it)."""
        assert self.rewriter is not None
        return evolve_children(
            self.rewriter, parents, priorities, n, seed, at, max_chars=self.max_chars,
            categorize=self.categorize, exclude_ids=self.exclude_ids, inherit=self.inherit,
        )  # fmt: skip

    def _run(self, job: tuple[Any, ...]) -> Evolved:
        """An evolution due at once: in the executor if there is one, else in this thread."""
        if self.executor is not None:
            return self.executor.submit(self._evolve, *job).result()
        return self._evolve(*job)

    def _join(self, made: Iterable[Evolved]) -> tuple[int, int]:
        """Add the children evolutions made to B; returns how many joined and were evicted."""
        joined = evicted = 0
        for records, priorities, stats, failed in made:
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
        constructor (the rewriter, executor, ...), less the buffer's settings, which are saved.
        The state is checked before it is used (``eva_core.creator_checks``): a malformed one,
        or one saved over other seeds, raises naming its field."""
        check_state(state)
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
        check_seeds(state, len(creator.buffer.seeds), creator.seed_digest)
        creator.buffer = PromptBuffer.from_state(creator.buffer.seeds, dict(state["buffer"]))
        creator.observations = state["observations"]
        creator.stats = CreatorStats(
            **{**state["stats"], "dropped": dict(state["stats"].get("dropped", {}))}
        )
        creator.outstanding.add(dict(r) for r in state["outstanding"])
        for job in state.get("evolutions", []):
            creator._evolutions.submit(tuple(job), creator._evolve, creator.executor)
        return creator


def _tied(rewards: np.ndarray) -> bool:
    finite = rewards[np.isfinite(rewards)]
    return bool(finite.size) and bool(finite.max() == finite.min())

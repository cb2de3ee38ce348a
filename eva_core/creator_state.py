"""What eva's creator (``eva_core.creator``) carries from one call to the next besides its
buffer, each part in the JSON-ready form ``Creator.state()`` saves: its counts, the prompts drawn
and not observed yet, and the evolutions not joined yet.

An evolution is submitted at observation t and joins the buffer at observation t + lag. With an
executor it starts at once and the trainer goes on while the rewriter works; without one it runs
when it is joined. A saved creator keeps the evolutions not joined yet as their arguments, and a
resumed one submits them again: their children join at the observation they would have, however
fast the rewriter is.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import Any

from eva_core.creator_records import Evolved, Record


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


class Outstanding(dict[str, list[Record]]):
    """Prompts drawn and not observed yet, by prompt id: a list each, since a prompt may be out
    more than once (drawn again before its first group is observed), oldest first."""

    def add(self, records: Iterable[Record]) -> None:
        for record in records:
            self.setdefault(record["prompt_id"], []).append(record)

    def take(self, prompt_id: str) -> Record | None:
        """The oldest drawn record of ``prompt_id``, no longer outstanding; None if none is."""
        drawn = self.get(prompt_id)
        if not drawn:
            return None
        record = drawn.pop(0)
        if not drawn:
            del self[prompt_id]
        return record

    def records(self) -> list[Record]:
        """Every outstanding record (``add`` them again on resume)."""
        return [record for drawn in self.values() for record in drawn]


class EvolutionQueue:
    """Evolutions submitted and not joined yet, oldest first. A job is the arguments
    ``(parents, priorities, n, seed, at)`` of the creator's ``evolve``, ``at`` the observation it
    was submitted at."""

    def __init__(self) -> None:
        # (observation, the job's arguments, its future if it runs in an executor)
        self._jobs: deque[tuple[int, tuple[Any, ...], Future[Evolved] | None]] = deque()

    def submit(
        self, job: tuple[Any, ...], evolve: Callable[..., Evolved], executor: Executor | None
    ) -> None:
        """Queue ``job``; start ``evolve(*job)`` in ``executor`` now if there is one."""
        future = executor.submit(evolve, *job) if executor is not None else None
        self._jobs.append((job[-1], job, future))

    def due(self, upto: float, evolve: Callable[..., Evolved]) -> Iterator[Evolved]:
        """What every job submitted at an observation <= ``upto`` made, in submission order
        (waiting for those in the executor, running those that never started)."""
        while self._jobs and self._jobs[0][0] <= upto:
            _, job, future = self._jobs.popleft()
            yield future.result() if future is not None else evolve(*job)

    def state(self) -> list[list[Any]]:
        """The jobs not joined yet, as their arguments (``submit`` them again on resume)."""
        return [list(job) for _, job, _ in self._jobs]

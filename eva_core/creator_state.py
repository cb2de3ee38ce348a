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

import hashlib
import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field, fields
from typing import Any

from eva_core.buffer import PHASES, SETTINGS
from eva_core.creator_checks import OptionError, check_settings, is_int, is_real, short
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


STATS_FIELDS = frozenset(f.name for f in fields(CreatorStats))


class Outstanding(dict[str, list[Record]]):
    """Prompts drawn and not observed yet, by prompt id: a list each, since a prompt may be out
    more than once (drawn again before its first group is observed), oldest first."""

    def add(self, records: Iterable[Record]) -> None:
        for record in records:
            self.setdefault(record["prompt_id"], []).append(record)

    def count(self, prompt_id: str) -> int:
        """How many drawn records of ``prompt_id`` are out."""
        return len(self.get(prompt_id, ()))

    def peek(self, prompt_ids: Iterable[str]) -> list[Record]:
        """The records ``take`` would give for ``prompt_ids`` (in order, a repeated id its next
        oldest), leaving them out; every id must be out as often as it is named."""
        seen: dict[str, int] = {}
        out = []
        for pid in prompt_ids:
            k = seen.get(pid, 0)
            out.append(self[pid][k])
            seen[pid] = k + 1
        return out

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

    def due(self, upto: float) -> int:
        """How many jobs, oldest first, were submitted at an observation <= ``upto``."""
        return next((i for i, (at, _, _) in enumerate(self._jobs) if at > upto), len(self._jobs))

    def results(self, count: int, evolve: Callable[..., Evolved]) -> list[Evolved]:
        """What the ``count`` oldest jobs made (waiting for those in the executor, running those
        that never started), leaving them queued: a job that raised is run again, in this
        thread, the next time its results are asked for."""
        out = []
        for i in range(count):
            at, job, future = self._jobs[i]
            try:
                out.append(future.result() if future is not None else evolve(*job))
            except BaseException:
                self._jobs[i] = (at, job, None)
                raise
        return out

    def pop(self, count: int) -> None:
        """Forget the ``count`` oldest jobs (their results were joined)."""
        for _ in range(count):
            self._jobs.popleft()

    def state(self) -> list[list[Any]]:
        """The jobs not joined yet, as their arguments (``submit`` them again on resume)."""
        return [list(job) for _, job, _ in self._jobs]


# --- a saved state, checked before it is resumed ---------------------------------------------


class StateError(ValueError):
    """A saved creator state that cannot be resumed: the message names the field."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"saved creator state: {field} {problem}")


def _need(ok: bool, field: str, problem: str, value: Any = None) -> None:
    if not ok:
        raise StateError(field, f"{problem}, got {short(value)}")


def _record(record: Any, field: str) -> None:
    _need(
        isinstance(record, Mapping)
        and isinstance(record.get("prompt_id"), str)
        and isinstance(record.get("prompt"), str),
        field,
        "must be a prompt record (prompt_id, prompt)",
        record,
    )


BUFFER_FIELDS = (
    "seed", "step", "epoch", "cursor", "consumed", "arrivals", "evicted", "refilled",
)  # fmt: skip


def check_state(state: Any) -> None:
    """Everything ``Creator.from_state`` reads from a saved ``state()``, before it builds
    anything: its fields, their types and ranges (``check_seeds`` then checks that it was saved
    over the same seeds)."""
    _need(isinstance(state, Mapping), "state", "must be a mapping", type(state).__name__)
    for key in ("buffer", "observations", "stats", "outstanding", "evolve_lag"):
        _need(key in state, key, "is missing", sorted(state))
    for key in ("observations", "evolve_lag"):
        _need(is_int(state[key]) and state[key] >= 0, key, "must be an integer >= 0", state[key])
    _check_buffer(state["buffer"])
    outstanding = state["outstanding"]
    _need(isinstance(outstanding, list), "outstanding", "must be a list", outstanding)
    for i, record in enumerate(outstanding):
        _record(record, f"outstanding[{i}]")
    stats = state["stats"]
    _need(isinstance(stats, Mapping), "stats", "must be a mapping", stats)
    for key, value in stats.items():
        _need(key in STATS_FIELDS, f"stats.{key}", "is not a creator count", key)
        ok = isinstance(value, Mapping) if key == "dropped" else is_int(value) and value >= 0
        _need(ok, f"stats.{key}", "must be an integer >= 0", value)
    _check_evolutions(state.get("evolutions", []))
    if "ties" in state:
        ties = state["ties"]
        _need(
            isinstance(ties, Mapping)
            and isinstance(ties.get("settings"), list)
            and len(ties["settings"]) == 4
            and all(is_real(x) for x in ties["settings"])
            and is_int(ties.get("decisions"))
            and isinstance(ties.get("counts"), Mapping),
            "ties",
            "must be a tie posterior's state (settings, decisions, counts)",
            ties,
        )


def seed_digest(records: Iterable[Mapping[str, Any]]) -> str:
    """A short digest of the seed prompts' ids, in order: a saved state names its seeds by it."""
    digest = hashlib.sha256()
    for record in records:
        digest.update(record["prompt_id"].encode())
        digest.update(b"\n")
    return digest.hexdigest()[:16]


def check_seeds(state: Mapping[str, Any], count: int, digest: str) -> None:
    """That ``state`` was saved over these seeds: their count and digest (a state saved before
    the digest was kept is checked by its cursor into the seeds alone)."""
    saved = state.get("seeds")
    if saved is not None:
        _need(
            saved == {"count": count, "digest": digest},
            "seeds",
            f"were other seed prompts: these are {count} (digest {digest}); resume over the "
            "seeds the state was saved over, in the same order",
            saved,
        )
    _need(
        state["buffer"]["cursor"] <= count,
        "buffer.cursor",
        f"is past the end of these {count} seed prompts: the state was saved over others",
        state["buffer"]["cursor"],
    )


def _check_buffer(buffer: Any) -> None:
    _need(isinstance(buffer, Mapping), "buffer", "must be a mapping", type(buffer).__name__)
    settings = buffer.get("settings")
    _need(
        isinstance(settings, Mapping) and set(settings) == set(SETTINGS),
        "buffer.settings",
        f"must hold {', '.join(SETTINGS)}",
        settings,
    )
    try:
        check_settings(settings)
    except OptionError as exc:
        raise StateError(
            f"buffer.settings.{exc.option}", f"{exc.requirement}, got {short(exc.value)}"
        ) from None
    _need(isinstance(settings["evolve"], bool), "buffer.settings.evolve", "must be a boolean",
          settings["evolve"])  # fmt: skip
    known = {"settings", "entries", "phase", "resampled", *BUFFER_FIELDS}
    _need(set(buffer) <= known, "buffer", "holds unknown fields", sorted(set(buffer) - known))
    for key in (*BUFFER_FIELDS, *(("resampled",) if "resampled" in buffer else ())):
        value = buffer.get(key)
        _need(is_int(value) and value >= 0, f"buffer.{key}", "must be an integer >= 0", value)
    phase = buffer.get("phase")
    _need(phase in PHASES, "buffer.phase", f"must be one of {', '.join(PHASES)}", phase)
    entries = buffer.get("entries")
    _need(isinstance(entries, list), "buffer.entries", "must be a list", type(entries).__name__)
    for i, entry in enumerate(entries):
        where = f"buffer.entries[{i}]"
        _need(isinstance(entry, Mapping), where, "must be a mapping", entry)
        _record(entry.get("record"), f"{where}.record")
        priority = entry.get("priority")
        _need(
            is_real(priority) and math.isfinite(priority) and priority >= 0,
            f"{where}.priority",
            "must be a finite number >= 0",
            priority,
        )
        _need(is_int(entry.get("arrival")), f"{where}.arrival", "must be an integer", entry)


def _check_evolutions(jobs: Any) -> None:
    _need(isinstance(jobs, list), "evolutions", "must be a list", jobs)
    for i, job in enumerate(jobs):
        where = f"evolutions[{i}]"
        _need(isinstance(job, list) and len(job) == 5, where,
              "must be [parents, priorities, n, seed, observation]", job)  # fmt: skip
        parents, priorities, n, seed, at = job
        _need(isinstance(parents, list), f"{where}.parents", "must be a list", parents)
        for j, parent in enumerate(parents):
            _record(parent, f"{where}.parents[{j}]")
        _need(
            isinstance(priorities, list)
            and len(priorities) == len(parents)
            and all(is_real(p) and math.isfinite(p) for p in priorities),
            f"{where}.priorities",
            "must be one finite number per parent",
            priorities,
        )
        for key, value in (("n", n), ("seed", seed), ("observation", at)):
            _need(is_int(value) and value >= 0, f"{where}.{key}", "must be an integer >= 0", value)

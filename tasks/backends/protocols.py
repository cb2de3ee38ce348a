"""The four swappable components of eva, as small protocols.

A stage never imports a concrete backend: its config holds a backend config object (a pydantic
model with a ``kind`` literal) whose ``load(...)`` returns something that satisfies one of these
protocols. Swapping vLLM for transformers, or a reward model for a verifier, is a config change.

``progress`` callbacks receive a fraction in [0, 1]; stages forward it to a Prefect progress
artifact so long work is visible in the UI.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

Progress = Callable[[float], None]
T = TypeVar("T")


def no_progress(_: float) -> None:
    """Default progress sink."""


# The optional lifecycle any backend may add to its protocol, declared here so that stages ask
# "does it report?" / "must it be closed?" by type, not by probing attribute names.


@runtime_checkable
class ReportsStats(Protocol):
    """A backend that counts what it did (requests, retries, failures, tokens, conversations
    too long to score, ...).

    Every backend's counts mean the same: everything since the backend was loaded, added up over
    its calls. A stage loads a backend, calls it once or several times (the complexity judge a
    chunk at a time), and records ``stats()`` under ``backend`` when it is done: a count is
    neither lost to a later call nor counted twice. A backend that keeps per-call counts adds
    them into a ``collections.Counter``."""

    def stats(self) -> dict[str, int]:
        """Counts since the backend was loaded, summed over every call."""
        ...


@runtime_checkable
class Closable(Protocol):
    """A backend that holds something to give back (a server it started, a GPU)."""

    def close(self) -> None: ...


@runtime_checkable
class StartsEngines(Protocol):
    """A backend that serves from an inference engine: started when it was loaded (1) or
    reused from an earlier stage on the same checkpoint (0), a count since load like
    ``stats()``."""

    engine_starts: int


def engine_stats(backend: object) -> dict[str, int]:
    """``{"engine_starts": n}`` for a backend that serves from an engine, else {}."""
    return {"engine_starts": backend.engine_starts} if isinstance(backend, StartsEngines) else {}


def stats_of(backend: object) -> dict[str, int]:
    """The backend's counts, or {} for one that does not report any."""
    return backend.stats() if isinstance(backend, ReportsStats) else {}


@contextmanager
def close_after(backend: T) -> Iterator[T]:
    """``with close_after(config.backend.load(...)) as gen:``: calls ``gen.close()`` on the way
    out when it is ``Closable`` (a backend that started a server stops it)."""
    try:
        yield backend
    finally:
        if isinstance(backend, Closable):
            backend.close()


@runtime_checkable
class ReadsPromptColumns(Protocol):
    """A reward or evolver that reads columns of its prompts' records beside their text (the
    instruction-following reward and evolver read each prompt's instructions): a stage hands
    it those columns as keyword arguments of ``score`` or ``evolve``, one value per prompt,
    as TRL hands a reward function its dataset's columns."""

    prompt_columns: tuple[str, ...]


def prompt_columns(component: object, table: Any) -> dict[str, Any]:
    """The columns ``component`` reads, from the stage's ``table``, as keyword arguments."""
    names = component.prompt_columns if isinstance(component, ReadsPromptColumns) else ()
    return {name: table.column(name).to_pylist() for name in names}


@dataclass(frozen=True)
class Generations:
    """What a ``Generator`` returns: ``n`` responses per prompt and, for each, whether it
    finished. A response finished when the policy ended it itself (its end-of-turn token, a
    stop string); one that ran into the length cap (``max_new_tokens``, ``max_tokens``) is
    truncated: its text reads like an answer, but the policy had not finished it, and a solver
    that trains it as the chosen side of a pair (closing it with the end-of-turn token, as
    TRL's templates do) teaches the policy to stop mid-sentence."""

    texts: list[list[str]]
    finished: list[list[bool]]

    def __post_init__(self) -> None:
        shape = [len(rs) for rs in self.texts]
        if shape != [len(fs) for fs in self.finished]:
            raise ValueError("finished must have one flag per response")

    def firsts(self) -> tuple[list[str], list[bool]]:
        """Each prompt's first response and its flag (one greedy answer per prompt)."""
        return [rs[0] for rs in self.texts], [fs[0] for fs in self.finished]

    def truncated(self) -> int:
        """How many responses ran into the length cap."""
        return sum(not f for fs in self.finished for f in fs)


@runtime_checkable
class Generator(Protocol):
    """Samples responses from a policy checkpoint."""

    def generate(
        self, prompts: Sequence[str], n: int, seed: int, progress: Progress = no_progress
    ) -> Generations:
        """Return ``n`` responses for every prompt, reproducible for a given ``seed``, each
        with whether it finished or was cut at the length cap."""
        ...


@runtime_checkable
class RewardModel(Protocol):
    """Scores (prompt, response) pairs; higher is better; NaN marks an unscorable response."""

    def score(
        self,
        prompts: Sequence[str],
        responses: Sequence[Sequence[str]],
        progress: Progress = no_progress,
    ) -> list[list[float]]:
        """Return one reward per response, shaped like ``responses``."""
        ...


@runtime_checkable
class Evolver(Protocol):
    """Rewrites prompts into new prompts (the creator's ``evolve``)."""

    def evolve(
        self,
        prompts: Sequence[str],
        categories: Sequence[str | None],
        num_evolutions: int,
        seed: int,
    ) -> list[list[tuple[str, str]]] | list[list[tuple[str, str, dict[str, Any]]]]:
        """Return up to ``num_evolutions`` ``(new_prompt, method)`` per input prompt, or
        ``(new_prompt, method, columns)`` where a child carries prompt columns of its own (its
        instructions: ``eva_core.schema.INSTRUCTION_COLUMNS``).

        Raw output: the stage strips, drops empties and duplicates, and fills in lineage.
        """
        ...


@runtime_checkable
class Solver(Protocol):
    """Updates a policy on preference pairs, starting from a checkpoint directory: each TRL
    objective, and a solver of yours (``train.solver: {kind: python, factory: ...}``)."""

    def train(
        self,
        policy_dir: str,
        prompts: Sequence[str],
        chosen: Sequence[str],
        rejected: Sequence[str],
        output_dir: str,
        seed: int,
        progress: Progress = no_progress,
    ) -> list[dict[str, float]]:
        """Train, save the new checkpoint (model + tokenizer) to ``output_dir``, and return
        the logged metrics, one dict per logging step (each with a ``step`` key)."""
        ...

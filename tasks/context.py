"""What a stage function is handed and what it returns: the run it belongs to, its context,
its output and the one shape of its stats; and the helpers stages share (their seeds, their
failure budget, the means and shares their stats report)."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from eva_runtime.errors import StageError
from eva_runtime.seeds import stage_seed as stage_seed  # a stage's seed
from tasks.plan import Plan
from tasks.store import Ref, RunStore


class RunContext(BaseModel):
    """What every stage needs to know about the run it belongs to."""

    model_config = ConfigDict(frozen=True)
    root: str
    run: str
    seed: int
    storage_options: dict[str, Any] = Field(default_factory=dict)
    plan: Plan = Field(default_factory=Plan)

    def store(self) -> RunStore:
        return RunStore(self.root, self.run, self.storage_options)


# A stage's stats, one shape for every stage: names to numbers, text, booleans or None, or to
# one level of breakdown (a count per category, per drop reason; a backend's own counts under
# "backend"). The manifest keeps them whole, the UI shows them as a table, the log as a line.
Stats = dict[str, Any]  # checked at run time by check_stats (typed loosely: stages build them)
_SCALARS = (int, float, str, bool, type(None))


def check_stats(artifact: str, stats: Mapping[str, Any]) -> None:
    """Refuse stats of another shape (a stage bug, caught where it is made)."""
    for name, value in stats.items():
        leaves = value.items() if isinstance(value, Mapping) else [("", value)]
        for sub, leaf in leaves:
            if not isinstance(leaf, _SCALARS):
                where = f"{name}.{sub}" if sub else name
                raise StageError(
                    f"{artifact}: stat {where} is a {type(leaf).__name__}; stats are numbers, "
                    "text or one level of breakdown"
                )


def recorded_stats(stats: Mapping[str, Any]) -> Stats:
    """``stats`` as the manifest records them: a number that is not finite (a loss that
    diverged to NaN, an infinite gradient norm) as its name, ``"nan"``, ``"inf"`` or
    ``"-inf"``, since a manifest is standard JSON, which has no such number; the log and the UI
    show the same text."""

    def leaf(value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
        return value

    return {
        name: {k: leaf(v) for k, v in value.items()} if isinstance(value, Mapping) else leaf(value)
        for name, value in stats.items()
    }


@dataclass
class StageOutput:
    table: pa.Table
    stats: Stats = field(default_factory=dict)
    model_dir: str | None = None  # a local checkpoint to publish as {iter}/model
    external_model: str | None = None  # a checkpoint used where it is (never copied)
    ui_tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # What each UI table shows, e.g. "top 20 of 200 prompts by informativeness, descending".
    ui_notes: dict[str, str] = field(default_factory=dict)


@dataclass
class StageContext:
    """Handed to a stage function: where it is, its seed, its inputs' refs, and sinks."""

    run: RunContext
    iteration: int | None
    artifact: str
    seed: int
    refs: Mapping[str, Ref]
    scratch: str  # a private temporary directory, removed after the stage
    store: RunStore
    progress: Callable[[float], None]

    def model_dir(self, name: str) -> str:
        ref = self.refs[name]
        if ref.model_uri is None:
            raise StageError(f"{self.artifact}: input '{name}' carries no checkpoint")
        return self.store.local_model(ref.model_uri, ref.content_hash)

    @property
    def log(self) -> logging.Logger | logging.LoggerAdapter:
        try:
            from prefect import get_run_logger

            return get_run_logger()
        except Exception:
            return logging.getLogger(f"eva.{self.artifact}")


def finite_mean(values: object) -> float | None:
    """The mean of the finite values, to 4 places; None when there is none (a manifest is
    JSON: a NaN there is no number a reader takes)."""
    x = np.asarray(values, dtype=np.float64)
    x = x[np.isfinite(x)]
    return round(float(x.mean()), 4) if x.size else None


def share(part: int, whole: int) -> float:
    """``part / whole`` to 4 places (0.0 of nothing)."""
    return round(part / whole, 4) if whole else 0.0


def check_failures(
    artifact: str,
    failed: int,
    total: int,
    what: str,
    limit: float,
    setting: str,
    endpoint: str | None = None,
    counts: Mapping[str, int] | None = None,
) -> None:
    """Fail the stage (no manifest, so a rerun retries it) when more than ``limit`` of its
    ``total`` items failed; fewer failures are the caller's to count in its stats. ``counts``:
    the backend's own (its failures by kind), said in the message where not zero.

    A backend that is down must not pass for a stage that found nothing to do: an evolver that
    kept 0 of 200 prompts because its endpoint refused every request would otherwise be cached
    as a finished stage and never retried.
    """
    if total and failed / total > limit:
        at = f" at {endpoint}" if endpoint else ""
        said = ", ".join(f"{k} {v}" for k, v in (counts or {}).items() if v)
        own = f" (the backend counted {said})" if said else ""
        raise StageError(
            f"{artifact}: {what} for {failed} of {total}{at}{own}, more than {setting} = "
            f"{limit:g} allows; fix the backend and run again (this stage left no artifact)"
        )

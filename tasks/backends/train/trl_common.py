"""What eva's TRL solvers share, offline (``dpo``, ``objectives``) and online (``online``): a
progress callback, a quiet scope for library noise, and the numeric rows of a trainer's log."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import datasets
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from eva_runtime.progress import report
from tasks.backends.protocols import Progress


class ProgressCallback(TrainerCallback):
    """Reports the share of optimizer steps done after each step, with the step and the last
    logged loss where the sink shows them (the terminal)."""

    def __init__(self, progress: Progress):
        self.progress = progress

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if state.max_steps:
            logged = [e["loss"] for e in state.log_history if isinstance(e.get("loss"), float)]
            loss = {"loss": logged[-1]} if logged else {}
            fraction = min(1.0, state.global_step / state.max_steps)
            report(self.progress, fraction, step=state.global_step, total=state.max_steps, **loss)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Hide datasets' per-map progress bars, transformers' v6 deprecation notices and TRL's
    experimental-API notice (raised from inside the libraries, nothing we can change) for the
    duration, then restore the caller's state."""
    was_enabled = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", ".*will be removed in v6", FutureWarning)
            warnings.filterwarnings("ignore", ".*importing from 'trl.experimental'")
            yield
    finally:
        if was_enabled:
            datasets.enable_progress_bars()


def numeric_row(entry: dict[str, Any]) -> dict[str, float]:
    """A trainer log entry's numbers (``step`` first), as floats."""
    row = {"step": float(entry["step"])}
    for key, value in entry.items():
        if isinstance(value, int | float) and not isinstance(value, bool) and key != "step":
            row[key] = float(value)
    return row

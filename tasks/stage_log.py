"""What a stage says: one line when it finishes (its headline stats, ``headline``), one line
when it fails (``reported``: the cause, with its full traceback kept in the run's logs/ unless
the launch lost the run's lock, when it writes nothing more there), and none of Prefect's own
lines that would only repeat or bury these.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from eva_runtime.errors import EvaError, StageError, first_line, raised_by_ctrl_c
from eva_runtime.prefect_ui import readable
from eva_runtime.progress import TerminalProgress
from tasks.run_lock import RunLockLost, may_write
from tasks.store import RunStore

# The attribute a stage's failure carries: the one line the CLI prints for it.
FAILURE = "eva_failure"


class _WithoutTraceback(logging.Filter):
    """Prefect logs a failed task run, and the flow run it fails, with the traceback. A
    StageError's message (and a lost lock's) already says what is wrong and what to do, and
    any other exception a stage raised has its traceback kept in the run's logs/
    (``reported``); three tracebacks through Prefect's engine (terminal and UI) would only
    bury it. So would the traceback of an error Prefect raised in a Ctrl-C's place
    (``raised_by_ctrl_c``): the command says it was interrupted. The log line itself stays.

    A stage that finished has just logged its own line (its headline stats): Prefect's
    "Finished in state Completed()" after it would only double every stage's lines."""

    def filter(self, record: logging.LogRecord) -> bool:
        failed = record.exc_info[1] if record.exc_info else None
        quiet = isinstance(failed, StageError | RunLockLost) or hasattr(failed, FAILURE)
        if quiet or (failed is not None and raised_by_ctrl_c(failed)):
            record.exc_info, record.exc_text = None, None
        return not (record.name == "prefect.task_runs" and record.getMessage() == _COMPLETED)


_COMPLETED = "Finished in state Completed()"


for _logger in ("prefect.task_runs", "prefect.flow_runs"):
    logging.getLogger(_logger).addFilter(_WithoutTraceback())


# The few stats a stage's log line shows, by stage name (the manifest and the UI keep them
# all); a stage not listed here, or whose stats have none of its names, shows its first four.
HEADLINE: dict[str, tuple[str, ...]] = {
    "prompts": ("prompts",),
    "heldout": ("prompts",),
    "bootstrap": ("checkpoint", "steps", "final_loss"),
    "generate": ("prompts", "responses"),
    "annotate": ("mean_reward", "unscored"),
    "score": ("mean_informativeness", "zero_informativeness"),
    "sample": ("selected", "prompts"),
    "evolve": ("parents", "kept"),
    "mix": ("size", "evolved", "original"),
    "complexity": ("mean_complexity", "unscored"),
    "pairs": ("pairs", "skipped_tied"),
    "train": ("pairs", "steps", "loss"),
    "evaluate": ("score", "solved"),
    "reference": ("references", "missing"),
    "judge": ("win_rate", "ci_low", "ci_high", "unjudged"),
    "online": ("steps", "mean_reward", "mean_informativeness", "budget"),
}


def headline(stage_name: str, stats: Mapping[str, Any]) -> str:
    """The stats that matter for ``stage_name``, as ``score 0.0951, solved 0``."""
    names = [k for k in HEADLINE.get(stage_name, ()) if k in stats]
    if not names:  # fall back to the first few numbers and words (no breakdowns)
        names = [k for k, v in stats.items() if not isinstance(v, Mapping)][:4]
    return ", ".join(f"{k} {readable(stats[k])}" for k in names) or "done"


@contextmanager
def reported(
    store: RunStore, where: str, artifact: str, progress: TerminalProgress
) -> Iterator[None]:
    """A stage that fails says so in one line: which stage, the cause, and where its full
    traceback is (``logs/<iteration>-<artifact>.log`` in the run). The exception goes on as it
    is (callers still catch its type), carrying that line as ``FAILURE``; Prefect's engine logs
    it without the traceback (``_WithoutTraceback``). A StageError the stage raised itself
    already says what is wrong and passes untouched, as does the ``RunLockLost`` of a launch
    that lost the run's lock: the run is another launch's, and nothing more is written there."""
    try:
        yield
    except (StageError, RunLockLost):  # each says what happened and what to do
        raise
    except Exception as exc:
        try:
            kept = _keep_traceback(store, f"{store.base}/logs/{where}-{artifact}.log", exc)
        except Exception as unwritten:  # the run root itself failing: say so, lose nothing else
            kept = f"no traceback written: {first_line(unwritten)}"
        cause = first_line(exc, with_type=not isinstance(exc, EvaError))
        setattr(exc, FAILURE, f"{artifact} of {where} failed: {cause} ({kept})")
        raise
    finally:
        progress.close()


def _keep_traceback(store: RunStore, path: str, exc: BaseException) -> str:
    """Write ``exc``'s traceback at ``path`` in the run, unless the run is another launch's now
    (this one lost its lock: it writes nothing more there); says where it is."""
    if not may_write(store):
        return "no traceback written: this launch lost the run's lock"
    store.fs.makedirs(f"{store.base}/logs", exist_ok=True)
    with store.fs.open(path, "w") as f:
        f.write("".join(traceback.format_exception(exc)))
    return f"full traceback in {store.uri(path)}"

"""What a process a stage started says to the stage: plain lines on its stdout.

eva logs in one place. Inside a Prefect task or flow run (a stage, a flow) a message goes to the
run's logger (``get_run_logger``; ``StageContext.log`` in a stage), which Prefect shows on the
terminal and in the UI; elsewhere it goes to an ``eva.*`` logger, whose warnings and errors
Prefect's console handler shows. A process a stage starts (an ``accelerate launch`` rank, a Ray
job's driver and workers) has no Prefect run, and often not eva's environment: it writes lines
to its stdout, and the stage that reads them (``ManagedProcess.lines``, the Ray job's log)
turns a progress mark (``eva_runtime.progress``) into its progress bar and forwards every other
line to its own log, so they reach the terminal and the UI as well.

``child_logger`` is that stdout for such a process: a logger whose records are bare lines,
flushed at once. Standard library only: the Ray job imports it in the cluster's environment.
"""

from __future__ import annotations

import logging
import sys


class _Lines(logging.Handler):
    """Each record as one line on the process's stdout of the moment, flushed at once."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stdout.write(self.format(record) + "\n")
            sys.stdout.flush()
        except Exception:
            self.handleError(record)


def child_logger(name: str) -> logging.Logger:
    """``name``'s logger, writing each record as one bare line on this process's stdout (set
    up once per process; it does not propagate, so a handler the process has elsewhere does
    not print the line a second time)."""
    log = logging.getLogger(name)
    if not any(isinstance(h, _Lines) for h in log.handlers):
        log.addHandler(_Lines())
        log.setLevel(logging.INFO)
        log.propagate = False
    return log

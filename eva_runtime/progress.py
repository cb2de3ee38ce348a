"""Progress across a process boundary: one marker line, one writer, one reader.

A training under ``accelerate launch`` and a stage's Ray job run in processes of their own; the
stage that started them sees only their output. They report progress by printing a marker line
(``progress_line``), which the stage's reader (``read_progress``) turns into a progress call and
never forwards to the log::

    @@eva-progress 0.4375    the fraction of the work done (rank 0 of a training)
    @@eva-progress +64       values done since the last mark (a Ray worker's block)

The reader finds the marker anywhere in a line, since Ray prefixes a worker's lines with its
name and pid. Standard library only: the Ray job imports it in the cluster's environment.
"""

from __future__ import annotations

from dataclasses import dataclass

MARK = "@@eva-progress"


@dataclass(frozen=True)
class ProgressMark:
    """One mark: either the ``fraction`` done, or a count of values ``done`` since the last."""

    fraction: float | None = None
    done: int | None = None


def progress_line(*, fraction: float | None = None, done: int | None = None) -> str:
    """The line that reports ``fraction`` of the work done, or ``done`` more values done."""
    if (fraction is None) == (done is None):
        raise ValueError("a progress mark carries a fraction or a count, one of them")
    return f"{MARK} {fraction:.4f}" if fraction is not None else f"{MARK} +{int(done or 0)}"


def read_progress(line: str) -> ProgressMark | None:
    """The mark in ``line``, None when it holds none (a line to forward to the log)."""
    at = line.find(MARK)
    if at < 0:
        return None
    value = line[at + len(MARK) :].split()
    try:
        if value and value[0].startswith("+"):
            return ProgressMark(done=int(value[0][1:]))
        return ProgressMark(fraction=float(value[0])) if value else None
    except ValueError:
        return None

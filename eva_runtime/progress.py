"""Progress across a process boundary: one marker line, one writer, one reader.

A training under ``accelerate launch`` and a stage's Ray job run in processes of their own; the
stage that started them sees only their output. They report progress by printing a marker line
(``progress_line``), which the stage's reader (``read_progress``) turns into a progress call and
never forwards to the log::

    @@eva-progress 0.4375    the fraction of the work done (rank 0 of a training)
    @@eva-progress +64       values done since the last mark (a Ray worker's block)

The reader finds the marker anywhere in a line, since Ray prefixes a worker's lines with its
name and pid. Standard library only: the Ray job imports it in the cluster's environment.

The stage shows the same progress on the terminal (``TerminalProgress``), and the CLI hides
Hugging Face's own bars before any library is imported (``quiet_library_bars``).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import TextIO

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


# -- the terminal ---------------------------------------------------------------------------

# Hugging Face's own bars ("Loading weights", "Writing model shards", datasets' map bars) would
# print once per checkpoint a stage loads; eva shows a stage's progress itself. The libraries
# read these variables when they are imported, and child processes (accelerate, Ray) inherit
# them. A variable the user set (e.g. HF_HUB_DISABLE_PROGRESS_BARS=0) is left as it is.
QUIET_BARS = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1"}


def quiet_library_bars(environ: MutableMapping[str, str] | None = None) -> None:
    """Hide Hugging Face's progress bars in this process and its children, importing nothing:
    set ``QUIET_BARS`` where unset and tell the libraries already imported (a test, a
    notebook), which read the variables only at import."""
    env = os.environ if environ is None else environ
    for name, value in QUIET_BARS.items():
        env.setdefault(name, value)
    if env["HF_HUB_DISABLE_PROGRESS_BARS"] == "1":
        if (hub := sys.modules.get("huggingface_hub.utils")) is not None:
            hub.disable_progress_bars()
        if (hf_logging := sys.modules.get("transformers.utils.logging")) is not None:
            hf_logging.disable_progress_bar()
    datasets_tqdm = sys.modules.get("datasets.utils.tqdm")
    if env["HF_DATASETS_DISABLE_PROGRESS_BARS"] == "1" and datasets_tqdm is not None:
        datasets_tqdm.disable_progress_bars()


class TerminalProgress:
    """A stage's progress on the terminal (stderr), called like any progress sink with the
    fraction done, and optionally with what the work is at (``step=3, total=40, loss=2.6``).

    On a terminal it redraws one line in place at most every half second and erases it when
    the stage ends (the stage's own log line follows); elsewhere (a log file, CI) it prints a
    plain line at most every ``interval_s`` seconds (10), the first after that long, so a stage
    that takes less prints nothing. Each call also goes to ``forward`` (the UI's bar)."""

    shows_detail = True  # ``report`` hands it the step and loss, not the fraction alone

    def __init__(
        self,
        label: str,
        forward: Callable[[float], None] | None = None,
        *,
        stream: TextIO | None = None,
        interval_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.label, self.forward, self.clock = label, forward, clock
        self.stream = sys.stderr if stream is None else stream
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval_s = interval_s if interval_s is not None else (0.5 if self.tty else 10.0)
        self.started = self.last = clock()
        # The ETA is measured from the first report, not from the stage's start: loading a
        # model or drawing examples before the first step would make it wildly long.
        self.first: tuple[float, float] | None = None  # (time, fraction) of the first report
        self.detail: dict[str, float | int | str] = {}
        self.drawn = False  # a line is on the terminal, to erase at the end
        self.lock = threading.Lock()

    def __call__(self, fraction: float, **detail: float | int | str) -> None:
        if self.forward is not None:
            self.forward(fraction)
        with self.lock:
            self.detail.update(detail)
            now = self.clock()
            if self.first is None:
                self.first = (now, fraction)
            if fraction >= 1.0:
                self._erase()
            elif now - self.last >= self.interval_s:
                self.last = now
                self._write(self.line(fraction, now))

    def line(self, fraction: float, now: float) -> str:
        """``bootstrap setup  45% | step 18/40 | loss 2.619 | 9 s, ETA 11 s``: the time since
        the stage started, and the rest at the pace since the first report."""
        fraction = min(max(fraction, 0.0), 1.0)
        parts = [f"{self.label} {100 * fraction:3.0f}%"]
        detail = dict(self.detail)
        if "step" in detail:
            total = detail.pop("total", None)
            parts.append(f"step {detail.pop('step')}" + (f"/{total}" if total else ""))
        parts += [f"{k} {_number(v)}" for k, v in detail.items()]
        at, done = self.first or (now, fraction)
        eta = ""
        if fraction > done and now > at:
            eta = f", ETA {duration((now - at) / (fraction - done) * (1 - fraction))}"
        parts.append(f"{duration(now - self.started)}{eta}")
        return " | ".join(parts)

    def close(self) -> None:
        """Erase a line still drawn (a stage that failed before it reached 100%)."""
        with self.lock:
            self._erase()

    def _write(self, line: str) -> None:
        if self.tty:
            self.stream.write(f"\r{line}\033[K")
            self.drawn = True
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def _erase(self) -> None:
        if self.drawn:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self.drawn = False


def report(progress: Callable[[float], None], fraction: float, **detail: float | int | str) -> None:
    """Report ``fraction`` to any progress sink, with ``detail`` where it shows it (a stage's
    ``TerminalProgress``, or a ``ScaledProgress`` part of one): what a training loop calls with
    its step and loss."""
    if getattr(progress, "shows_detail", False):
        progress(fraction, **detail)
    else:
        progress(fraction)


class ScaledProgress:
    """One part of another sink's bar: this part's fraction ``f`` is ``start + share * f``
    there, and the step and loss pass through (a stage whose training is its last 90%)."""

    shows_detail = True

    def __init__(self, sink: Callable[[float], None], start: float, share: float):
        self.sink, self.start, self.share = sink, start, share

    def __call__(self, fraction: float, **detail: float | int | str) -> None:
        report(self.sink, self.start + self.share * fraction, **detail)


def _number(value: float | int | str) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def duration(seconds: float) -> str:
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"

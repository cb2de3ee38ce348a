"""Waiting for something outside eva: one poll loop instead of one per waiter.

A server that must answer before a stage can use it, a Ray job that must end, a follower that
waits for machine 0's next launch request, the UI posts that must be sent before a flow ends:
each is "ask again every so often until the answer is yes, give up after a while". Written out
by hand each time, the loops differed in small ways (whether the last check came at the
deadline, whether a dead process was noticed before or after the wait ran out); ``wait_until``
is that loop once.

``check`` says whether the wait is over by returning something truthy, which ``wait_until``
returns; it may raise to end the wait with an error of its own. ``abort`` is asked first, each
time: it returns the exception to raise when waiting has become pointless (the process that was
to answer has exited). ``timeout_s=None`` waits for as long as it takes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from eva_runtime.errors import EvaError

T = TypeVar("T")


class PollTimeout(EvaError, TimeoutError):
    """``check`` gave no truthy answer within the timeout; the message names what was awaited.
    Callers that have more to say (a log tail, the setting to raise) catch it and raise their
    own error."""

    def __init__(self, what: str, timeout_s: float, hint: str | None = None):
        super().__init__(f"no {what} within {timeout_s:g} s", hint=hint)
        self.what, self.timeout_s = what, timeout_s


def wait_until(
    check: Callable[[], T | None],
    timeout_s: float | None,
    *,
    interval_s: float = 0.1,
    what: str = "answer",
    hint: str | None = None,
    abort: Callable[[], BaseException | None] | None = None,
) -> T:
    """Call ``check()`` every ``interval_s`` seconds until it returns something truthy, and
    return that. Before each call, ``abort()`` (when given) may return an exception, which is
    raised at once. After ``timeout_s`` seconds (None: never) with no truthy answer, raise
    ``PollTimeout`` naming ``what`` ("no {what} within {timeout_s} s"); the last check is made
    at the deadline, so a zero timeout still checks once."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        if abort is not None and (stop := abort()) is not None:
            raise stop
        found = check()
        if found:
            return found
        if deadline is None:
            time.sleep(interval_s)
            continue
        left = deadline - time.monotonic()
        if left <= 0:
            assert timeout_s is not None
            raise PollTimeout(what, timeout_s, hint)
        time.sleep(min(interval_s, left))

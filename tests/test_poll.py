"""The one poll helper: the first truthy answer, a timeout that names what was awaited, an abort
asked before each check, and a wait with no timeout."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from eva_runtime.errors import EvaError
from eva_runtime.poll import PollTimeout, wait_until


def answers(*values: object) -> tuple[list[int], Callable[[], object]]:
    """A check returning ``values`` in turn (the last one from then on), and its call count."""
    calls: list[int] = []

    def check() -> object:
        calls.append(1)
        return values[min(len(calls), len(values)) - 1]

    return calls, check


def test_returns_the_first_truthy_answer() -> None:
    calls, check = answers(None, 0, "", {"ready": True})
    assert wait_until(check, 5.0, interval_s=0.001) == {"ready": True}
    assert len(calls) == 4


def test_a_timeout_names_what_was_awaited_and_checks_at_the_deadline() -> None:
    calls, check = answers(False)
    started = time.monotonic()
    with pytest.raises(PollTimeout) as err:
        wait_until(check, 0.3, interval_s=0.05, what="answer from the server", hint="wait longer")
    assert 0.3 <= time.monotonic() - started < 2.0
    assert str(err.value) == "no answer from the server within 0.3 s (wait longer)"
    assert isinstance(err.value, TimeoutError) and isinstance(err.value, EvaError)
    assert (err.value.what, err.value.timeout_s) == ("answer from the server", 0.3)
    assert len(calls) >= 6  # every 0.05 s, the last one at the deadline

    calls, check = answers(False)
    with pytest.raises(PollTimeout):
        wait_until(check, 0, interval_s=10.0)
    assert len(calls) == 1  # a zero timeout still asks once, and never sleeps


def test_abort_is_asked_before_each_check() -> None:
    calls, check = answers(False)
    aborts = iter([None, None, RuntimeError("the process exited")])
    with pytest.raises(RuntimeError, match="the process exited"):
        wait_until(check, 5.0, interval_s=0.001, abort=lambda: next(aborts))
    assert len(calls) == 2  # the third round aborted before its check


def test_no_timeout_waits_as_long_as_it_takes_and_errors_of_check_propagate() -> None:
    calls, check = answers(*[False] * 30, "done")
    assert wait_until(check, None, interval_s=0.001) == "done"
    assert len(calls) == 31

    def broken() -> bool:
        raise ValueError("a bad answer")

    with pytest.raises(ValueError, match="a bad answer"):
        wait_until(broken, None)

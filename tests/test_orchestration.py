"""eva's changes to Prefect's per-flow-run costs: heartbeats that stop at once."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import prefect.flow_engine

from flows import heartbeats


class _Engine:
    """What the heartbeat context reads of a flow run engine, recording what it sends."""

    def __init__(self, seconds: int | None):
        self.heartbeat_seconds = seconds
        self.flow_run = SimpleNamespace(state=None)
        self.logger = SimpleNamespace(debug=lambda *a, **k: None)
        self.sent: list[tuple[Any, Any]] = []

    def _build_heartbeat_event_template(self) -> tuple[str, list[str]]:
        return "resource", ["related"]

    def _emit_flow_run_heartbeat(self, resource: Any, related: Any) -> None:
        self.sent.append((resource, related))


def test_heartbeats_are_sent_and_stop_as_soon_as_the_flow_run_ends() -> None:
    assert prefect.flow_engine._send_heartbeats is heartbeats.send_heartbeats  # installed
    engine = _Engine(seconds=30)
    before = threading.active_count()
    with heartbeats.send_heartbeats(engine):
        deadline = time.monotonic() + 5
        while not engine.sent and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.sent == [("resource", ["related"])]  # one at the start, the next in 30 s
        started = time.monotonic()
    assert time.monotonic() - started < 0.2  # Prefect's own waits up to a second here
    assert threading.active_count() == before  # the thread is gone, not left behind
    # Heartbeats off (no frequency): no thread at all.
    off = _Engine(seconds=None)
    with heartbeats.send_heartbeats(off):
        assert threading.active_count() == before
    assert off.sent == []


def test_a_finished_flow_run_sends_no_heartbeat() -> None:
    engine = _Engine(seconds=30)
    engine.flow_run.state = SimpleNamespace(is_final=lambda: True)
    with heartbeats.send_heartbeats(engine):
        time.sleep(0.05)
    assert engine.sent == []

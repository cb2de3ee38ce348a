"""Flow-run heartbeats that stop at once when the flow run ends (Prefect 3.8).

Prefect 3.8 sends a heartbeat event for every flow run from a thread (they let a "zombie flow"
automation mark a run whose process died as Crashed). The thread sleeps in one-second steps
between checks of its stop flag, and the engine joins it when the flow run ends: every flow run
waits up to a second for it, on average half. An eva run is a launch plus one subflow per
iteration, so a cached rerun of a 2-iteration demo spent 2.5 of its 7 s in these joins.

``install()`` replaces the engine's context manager with one that sends the same events at the
same interval, from the same kind of thread, but waits on the stop flag itself, so the join
returns at once. It applies only to the Prefect minor it was written against (the project pins
``prefect>=3.8,<3.9``); any other version keeps Prefect's own.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import prefect
import prefect.flow_engine as engine_module

_ORIGINAL = getattr(engine_module, "_send_heartbeats", None)


@contextmanager
def send_heartbeats(engine: Any, join_on_exit: bool = True) -> Iterator[None]:
    """Prefect 3.8's ``_send_heartbeats`` with an interruptible wait."""
    seconds = engine.heartbeat_seconds
    if seconds is None:
        yield
        return
    seconds = max(seconds, engine_module.MINIMUM_HEARTBEAT_INTERVAL)
    resource, related = engine._build_heartbeat_event_template()
    stop = threading.Event()

    def beat() -> None:
        while not stop.is_set():
            run = engine.flow_run
            if run and run.state and run.state.is_final():
                return
            try:
                engine._emit_flow_run_heartbeat(resource, related)
            except Exception:
                engine.logger.debug("Failed to emit heartbeat", exc_info=True)
            if stop.wait(seconds):
                return

    # The caller's context (its settings, so its API URL), as Prefect's own thread gets.
    context = contextvars.copy_context()
    thread = threading.Thread(target=context.run, args=(beat,), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        if join_on_exit:
            thread.join(timeout=2)


def install() -> bool:
    """Use ``send_heartbeats`` in Prefect's flow engine; False where the version differs."""
    if _ORIGINAL is None or not prefect.__version__.startswith("3.8."):
        return False
    engine_module._send_heartbeats = send_heartbeats
    return True

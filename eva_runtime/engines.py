"""Inference servers as engines shared between stages: one start per checkpoint, never orphaned.

Within an iteration ``creator_generate`` and ``generate`` sample the same checkpoint, and
``evaluate`` of theta_t samples the checkpoint the next iteration's creator samples. Starting a
``vllm serve`` for each of them costs minutes at 9B, so the ``served`` backend asks ``ENGINES``
(one pool per process) for a server instead of starting one:

- a running server with the same settings on the same checkpoint is reused;
- one with the same settings on another checkpoint is stopped first: its checkpoint is stale and
  it holds the GPU the new one needs;
- ``ENGINES.stop_all()`` frees the GPU: the train stage calls it before training (the next
  checkpoint is on its way), and flows call it when they end.

An ``Engine`` is a ``ManagedProcess`` (``eva_runtime.process``) that listens on a port: it runs
under the guard, its stop takes vLLM's workers with it, it never outlives eva, and its log is
kept and quoted when it fails. This module adds what a server needs on top: when it is ready
(its OpenAI ``/models`` list names the model) and the pool's reuse policy.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable, Mapping, Sequence

import httpx

from eva_runtime.process import ManagedProcess

log = logging.getLogger(__name__)


class Engine(ManagedProcess):
    """One running server on ``port`` (under its guard); ``env`` is added to eva's own and
    ``stop_s`` is the grace period between SIGTERM and SIGKILL."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], port: int, stop_s: float):
        super().__init__(argv, env=env, stop_s=stop_s)
        self.port = port

    def wait_ready(self, url: str, model: str, headers: Mapping[str, str], timeout: float) -> None:
        """Wait until ``GET url`` (an OpenAI ``/models`` list) lists ``model``."""
        with httpx.Client(headers=dict(headers), timeout=5.0, trust_env=False) as http:
            self.wait_until(lambda: self._listed(http, url, model), timeout)

    def _listed(self, http: httpx.Client, url: str, model: str) -> bool:
        try:
            resp = http.get(url)
        except httpx.HTTPError:
            return False  # not listening yet
        if resp.status_code in (401, 403):
            raise self.fail(
                f"the server refused GET {url} (HTTP {resp.status_code}): set "
                "client.llm.api_key_env to the variable holding its --api-key"
            )
        if resp.status_code != 200:
            return False
        try:
            ids = [m["id"] for m in resp.json()["data"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise self.fail(f"GET {url} answered {resp.text[:200]!r}") from exc
        if model not in ids:
            raise self.fail(f"the server on port {self.port} serves {ids}, not {model!r}")
        return True


class EnginePool:
    """At most one running engine per settings key, on one checkpoint at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[Hashable, tuple[str, Engine]] = {}
        self.starts = 0  # engines started by this pool, for tests and stats

    def acquire(
        self, settings: Hashable, checkpoint: str, start: Callable[[], Engine]
    ) -> tuple[Engine, bool]:
        """The running engine for ``(settings, checkpoint)``, started with ``start()`` unless
        one is up; returns it and whether it was started now."""
        with self._lock:
            held = self._held.pop(settings, None)
            if held is not None:
                if held[0] == checkpoint and held[1].running:
                    self._held[settings] = held
                    return held[1], False
                held[1].stop()  # a stale checkpoint, or a server that died: make room
            engine = start()  # raises on failure: nothing is held
            self.starts += 1
            self._held[settings] = (checkpoint, engine)
            return engine, True

    def stop_all(self) -> int:
        """Stop every engine (the GPU is needed elsewhere); returns how many were running."""
        with self._lock:
            held, self._held = list(self._held.values()), {}
        for _, engine in held:
            engine.stop()
        return len(held)


ENGINES = EnginePool()

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

Every server runs under ``engine_guard`` in its own process group. Stopping it sends SIGTERM to
the group, waits the grace period, then sends SIGKILL, so vLLM's workers go with it. A finalizer
stops it at interpreter exit, and the guard stops it when eva dies without one (SIGKILL, the OOM
killer). Output goes to a log file in a temporary directory, removed after a clean stop and kept
(and named in the error) when the server failed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

import httpx

from eva_runtime import guard as engine_guard
from eva_runtime.errors import EvaError

log = logging.getLogger(__name__)

TAIL_LINES = 30


class ServerStartError(EvaError, RuntimeError):
    """The server exited, refused us, or did not become ready in time; the message ends with
    the last lines of its log."""

    def __init__(self, message: str, *, pid: int, returncode: int | None, log_path: str):
        super().__init__(message)
        self.pid = pid
        self.returncode = returncode  # None: it was still running (and has been stopped)
        self.log_path = log_path


def free_port() -> int:
    """A localhost port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def log_tail(path: str, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file ('' when there is none)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class _ServerState:
    """What stopping needs; held by the finalizer, so it must not refer to the engine."""

    process: subprocess.Popen[bytes]
    stop_timeout_s: float
    log_dir: str
    keep_log: bool = False


def _group_alive(pgid: int) -> bool:
    """Whether a process of the group still runs. On Linux, zombies do not count: an orphaned
    worker that has exited waits for init to reap it, which some container inits never do."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if not os.path.isdir("/proc"):
        return True
    return any(_runs_in_group(entry, pgid) for entry in os.listdir("/proc") if entry.isdigit())


def _runs_in_group(pid: str, pgid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state, _ppid, pgrp = f.read().rsplit(")", 1)[1].split()[:3]
    except (OSError, ValueError):
        return False  # gone meanwhile
    return int(pgrp) == pgid and state not in ("Z", "X")


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _stop(state: _ServerState) -> None:
    """SIGTERM the server's process group, wait up to the grace period, then SIGKILL it."""
    process, pgid = state.process, state.process.pid  # start_new_session: pgid == pid
    deadline = time.monotonic() + state.stop_timeout_s
    if process.poll() is None or _group_alive(pgid):
        _signal_group(pgid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=state.stop_timeout_s)
        # The leader may exit before its workers: give them the rest of the grace period.
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if process.poll() is None or _group_alive(pgid):
            log.warning("server pid %d did not stop on SIGTERM: killing it", pgid)
            _signal_group(pgid, signal.SIGKILL)
    process.wait()
    if process.stdin is not None:
        process.stdin.close()
    if not state.keep_log:
        shutil.rmtree(state.log_dir, ignore_errors=True)


class Engine:
    """One running server (under its guard). ``stop()`` is idempotent; the server is stopped at
    garbage collection or interpreter exit otherwise."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], port: int, stop_s: float):
        self.argv, self.port = list(argv), port
        log_dir = tempfile.mkdtemp(prefix="eva-served-")
        self.log_path = os.path.join(log_dir, "server.log")
        guard = [sys.executable, engine_guard.__file__, str(stop_s), "--", *self.argv]
        try:
            with open(self.log_path, "wb") as out:
                self.process = subprocess.Popen(
                    guard,
                    stdin=subprocess.PIPE,  # its other end is the guard's "eva is alive" line
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, **env},
                    start_new_session=True,  # its own process group: stopped with its children
                )
        except OSError as exc:
            shutil.rmtree(log_dir, ignore_errors=True)
            raise ServerStartError(
                f"cannot start the guard for {self.argv[0]!r}: {exc}", pid=-1, returncode=None,
                log_path="",
            ) from exc  # fmt: skip
        self._state = _ServerState(self.process, stop_s, log_dir)
        self._finalizer = weakref.finalize(self, _stop, self._state)  # also runs at exit
        log.info("started %s (pid %d, log %s)", " ".join(self.argv), self.process.pid, log_dir)

    @property
    def stopped(self) -> bool:
        """Stopped by eva (``stop()``, the pool, exit), as opposed to a server that died."""
        return not self._finalizer.alive

    @property
    def running(self) -> bool:
        return not self.stopped and self.process.poll() is None

    def stop(self, *, keep_log: bool = False) -> None:
        self._state.keep_log = self._state.keep_log or keep_log
        self._finalizer()

    def fail(self, message: str) -> ServerStartError:
        """An error naming the command and quoting the log's tail; the log is kept."""
        self._state.keep_log = True
        return ServerStartError(
            f"{message}; command: {' '.join(self.argv)}; log {self.log_path} ends with:\n"
            f"{log_tail(self.log_path)}",
            pid=self.process.pid,
            returncode=self.process.poll(),
            log_path=self.log_path,
        )

    def wait_until(
        self, ready: Callable[[], bool], timeout: float, name: str = "the server", hint: str = ""
    ) -> None:
        """Poll ``ready()`` until it is true; raise (the server stopped, its log kept) when the
        process exits, ``ready`` raises, or ``timeout`` seconds pass (``hint`` ends that
        message: the setting to raise)."""
        deadline = time.monotonic() + timeout
        try:
            while True:
                code = self.process.poll()
                if code is not None:
                    raise self.fail(f"{name} exited with code {code} before it was ready")
                if ready():
                    return
                if time.monotonic() >= deadline:
                    raise self.fail(f"{name} was not ready after {timeout:g} s{hint}")
                time.sleep(min(0.1, max(deadline - time.monotonic(), 0)))
        except BaseException:  # a timeout, a dead server, or an interrupt: never leave it up
            self.stop(keep_log=True)
            raise

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

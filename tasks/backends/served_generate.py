"""Rollouts from a server started on the stage's own checkpoint: ``vllm serve`` from its own env.

vLLM cannot be installed in eva's environment (every vLLM release pins ``fastapi<0.137``, prefect
3.8 needs ``>=0.139``), so it runs from a separate virtualenv and eva talks to it over HTTP. A
long-running server would serve a stale policy, though: the checkpoint changes every iteration.
This backend's ``load(model_dir)`` starts the server on exactly that checkpoint, waits until it
answers ``GET /v1/models``, and returns a generator whose requests go through the ``openai``
backend (same seeding, retries and concurrency); ``close()`` stops the server and everything it
started, which frees the GPU for the next stage. Stages close it with ``close_after``.

Config, e.g. for a stage's ``backend``::

    kind: served
    command: [.venv-vllm/bin/vllm, serve, "{model}", --port, "{port}", --seed, "0",
              --served-model-name, "{name}"]
    extra_args: [--tensor-parallel-size, "8", --max-model-len, "4096"]
    env: {CUDA_VISIBLE_DEVICES: "0,1,2,3,4,5,6,7"}
    client: {temperature: 0.7, top_p: 0.9, max_tokens: 1024, llm: {concurrency: 64}}

Placeholders are replaced wherever they occur inside an argument (other braces are left alone):
``{model}`` = the checkpoint directory, ``{port}`` = a free localhost port picked at load time,
``{name}`` = the served model name, ``policy`` (without ``{name}`` in the command, the client asks
for the model by its directory, the name ``vllm serve DIR`` uses by default).

The server runs in its own session (process group): stopping it sends SIGTERM to the whole group,
waits ``stop_timeout_s``, then sends SIGKILL, so vLLM's worker processes go with it. A finalizer
stops it too when the generator is garbage-collected or the interpreter exits, so an exception
never leaves a server holding the GPU; only a process killed outright (SIGKILL, the OOM killer)
cannot clean up after itself. Its output goes to a log file in a temporary directory; errors
quote the log's last lines; the directory is removed after a clean stop and kept (and named in
the error) when the server failed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field, model_validator

from tasks.backends.llm_client import LLMClientConfig, auth_headers
from tasks.backends.openai_generate import GenerationError, OpenAIGeneration, OpenAIGenerator
from tasks.backends.protocols import Progress, no_progress

log = logging.getLogger(__name__)

SERVED_NAME = "policy"
TAIL_LINES = 30
DEFAULT_COMMAND = (
    "vllm", "serve", "{model}", "--port", "{port}", "--seed", "0", "--served-model-name", "{name}",
)  # fmt: skip
_LLM_DEFAULTS = LLMClientConfig()


class ServerStartError(RuntimeError):
    """The server exited, refused us, or did not become ready in time; the message ends with
    the last lines of its log."""

    def __init__(self, message: str, *, pid: int, returncode: int | None, log_path: str):
        super().__init__(message)
        self.pid = pid
        self.returncode = returncode  # None: it was still running (and has been stopped)
        self.log_path = log_path


class ServedGeneration(BaseModel):
    """Start an OpenAI-compatible server (``vllm serve``) on the stage's checkpoint, sample from
    it, stop it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["served"] = "served"
    command: list[str] = Field(
        default_factory=lambda: list(DEFAULT_COMMAND),
        description="The server command line, placeholders {model} (checkpoint dir), {port} "
        "and {name}. Point the first element at the separate environment's binary, e.g. "
        "'.venv-vllm/bin/vllm'.",
    )
    extra_args: list[str] = Field(
        default_factory=list,
        description="Appended to command, e.g. ['--tensor-parallel-size', '8'].",
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Extra environment for the server (over eva's own). It is part of the "
        "config, so of manifests and config hashes: no secrets here, export them instead.",
    )
    startup_timeout_s: float = Field(
        default=900.0, gt=0, description="Most seconds to wait for the server to answer."
    )
    stop_timeout_s: float = Field(
        default=30.0, ge=0, description="Grace period after SIGTERM before SIGKILL."
    )
    client: OpenAIGeneration = Field(
        default_factory=OpenAIGeneration,
        description="Sampling and request settings (temperature, top_p, max_tokens, and under "
        "llm: concurrency, retries...). llm.base_url and llm.model are set to the launched "
        "server's.",
    )

    @model_validator(mode="after")
    def _check(self) -> ServedGeneration:
        if not self.command:
            raise ValueError("command is empty: give the server command line")
        argv = [*self.command, *self.extra_args]
        for placeholder in ("{model}", "{port}"):
            if not any(placeholder in arg for arg in argv):
                raise ValueError(
                    f"command must contain {placeholder}: the server has to load the stage's "
                    "checkpoint on the port this backend picks"
                )
        llm = self.client.llm
        if llm.base_url != _LLM_DEFAULTS.base_url or llm.model != _LLM_DEFAULTS.model:
            raise ValueError(
                "client.llm.base_url and client.llm.model are set from the launched server: "
                "leave them out (use kind 'openai' to talk to a server that is already running)"
            )
        return self

    def argv(self, model_dir: str, port: int) -> list[str]:
        """The command line for ``model_dir`` on ``port``, placeholders filled in."""
        return [
            arg.replace("{model}", model_dir)
            .replace("{port}", str(port))
            .replace("{name}", SERVED_NAME)
            for arg in [*self.command, *self.extra_args]
        ]

    def served_name(self, model_dir: str) -> str:
        """The name requests ask for: ``{name}``'s value, else vLLM's default (the path)."""
        uses_name = any("{name}" in arg for arg in [*self.command, *self.extra_args])
        return SERVED_NAME if uses_name else model_dir

    def load(self, model_dir: str) -> ServedGenerator:
        """Start the server on ``model_dir`` and wait until it is ready; close the result (or
        use it as a context manager) to stop the server."""
        port = free_port()
        argv = self.argv(model_dir, port)
        model = self.served_name(model_dir)
        llm = self.client.llm.model_copy(
            update={"base_url": f"http://127.0.0.1:{port}/v1", "model": model}
        )
        # Built first: a missing API key fails here, before a server takes the GPU.
        client = self.client.model_copy(update={"llm": llm}).load(model)
        log_dir = tempfile.mkdtemp(prefix="eva-served-")
        log_path = os.path.join(log_dir, "server.log")
        try:
            with open(log_path, "wb") as out:
                process = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, **self.env},
                    start_new_session=True,  # its own process group: stopped with its children
                )
        except OSError as exc:
            client.close()
            shutil.rmtree(log_dir, ignore_errors=True)
            raise ServerStartError(
                f"cannot start the server {argv[0]!r}: {exc} (set command[0] to the server "
                "binary of the environment that has it, e.g. '.venv-vllm/bin/vllm')",
                pid=-1,
                returncode=None,
                log_path="",
            ) from exc
        log.info("started %s (pid %d, log %s)", " ".join(argv), process.pid, log_path)
        generator = ServedGenerator(self, process, argv, port, client, log_dir)
        try:
            generator._wait_ready()
        except BaseException:  # a timeout, a dead server, or an interrupt: never leave it up
            generator._state.keep_log = True
            generator.close()
            raise
        log.info("server pid %d ready on port %d", process.pid, port)
        return generator


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
    """What stopping needs; held by the finalizer, so it must not refer to the generator."""

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
    if not state.keep_log:
        shutil.rmtree(state.log_dir, ignore_errors=True)


class ServedGenerator:
    """A running server on one checkpoint; satisfies ``Generator``. Close it (or use ``with``)
    to stop the server; it is stopped at garbage collection or interpreter exit otherwise."""

    def __init__(
        self,
        config: ServedGeneration,
        process: subprocess.Popen[bytes],
        argv: list[str],
        port: int,
        client: OpenAIGenerator,
        log_dir: str,
    ):
        self.config = config
        self.process = process
        self.argv = argv
        self.port = port
        self.model = client.model
        self.base_url = client.config.llm.base_url
        self.log_path = os.path.join(log_dir, "server.log")
        self._state = _ServerState(process, config.stop_timeout_s, log_dir)
        self._finalizer = weakref.finalize(self, _stop, self._state)  # also runs at exit
        self._client = client

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"ServedGenerator(pid={self.process.pid}, base_url={self.base_url!r}, {state})"

    @property
    def running(self) -> bool:
        return self._finalizer.alive and self.process.poll() is None

    def __enter__(self) -> ServedGenerator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the server and its children (idempotent)."""
        self._finalizer()
        self._client.close()

    def stats(self) -> dict[str, int]:
        """The client's request counts (requests, retries, failures, tokens)."""
        return self._client.stats()

    def _fail(self, message: str) -> ServerStartError:
        self._state.keep_log = True
        tail = log_tail(self.log_path)
        return ServerStartError(
            f"{message}; command: {' '.join(self.argv)}; log {self.log_path} ends with:\n{tail}",
            pid=self.process.pid,
            returncode=self.process.poll(),
            log_path=self.log_path,
        )

    def _wait_ready(self) -> None:
        """Poll ``GET /v1/models`` until it lists our model, the process exits, or time is up."""
        timeout = self.config.startup_timeout_s
        deadline = time.monotonic() + timeout
        url = f"{self.base_url}/models"
        # The client's key: a server started with --api-key wants it here too.
        headers = auth_headers(self._client.config.llm)
        with httpx.Client(headers=headers, timeout=5.0, trust_env=False) as http:
            while True:
                code = self.process.poll()
                if code is not None:
                    raise self._fail(f"the server exited with code {code} before it was ready")
                try:
                    resp = http.get(url)
                except httpx.HTTPError:
                    resp = None  # not listening yet
                if resp is not None and resp.status_code in (401, 403):
                    raise self._fail(
                        f"the server refused GET {url} (HTTP {resp.status_code}): set "
                        "client.llm.api_key_env to the variable holding its --api-key"
                    )
                if resp is not None and resp.status_code == 200:
                    try:
                        ids = [m["id"] for m in resp.json()["data"]]
                    except (ValueError, KeyError, TypeError) as exc:
                        raise self._fail(f"GET {url} answered {resp.text[:200]!r}") from exc
                    if self.model in ids:
                        return
                    raise self._fail(
                        f"the server on port {self.port} serves {ids}, not {self.model!r}"
                    )
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._fail(f"the server was not ready after {timeout:g} s")
                time.sleep(min(0.2, left))

    def generate(
        self, prompts: Sequence[str], n: int, seed: int, progress: Progress = no_progress
    ) -> list[list[str]]:
        """``n`` responses per prompt from the served checkpoint (see ``OpenAIGenerator``)."""
        if not self._finalizer.alive:
            raise RuntimeError(f"{self!r} is closed: load the backend again")
        try:
            return self._client.generate(prompts, n, seed, progress)
        except GenerationError as exc:
            code = self.process.poll()
            if code is None:
                raise
            self._state.keep_log = True
            raise GenerationError(
                f"{exc}; the server exited with code {code}; log {self.log_path} ends with:\n"
                f"{log_tail(self.log_path)}",
                exc.failed,
            ) from exc

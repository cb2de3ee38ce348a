"""Rollouts from a server started on the stage's own checkpoint: ``vllm serve`` from its own env.

vLLM cannot be installed in eva's environment (every vLLM release pins ``fastapi<0.137``, prefect
3.8 needs ``>=0.139``), so it runs from a separate virtualenv and eva talks to it over HTTP. A
long-running server would serve a stale policy, though: the checkpoint changes every iteration.
This backend's ``load(model_dir)`` gets a server on exactly that checkpoint from the engine pool
(``eva_runtime.engines``), waits until it answers ``GET /v1/models``, and returns a generator
whose requests go through the ``openai`` backend (same seeding, retries and concurrency).

With ``reuse: true`` (the default) the server outlives the stage: the next stage that samples the
same checkpoint with the same server settings gets it back at no cost (creator_generate ->
generate within an iteration; evaluate of theta_t -> the next creator), it is stopped when another
checkpoint is asked for, when training starts, and when the flow ends. That keeps it on its GPUs
through the stages between (annotate, evolve): give a GPU reward model other devices (``env``:
CUDA_VISIBLE_DEVICES) or leave it room (``--gpu-memory-utilization``), or set ``reuse: false`` to
stop the server after every stage, as before. Engine starts are counted in the stage stats.

Config, e.g. for a stage's ``backend``::

    kind: served
    command: [.venv-vllm/bin/vllm, serve, "{model}", --host, "{host}", --port, "{port}",
              --seed, "0", --served-model-name, "{name}"]
    extra_args: [--tensor-parallel-size, "8", --max-model-len, "4096"]
    env: {CUDA_VISIBLE_DEVICES: "0,1,2,3,4,5,6,7"}
    client: {temperature: 0.7, top_p: 0.9, max_tokens: 1024, llm: {concurrency: 64}}

Placeholders are replaced wherever they occur inside an argument (other braces are left alone):
``{model}`` = the checkpoint directory, ``{port}`` = a free localhost port picked at start,
``{name}`` = the served model name, ``policy`` (without ``{name}`` in the command, the client asks
for the model by its directory, the name ``vllm serve DIR`` uses by default), ``{host}`` = the
address the server listens on (``host``, 127.0.0.1 unless the config names another).

The server is an unauthenticated OpenAI-compatible API on the user's model: it listens on
loopback only unless ``host`` says otherwise. ``vllm serve`` without ``--host`` listens on every
interface, so a ``vllm serve`` command line without ``{host}`` gets ``--host <host>`` appended;
another server's command line puts ``{host}`` where that server takes its address. A ``--host``
written into the command itself is refused: ``host`` is what the client calls, too.

The server never outlives eva: see ``eva_runtime.engines`` (process groups, the guard that
stops it on a SIGKILL of eva, logs kept after a failure).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Hashable, Sequence
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from eva_runtime.engines import ENGINES, Engine, EnginePool
from eva_runtime.llm_config import LLMClientConfig, auth_headers
from eva_runtime.process import ServerStartError, free_port
from tasks.backends.generate.openai import GenerationError, OpenAIGeneration, OpenAIGenerator
from tasks.backends.protocols import Generations, Progress, no_progress

log = logging.getLogger(__name__)

SERVED_NAME = "policy"
DEFAULT_COMMAND = (
    "vllm", "serve", "{model}", "--host", "{host}", "--port", "{port}", "--seed", "0",
    "--served-model-name", "{name}",
)  # fmt: skip
LOOPBACK = "127.0.0.1"
# A wildcard address listens everywhere; the client, on this machine, calls loopback.
WILDCARDS = ("0.0.0.0", "::", "")
_LLM_DEFAULTS = LLMClientConfig()


class ServedGeneration(BaseModel):
    """Start an OpenAI-compatible server (``vllm serve``) on the stage's checkpoint, sample from
    it, stop it."""

    # 2: each response says whether it finished before the length cap (``Generations``).
    version: ClassVar[int] = 2  # bump when a change can change what it computes
    libraries: ClassVar[tuple[str, ...]] = ()  # vLLM runs in its own environment

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["served"] = "served"
    command: list[str] = Field(
        default_factory=lambda: list(DEFAULT_COMMAND),
        description="The server command line, placeholders {model} (checkpoint dir), {port}, "
        "{name} and {host}. Point the first element at the separate environment's binary, e.g. "
        "'.venv-vllm/bin/vllm'. A `vllm serve` line without {host} gets `--host <host>` "
        "appended.",
    )
    host: str = Field(
        default=LOOPBACK,
        min_length=1,
        description="The address the server listens on: 127.0.0.1 (this machine only) unless "
        "another machine must reach it (0.0.0.0: every interface; the server has no "
        "authentication). The client calls it here (127.0.0.1 for 0.0.0.0 or ::).",
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
    reuse: bool = Field(
        default=True,
        description="Keep the server running after the stage, for the next stage that samples "
        "the same checkpoint with the same command, extra_args and env (stopped when another "
        "checkpoint is asked for, when training starts, and when the flow ends). false: stop "
        "it after every stage.",
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
        if named := _literal_host(argv):
            raise ValueError(
                f"{named!r} in the command line: set host instead (the client calls it too; "
                "the default, 127.0.0.1, keeps the server to this machine)"
            )
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
        """The command line for ``model_dir`` on ``port``, placeholders filled in; a ``vllm
        serve`` line without ``{host}`` listens on ``host`` too (``--host`` appended)."""
        argv = [*self.command, *self.extra_args]
        if _is_vllm_serve(argv) and not any("{host}" in arg for arg in argv):
            argv += ["--host", "{host}"]
        return [
            arg.replace("{model}", model_dir)
            .replace("{port}", str(port))
            .replace("{name}", SERVED_NAME)
            .replace("{host}", self.host)
            for arg in argv
        ]

    def client_host(self) -> str:
        """Where the client calls the server: ``host``, loopback for a wildcard address."""
        host = LOOPBACK if self.host in WILDCARDS else self.host
        return f"[{host}]" if ":" in host else host  # an IPv6 address in a URL

    def served_name(self, model_dir: str) -> str:
        """The name requests ask for: ``{name}``'s value, else vLLM's default (the path)."""
        uses_name = any("{name}" in arg for arg in [*self.command, *self.extra_args])
        return SERVED_NAME if uses_name else model_dir

    def engine_settings(self) -> Hashable:
        """What makes two stages' servers interchangeable (the client's sampling does not)."""
        return (
            tuple(self.command),
            tuple(self.extra_args),
            tuple(sorted(self.env.items())),
            self.host,
        )

    def load(self, model_dir: str, pool: EnginePool = ENGINES) -> ServedGenerator:
        """A generator on a server running ``model_dir``: the pool's, when ``reuse`` and one is
        up, else a server started now. Close the result (or use it as a context manager) when
        the stage is done; that stops the server unless ``reuse``."""
        model = self.served_name(model_dir)
        # Checked first: a missing API key or binary fails here, before a server takes the GPU.
        headers = auth_headers(self.client.llm)
        binary = self.argv(model_dir, 0)[0]
        if shutil.which(binary) is None:
            raise ServerStartError(
                f"cannot start the server {binary!r}: no such executable (set command[0] to the "
                "server binary of the environment that has it, e.g. '.venv-vllm/bin/vllm')",
                pid=-1, returncode=None, log_path="",
            )  # fmt: skip

        def start() -> Engine:
            port = free_port()
            engine = Engine(self.argv(model_dir, port), self.env, port, self.stop_timeout_s)
            url = f"http://{self.client_host()}:{port}/v1/models"
            # The client's key: a server started with --api-key wants it here too.
            engine.wait_ready(url, model, headers, self.startup_timeout_s)
            log.info("server pid %d ready on port %d", engine.process.pid, port)
            return engine

        if self.reuse:
            engine, started = pool.acquire(
                self.engine_settings(), os.path.realpath(model_dir), start
            )
        else:
            engine, started = start(), True
        llm = self.client.llm.model_copy(
            update={"base_url": f"http://{self.client_host()}:{engine.port}/v1", "model": model}
        )
        client = self.client.model_copy(update={"llm": llm}).load(model)
        return ServedGenerator(self, engine, client, started=started)


def _literal_host(argv: Sequence[str]) -> str | None:
    """A ``--host`` in ``argv`` given another value than ``{host}``, as written, else None."""
    for i, arg in enumerate(argv):
        flag, eq, value = arg.partition("=")
        if flag != "--host":
            continue
        if not eq:
            value = argv[i + 1] if i + 1 < len(argv) else ""
        if "{host}" not in value:
            return f"{arg} {value}" if not eq else arg
    return None


def _is_vllm_serve(argv: Sequence[str]) -> bool:
    """``vllm serve ...`` (any path to the binary) or vLLM's API server module."""
    return (
        len(argv) > 1 and os.path.basename(argv[0]) == "vllm" and argv[1] == "serve"
    ) or "vllm.entrypoints.openai.api_server" in argv


class ServedGenerator:
    """Samples from a running server; satisfies ``Generator``. ``close()`` stops the server
    unless the config reuses it (the pool stops it then)."""

    def __init__(
        self, config: ServedGeneration, engine: Engine, client: OpenAIGenerator, started: bool
    ):
        self.config = config
        self.engine = engine
        self.engine_starts = int(started)  # 0: this stage reused a running server
        self.model = client.model
        self.base_url = client.config.llm.base_url
        self._client = client
        self._closed = False

    # The server's identity, for logs and tests.
    process = property(lambda self: self.engine.process)
    argv = property(lambda self: self.engine.argv)
    port = property(lambda self: self.engine.port)
    log_path = property(lambda self: self.engine.log_path)

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"ServedGenerator(pid={self.process.pid}, base_url={self.base_url!r}, {state})"

    @property
    def running(self) -> bool:
        return not self._closed and self.engine.running

    def __enter__(self) -> ServedGenerator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Done sampling (idempotent): stops the server unless it is kept for reuse."""
        self._closed = True
        self._client.close()
        if not self.config.reuse:
            self.engine.stop()

    def stats(self) -> dict[str, int]:
        """The client's request counts since load (requests, retries, failures, tokens)."""
        return self._client.stats()

    def generate(
        self, prompts: Sequence[str], n: int, seed: int, progress: Progress = no_progress
    ) -> Generations:
        """``n`` responses per prompt from the served checkpoint (see ``OpenAIGenerator``)."""
        if self._closed or self.engine.stopped:
            raise RuntimeError(f"{self!r} is closed: load the backend again")
        try:
            return self._client.generate(prompts, n, seed, progress)
        except GenerationError as exc:
            code = self.process.poll()
            if code is None:
                raise
            error = self.engine.fail(f"the server exited with code {code}")
            raise GenerationError(f"{exc}; {error}", exc.failed) from exc

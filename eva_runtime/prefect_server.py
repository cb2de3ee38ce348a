"""eva's temporary Prefect server: Prefect's own API app, with SQLite writes that wait their turn.

When no Prefect API is configured and none is running locally, a command that runs flows needs
a server for as long as it lasts. Prefect would start its "temporary server" (a uvicorn
subprocess on a SQLite database). eva starts the same app itself, for two reasons:

* **No 2-second stalls.** Prefect opens its SQLite transactions ``BEGIN DEFERRED``. A request
  that reads and then writes (creating a task run reads its flow run's labels, then inserts)
  fails at once with "database is locked" when another write committed in between; SQLite's
  busy timeout does not cover that case, because the reader's snapshot is stale. The server on
  the other side of that race is Prefect's own task-run recorder, filing the events of the stage
  that just finished, so every subflow an eva iteration opens risks it. The API answers 503 and
  the client retries after 2 s, then 4 s (PrefectHQ/prefect#18934 is the upstream report). Here
  every write transaction begins ``IMMEDIATE``: it takes the write lock before its first read,
  so a second writer waits on the busy timeout instead of failing (what that saves a cached
  rerun: ``python -m bench.costs --cached-rerun``, docs/benchmarks.md, section 2).
* **No orphan.** The server is a ``ManagedProcess`` (``eva_runtime.process``): it runs under
  eva's guard and stops with the command, also when the command is killed with SIGKILL.

The UI sees what it sees on Prefect's temporary server: the app, its database and its services
are Prefect's own; only the transaction mode differs.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import httpx

from eva_runtime.errors import ConfigError
from eva_runtime.process import ManagedProcess, ServerStartError, free_port, log_tail

STOP_GRACE_S = 10.0  # uvicorn's graceful shutdown stops Prefect's services first
log = logging.getLogger("eva.prefect_server")


def begin_writes_immediate() -> None:
    """In this process, open every Prefect SQLite transaction as one that will write
    (``BEGIN IMMEDIATE``, what Prefect itself uses for ``SELECT ... FOR UPDATE``)."""
    from prefect.server.database.configurations import AioSqliteConfiguration

    original = AioSqliteConfiguration.begin_transaction
    if getattr(original, "eva_immediate", False):
        return

    def begin_transaction(self: Any, session: Any, with_for_update: bool = False) -> Any:
        return original(self, session, with_for_update=True)

    begin_transaction.eva_immediate = True  # type: ignore[attr-defined]
    AioSqliteConfiguration.begin_transaction = begin_transaction  # type: ignore[method-assign]


def create_app() -> Any:
    """The uvicorn factory the server process runs: Prefect's API app (no UI, ephemeral
    services, as in Prefect's temporary server) with immediate SQLite writes."""
    begin_writes_immediate()
    from prefect.server.api.server import create_app as prefect_app

    return prefect_app()


def _check_database_folder() -> None:
    """A ``ConfigError`` naming the setting when the SQLite file Prefect's settings give the
    server (``PREFECT_HOME/prefect.db`` unless a connection URL says otherwise) lies in a
    folder that does not exist: Prefect makes its home only where the home's parent exists, and
    a server without its database folder dies at startup, after a warning about the home."""
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    url = settings.server.database.connection_url
    url_text = url.get_secret_value() if url is not None else ""
    scheme, sep, rest = url_text.partition(":///")
    if not scheme.startswith("sqlite") or not sep:
        return  # another database (PostgreSQL): the server says what it cannot reach
    path = rest.split("?", 1)[0]
    folder = os.path.dirname(os.path.abspath(path)) if path and path != ":memory:" else ""
    if not folder or os.path.isdir(folder):
        return
    home = os.path.abspath(os.path.expanduser(str(settings.home)))
    field = "PREFECT_HOME" if folder == home else "PREFECT_SERVER_DATABASE_CONNECTION_URL"
    raise ConfigError(
        f"{folder} does not exist, and the Prefect server keeps its database there",
        field=field,
        hint=f"create it (mkdir -p {folder}), or set {field} to a folder that exists",
    )


def _start(database_url: str | None, timeout_s: float) -> tuple[ManagedProcess, str]:
    from prefect.settings import get_current_settings

    if database_url is None:  # the caller's own URL is the caller's to check
        _check_database_folder()
    env = {
        **get_current_settings().to_environment_variables(exclude_unset=True),
        # What Prefect sets for its temporary server: no UI, the ephemeral set of services.
        "PREFECT_UI_ENABLED": "0",
        "PREFECT__SERVER_EPHEMERAL": "1",
        "PREFECT__SERVER_FINAL": "1",
    }
    env.pop("PREFECT_API_URL", None)
    if database_url:
        env["PREFECT_SERVER_DATABASE_CONNECTION_URL"] = database_url
    project = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for _ in range(3):
        port = free_port()
        server = ManagedProcess(
            [sys.executable, "-m", "uvicorn", "--app-dir", project, "--factory",
             "eva_runtime.prefect_server:create_app", "--host", "127.0.0.1", "--port", str(port),
             "--log-level", "error", "--lifespan", "on"],
            env=env, stop_s=STOP_GRACE_S,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}/api"
        try:
            server.wait_until(
                partial(_healthy, url),
                timeout_s,
                what="the Prefect server",
                hint="raise PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS",
            )
            return server, url
        except ServerStartError as exc:
            if exc.returncode is None or "address already in use" not in log_tail(exc.log_path):
                raise
            # Another process took the port between free_port() and uvicorn's bind: next one.
            shutil.rmtree(os.path.dirname(exc.log_path), ignore_errors=True)
    raise ServerStartError(
        "the Prefect server found no free port in 3 tries", pid=-1, returncode=None, log_path=""
    )


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2.0, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False  # not listening yet


@contextmanager
def temporary_server(
    database_url: str | None = None, say: Callable[[str], None] | None = None
) -> Iterator[str]:
    """Run the body against a Prefect server started for it, and stopped after it; yields its
    API URL. ``database_url``: a SQLAlchemy URL (default: Prefect's configured database);
    ``say``: where to tell the user about the server (a command's output); None: nowhere."""
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
        temporary_settings,
    )

    server, url = _start(
        database_url, float(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value())
    )
    try:
        if say:
            say(
                f"eva: started a temporary Prefect server at {url} (stopped when this command "
                "ends, and its runs with it; to keep runs in the UI, keep `eva prefect-server` "
                "running and export PREFECT_API_URL=http://127.0.0.1:4200/api)"
            )
        with temporary_settings(updates={PREFECT_API_URL: url}):
            try:
                yield url
            finally:
                _drain_to(url)
    finally:
        server.stop()


def start_lasting(argv: list[str]) -> int:
    """``prefect server start ARGV`` in this process, with immediate SQLite writes: the lasting
    server a team keeps for the UI and its schedules, without the 503 stalls (``eva
    prefect-server``). Returns the exit code; ``ConfigError`` for an option that would start
    the server in other processes."""
    refused = [a for a in argv if a.split("=")[0] in ("--background", "-b", "--workers")]
    if refused:
        raise ConfigError(
            "starts the server in other processes, which would not have eva's change",
            field=f"eva prefect-server {refused[0]}",
            hint="run it in the foreground; a service manager can keep it up",
        )
    _ui_calls_this_server(argv)
    begin_writes_immediate()
    from prefect.cli import app

    sys.argv = ["prefect", "server", "start", *argv]
    try:
        app()
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1 if exc.code else 0
    return 0


def _ui_calls_this_server(argv: list[str]) -> None:
    """Point the UI at the host and port the server is started on. Prefect derives the UI's API
    URL from its settings (``PREFECT_API_URL``, else the default port 4200), not from
    ``--host``/``--port``, so a UI served on another port called 4200 and showed "Oops.
    Something went wrong."; a UI API URL the user set stays."""
    given: dict[str, str] = {}
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name in ("--host", "--port"):
            given[name] = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
    if not given:
        return
    host = given.get("--host") or os.environ.get("PREFECT_SERVER_API_HOST", "127.0.0.1")
    port = given.get("--port") or os.environ.get("PREFECT_SERVER_API_PORT", "4200")
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host  # what a browser here can call
    os.environ["PREFECT_SERVER_API_HOST"], os.environ["PREFECT_SERVER_API_PORT"] = host, port
    if not (os.environ.get("PREFECT_UI_API_URL") or os.environ.get("PREFECT_SERVER_UI_API_URL")):
        os.environ["PREFECT_UI_API_URL"] = f"http://{shown}:{port}/api"


class RetriedRequests(logging.Handler):
    """Counts the requests Prefect's client retried because the API answered 503 (on SQLite,
    its answer to two writes that met; the client backs off 2 s, then 4 s)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "retryable status code" in record.getMessage():
            self.count += 1


@contextmanager
def counting_retries() -> Iterator[RetriedRequests]:
    """Count, in the body, the requests this process's Prefect client retried after a 503."""
    client_log = logging.getLogger("prefect.client")
    retries, level = RetriedRequests(), client_log.level
    client_log.addHandler(retries)
    client_log.setLevel(logging.DEBUG)  # the retry is logged at debug level
    try:
        yield retries
    finally:
        client_log.removeHandler(retries)
        client_log.setLevel(level)


def _drain_to(url: str) -> None:
    """Send the logs and events still queued in this process to the server before it stops
    (what Prefect's test harness does): the last flow run's records would be lost otherwise."""
    import inspect

    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.utilities.asyncutils import run_coro_as_sync

    async def drain() -> None:
        try:
            done = APILogWorker.instance().drain()
            if inspect.isawaitable(done):
                await done
        except RuntimeError:  # never started
            pass
        drained = EventsWorker.drain_all()
        if inspect.isawaitable(drained):
            await drained

    try:
        run_coro_as_sync(drain())
    except Exception as exc:  # the run is over; what is lost is a view of it
        log.warning("could not send the last logs to %s: %s", url, exc)


__all__ = [
    "ServerStartError",
    "begin_writes_immediate",
    "counting_retries",
    "create_app",
    "start_lasting",
    "temporary_server",
]

"""Which Prefect API a command's flows report to: the configured one, else a local server that is
already running, else a temporary one (eva's, see ``eva_runtime.prefect_server``).

Without ``PREFECT_API_URL`` every ``eva run`` needs a temporary server, stopped when the run ends,
and the UI shows the run only while it lasts. A user who keeps ``prefect server start`` running
wants the run there: it costs nothing to start and the run stays in the UI. So, when no API is
configured, the commands that run flows ask the address a local ``prefect server start`` listens
on (``PREFECT_SERVER_API_HOST``/``PORT``, 127.0.0.1:4200 by default) for ``/api/health`` and, if
it answers, use it for this command only. ``EVA_PREFECT_SERVER=temporary`` keeps the temporary
server regardless.

Flow-run heartbeats are turned off on the temporary server. They exist so that an automation on
a lasting server can mark a flow run whose process died as Crashed; the temporary server dies
with the process and runs no automation, so nothing reads them, and they cost each flow run up
to a second at its end (Prefect joins the heartbeat thread, which sleeps in one-second steps).
Against a lasting server (the configured one or a running local one) they stay on.

A configured API that does not answer is refused in one line naming ``PREFECT_API_URL``
(``check_answers``), before any flow starts.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx

from eva_runtime.errors import ConfigError, first_line


def local_server_url(timeout_s: float = 0.5) -> str | None:
    """The API URL of a Prefect server answering on this machine's configured address, or
    None (nothing listening, or something that is not a Prefect API)."""
    from prefect.settings import get_current_settings

    api = get_current_settings().server.api
    host = "127.0.0.1" if api.host in ("0.0.0.0", "::") else api.host
    url = f"http://{host}:{api.port}/api"
    try:
        resp = httpx.get(f"{url}/health", timeout=timeout_s, trust_env=False)
    except httpx.HTTPError:
        return None
    return url if resp.status_code == 200 and resp.text.strip() == "true" else None


@contextmanager
def prefect_api(say: Callable[[str], None] | None = None) -> Iterator[str]:
    """Run the body against the configured API, else a running local server, else a temporary
    server without flow-run heartbeats; yields the API's URL. ``say``: where to tell the user
    which server the runs report to (a command's output, ``flows.commands``); None: nowhere."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from eva_runtime.prefect_server import temporary_server

    configured = PREFECT_API_URL.value()
    if configured:
        check_answers(configured)
        yield configured
        return
    url = None if os.environ.get("EVA_PREFECT_SERVER") == "temporary" else local_server_url()
    if url is None:
        with temporary_server(say=say) as url, no_heartbeats():
            yield url
        return
    if say:
        say(f"eva: reporting to the Prefect server already running at {url}")
    with temporary_settings(updates={PREFECT_API_URL: url}):
        yield url


def check_answers(url: str) -> None:
    """A ``ConfigError`` naming ``PREFECT_API_URL`` when the configured API does not answer its
    health check (nothing listening, another service, a server that errs): said in one line
    before a flow starts, instead of the client's traceback from inside Prefect's engine. The
    check is Prefect's own client's, so it sends what that client sends (an API key included)."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        failed = client.api_healthcheck()
    if failed is not None:
        raise ConfigError(
            f"the Prefect API at {url} does not answer ({first_line(failed)})",
            field="PREFECT_API_URL",
            hint="start that server (eva prefect-server), or unset PREFECT_API_URL and eva "
            "starts a temporary one",
        )


@contextmanager
def no_heartbeats() -> Iterator[None]:
    """Flow runs in the body send no heartbeats (what the temporary server needs)."""
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield

"""What a stage shows in the Prefect UI: its summary, tables, progress, and what it reused.

All of it is a view of the run: the parquet artifacts and manifests are the record, so nothing
here may fail a stage, and none of it should hold a stage up:

* A stage's summary, tables and progress bar are posted by one background thread
  (``POSTER``), in order, each with the task run, flow run and API of the stage that asked
  (read when it is queued), so the UI shows them where a direct post would. Each post is an
  API round trip; made by the stage itself, they were most of a demo iteration's
  orchestration time.
  ``opened_run`` flushes the queue when a flow ends, and so does interpreter exit.
* A cached stage is listed in its flow run's "reused" table, posted when the run closes
  (``REUSED.flush()``), instead of getting an artifact of its own: a cached rerun of a demo run
  posted 33 of those, about a seventh of its time.
* A progress bar appears once a stage has run for a second (a shorter stage's summary says
  all a bar would) and moves at most once a second.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import json
import logging
import queue
import re
import threading
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any
from uuid import UUID

from eva_runtime.poll import PollTimeout, wait_until

log = logging.getLogger("eva")


class ReusedTables:
    """Cached stages, listed per flow run and posted as one table each when the run closes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: dict[UUID | None, list[dict[str, Any]]] = {}

    def add(self, row: dict[str, Any]) -> None:
        from prefect.utilities.context import get_flow_run_id

        with self._lock:
            self._rows.setdefault(get_flow_run_id(), []).append(row)

    def flush(self) -> int:
        """Queue one table per flow run that reused stages (on that flow run's page) for the
        poster; returns how many. ``POSTER.flush()`` waits until they are posted."""
        with self._lock:
            groups, self._rows = self._rows, {}
        for flow_run_id, rows in groups.items():
            where = ", ".join(sorted({r["iteration"] for r in rows}))
            POSTER.post(
                "table",
                json.dumps(rows),
                key=None,
                description=f"reused (Cached): {len(rows)} stage(s) of {where}",
                run_ids=(None, flow_run_id),
            )
        return len(groups)


REUSED = ReusedTables()


class Poster:
    """Creates artifacts on one daemon thread, in the order they were asked for. A post keeps
    the task run, flow run and Prefect settings (the API) of the thread that asked; the worker
    has clients of its own (the caller's is closed when its task run ends), one per API, kept
    open while posts keep coming: a new client builds a TLS context and asks for a CSRF token,
    work that would otherwise be repeated for every post of every stage."""

    IDLE_S = 5.0  # close the worker's clients after this long without a post

    def __init__(self) -> None:
        self._queue: queue.Queue[tuple[Callable[[Any], None], Any]] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def post(
        self,
        type_: str,
        data: Any,
        *,
        key: str | None,
        description: str | None,
        run_ids: tuple[UUID | None, UUID | None] | None = None,
        then: Callable[[UUID], None] | None = None,
    ) -> None:
        """Queue an artifact for the caller's task run and flow run, or for ``run_ids``
        (task run, flow run) when given; ``then`` receives its id once it is created."""
        from prefect.client.schemas.actions import ArtifactCreate
        from prefect.utilities.context import get_task_and_flow_run_ids

        task_run_id, flow_run_id = run_ids or get_task_and_flow_run_ids()
        artifact = ArtifactCreate(
            type=type_, data=data, key=key, description=description,
            task_run_id=task_run_id, flow_run_id=flow_run_id,
        )  # fmt: skip

        def create(client: Any) -> None:
            created = client.create_artifact(artifact=artifact)
            if then is not None:
                then(created.id)

        self.submit(create)

    def submit(self, call: Callable[[Any], None]) -> None:
        """Queue ``call(client)``, to run on the poster's thread with a client for the
        caller's Prefect settings (its API)."""
        from prefect.context import SettingsContext

        self._queue.put((call, SettingsContext.get()))
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._work, name="eva-ui", daemon=True)
                self._thread.start()

    def _work(self) -> None:
        clients: dict[str | None, Any] = {}  # API URL -> an open sync client
        while True:
            try:
                call, settings = self._queue.get(timeout=self.IDLE_S)
            except queue.Empty:
                _close(clients, list(clients))
                continue
            url = settings.settings.api.url if settings is not None else None
            try:
                contextvars.Context().run(_call_with, call, settings, clients, url)
            except Exception as exc:  # a view of the run; never fails anything
                log.debug("could not publish an artifact to the UI: %s", exc)
                _close(clients, [url])  # a server that went away: a new client next time
            finally:
                self._queue.task_done()

    def flush(self, timeout_s: float = 60.0) -> bool:
        """Wait until every queued artifact is created (False if ``timeout_s`` passed first)."""
        try:
            wait_until(
                lambda: not self._queue.unfinished_tasks, timeout_s, interval_s=0.005,
                what="UI posts sent",
            )  # fmt: skip
        except PollTimeout:
            return False
        return True


def _call_with(
    call: Callable[[Any], None], settings: Any, clients: dict[str | None, Any], url: str | None
) -> None:
    """``call(client)`` in a fresh context holding only the caller's settings, with the open
    client for their API ``url`` (opened now if there is none)."""
    from prefect.client.orchestration import get_client
    from prefect.context import SettingsContext

    if settings is not None:
        SettingsContext.__var__.set(settings)
    if url not in clients:
        clients[url] = get_client(sync_client=True).__enter__()
    call(clients[url])


def _close(clients: dict[str | None, Any], urls: list[str | None]) -> None:
    for url in urls:
        if (client := clients.pop(url, None)) is not None:
            with contextlib.suppress(Exception):  # a connection to a server that is gone
                client.__exit__(None, None, None)


POSTER = Poster()
atexit.register(POSTER.flush, 30.0)


def artifact_key(run: str, where: str, artifact: str, suffix: str = "") -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes only."""
    raw = "-".join(p for p in (run, where, artifact, suffix) if p)
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", raw.lower())).strip("-")


class ProgressArtifact:
    """A Prefect progress artifact, updated at most once a second, posted by ``POSTER`` (not
    by the stage: each post is an API round trip); silent outside a flow."""

    def __init__(self, key: str):
        # The first post waits a second: a stage that ends sooner gets no bar.
        self.key, self.last, self.started = key, time.monotonic(), False
        self.id: UUID | None = None  # set on the poster's thread once the bar exists

    def __call__(self, fraction: float) -> None:
        now = time.monotonic()
        done = fraction >= 1.0
        if (done and not self.started) or (not done and now - self.last < 1.0):
            return  # the end of a bar always shows; a bar starts after a second
        pct = round(100 * min(max(fraction, 0.0), 1.0), 1)
        if self.started:
            POSTER.submit(partial(self._update, pct))
        else:
            from prefect.utilities.context import get_task_and_flow_run_ids

            if get_task_and_flow_run_ids() == (None, None):
                return  # a plain call, outside any run: no bar to show it on
            self.started = True
            POSTER.post("progress", pct, key=self.key, description=None, then=self._created)
        self.last = now

    def _created(self, artifact_id: UUID) -> None:
        self.id = artifact_id

    def _update(self, pct: float, client: Any) -> None:
        from prefect.client.schemas.actions import ArtifactUpdate

        if self.id is not None:  # None: its creation failed (and was logged); so would this
            client.update_artifact(artifact_id=self.id, artifact=ArtifactUpdate(data=pct))


def readable(value: Any) -> str:
    """A stat as a person reads it: 4 significant digits, mappings as ``k: v`` lists, text as
    is (no JSON quotes), nothing as "-"."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return "nan" if value != value else f"{value:.4g}"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {readable(v)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return "[" + ", ".join(readable(v) for v in value) + "]"
    return str(value)


def _cell(value: Any) -> Any:
    """A table cell: floats rounded to 4 significant digits, containers as readable text."""
    if isinstance(value, float):
        return value if value != value else float(f"{value:.4g}")
    if isinstance(value, dict | list | tuple):
        return readable(value)
    return value


def _json_cell(value: Any) -> Any:
    """A table cell as the UI's JSON holds it: NaN (not JSON) as null."""
    value = _cell(value)
    return None if isinstance(value, float) and value != value else value


WIDE_CHARS = 24  # a column with a longer cell is drawn wide (a prompt, a response)


def narrow_first(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows with their narrow columns first (ids, lineage, numbers: what identifies a row)
    and the wide ones (prompts, responses) last, each group in its given order: the UI's table
    grows to the right, and a wide column in the middle pushed lineage off a 1400-1600 px
    screen."""
    columns = list(dict.fromkeys(k for row in rows for k in row))
    wide = {c for c in columns if any(len(readable(row.get(c))) > WIDE_CHARS for row in rows)}
    order = [c for c in columns if c not in wide] + [c for c in columns if c in wide]
    return [{c: row[c] for c in order if c in row} for row in rows]


def link_reused(run: str, where: str, artifact: str, manifest: dict) -> None:
    """A cached stage, in its flow run's "reused" table: what it reused, when that was made, and
    the key of the summary published then, so a rerun's page leads to what it did not redo."""
    REUSED.add(
        {
            "iteration": where,
            "stage": artifact,
            "reused": manifest["uri"],
            "rows": manifest["rows"],
            "made": manifest.get("created_at", "?"),
            "summary artifact": artifact_key(run, where, artifact),
        }
    )


def publish_markdown(run: str, name: str, markdown: str, description: str) -> None:
    """A markdown artifact of the asking flow run under the stable key ``{run}-{name}`` (a run's
    summary, its charts): posted like every other artifact, by ``POSTER``."""
    POSTER.post("markdown", markdown, key=artifact_key(run, "", name), description=description)


def publish_stage(
    run: str,
    where: str,
    artifact: str,
    manifest: dict[str, Any],
    tables: Mapping[str, list[dict[str, Any]]],
    notes: Mapping[str, str] | None = None,
) -> None:
    """A finished stage's summary (its stats) and its tables, keyed by run, iteration and
    artifact, so the UI's artifact pages track each across reruns."""
    lines = [
        f"### {artifact} · {where}",
        f"{manifest['rows']} rows in {manifest['seconds']:.2f} s → `{manifest['uri']}`",
        "",
        "| stat | value |",
        "| --- | --- |",
        *(f"| {k} | {readable(v)} |" for k, v in manifest["stats"].items()),
    ]
    try:
        POSTER.post(
            "markdown",
            "\n".join(lines),
            key=artifact_key(run, where, artifact),
            description=f"{artifact} summary",
        )
        for suffix, rows in tables.items():
            if rows:
                cells = [{k: _json_cell(v) for k, v in row.items()} for row in narrow_first(rows)]
                POSTER.post(
                    "table",
                    json.dumps(cells),
                    key=artifact_key(run, where, artifact, suffix),
                    description=f"{artifact} {where}: "
                    + (notes or {}).get(suffix, f"{len(rows)} of {manifest['rows']} rows"),
                )
    except Exception as exc:  # the artifact on disk is what matters; the UI is a view of it
        log.debug("could not publish UI artifacts: %s", exc)

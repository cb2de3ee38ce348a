"""What a stage shows in the Prefect UI: its summary, tables, progress, and what it reused.

All of it is a view of the run: the parquet artifacts and manifests are the record, so nothing
here may fail a stage. Summaries and tables are posted by one background thread (``LATER``)
instead of the stage's own: each post is a round trip to the API server (tens of milliseconds,
more while the server is busy), which can run while the next stage computes. A post keeps the
task run, flow run and API of its caller (read when it is queued), so the UI shows it exactly
where a direct post would. Cached stages are listed in one "reused" table per flow run instead
of one artifact each: a cached rerun of a demo run made 33 such posts, and the server's writes,
not eva, were most of its time. Flows call ``LATER.flush()`` before they return, so a finished
run has all of its artifacts; the queue is flushed at interpreter exit too. Progress bars stay
synchronous: they are throttled to one update a second, and a bar that lags its stage is worse
than none.
"""

from __future__ import annotations

import atexit
import contextvars
import json
import logging
import queue
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from tasks.store import iteration_dir

log = logging.getLogger("eva")


@dataclass(frozen=True)
class _Post:
    """One artifact to create, with the run it belongs to and the API it goes to."""

    type: str  # "markdown" or "table"
    data: str
    key: str | None
    description: str | None
    task_run_id: UUID | None
    flow_run_id: UUID | None
    settings: Any  # the caller's prefect SettingsContext (its API URL), or None


class Later:
    """Creates artifacts on one daemon thread, in submission order. Each keeps the task run,
    flow run and API of the thread that asked for it (the worker thread has none of its own:
    it must not borrow the caller's client, which is closed when the task run ends)."""

    def __init__(self) -> None:
        self._queue: queue.Queue[_Post] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        # Cached stages, per flow run: one table each at flush(), not one artifact per stage.
        self._reused: dict[UUID | None, tuple[list[dict[str, Any]], Any]] = {}

    def markdown(self, text: str, *, key: str | None = None, description: str) -> None:
        self._submit("markdown", text, key, description)

    def table(self, rows: list[dict[str, Any]], *, key: str, description: str) -> None:
        from prefect.artifacts import TableArtifact

        self._submit("table", json.dumps(TableArtifact._sanitize(rows)), key, description)

    def reused(self, row: dict[str, Any]) -> None:
        """A cached stage: listed with the other cached stages of its flow run, in one table
        posted at ``flush()`` (a cached rerun would otherwise post one artifact per stage, and
        the API server's writes, not eva, were most of its time)."""
        from prefect.context import SettingsContext
        from prefect.utilities.context import get_task_and_flow_run_ids

        _, flow_run_id = get_task_and_flow_run_ids()
        with self._lock:
            rows, _ = self._reused.setdefault(flow_run_id, ([], SettingsContext.get()))
            rows.append(row)

    def _submit(self, type_: str, data: str, key: str | None, description: str | None) -> None:
        from prefect.context import SettingsContext
        from prefect.utilities.context import get_task_and_flow_run_ids

        task_run_id, flow_run_id = get_task_and_flow_run_ids()
        settings = SettingsContext.get()
        self._put(_Post(type_, data, key, description, task_run_id, flow_run_id, settings))

    def _put(self, post: _Post) -> None:
        self._queue.put(post)
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._work, name="eva-ui", daemon=True)
                self._thread.start()

    def _work(self) -> None:
        while True:
            post = self._queue.get()
            try:
                contextvars.Context().run(_create, post)
            except Exception as exc:  # a view of the run; never fails anything
                log.debug("could not publish %s to the UI: %s", post.key or post.description, exc)
            finally:
                self._queue.task_done()

    def flush(self, timeout_s: float = 60.0) -> bool:
        """Post the tables of reused stages, then wait until every queued artifact is created
        (False if ``timeout_s`` passed first)."""
        with self._lock:
            groups, self._reused = self._reused, {}
        for flow_run_id, (rows, settings) in groups.items():
            where = ", ".join(sorted({r["iteration"] for r in rows}))
            description = f"reused (Cached): {len(rows)} stage(s) of {where}"
            self._put(
                _Post("table", json.dumps(rows), None, description, None, flow_run_id, settings)
            )
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True


def _create(post: _Post) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import ArtifactCreate
    from prefect.context import SettingsContext

    if post.settings is not None:
        SettingsContext.__var__.set(post.settings)  # this fresh context's only variable
    with get_client(sync_client=True) as client:
        client.create_artifact(
            artifact=ArtifactCreate(
                type=post.type,
                key=post.key,
                description=post.description,
                data=post.data,
                task_run_id=post.task_run_id,
                flow_run_id=post.flow_run_id,
            )
        )


LATER = Later()
atexit.register(LATER.flush, 30.0)


def artifact_key(run: str, iteration: int | None, artifact: str, suffix: str = "") -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes only."""
    raw = "-".join(p for p in (run, iteration_dir(iteration), artifact, suffix) if p)
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", raw.lower())).strip("-")


class ProgressArtifact:
    """A Prefect progress artifact, updated at most once a second; silent outside a flow."""

    def __init__(self, key: str):
        self.key, self.last, self.disabled = key, 0.0, False
        self.id: Any = None

    def __call__(self, fraction: float) -> None:
        now = time.monotonic()
        if self.disabled or (fraction < 1.0 and now - self.last < 1.0):
            return
        self.last = now
        try:
            from prefect.artifacts import create_progress_artifact, update_progress_artifact

            pct = round(100 * min(max(fraction, 0.0), 1.0), 1)
            if self.id is None:
                self.id = create_progress_artifact(pct, key=self.key)
            else:
                update_progress_artifact(self.id, pct)
        except Exception:  # no Prefect API here (a plain call): progress is best-effort
            self.disabled = True


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


def link_reused(run: str, iteration: int | None, artifact: str, manifest: dict) -> None:
    """A cached stage, in its flow run's "reused" table: what it reused, when that was made, and
    the key of the summary published then, so a rerun's page leads to what it did not redo."""
    LATER.reused(
        {
            "iteration": iteration_dir(iteration),
            "stage": artifact,
            "reused": manifest["uri"],
            "rows": manifest["rows"],
            "made": manifest.get("created_at", "?"),
            "summary artifact": artifact_key(run, iteration, artifact),
        }
    )


def publish_stage(
    run: str,
    iteration: int | None,
    artifact: str,
    manifest: dict[str, Any],
    tables: Mapping[str, list[dict[str, Any]]],
    notes: Mapping[str, str] | None = None,
) -> None:
    """A finished stage's summary (its stats) and its tables, keyed by run, iteration and
    artifact, so the UI's artifact pages track each across reruns."""
    lines = [
        f"### {artifact} · {iteration_dir(iteration)}",
        f"{manifest['rows']} rows in {manifest['seconds']:.2f} s → `{manifest['uri']}`",
        "",
        "| stat | value |",
        "| --- | --- |",
        *(f"| {k} | {readable(v)} |" for k, v in manifest["stats"].items()),
    ]
    LATER.markdown(
        "\n".join(lines),
        key=artifact_key(run, iteration, artifact),
        description=f"{artifact} summary",
    )
    for suffix, rows in tables.items():
        if rows:
            LATER.table(
                [{k: _cell(v) for k, v in row.items()} for row in rows],
                key=artifact_key(run, iteration, artifact, suffix),
                description=f"{artifact} {iteration_dir(iteration)}: "
                + (notes or {}).get(suffix, f"{len(rows)} of {manifest['rows']} rows"),
            )

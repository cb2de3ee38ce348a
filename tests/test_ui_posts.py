"""What a stage posts to the Prefect UI reaches the right run, in order, off the stage's path."""

from __future__ import annotations

import json
import threading
import time
import uuid

from prefect import flow, task
from prefect.client.orchestration import get_client
from prefect.context import get_run_context

from eva_runtime.prefect_ui import POSTER, ProgressArtifact, publish_stage


def _by_key(key: str):
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    return ArtifactFilter(key=ArtifactFilterKey(any_=[key]))


def test_summaries_and_tables_land_on_the_stage_task_run_in_order(prefect_api) -> None:
    run = f"ui{uuid.uuid4().hex[:6]}"
    seen: dict[str, object] = {}

    @task
    def a_stage(rows: int) -> None:
        ctx = get_run_context()
        seen["task_run"] = ctx.task_run.id  # type: ignore[union-attr]
        manifest = {"rows": rows, "seconds": 0.5, "uri": "iter_1/score.parquet"}
        for version in (1, 2):  # a rerun posts a new version of the same keys
            manifest["stats"] = {"version": version, "mean": float("nan")}
            table = [{"prompt": "p", "informativeness": 0.25 * version, "x": float("nan")}]
            publish_stage(run, "iter_1", "score", manifest, {"top": table}, {"top": "the top"})

    @flow
    def a_run() -> None:
        seen["flow_run"] = get_run_context().flow_run.id  # type: ignore[union-attr]
        started = time.perf_counter()
        a_stage(8)
        seen["stage_s"] = time.perf_counter() - started

    a_run()
    assert POSTER.flush(timeout_s=30)
    with get_client(sync_client=True) as client:
        summaries = client.read_artifacts(artifact_filter=_by_key(f"{run}-iter-1-score"))
        tables = client.read_artifacts(artifact_filter=_by_key(f"{run}-iter-1-score-top"))
    assert len(summaries) == len(tables) == 2  # every post made it, none twice
    for artifact in (*summaries, *tables):
        assert artifact.task_run_id == seen["task_run"]
        assert artifact.flow_run_id == seen["flow_run"]
    newest = max(summaries, key=lambda a: a.created)  # the later post is the newer version
    assert "| version | 2 |" in str(newest.data) and "| mean | nan |" in str(newest.data)
    rows = json.loads(str(max(tables, key=lambda a: a.created).data))
    assert rows == [{"prompt": "p", "informativeness": 0.5, "x": None}]  # NaN is not JSON
    assert max(tables, key=lambda a: a.created).description == "score iter_1: the top"


def test_a_progress_bar_appears_only_after_a_second_and_always_ends_at_100(prefect_api) -> None:
    key = f"bar-{uuid.uuid4().hex[:6]}"

    def bars() -> list[float]:
        with get_client(sync_client=True) as client:
            return [a.data for a in client.read_artifacts(artifact_filter=_by_key(key))]

    @flow
    def a_stage() -> None:  # bars belong to a run
        quick = ProgressArtifact(key)
        quick(0.5)
        quick(1.0)  # a stage that ended within its first second: no bar at all
        assert POSTER.flush(timeout_s=30)
        assert not quick.started and bars() == []

        slow = ProgressArtifact(key)
        slow(0.2)
        assert not slow.started
        slow.last -= 1.1  # a second later
        slow(0.4)
        assert POSTER.flush(timeout_s=30)
        assert slow.id is not None and bars() == [40.0]
        slow(0.6)  # within the second: not posted
        slow(1.0)  # the end always is
        assert POSTER.flush(timeout_s=30)
        assert bars() == [100.0]

    outside = ProgressArtifact(key)  # a plain call, in no run: nothing to post it on
    outside.last -= 1.1
    outside(0.5)
    assert not outside.started
    a_stage()


def test_the_poster_reuses_its_client_while_posts_keep_coming(prefect_api, monkeypatch) -> None:
    import prefect.client.orchestration as orchestration

    opened: list[object] = []
    original = orchestration.get_client

    def counting(*args, **kwargs):
        if threading.current_thread().name == "eva-ui":  # not Prefect's own workers
            opened.append(kwargs)
        return original(*args, **kwargs)

    key = f"reuse-{uuid.uuid4().hex[:6]}"
    monkeypatch.setattr(POSTER, "IDLE_S", 0.3)
    POSTER.post("markdown", "wake", key=f"{key}-wake", description="d", run_ids=(None, None))
    assert POSTER.flush(timeout_s=30)
    time.sleep(0.6)  # idle from here: the worker closed its clients
    monkeypatch.setattr(orchestration, "get_client", counting)
    for i in range(5):
        POSTER.post("markdown", f"post {i}", key=key, description="d", run_ids=(None, None))
    assert POSTER.flush(timeout_s=30)
    assert len(opened) == 1  # five posts, one client
    time.sleep(0.6)  # idle: the client is closed
    POSTER.post("markdown", "post 5", key=key, description="d", run_ids=(None, None))
    assert POSTER.flush(timeout_s=30)
    assert len(opened) == 2
    with get_client(sync_client=True) as client:
        posted = client.read_artifacts(artifact_filter=_by_key(key))
    assert sorted(str(a.data) for a in posted) == [f"post {i}" for i in range(6)]

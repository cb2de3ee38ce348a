"""Where a run's time goes, read from Prefect: each iteration's wall time by stage, a cached
rerun of a finished run, and Prefect's own floor under an iteration (``bench.costs`` reports
them)."""

from __future__ import annotations

import contextlib
import os
import time
from datetime import UTC, datetime
from typing import Any

import flows  # noqa: F401  (eva's Prefect defaults, before prefect is imported)
from eva_runtime.poll import PollTimeout, wait_until
from eva_runtime.prefect_server import counting_retries
from flows.config import RunConfig
from tasks.run_paths import iteration_dir
from tasks.store import RunStore


def _flow_runs(name: str, since: datetime, launch: bool = False) -> list[Any]:
    """Flow runs called ``name`` that started after ``since`` (oldest first); ``launch``: the
    top-level runs of eva run ``name``, whose names add the start time (``demo @11-22 ...``)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterName,
        FlowRunFilterStartTime,
    )

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                name=FlowRunFilterName(like_=f"{name} @")
                if launch
                else FlowRunFilterName(any_=[name]),
                start_time=FlowRunFilterStartTime(after_=since),  # type: ignore[arg-type]
            )
        )
    return sorted(runs, key=lambda r: r.start_time)


def _task_runs(flow_run_id: Any) -> dict[str, Any]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
        )
    return {r.name: r for r in runs}


def _wall(run: Any) -> float:
    return (run.end_time - run.start_time).total_seconds()


def timed_run(cfg: RunConfig) -> dict[str, Any]:
    """Run ``cfg`` and break each eva iteration's wall time down by stage."""
    import flows.run
    from flows.run import eva_run

    # Each iteration as the run sees it: the call of its subflow, so creating the subflow run
    # and reporting its final state (outside the subflow's own recorded start and end) count.
    called: list[float] = []
    subflow = flows.run.eva_iteration

    def timed_iteration(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return subflow(*args, **kwargs)
        finally:
            called.append(time.perf_counter() - started)

    since = datetime.now(UTC)
    started = time.perf_counter()
    flows.run.eva_iteration = timed_iteration  # type: ignore[assignment]
    try:
        eva_run(cfg)
    finally:
        flows.run.eva_iteration = subflow
    total = time.perf_counter() - started
    store = RunStore(cfg.root, cfg.run)
    manifests = {
        (t, artifact): m
        for t in (None, *range(cfg.iterations + 1))
        for artifact in store.artifacts(t)
        if (m := store.read_manifest(t, artifact)) is not None
    }
    iterations = []
    for t in range(1, cfg.iterations + 1):
        (sub,) = _flow_runs(f"{cfg.run}-iter-{t}", since)[-1:]
        tasks = _task_runs(sub.id)
        stages = {}
        for (it, artifact), manifest in manifests.items():
            if it != t:
                continue
            task_run = tasks[f"{artifact}-{iteration_dir(t).replace('_', '-')}"]
            stages[artifact] = {
                "task": round(_wall(task_run), 3),
                "stage": manifest["seconds"],
                "backend": manifest["stats"].get("backend_seconds", 0.0),
                "stats": manifest["stats"],
            }
        wall = called[t - 1]
        backend = sum(s["backend"] for s in stages.values())
        inside = sum(s["stage"] for s in stages.values())
        iterations.append(
            {
                "t": t,
                "wall": round(wall, 3),
                "subflow": round(_wall(sub), 3),  # its recorded start to end
                "backend": round(backend, 3),
                "stage_io": round(inside - backend, 3),  # parquet, hashing, checkpoints
                "orchestration": round(wall - inside, 3),  # Prefect task and subflow runs
                "overhead_share": round((wall - backend) / wall, 4),
                "stages": stages,
            }
        )
    # The whole run as the caller sees it: setup, iteration 0 and the top-level flow run too.
    backend_all = sum((m["stats"] or {}).get("backend_seconds", 0.0) for m in manifests.values())
    return {
        "total": round(total, 3),
        "backend": round(backend_all, 3),
        "overhead_share": round((total - backend_all) / total, 4),
        "iterations": iterations,
    }


def _manifests(root: str, run: str) -> dict[str, bytes]:
    out = {}
    for dirpath, _, files in os.walk(os.path.join(root, run)):
        for name in files:
            if name.endswith(".manifest.json"):
                path = os.path.join(dirpath, name)
                with open(path, "rb") as f:
                    out[path] = f.read()
    return out


def cached_rerun(cfg: RunConfig, original_seconds: float, repeats: int = 3) -> dict[str, Any]:
    """Launch the finished run again, ``repeats`` times: every stage must come back from its
    manifest. The median is reported; each run's time and the 503 retries are kept."""
    from flows.run import eva_run

    before = _manifests(cfg.root, cfg.run)
    times = []
    with counting_retries() as retries:
        for _ in range(repeats):
            since = datetime.now(UTC)
            started = time.perf_counter()
            eva_run(cfg)
            times.append(round(time.perf_counter() - started, 3))
    after = _manifests(cfg.root, cfg.run)
    # Where the last rerun's time went: the stage tasks (cache checks) against the flow runs.
    flow_runs = [
        r for t in range(cfg.iterations + 1) for r in _flow_runs(f"{cfg.run}-iter-{t}", since)
    ]
    (top,) = _flow_runs(cfg.run, since, launch=True)[-1:]
    # The server files task runs from their events, a moment after the run: wait for all.
    stage_tasks: list[Any] = []

    def all_filed() -> bool:
        tasks = [tr for fr in (top, *flow_runs) for tr in _task_runs(fr.id).values()]
        stage_tasks[:] = [tr for tr in tasks if tr.state_name == "Cached"]
        return len(stage_tasks) >= len(before)

    with contextlib.suppress(PollTimeout):  # report what was filed by then
        wait_until(all_filed, 30, interval_s=0.5, what="cached task runs filed")
    changed = sorted(os.path.relpath(p, cfg.root) for p in before if before[p] != after.get(p))
    median = sorted(times)[len(times) // 2]
    return {
        "seconds": median,
        "runs": times,
        "share": round(median / original_seconds, 4),
        "best_share": round(min(times) / original_seconds, 4),
        "retries_503": retries.count,
        "stages": len(before),
        "reexecuted": changed,
        "cached_tasks": len(stage_tasks),
        "cached_tasks_seconds": round(sum(_wall(tr) for tr in stage_tasks), 3),
        "flow_runs": 1 + len(flow_runs),
    }


def prefect_floor(tasks: int, repeats: int = 9) -> dict[str, Any]:
    """What Prefect itself costs an iteration of this shape here: a subflow of ``tasks`` task
    runs that do nothing, called from a flow as ``eva_run`` calls an iteration (each call timed
    by the caller; the median of nine is reported: single calls vary widely on a shared
    machine). No iteration's orchestration costs less on this machine: it is the API round
    trips of the subflow and the server's work on the task runs' events, against the same
    server."""
    from prefect import flow, task
    from prefect.cache_policies import NONE

    @task(name="eva-bench-noop", cache_policy=NONE, persist_result=False)
    def noop(i: int) -> int:
        return i

    @flow(name="eva-bench-iteration")
    def iteration(n: int) -> None:
        for i in range(n):
            noop(i)

    times: list[float] = []

    @flow(name="eva-bench-floor")
    def run() -> None:
        for _ in range(repeats):
            started = time.perf_counter()
            iteration(tasks)
            times.append(round(time.perf_counter() - started, 3))

    run()
    return {"tasks": tasks, "seconds": sorted(times)[len(times) // 2], "runs": times}


def above_floor(run: dict[str, Any], floor_seconds: float) -> None:
    """Split each iteration's overhead into Prefect's floor and what eva adds above it, as
    shares of the iteration's wall time (``floor_share``, ``eva_share``: the overhead's two
    parts, side by side)."""
    for it in run["iterations"]:
        it["floor_share"] = round(floor_seconds / it["wall"], 4)
        it["eva_share"] = round(it["overhead_share"] - floor_seconds / it["wall"], 4)


def prefect_startup() -> float:
    """Run an empty flow first (Prefect's client, its event workers), so later timings
    exclude what the first flow run of a process pays once."""
    from prefect import flow

    @flow(name="eva-bench-warmup")
    def warmup() -> None:
        return None

    started = time.perf_counter()
    warmup()
    return round(time.perf_counter() - started, 3)

"""The eva-run deployment through a Prefect *process work pool*, as a team running workers
would: `prefect work-pool create`, `prefect deploy` of infra/prefect.yaml, a worker, and flow runs
triggered through the API. The second trigger of the same run finds every stage cached."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from flows.serve import PROJECT
from tasks.store import RunStore
from tests.conftest import tiny_run_config

pytestmark = pytest.mark.usefixtures("prefect_api")
POOL = "eva-local"  # the pool infra/prefect.yaml names


def _prefect(*args: str, env: dict[str, str], cwd: str = PROJECT) -> str:
    exe = os.path.join(os.path.dirname(sys.executable), "prefect")
    done = subprocess.run(
        [exe, "--no-prompt", *args], env=env, cwd=cwd, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


def _trigger_and_work(name: str, env: dict[str, str], parameters: dict) -> object:
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment

    scheduled = run_deployment(name, parameters=parameters, timeout=0, as_subflow=False)
    # One polling pass: the worker starts the scheduled run in a subprocess and waits for it.
    _prefect("worker", "start", "--pool", POOL, "--type", "process", "--run-once", env=env)
    with get_client(sync_client=True) as client:
        return client.read_flow_run(scheduled.id)


def test_a_process_work_pool_runs_the_deployment_and_a_rerun_is_cached(tmp_path: Path) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterParentFlowRunId,
        TaskRunFilter,
        TaskRunFilterFlowRunId,
    )
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value()), "PYTHONPATH": PROJECT}
    root = str(tmp_path / "runs")
    _prefect("work-pool", "create", POOL, "--type", "process", env=env)
    # The project's own deployment file, as the README says to deploy it (from the project:
    # prefect records it as the runs' working directory). A trigger from the UI or the API may
    # replace parameters; here a tiny run instead of the demo world.
    _prefect("deploy", "--all", "--prefect-file", "infra/prefect.yaml", env=env)
    tiny = {"config": tiny_run_config(root, run="pooled"), "advance": 0}

    first = _trigger_and_work("eva-run/eva-run", env, tiny)
    assert first.state is not None and first.state.is_completed(), first.state
    assert os.path.isdir(os.path.join(root, "pooled", "iter_1", "model"))
    second = _trigger_and_work("eva-run/eva-run", env, tiny)
    assert second.state is not None and second.state.is_completed(), second.state
    # Every stage of the second run came back Cached, in the launch and in its iterations.
    with get_client(sync_client=True) as client:
        subflows = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[second.id])
            )
        )
        ids = {second.id, *(f.id for f in subflows)}
        runs = [  # filtered by the server: the API pages, and the suite shares it
            t
            for t in client.read_task_runs(
                task_run_filter=TaskRunFilter(flow_run_id=TaskRunFilterFlowRunId(any_=list(ids)))
            )
            if t.state
        ]
    # Stage task runs are named "{artifact}-{setup|iter-t}"; the rest track subflows.
    store = RunStore(root, "pooled")
    made = {a for i in (None, *store.iterations()) for a in store.artifacts(i)}
    stages = {t.name: t.state.name for t in runs if t.name.split("-")[0] in made}
    assert len(stages) >= 10 and set(stages.values()) == {"Cached"}, stages

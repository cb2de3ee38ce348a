"""The eva-run deployment against a real Prefect API: served from another directory by
`eva serve`, each trigger through the API continues the run by one iteration."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from flows.run import finished_iterations
from flows.serve import PROJECT, deployment_config
from tasks.store import RunStore
from tests.conftest import tiny_run_config

pytestmark = pytest.mark.usefixtures("prefect_api")


def test_a_relative_root_is_under_the_project_whoever_serves_it(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # served from elsewhere
    config = deployment_config(str(tmp_path / "spec.yaml"), {"config": {"root": "runs-x"}})
    assert config["root"] == os.path.join(PROJECT, "runs-x")
    absolute = str(tmp_path / "r")
    assert deployment_config("spec.yaml", {"config": {"root": absolute}})["root"] == absolute


def _wait_for_deployment(name: str, proc: subprocess.Popen, seconds: float = 120) -> None:
    from prefect.client.orchestration import get_client

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"eva serve exited: {proc.stdout.read() if proc.stdout else ''}")
        with get_client(sync_client=True) as client:
            try:
                client.read_deployment_by_name(name)
                return
            except Exception:  # not registered yet
                time.sleep(1)
    raise AssertionError(f"{name} was not served within {seconds} s")


def test_each_trigger_of_the_served_deployment_advances_the_run(tmp_path: Path) -> None:
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL

    root = str(tmp_path / "runs")
    spec = {
        "name": "eva",
        "deployments": [
            {
                "name": "eva-run",
                "entrypoint": "flows/run.py:eva_run",
                # iterations is ignored when advancing: each trigger adds one.
                "parameters": {
                    "advance": 1,
                    "config": {**tiny_run_config(root, run="nightly"), "iterations": 9},
                },
            }
        ],
    }
    (tmp_path / "prefect.yaml").write_text(yaml.safe_dump(spec))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {
        **os.environ,
        "PREFECT_API_URL": str(PREFECT_API_URL.value()),
        "PYTHONPATH": PROJECT,  # this checkout, whatever is installed
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "serve", "--file", str(tmp_path / "prefect.yaml")],
        cwd=elsewhere,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        _wait_for_deployment("eva-run/eva-run", proc)
        store = RunStore(root, "nightly")
        first = run_deployment("eva-run/eva-run", timeout=600, poll_interval=1, as_subflow=False)
        assert first.state is not None and first.state.is_completed(), first.state
        assert finished_iterations(store) == 1
        trained_1 = store.read_manifest(1, "train")
        second = run_deployment("eva-run/eva-run", timeout=600, poll_interval=1, as_subflow=False)
        assert second.state is not None and second.state.is_completed(), second.state
        # The second trigger trained iteration 2 and reused iteration 1 as it was.
        assert finished_iterations(store) == 2
        assert store.read_manifest(1, "train") == trained_1
        assert store.read_manifest(3, "train") is None
        # Reruns of one run tell apart by name: the run, the advance, the start time.
        assert first.name.startswith("nightly+1 @") and second.name.startswith("nightly+1 @")
        assert first.name != second.name
        # It wrote where its config says, not under the directory it was served from.
        assert os.listdir(elsewhere) == []
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_eva_run_reports_to_a_local_server_that_is_already_running(tmp_path: Path) -> None:
    # The suite's Prefect API stands in for `prefect server start`: eva, given no API URL, finds
    # it where such a server listens, runs there (no temporary server) and the run stays in it.
    from urllib.parse import urlsplit

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
    from prefect.settings import PREFECT_API_URL

    api = urlsplit(str(PREFECT_API_URL.value()))
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(tiny_run_config(str(tmp_path / "runs"), run="found")))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update(PREFECT_SERVER_API_HOST=str(api.hostname), PREFECT_SERVER_API_PORT=str(api.port))
    cli = [sys.executable, "-c", "import sys; from flows.cli import main; sys.exit(main())"]
    done = subprocess.run(
        [*cli, "run", "--config", str(config), "--set", "iterations=0"],
        env=env, cwd=PROJECT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert f"already running at http://{api.hostname}:{api.port}/api" in out
    assert "temporary" not in out  # neither Prefect's temporary server nor eva's
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_="found @"))
        )
    assert [r.state.type.value for r in runs if r.state] == ["COMPLETED"]


def test_the_probe_finds_a_prefect_api_and_nothing_else(monkeypatch) -> None:
    from urllib.parse import urlsplit

    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_SERVER_API_HOST,
        PREFECT_SERVER_API_PORT,
        get_current_settings,
        temporary_settings,
    )

    from eva_runtime.prefect_api import local_server_url, prefect_api
    from tests.support.openai_server import OpenAICompatibleServer

    api = urlsplit(str(PREFECT_API_URL.value()))
    at = {PREFECT_SERVER_API_HOST: api.hostname, PREFECT_SERVER_API_PORT: api.port}
    with temporary_settings(updates=at):
        assert local_server_url() == f"http://{api.hostname}:{api.port}/api"
    # An HTTP server that is not Prefect's (404 on /api/health), then nothing on that port.
    with OpenAICompatibleServer() as other:
        port = int(urlsplit(other.base_url).port or 0)
        with temporary_settings(updates={**at, PREFECT_SERVER_API_PORT: port}):
            assert local_server_url() is None
    with temporary_settings(updates={**at, PREFECT_SERVER_API_PORT: port}):  # now closed
        assert local_server_url() is None
    # No API configured: the running server is used, unless told to start a temporary one.
    with temporary_settings(updates=at, restore_defaults={PREFECT_API_URL}):
        with prefect_api() as url:
            assert url == f"http://{api.hostname}:{api.port}/api" == PREFECT_API_URL.value()
            assert get_current_settings().flows.heartbeat_frequency == 180  # a lasting server
        monkeypatch.setenv("EVA_PREFECT_SERVER", "temporary")
        with prefect_api() as url:
            assert url != f"http://{api.hostname}:{api.port}/api" and url == PREFECT_API_URL.value()
            assert httpx.get(f"{url}/health", trust_env=False).json() is True
            # Nothing reads heartbeats on the temporary server, and each costs a flow run
            # up to a second at its end: off.
            assert get_current_settings().flows.heartbeat_frequency is None
        with pytest.raises(httpx.ConnectError):  # stopped with the body
            httpx.get(f"{url}/health", trust_env=False)

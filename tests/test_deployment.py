"""The eva-run deployment against a real Prefect API: served from another directory by
`eva serve`, each trigger through the API continues the run by one iteration."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

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

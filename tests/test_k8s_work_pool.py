"""The Kubernetes work pool against a real Prefect API: created from infra/k8s's template by the
CLI, read back, the deployments of infra/k8s/prefect.yaml deployed to it, and the Job manifest a
Kubernetes worker would submit for a flow run, built by prefect-kubernetes' own job
configuration (no cluster: nothing is submitted)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from flows.serve import PROJECT, deployment_config

pytestmark = pytest.mark.usefixtures("prefect_api")
TEMPLATE = Path(PROJECT) / "infra/k8s/base-job-template.json"
SPEC = Path(PROJECT) / "infra/k8s/prefect.yaml"
POOL = "eva-k8s"  # the name infra/k8s/prefect.yaml deploys to


def _prefect(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value()), "PYTHONPATH": PROJECT}
    exe = os.path.join(os.path.dirname(sys.executable), "prefect")
    done = subprocess.run(
        [exe, "--no-prompt", *args], env=env, cwd=PROJECT, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    if check:
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done


def _container(manifest: dict[str, Any]) -> dict[str, Any]:
    return manifest["spec"]["template"]["spec"]["containers"][0]


def test_the_deployments_parameters_are_valid_run_configs() -> None:
    for d in yaml.safe_load(SPEC.read_text())["deployments"]:
        config = deployment_config(str(SPEC), d["parameters"])  # resolves extends, validates
        assert config["run"] == d["parameters"]["config"]["run"]
    assert config["train"]["nodes"]["machines"] == 2 and config["train"]["num_processes"] == 16


def test_a_broken_template_is_refused(tmp_path: Path) -> None:
    template = json.loads(TEMPLATE.read_text())
    limits = _container(template["job_configuration"]["job_manifest"])["resources"]["limits"]
    limits["nvidia.com/gpu"] = "{{ gpu_count }}"  # a placeholder with no variable behind it
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(template))
    done = _prefect(
        "work-pool", "create", "eva-k8s-broken", "--type", "kubernetes",
        "--base-job-template", str(broken), check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert "undeclared variable(s): gpu_count" in done.stdout + done.stderr


def test_the_pool_runs_flow_runs_as_gpu_jobs() -> None:
    from prefect.client.orchestration import get_client
    from prefect.exceptions import PrefectHTTPStatusError

    _prefect("work-pool", "create", POOL, "--type", "kubernetes",
             "--base-job-template", str(TEMPLATE))  # fmt: skip
    with get_client(sync_client=True) as client:
        pool = client.read_work_pool(POOL)
    assert pool.type == "kubernetes"
    assert pool.base_job_template == json.loads(TEMPLATE.read_text())  # stored as written

    _prefect("deploy", "--all", "--prefect-file", str(SPEC))
    single = _job_manifest("eva-run/eva-run-k8s")
    container = _container(single)
    assert container["image"] == "registry.example.com/eva:0.1.0"
    assert container["resources"]["limits"] == {"nvidia.com/gpu": 8}
    assert container["workingDir"] == "/opt/eva"
    env = {e["name"]: e for e in container["env"]}
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        ref = {"name": "eva-s3", "key": key, "optional": True}
        assert env[key]["valueFrom"] == {"secretKeyRef": ref}, env[key]
    assert "PREFECT__FLOW_RUN_ID" in env  # the worker's own variables are still there
    assert container["args"][:3] == ["prefect", "flow-run", "execute"]
    pod = single["spec"]["template"]["spec"]
    assert pod["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    assert container["volumeMounts"] == [{"name": "dshm", "mountPath": "/dev/shm"}]
    assert "hostname" not in pod and "subdomain" not in pod  # unset variables leave no key

    # Machine 0 of the two-machine deployment: the stable name the follower Job dials.
    two = _job_manifest("eva-run/eva-run-k8s-2x8")
    pod = two["spec"]["template"]["spec"]
    assert (pod["hostname"], pod["subdomain"]) == ("eva-train-0", "eva-train")
    assert pod["volumes"][1] == {"name": "runs", "persistentVolumeClaim": {"claimName": "eva-runs"}}
    assert _container(two)["volumeMounts"][1] == {"name": "runs", "mountPath": "/mnt/eva"}
    # The headless Service of infra/k8s/train-nodes.yaml selects machine 0 by this label.
    assert two["spec"]["template"]["metadata"]["labels"]["app"] == "eva-train"

    # A run's job variables are checked against the template's schema by the server.
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name("eva-run/eva-run-k8s")
        with pytest.raises(PrefectHTTPStatusError, match="Validation failed for field 'gpus'"):
            client.create_flow_run_from_deployment(deployment.id, job_variables={"gpus": "x"})


def _job_manifest(name: str) -> dict[str, Any]:
    """The Job a Kubernetes worker would create for a new flow run of deployment ``name``."""
    from prefect.client.orchestration import get_client
    from prefect_kubernetes.worker import KubernetesWorker

    async def build() -> dict[str, Any]:
        async with get_client() as client:
            deployment = await client.read_deployment_by_name(name)
            flow_run = await client.create_flow_run_from_deployment(deployment.id)
            pool = await client.read_work_pool(POOL)
            config = await KubernetesWorker.job_configuration.resolve_for_flow_run(
                flow_run, client=client, work_pool=pool, worker_name="test", deployment=deployment
            )
            return dict(config.job_manifest)

    return asyncio.run(build())

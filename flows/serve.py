"""Serve the eva-run deployment declared in ``infra/prefect.yaml`` to a Prefect API."""

from __future__ import annotations

import os

import yaml
from prefect.schedules import Cron, Interval

from flows.config import PROJECT_DIR, resolve_extends, validate_config
from flows.run import eva_run

# Entrypoints (flows/run.py) and relative run roots are read against the project root, so a
# deployment writes where its config says whoever serves it and from wherever.
PROJECT = PROJECT_DIR


def deployment_config(spec_path: str, parameters: dict) -> dict:
    """The deployment's ``config`` parameter resolved like a config file (its ``extends:`` is
    relative to the project root, as for any config given as data), a relative ``root`` made
    absolute under the project root, validated, and given in full, so the UI's form shows
    every field."""
    data = resolve_extends(parameters.get("config") or {}, PROJECT)
    root = str(data.get("root", "runs"))
    if "://" not in root:
        data["root"] = os.path.join(PROJECT, os.path.expanduser(root))
    return validate_config(data).model_dump(mode="json")


def serve(path: str) -> None:
    path = os.path.abspath(path)
    with open(path) as f:
        spec = yaml.safe_load(f)
    deployments = [d for d in spec.get("deployments", []) if d["entrypoint"].endswith(":eva_run")]
    if not deployments:
        raise SystemExit(f"eva: error: {path}: no deployment with entrypoint ...:eva_run")
    d = deployments[0]
    schedules = []
    for s in d.get("schedules") or []:
        if "cron" in s:
            schedules.append(
                Cron(s["cron"], timezone=s.get("timezone"), active=s.get("active", True))
            )
        elif "interval" in s:
            schedules.append(Interval(s["interval"], active=s.get("active", True)))
    # Prefect records the entrypoint relative to the working directory and runs it from there.
    os.chdir(PROJECT)
    eva_run.serve(
        name=d["name"],
        description=d.get("description"),
        tags=d.get("tags"),
        parameters={
            **(d.get("parameters") or {}),
            "config": deployment_config(path, d.get("parameters") or {}),
        },
        schedules=schedules or None,
    )

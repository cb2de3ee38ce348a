"""Serve the eva-run deployment declared in ``infra/prefect.yaml`` to a Prefect API."""

from __future__ import annotations

import os

import yaml
from prefect.schedules import Cron, Interval

from flows.config import resolve_extends, validate_config
from flows.run import eva_run


def deployment_config(spec_path: str, parameters: dict) -> dict:
    """The deployment's ``config`` parameter resolved like a config file (its ``extends:`` is
    relative to the spec), validated, and given in full, so the UI's form shows every field."""
    data = resolve_extends(
        parameters.get("config") or {}, os.path.dirname(os.path.abspath(spec_path))
    )
    return validate_config(data).model_dump(mode="json")


def serve(path: str) -> None:
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

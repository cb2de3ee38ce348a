"""Serve the eva-run deployment declared in ``infra/prefect.yaml`` to a Prefect API."""

from __future__ import annotations

import yaml
from prefect.schedules import Cron, Interval

from flows.run import eva_run


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
        parameters=d.get("parameters") or {},
        schedules=schedules or None,
    )

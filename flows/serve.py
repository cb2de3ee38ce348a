"""Serve the eva-run deployment declared in ``infra/prefect.yaml`` to a Prefect API."""

from __future__ import annotations

import os
from typing import Any

import yaml

from eva_runtime.errors import ConfigError, first_line
from flows.config import PROJECT_DIR, validate_config
from flows.config_layers import resolve_extends

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


def read_deployment(path: str) -> dict[str, Any]:
    """The file's first deployment of ``eva_run``, or a ``ConfigError`` in one line naming the
    file: checked before a Prefect API is opened or anything is served."""
    path = os.path.abspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            spec = yaml.safe_load(f)
    except FileNotFoundError:
        raise ConfigError(
            f"no file at {path}",
            field="--file",
            hint="eva serve reads infra/prefect.yaml of a checkout of eva; pass --file",
        ) from None
    except IsADirectoryError:
        raise ConfigError(f"{path} is a directory, not a YAML file", field="--file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})", field="--file") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(f"{path}:{where}: {problem}", field="--file") from None
    found = spec.get("deployments") if isinstance(spec, dict) else None
    deployments = [
        d
        for d in (found if isinstance(found, list) else [])
        if isinstance(d, dict) and str(d.get("entrypoint", "")).endswith(":eva_run")
    ]
    if not deployments:
        raise ConfigError(
            f"{path}: no deployment with entrypoint ...:eva_run under deployments:",
            field="--file",
            hint="see the project's infra/prefect.yaml",
        )
    d: dict[str, Any] = deployments[0]
    if not isinstance(d.get("parameters") or {}, dict):
        raise ConfigError(f"{path}: {d.get('name')}: parameters: expected a mapping")
    if not d.get("name"):
        raise ConfigError(f"{path}: the eva_run deployment has no name")
    return d


def check(path: str) -> None:
    """Everything ``serve`` reads, checked before a Prefect API is opened: the file, its
    deployment, the run config the deployment gives, its ``advance`` and its schedules."""
    d = read_deployment(path)
    _config(path, d)
    _advance(path, d)
    _schedules(path, d)


def _config(path: str, d: dict[str, Any]) -> dict[str, Any]:
    try:
        return deployment_config(path, d.get("parameters") or {})
    except ConfigError as exc:
        raise ConfigError(f"{os.path.abspath(path)}: parameters.config.{exc.line()}") from None


def _advance(path: str, d: dict[str, Any]) -> None:
    """``parameters.advance``: how many iterations each scheduled run adds, a whole number >= 0."""
    advance = (d.get("parameters") or {}).get("advance", 0)
    if isinstance(advance, bool) or not isinstance(advance, int) or advance < 0:
        raise ConfigError(
            f"{path}: parameters.advance: {advance!r} is not a whole number >= 0",
            hint="the iterations each scheduled run adds past the last one finished (0: none)",
        )


_SCHEDULE_KEYS = {"cron": {"cron", "timezone", "active"}, "interval": {"interval", "active"}}


def _schedules(path: str, d: dict[str, Any]) -> list[Any]:
    """Prefect schedules from the deployment's ``schedules:``; each entry a mapping with one of
    ``cron`` or ``interval`` (seconds > 0), anything else refused in one line: Prefect would
    drop a bare string without a word, and fail on a negative interval with a traceback."""
    from prefect.schedules import Cron, Interval

    found = d.get("schedules") or []
    if not isinstance(found, list):
        raise ConfigError(f"{path}: schedules: expected a list, got {found!r}")
    schedules: list[Any] = []
    for i, s in enumerate(found):
        where = f"{path}: schedules[{i}]: {s!r}"
        if not isinstance(s, dict):
            raise ConfigError(
                f"{where}: expected a mapping", hint=f"write it as {{cron: {str(s)!r}}}"
            )
        kinds = [k for k in _SCHEDULE_KEYS if k in s]
        if len(kinds) != 1:
            raise ConfigError(f"{where}: give exactly one of cron or interval")
        if unknown := sorted(set(s) - _SCHEDULE_KEYS[kinds[0]]):
            raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}")
        active = s.get("active", True)
        try:
            if kinds[0] == "cron":
                schedules.append(Cron(s["cron"], timezone=s.get("timezone"), active=active))
                continue
            seconds = s["interval"]
            if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds <= 0:
                raise ValueError("interval is a number of seconds > 0")
            schedules.append(Interval(seconds, active=active))
        except (TypeError, ValueError, KeyError) as exc:
            raise ConfigError(f"{where}: {first_line(exc, with_type=False)}") from None
    return schedules


def serve(path: str) -> None:
    from flows.run import eva_run  # the flow (torch, via the stages) once the file is read

    d = read_deployment(path)
    config = _config(path, d)
    _advance(path, d)
    schedules = _schedules(path, d)
    # Prefect records the entrypoint relative to the working directory and runs it from there.
    os.chdir(PROJECT)
    eva_run.serve(
        name=d["name"],
        description=d.get("description"),
        tags=d.get("tags"),
        parameters={**(d.get("parameters") or {}), "config": config},
        schedules=schedules or None,
    )

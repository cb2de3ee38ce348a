"""Finding an existing run: its stored config, its size, and close matches for what a user typed.

``eva stage`` and ``eva show`` address a run that a launch left under a root; everything they
need is read back from the run's folder. The folder is the run: its root and its name are those
given on the command line, never the ones its config.json recorded, so a run copied, renamed or
moved (``cp -a runs/demo runs/demo2``) is shown and rerun where it now is, and never reads,
writes or locks the folder it came from.
"""

from __future__ import annotations

import json
import os
from typing import Any

from eva_runtime.errors import ConfigError, first_line, shorten
from flows.config import RUN_NAME, OnlineRunConfig, RunConfig, validate_config
from flows.explain import close_match
from tasks.store import RunStore


def stored_config(
    root: str, run: str, storage_options: dict[str, Any] | None = None
) -> RunConfig | OnlineRunConfig:
    """The config a run was last launched with (an offline or an online run's), as the run at
    ``root``/``run``: the stored ``root`` and ``run`` name where the run was when it was last
    launched (another folder, for a copy) and are replaced by these. ``storage_options`` open
    the root (an S3 endpoint, credentials) and take precedence over the stored ones."""
    if not RUN_NAME.fullmatch(run):
        raise ConfigError(
            f"--run {shorten(repr(run))}: a run name (letters, digits, '_', '.', '-'; at most "
            "128 characters), not a path"
        )
    root = os.path.abspath(root) if "://" not in root else root
    given = dict(storage_options or {})
    store = RunStore(root, run, given)
    where = f"{store.base}/config.json"
    try:
        with store.fs.open(where) as f:
            data = json.load(f)
    except FileNotFoundError:
        near = close_match(run, runs_under(store))
        hint = f"did you mean --run {near}?" if near else "start it with `eva run`"
        raise ConfigError(f"--run {run}: no run at {store.base}", hint=hint) from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--run {run}: {where} is not a run config ({exc.msg})") from None
    except Exception as exc:  # a root that is a file, an S3 endpoint that does not answer
        raise ConfigError(f"--root {root}: cannot read {where} ({first_line(exc)})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--run {run}: {where} is not a run config (not a mapping)")
    data["root"], data["run"] = root, run  # the folder it is in, not the one it was copied from
    data["storage_options"] = {**data.get("storage_options", {}), **given}
    if "online" in data:
        return validate_config(data, OnlineRunConfig)
    return validate_config(data, RunConfig)


def is_online(config: RunConfig | OnlineRunConfig) -> bool:
    return isinstance(config, OnlineRunConfig)


def last_iteration(config: RunConfig | OnlineRunConfig) -> int:
    """The last iteration (online: segment) the run's config asks for."""
    if isinstance(config, OnlineRunConfig):
        return config.online.segments(seed_count(config))
    return config.iterations


def check_iteration(config: RunConfig | OnlineRunConfig, iteration: int | None) -> None:
    """Refuse an ``--iteration`` the run does not have before anything is launched (no flow
    run, no config rewritten): an online run's segments are 1 to N, an offline run's
    iterations 0 (with ``iteration0_dpo``) or 1 to T; None is setup, which every run has."""
    if iteration is None:
        return
    last = last_iteration(config)
    if isinstance(config, OnlineRunConfig):
        first, step = 1, "segments"
    else:
        first, step = (0 if config.iteration0_dpo else 1), "iterations"
    if not first <= iteration <= last:
        has = f"{step} {first} to {last}" if first <= last else f"no {step}"
        raise ConfigError(
            f"--iteration {iteration}: run {config.run} has {has}",
            hint="--iteration setup addresses X_0, the held-out set and theta_0",
        )


def seed_count(config: RunConfig | OnlineRunConfig) -> int:
    """|D| of a run, from its finished prompts stage (0 when it has none)."""
    store = RunStore(config.root, config.run, config.storage_options)
    manifest = store.read_manifest(None, "prompts")
    return int(manifest["rows"]) if manifest else 0


def runs_under(store: RunStore) -> list[str]:
    """The runs next to ``store``'s (folders holding a config.json)."""
    parent = store.base.rsplit("/", 1)[0]
    try:
        found = store.fs.glob(f"{parent}/*/config.json")
    except Exception:  # an unreachable root: no suggestions, the caller's error says why
        return []
    return sorted(p.rsplit("/", 2)[-2] for p in found)

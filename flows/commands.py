"""What each ``eva`` command does, once ``flows.cli`` has parsed its arguments.

Every handler takes the parsed arguments and returns the exit status. Heavy imports (the
flows, torch through the stages) happen inside the handlers, so ``eva --help`` and a usage
error stay fast.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from typing import TypeVar

from eva_runtime.errors import ConfigError
from flows.config import OnlineRunConfig, RunConfig

T = TypeVar("T", RunConfig, OnlineRunConfig)


def load(args: argparse.Namespace, model: type[T]) -> T:
    """The config ``--config``/``--set`` and the shortcut flags ask for, checked at the edge."""
    from flows.config import load_config
    from flows.inputs import check_inputs

    overrides = list(args.set)
    for field in ("run", "root", "iterations", "seed"):
        value = getattr(args, field, None)
        if value is not None:
            # Names and paths stay text: `--run 2024` is a name, not the number 2024.
            text = json.dumps(value) if isinstance(value, str) else value
            overrides.append(f"{field}={text}")
    config = load_config(args.config, overrides, model)
    check_inputs(config)  # before any artifact is written
    _refuse_if_held(config)
    return config


def _refuse_if_held(config: RunConfig | OnlineRunConfig) -> None:
    """Another launch of this run is going on: refused in one line before a Prefect API and a
    flow start (the flow takes the run's lock itself)."""
    from tasks.run_lock import refuse_if_held
    from tasks.store import RunStore

    refuse_if_held(RunStore(config.root, config.run, config.storage_options))


def run(args: argparse.Namespace) -> int:
    config = load(args, RunConfig)  # refused here, in seconds, before any server starts
    from eva_runtime.prefect_api import prefect_api
    from flows.run import eva_run
    from flows.summary import summary_table

    with prefect_api() as api:  # PREFECT_API_URL, else a running local server, else temporary
        ui = _ui_url()
        rows = eva_run(config)
    print(f"\neva run '{config.run}' under {config.root}\n{summary_table(rows)}")
    print(next_steps(config, ui if _lasting(api) else None))
    return 0


def online(args: argparse.Namespace) -> int:
    config = load(args, OnlineRunConfig)
    from eva_runtime.prefect_api import prefect_api
    from flows.online import eva_online
    from flows.summary import summary_table

    with prefect_api() as api:
        ui = _ui_url()
        rows = eva_online(config)
    print(f"\neva online run '{config.run}' under {config.root}\n{summary_table(rows)}")
    print(next_steps(config, ui if _lasting(api) else None))
    return 0


def next_steps(config: RunConfig | OnlineRunConfig, ui: str | None) -> str:
    """What to do after a run: inspect it, and find it in the UI of a lasting Prefect server
    (a temporary one is gone with the command)."""
    where = f"--run {shlex.quote(config.run)} --root {shlex.quote(config.root)}"
    lines = [f"next: eva show {where}    (a stage's rows: add --iteration N --stage NAME)"]
    if ui:
        lines.append(f"      the run in the Prefect UI: {ui.rstrip('/')}/runs")
    return "\n".join(lines)


def _ui_url() -> str | None:
    """The UI of the Prefect API in effect (inside ``prefect_api``)."""
    from prefect.settings import PREFECT_UI_URL

    return PREFECT_UI_URL.value() or None


def _lasting(api: str) -> bool:
    """Whether the API the command reported to outlives it: a configured one, or a server that
    still answers now that the command's temporary one (if it used one) has stopped."""
    import httpx
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        return True
    try:
        return httpx.get(f"{api}/health", timeout=0.5, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def stage(args: argparse.Namespace) -> int:
    """Rerun one stage of a run (and, with --downstream, what depends on it): the flow runs
    as it always does, and the plan reuses every other stage and computes none."""
    from flows.runs import check_iteration, close_match, stored_config

    config = stored_config(args.root, args.run, args.storage_options)
    check_iteration(config, args.iteration)  # before a flow runs or the config is rewritten
    _refuse_if_held(config)
    from eva_runtime.prefect_api import prefect_api
    from flows.online import eva_online
    from flows.run import eva_run
    from flows.summary import summary_table
    from tasks.plan import Plan

    plan = Plan(
        target_iteration=args.iteration,
        target=args.name,
        force=args.force,
        downstream=args.downstream,
    )
    with prefect_api():
        if isinstance(config, OnlineRunConfig):
            rows = eva_online(config, plan)
        else:
            rows = eva_run(config, plan)
    if not plan.met():
        where = "setup" if args.iteration is None else f"iteration {args.iteration}"
        called = plan.called_at(args.iteration)
        near = close_match(args.name, called)
        hint = f"did you mean {near}?" if near else f"it runs {', '.join(called) or 'nothing'}"
        raise ConfigError(f"{args.name} does not run in {where} of {args.run}", hint=hint)
    print(summary_table(rows))
    return 0


def show(args: argparse.Namespace) -> int:
    from flows.runs import close_match, is_online, seed_count, stored_config
    from flows.summary import iteration_summary, online_summary, summary_table
    from tasks.store import RunStore

    config = stored_config(args.root, args.run, args.storage_options)
    store = RunStore(config.root, config.run, config.storage_options)
    if args.stage is None:
        if isinstance(config, OnlineRunConfig):
            rows = online_summary(store, config.online.segments(seed_count(config)))
        else:
            rows = iteration_summary(store, config)
        print(summary_table(rows))
        return 0
    manifest = store.read_manifest(args.iteration, args.stage)
    if manifest is None:
        step = "segment" if is_online(config) else "iteration"
        where = "setup" if args.iteration is None else f"{step} {args.iteration}"
        here = store.artifacts(args.iteration)
        later = [i for i in store.iterations() if args.stage in store.artifacts(i)]
        if args.iteration is None and later:
            hint = f"it is made in every {step}: add --iteration N (e.g. --iteration {later[0]})"
        elif near := close_match(args.stage, here):
            hint = f"did you mean {near}?"
        else:
            hint = f"{where} has {', '.join(here) or 'no artifacts'}"
        raise ConfigError(
            f"--stage {args.stage}: no such artifact in {where} of {args.run}", hint=hint
        )
    print(
        json.dumps(
            {k: manifest[k] for k in ("uri", "rows", "seconds", "stats", "content_hash")},
            indent=2,
            default=str,
        )
    )
    table = store.read_table(manifest["uri"]).slice(0, args.rows)
    for row in table.to_pylist():
        print(json.dumps(row, default=str)[:400])
    return 0


def train_node(args: argparse.Namespace) -> int:  # runs no flow: no Prefect API
    from eva_runtime.follow import follow, request_dir
    from flows.config import RUN_NAME

    if not RUN_NAME.fullmatch(args.run):
        raise ConfigError(f"--run {args.run!r}: a run name (letters, digits, '_', '.', '-')")
    if "://" in args.root:
        raise ConfigError(f"--root {args.root}: multi-node training needs a shared filesystem path")
    folder = request_dir(os.path.join(os.path.abspath(args.root), args.run))
    status = follow(folder, rank=args.machine_rank, once=args.once, wait_s=args.wait)
    return 0 if status == 0 else 1


def serve(args: argparse.Namespace) -> int:
    from eva_runtime.prefect_api import prefect_api
    from flows.serve import check
    from flows.serve import serve as serve_deployment

    check(args.file)  # refused in one line before a Prefect API is opened
    with prefect_api():
        serve_deployment(args.file)
    return 0


def config(args: argparse.Namespace) -> int:
    """What a recipe and its overrides amount to, before any GPU hour is spent on them."""
    import yaml

    from flows.config import load_config

    model = OnlineRunConfig if args.online else RunConfig
    resolved = load_config(args.config, list(args.set), model)
    if args.explain:
        from flows.explain import explain

        print("\n".join(explain(resolved)))
        return 0
    print(yaml.safe_dump(resolved.model_dump(mode="json"), sort_keys=False))
    return 0


def bench(args: argparse.Namespace) -> int:
    """The benchmarks are their own program (``python -m bench``): the method does not import
    the benchmark code, it only starts it."""
    argv = [*(["--quick"] if args.quick else []), "--root", args.root, "--out", args.out]
    return subprocess.call([sys.executable, "-m", "bench", *argv])

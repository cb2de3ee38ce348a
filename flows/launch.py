"""What every eva flow does first and last: check inputs, open the run, publish its summary."""

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from eva_runtime.accelerate import write_run_finished
from eva_runtime.engines import ENGINES
from eva_runtime.follow import request_dir
from eva_runtime.prefect_ui import POSTER, REUSED, publish_markdown
from flows.config import OnlineRunConfig, RunConfig
from flows.inputs import check_inputs
from flows.summary import summary_markdown
from tasks.context import RunContext
from tasks.plan import Plan
from tasks.run_lock import run_lock
from tasks.store import RunStore
from tasks.versions import edited_line, edited_stages


@contextmanager
def opened_run(
    config: RunConfig | OnlineRunConfig,
    plan: Plan | None,
    reads: tuple[str, ...] = ("prompts", "heldout"),
) -> Iterator[RunContext]:
    """The run, opened for the flow's body and closed after it, whatever the body raised.

    Opening checks inputs, the prompt sets among them that the flow ``reads`` (again: a run
    started from the UI never passed through the CLI), takes
    the run's lock (released on closing), sets the torch threads, sweeps what a killed launch
    left, and records the config being run. A whole run that finished releases the other
    machines of multi-node training. Closing stops the inference servers kept for a next stage
    (there is none now), posts the tables of reused stages, waits for the stages' summaries
    still queued for the UI and releases the lock."""
    check_inputs(config, reads)
    # One launch of a run at a time (tasks/run_lock.py), taken before anything is swept.
    with run_lock(RunStore(config.root, config.run, config.storage_options)):
        run = _open(config, plan)
        try:
            yield run
            _finished(config, run)
        finally:
            ENGINES.stop_all()
            REUSED.flush()
            POSTER.flush()


def _open(config: RunConfig | OnlineRunConfig, plan: Plan | None) -> RunContext:
    if config.torch_threads:
        import torch

        torch.set_num_threads(config.torch_threads)
    run = RunContext(
        root=config.root,
        run=config.run,
        seed=config.seed,
        storage_options=config.storage_options,
        plan=plan or Plan(),
    )
    store = run.store()
    store.sweep()  # staging copies and stage scratch of a killed launch
    say_edited_code(config, store)
    store.write_json(f"{store.base}/config.json", config.model_dump(mode="json"))
    return run


def say_edited_code(config: RunConfig | OnlineRunConfig, store: RunStore) -> str | None:
    """One warning line when a stage this run calls, or a component it selects, no longer has
    the code recorded for its version (tasks/versions.lock.json: a local edit without a bump)
    and the run has finished artifacts of that stage: the launch reuses them as they are.
    Returns the line (None when there is nothing to say)."""
    try:
        edited = edited_stages(config)
        line = edited_line(edited, _finished_stages(store)) if edited else None
    except Exception as exc:  # a check that cannot run must not stop a launch
        line = f"could not compare the code with tasks/versions.lock.json: {exc!r}"
    if line:
        _log().warning(line)
    return line


def _finished_stages(store: RunStore) -> set[str]:
    """The stages with a finished artifact in the run (any iteration), read from manifests."""
    paths = store.fs.glob(f"{store.base}/*/*.manifest.json")
    found = store.fs.cat(list(paths), on_error="return") if paths else {}  # one round on S3
    stages = set()
    for data in found.values():
        try:
            stages.add(str(json.loads(data)["stage"]))
        except (TypeError, ValueError, KeyError):
            continue  # unreadable (the sweep removed those it found) or no stage's
    return stages


def _log() -> logging.Logger | logging.LoggerAdapter:
    """The flow's logger inside a flow (so the UI shows the line), else eva's."""
    try:
        from prefect import get_run_logger

        return get_run_logger()
    except Exception:
        return logging.getLogger("eva.launch")


def _finished(config: RunConfig | OnlineRunConfig, run: RunContext) -> None:
    """A whole run (not ``eva stage``) that finished lets the machines that joined its
    trainings go: their ``eva train-node`` exits (a Kubernetes Job of them completes)."""
    if isinstance(config, RunConfig) and config.train.nodes.machines > 1 and not run.plan.target:
        write_run_finished(request_dir(run.store().base))


def run_name() -> str:
    """A flow run's name: the eva run, what the launch asks for, and when it started, so
    reruns of one run tell apart in the UI (``demo+1 @11-22 03:00``, ``demo evolve@1``)."""
    from prefect.runtime import flow_run

    p = flow_run.parameters
    config, plan = p.get("config"), p.get("plan")
    name = config["run"] if isinstance(config, dict) else getattr(config, "run", "eva")
    if p.get("advance"):
        name += f"+{p['advance']}"
    target = plan.get("target") if isinstance(plan, dict) else getattr(plan, "target", None)
    if target:
        it = plan["target_iteration"] if isinstance(plan, dict) else plan.target_iteration
        name += f" {target}@{'setup' if it is None else it}"
    started = flow_run.scheduled_start_time
    return f"{name} @{started:%m-%d %H:%M:%S}" if started else name


def publish_charts(run: str, markdown: str) -> None:
    """The run's charts (``flows.run_charts``) as a markdown artifact under a stable key."""
    description = "eva run charts: held-out, informativeness, curriculum, training"
    publish_markdown(run, "charts", markdown, description)


def publish_summary(run: str, rows: list[dict[str, Any]], title: str) -> None:
    """The run's summary table as a markdown artifact under a stable key."""
    publish_markdown(run, "summary", summary_markdown(run, rows, title=title), f"{title} summary")

"""What every eva flow does first and last: check inputs, open the run, publish its summary."""

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


@contextmanager
def opened_run(config: RunConfig | OnlineRunConfig, plan: Plan | None) -> Iterator[RunContext]:
    """The run, opened for the flow's body and closed after it, whatever the body raised.

    Opening checks inputs (again: a run started from the UI never passed through the CLI), takes
    the run's lock (released on closing), sets the torch threads, sweeps what a killed launch
    left, and records the config being run. A whole run that finished releases the other
    machines of multi-node training. Closing stops the inference servers kept for a next stage
    (there is none now), posts the tables of reused stages, waits for the stages' summaries
    still queued for the UI and releases the lock."""
    check_inputs(config)
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
    store.write_json(f"{store.base}/config.json", config.model_dump(mode="json"))
    return run


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

"""A run of T eva iterations, incremental from the last checkpoint.

Every stage is keyed on its config and its inputs' content, so launching the same run again
(after a crash, a kill -9, or from the UI) reuses every finished stage and runs the rest.
"""

from typing import Any

from prefect import flow

from flows.config import RunConfig
from flows.iteration import dpo_iteration, eva_iteration, setup
from flows.launch import opened_run, publish_charts, publish_summary, run_name
from flows.run_charts import run_charts
from flows.summary import iteration_summary
from tasks.plan import Plan
from tasks.store import RunStore


@flow(name="eva-run", flow_run_name=run_name)
def eva_run(config: RunConfig, plan: Plan | None = None, advance: int = 0) -> list[dict[str, Any]]:
    """``advance`` = k > 0 continues the run by k iterations past the last one it finished
    (``config.iterations`` is ignored): what a scheduled trigger of a deployment does."""
    if advance:
        reached = finished_iterations(RunStore(config.root, config.run, config.storage_options))
        config = config.model_copy(update={"iterations": reached + advance})
    with opened_run(config, plan) as run:
        # X_0, held-out, theta_0, and the reference answers of the judge (None without one)
        prompts, heldout, policy, answers = setup(run, config)

        step, older = None, None
        if config.iteration0_dpo:
            step = dpo_iteration(run, 0, config, prompts, policy, heldout, answers)
            policy = step.policy
        for t in range(1, config.iterations + 1):
            last = step.rollouts if step else None
            step = eva_iteration(run, t, config, prompts, policy, heldout, last, older, answers)
            prompts, policy, older = step.prompts, step.policy, last

        rows = iteration_summary(run.store(), config)
        publish_summary(config.run, rows, f"eva run, iteration {config.iterations}")
        publish_charts(config.run, run_charts(run.store(), config, rows))
        return rows


def finished_iterations(store: RunStore) -> int:
    """The last iteration t >= 1 whose checkpoint was evaluated (0 when none was)."""
    t = 0
    while store.read_manifest(t + 1, "evaluate") is not None:
        t += 1
    return t

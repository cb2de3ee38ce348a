"""Online eva (paper appendix A/B): theta_0, then an online RL solver whose prompts come from the
prioritized generative buffer, refreshed every mini-batch, in cached segments of S steps.

Each segment continues from the previous segment's checkpoint, which carries the buffer, so a
killed run relaunched with the same config resumes at the last finished segment and ends with
the same buffer and the same trained prompts as an uninterrupted run.
"""

from typing import Any

from prefect import flow
from prefect.artifacts import create_markdown_artifact

from flows.config import OnlineRunConfig
from flows.inputs import check_inputs
from flows.summary import online_summary, summary_markdown
from tasks.bootstrap import bootstrap
from tasks.evaluate import evaluate
from tasks.online import online
from tasks.prompts import load_heldout, load_prompts
from tasks.stage import Plan, RunContext


@flow(name="eva-online", flow_run_name="{config.run}")
def eva_online(config: OnlineRunConfig, plan: Plan | None = None) -> list[dict[str, Any]]:
    check_inputs(config)
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
    store.sweep()  # what a killed launch left: staging copies, stage scratch
    store.write_json(f"{store.base}/config.json", config.model_dump(mode="json"))

    seeds = load_prompts(run, None, config.prompts)  # D
    heldout = load_heldout(run, None, config.heldout, seed_set=seeds)
    policy = bootstrap(run, None, config.bootstrap, heldout=heldout)  # theta_0
    evaluate(run, None, config.evaluate, heldout=heldout, policy=policy)
    for segment in range(1, config.online.segments(seeds.rows) + 1):
        # S steps of RLOO; the buffer's state travels inside the checkpoint.
        policy = online(run, segment, config.online, seeds=seeds, heldout=heldout, policy=policy)
        evaluate(run, segment, config.evaluate, heldout=heldout, policy=policy)

    rows = online_summary(run.store(), config.online.segments(seeds.rows))
    create_markdown_artifact(
        summary_markdown(config.run, rows, title="eva online run"),
        key=f"{config.run.lower().replace('_', '-').replace('.', '-')}-summary",
        description="eva online run summary",
    )
    return rows

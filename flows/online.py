"""Online eva (paper appendix A/B): theta_0, then an online RL solver whose prompts come from the
prioritized generative buffer, refreshed every mini-batch, in cached segments of S steps.

Each segment continues from the previous segment's checkpoint, which carries the buffer, so a
killed run relaunched with the same config resumes at the last finished segment and ends with
the same buffer and the same trained prompts as an uninterrupted run.
"""

from typing import Any

from prefect import flow

from eva_runtime.prefect_ui import publish_markdown
from flows.config import OnlineRunConfig
from flows.iteration import setup
from flows.launch import opened_run, publish_summary, run_name
from flows.run_charts import online_run_charts
from flows.summary import online_summary
from tasks.evaluate import evaluate
from tasks.judge import judge
from tasks.online import online
from tasks.plan import Plan


@flow(name="eva-online", flow_run_name=run_name)
def eva_online(config: OnlineRunConfig, plan: Plan | None = None) -> list[dict[str, Any]]:
    with opened_run(config, plan) as run:
        seeds, heldout, policy, answers = setup(run, config)  # D, held-out, theta_0
        for segment in range(1, config.online.segments(seeds.rows) + 1):
            # S steps of RLOO; the buffer's state travels inside the checkpoint.
            policy = online(
                run, segment, config.online, seeds=seeds, heldout=heldout, policy=policy
            )
            evaluated = evaluate(
                run, segment, config.evaluation.without_judge(), heldout=heldout, policy=policy
            )
            if (judged := config.evaluation.judge) is not None and answers is not None:
                judge(run, segment, judged.without_reference(), evaluated=evaluated,
                      reference=answers)  # fmt: skip

        segments = config.online.segments(seeds.rows)
        rows = online_summary(run.store(), config, segments)
        publish_summary(config.run, rows, "eva online run")
        charts = online_run_charts(run.store(), config.run, rows)
        publish_markdown(
            config.run, "charts", charts,
            "eva online charts: held-out, reward and informativeness per step, buffer",
        )  # fmt: skip
        return rows

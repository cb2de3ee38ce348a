"""``eva evaluate``: a finished run's checkpoints scored on another held-out set, such as IFEval's
own 541 prompts, so that a figure eva prints can be set beside a published one.

It runs as stages of the run, under the run's lock: the held-out set is the ``heldout`` stage
again (artifact ``heldout_<name>``, disjoint from the run's training prompts as the run's own
is), and each checkpoint's answers the ``evaluate`` stage (artifact ``evaluate_<name>``) with the
run's evaluation config unless ``--set evaluate....`` changes it. Both are cached like every
stage: a rerun scores only what it has not, and ``eva show --stage evaluate_<name>`` shows the
answers. An instruction-following reward's counts give IFEval's four figures
(``ifeval_figures``).
"""

from __future__ import annotations

import re
from typing import Any

from prefect import flow
from pydantic import BaseModel, ConfigDict, Field

from eva_runtime.errors import ConfigError
from flows.config import OnlineRunConfig, RunConfig
from flows.launch import opened_run
from flows.markdown import md_table
from tasks.evaluate import EvaluateConfig, evaluate
from tasks.prompts import PromptsConfig, load_heldout
from tasks.provenance import ref_of
from tasks.store import Ref, RunStore

NAME = re.compile(r"[a-z][a-z0-9_]*")


class HeldoutEvaluation(BaseModel):
    """What ``eva evaluate`` scores the checkpoints on, and how."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str = Field(
        pattern=NAME.pattern,
        description="Names the artifacts (heldout_<name>, evaluate_<name>): lowercase letters, "
        "digits and _.",
    )
    heldout: PromptsConfig = Field(description="The held-out set, as the run's heldout reads one.")
    evaluate: EvaluateConfig = Field(description="Decoding and reward; default: the run's own.")


def checkpoints(store: RunStore, online: bool) -> list[int | None]:
    """The run's checkpoints, in order: theta_0 (None) and each iteration or segment that made
    one."""
    made = "online" if online else "train"
    found: list[int | None] = [None] if store.read_manifest(None, "bootstrap") else []
    t = 0
    while True:
        if store.read_manifest(t, made) is not None:
            found.append(t)
        elif t > 0:
            return found
        t += 1


def policy_ref(store: RunStore, t: int | None, online: bool) -> Ref:
    stage = "bootstrap" if t is None else "online" if online else "train"
    manifest = store.read_manifest(t, stage)
    if manifest is None or not manifest.get("model_uri"):
        where = "setup" if t is None else f"iteration {t}"
        raise ConfigError(f"the run has no checkpoint at {where}", field="--iteration")
    return ref_of(manifest)


@flow(name="eva-evaluate", validate_parameters=False)
def eva_evaluate(
    config: RunConfig | OnlineRunConfig, job: HeldoutEvaluation, iterations: list[int | None]
) -> list[dict[str, Any]]:
    """Each checkpoint of ``iterations`` (None: theta_0) scored on ``job.heldout``; one row of
    the evaluate stage's stats per checkpoint."""
    online = isinstance(config, OnlineRunConfig)
    # The run's own prompt files are not read: its X_0 comes from its store, from wherever
    # this is launched (a relative path recorded by a launch elsewhere names nothing here).
    with opened_run(config, None, reads=()) as run:
        store = run.store()
        seeds = store.read_manifest(None, "prompts")
        if seeds is None:
            raise ConfigError(f"run {config.run} has no prompts yet", field="--run")
        heldout = load_heldout(
            run, None, job.heldout, artifact=f"heldout_{job.name}", seed_set=ref_of(seeds)
        )
        rows = []
        for t in iterations:
            policy = policy_ref(store, t, online)
            evaluate(run, t, job.evaluate, artifact=f"evaluate_{job.name}",
                     heldout=heldout, policy=policy)  # fmt: skip
            manifest = store.read_manifest(t, f"evaluate_{job.name}")
            assert manifest is not None
            label = "theta_0" if t is None else t
            rows.append({"checkpoint": label, "prompts": manifest["rows"], **manifest["stats"]})
        return rows


def ifeval_figures(counts: dict[str, int], prompts: int) -> dict[str, float] | None:
    """IFEval's four figures from an instruction-following reward's counts over ``prompts``
    answers (an answer a checker failed on counts as not followed): prompt-level and
    instruction-level accuracy, strict and loose. None without those counts."""
    if "instructions_given" not in counts or not prompts:
        return None
    instructions = counts["instructions_given"]
    return {
        "prompt_strict": counts.get("all_followed_strict", 0) / prompts,
        "instruction_strict": counts.get("followed_strict", 0) / instructions,
        "prompt_loose": counts.get("all_followed_loose", 0) / prompts,
        "instruction_loose": counts.get("followed_loose", 0) / instructions,
    }


def ifeval_table(rows: list[dict[str, Any]]) -> str:
    """One line per checkpoint: its score, IFEval's four figures where the reward counts
    instructions, the truncated share and what went unscored."""
    header = ("checkpoint", "score", "prompt_strict", "instruction_strict", "prompt_loose",
              "instruction_loose", "truncated_share", "unscored")  # fmt: skip
    lines = []
    for row in rows:
        figures = ifeval_figures(row.get("reward", {}), row["prompts"]) or {}
        cells = [row["checkpoint"], row.get("score"), *(figures.get(k) for k in header[2:6]),
                 row.get("truncated_share"), row.get("unscored")]  # fmt: skip
        lines.append(["-" if c is None else f"{c:.3f}" if isinstance(c, float) else str(c)
                      for c in cells])  # fmt: skip
    return "\n".join(md_table(header, lines))

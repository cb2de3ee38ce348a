"""The benchmark's baselines: iterative DPO on new prompts every iteration instead of evolved ones.

These are arms of the benchmark, not features of eva: they need a prompt source that can draw
as many new prompts as asked (the built-in world's distributions), which a user's prompt file
is not. Each iteration t trains on split t of a stream:

* ``fresh``: new prompts of the seed distribution (the paper's "+new seed prompts" baseline);
* ``target``: new prompts of the held-out (target) distribution itself, never the held-out
  prompts: the upper bound of what a prompt set can give.

The flow is the method's own solver step (``flows.iteration.dpo_iteration``) on those splits;
only the prompts differ from an eva run.
"""

from __future__ import annotations

from typing import Any, Literal

import pyarrow as pa
from prefect import flow

from eva_core.schema import PROMPT_COLUMNS, seed_records
from eva_world.components import WorldPrompts
from flows.config import RunConfig
from flows.iteration import dpo_iteration, setup
from flows.launch import opened_run, publish_summary, run_name
from flows.summary import iteration_summary
from tasks.context import StageContext, StageOutput, stage_seed
from tasks.prompts import PromptsConfig
from tasks.stage import stage

Baseline = Literal["fresh", "target"]


def world_sizes(prompts: int, heldout: int | None = None) -> dict[str, Any]:
    """Config fields (to deep-merge onto configs/world.yaml) that size the world's seed and
    held-out prompt sets."""
    out: dict[str, Any] = {"prompts": {"source": {"options": {"size": prompts}}}}
    if heldout is not None:
        out["heldout"] = {"source": {"options": {"size": heldout}}}
    return out


def sft_steps(steps: int) -> dict[str, Any]:
    """Config fields that shorten the world's theta_0 SFT."""
    return {"bootstrap": {"builder": {"options": {"sft": {"steps": steps}}}}}


def start_from(checkpoint: str) -> dict[str, Any]:
    """The bootstrap section of a run that starts from a checkpoint, not the world's SFT."""
    return {"init_checkpoint": checkpoint, "builder": None}


# Split t takes the start of the t-th window of WINDOW x size prompts after X_0 (the stream's
# first ``size``). Two, not more: the benchmark's seed distribution holds about 15,000 prompts,
# and X_0 plus three iterations' windows must fit in it.
WINDOW = 2


def split_source(config: RunConfig, arm: Baseline, topup: float = 1.0) -> PromptsConfig:
    """The prompt source an arm splits: the seed set's, or the target distribution at the seed
    set's size; ``topup`` (up to ``WINDOW``) grows every split to reach the pair budget."""
    if not 1.0 <= topup <= WINDOW:
        raise ValueError(f"topup must be in [1, {WINDOW}] (got {topup})")
    source = config.prompts.source
    if source is None or config.prompts.path is not None:
        raise ValueError(f"the {arm} arm draws new prompts: prompts needs a source, not a file")
    if arm == "target":  # whatever the held-out set is drawn from, at the seed set's size
        held = config.heldout.source
        if held is None or config.heldout.path is not None:
            raise ValueError("the target arm draws from the held-out set's source, not a file")
        distribution = held.options.get("distribution", "seed")
        options = {**source.options, "distribution": distribution, "stream": "target"}
        source = source.model_copy(update={"options": options})
    if topup != 1.0:
        source = source.model_copy(update={"options": {**source.options, "topup": topup}})
    return PromptsConfig(source=source)


@stage(
    "split",
    version=4,
    inputs={"heldout": ("prompt",), "seed_set": ("prompt",)},
    outputs=PROMPT_COLUMNS,
)
def load_split(
    ctx: StageContext, config: PromptsConfig, heldout: pa.Table, seed_set: pa.Table
) -> StageOutput:
    """Split t of a baseline arm: ``size`` (x ``topup``) new prompts for iteration t.

    Every split of an arm comes from one seeded stream that skips the held-out prompts. For the
    seed distribution the stream has X_0's seed, so it starts with X_0; split t takes the start
    of the t-th window of ``WINDOW`` x ``size`` prompts after it. Splits thus never repeat X_0
    ("+new seed prompts" never retrains on it) or one another, whatever their top-up, and
    never touch the held-out set. The target distribution (the upper-bound arm) has a stream
    of its own seed, which skips X_0 as well.
    """
    assert config.source is not None and ctx.iteration is not None
    options: dict[str, Any] = dict(config.source.options)
    size = int(options.pop("size", 256))
    take = round(size * float(options.pop("topup", 1.0)))
    name = str(options.pop("stream", "prompts"))  # "prompts": X_0's own stream
    exclude = set(heldout.column("prompt").to_pylist())
    if name != "prompts":
        exclude |= set(seed_set.column("prompt").to_pylist())
    window, start = WINDOW * size, size + (ctx.iteration - 1) * WINDOW * size
    stream = WorldPrompts(**options, size=start + window).draw(
        seed=stage_seed(ctx.run.seed, None, name), exclude=exclude
    )[start : start + take]
    table = seed_records([p for p, _ in stream], [c for _, c in stream])
    cats = table.column("category").to_pylist()
    counts = {str(c): cats.count(c) for c in sorted(set(cats), key=str)}
    return StageOutput(table, stats={"prompts": table.num_rows, "categories": counts})


@flow(name="eva-baseline", flow_run_name=run_name)
def baseline_run(config: RunConfig, arm: Baseline, topup: float = 1.0) -> list[dict[str, Any]]:
    """T iterations of iterative DPO, each on a new split of the arm's prompt source."""
    source = split_source(config, arm, topup)
    with opened_run(config, None) as run:
        prompts, heldout, policy, answers = setup(run, config)
        if config.iteration0_dpo:
            policy = dpo_iteration(run, 0, config, prompts, policy, heldout, answers).policy
        x0 = prompts
        for t in range(1, config.iterations + 1):
            prompts = load_split(run, t, source, artifact="prompts", heldout=heldout, seed_set=x0)
            policy = dpo_iteration(run, t, config, prompts, policy, heldout, answers).policy
        rows = iteration_summary(run.store(), config)
        publish_summary(config.run, rows, f"{arm} baseline, iteration {config.iterations}")
        return rows

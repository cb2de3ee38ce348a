"""Stage ``online``: one segment of online eva, S optimizer steps of RLOO (or GRPO, or online
DPO) whose prompts come from eva's prioritized generative buffer (paper appendix A/B). The loop
itself, step by step, is ``tasks.online_loop``; the TRL trainer is ``tasks.backends.train.online``.

Inputs: the seed set D, the held-out set (evolved prompts that hit it are dropped) and the
policy to continue from. The policy checkpoint of a finished segment carries the buffer's state
(``eva_online_state.json``, beside the weights, as a Hugging Face checkpoint carries its
trainer state), so the next segment resumes exactly: same buffer, same batches. A segment's
table lists every prompt it trained on, in order, with the phase, where it came from, its
samples' rewards and informativeness, and whether it was evolved.
"""

from __future__ import annotations

import json
import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, model_validator

from eva_core.buffer import PromptBuffer
from eva_core.creator import Creator
from eva_core.schema import PROMPT_COLUMNS
from eva_runtime.errors import ConfigError
from tasks.backends.evolve import EvolverBackend
from tasks.backends.python import Builds
from tasks.backends.reward import PointwiseRewardBackend
from tasks.backends.train.online import OnlineSolverBackend, OnlineSolverConfig
from tasks.context import StageContext, StageOutput, check_failures, finite_mean
from tasks.online_loop import BufferConfig, OnlineLoop, rewriter_of
from tasks.stage import MODEL, StageError, stage

STATE_FILE = "eva_online_state.json"
LOG_COLUMNS = (
    *PROMPT_COLUMNS, "step", "phase", "from_buffer", "rewards", "finished", "informativeness",
)  # fmt: skip


class OnlineConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    solver: Annotated[OnlineSolverBackend, Builds("an online solver", ("train_segment",))] = Field(
        default_factory=OnlineSolverConfig,
        description="TRL's online solver (kind rloo, the default, grpo or online_dpo) or one of "
        'yours: {kind: python, factory: "package.module:Name", options: {...}, '
        "prompts_per_step: 16}, whose object trains a segment (train_segment, "
        "tasks.backends.train.online.OnlineSolver).",
    )
    buffer: BufferConfig = Field(default_factory=BufferConfig)
    budget: float = Field(
        default=1.0,
        gt=0,
        description="Prompts to train on, in multiples of |D| (the paper's 1x, 2x, 3x, 6x).",
    )
    steps_per_segment: int = Field(
        default=50, ge=1, description="Optimizer steps per segment (a cached, resumable stage)."
    )
    reward: Annotated[PointwiseRewardBackend | None, Builds("a reward model", ("score",))] = Field(
        default=None,
        description="Scores samples: a reward model, a function or an object of yours "
        "(required; see annotate.reward of an offline run).",
    )

    evolver: Annotated[EvolverBackend | None, Builds("an evolver", ("evolve",))] = Field(
        default=None, description="The rewriter (required unless buffer.evolve is false)."
    )

    max_chars: int | None = Field(
        default=8192, ge=1, description="Drop rewrites longer than this many characters."
    )
    max_unscored_share: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        # Keyed only when set (tasks/keys.py): the keys of segments cached before they existed
        # hold (the same rules as annotate's, which an online segment had none of).
        json_schema_extra={"key": "unless default"},
        description="Fail the segment when more than this share of the prompts it trained on "
        "got no finite reward at all (a reward that is broken or down); its policy is not "
        "kept. Fewer are counted in the stats (annotate.max_unscored_share offline).",
    )
    fail_on_no_signal: bool = Field(
        default=False,
        json_schema_extra={"key": "unless default"},
        description="Fail the segment when every scored prompt's rewards were all equal (no "
        "signal: RLOO's advantages are all 0, the policy does not move); by default this is "
        "reported (tied_prompts) and the run goes on.",
    )
    max_failed_share: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="Fail the segment when an LLM evolver returned nothing usable for more "
        "than this share of the parents it was given (an endpoint that is down).",
    )
    evolve_lag: int = Field(
        default=1,
        ge=0,
        description="Children of step t's prompts enter the buffer at step t + lag, so a slow "
        "API evolver overlaps with training; 0 waits for it every step.",
    )

    @model_validator(mode="before")
    @classmethod
    def _rloo_by_default(cls, data: Any) -> Any:
        """A solver section without a kind is TRL's RLOO (as before solvers had kinds)."""
        solver = data.get("solver") if isinstance(data, dict) else None
        if isinstance(solver, dict) and "kind" not in solver:
            return {**data, "solver": {**solver, "kind": "rloo"}}
        return data

    def check_budget(self, seeds: int) -> None:
        """Refuse a step larger than the whole budget: ``total_steps`` rounds up to one step, so
        it would train ``prompts_per_step / (budget x |D|)`` times the budget, silently."""
        per_step, budget = self.solver.prompts_per_step, self.budget * seeds
        if per_step > budget:
            raise ConfigError(
                f"{per_step} prompts a step exceed the whole budget, online.budget x |D| = "
                f"{self.budget:g} x {seeds} = {budget:g} prompts: one step would train "
                f"{per_step / budget:.3g}x the budget",
                field="online.solver.prompts_per_step",
                hint=f"set it to at most {math.floor(budget)}, or raise online.budget",
            )

    def total_steps(self, seeds: int) -> int:
        return max(1, math.ceil(self.budget * seeds / self.solver.prompts_per_step))

    def segments(self, seeds: int) -> int:
        return math.ceil(self.total_steps(seeds) / self.steps_per_segment)


def _log_table(rows: list[dict[str, Any]]) -> pa.Table:
    if not rows:
        return pa.table({c: pa.array([], pa.string()) for c in LOG_COLUMNS})
    return pa.Table.from_pylist(rows)


def read_state(path: str, segment: int, run: str) -> dict[str, Any]:
    """The buffer state the previous segment's checkpoint carries, checked as it is read: a
    missing, cut or edited file is one line naming it and its field, and how to make it again
    (the creator's part is checked again, field by field, as the creator loads it)."""
    if not os.path.exists(path):
        raise _state_error(path, segment, run, "there is no such file")
    try:
        with open(path) as f:
            state = json.load(f)
    except json.JSONDecodeError as exc:
        raise _state_error(
            path, segment, run, f"not JSON: {exc.msg} (character {exc.pos})"
        ) from None
    if not isinstance(state, dict) or not isinstance(state.get("creator"), dict):
        raise _state_error(path, segment, run, "no creator state in it")
    for field in ("trained_steps", "drawn"):
        value = state.get(field, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise _state_error(path, segment, run, f"{field} {json.dumps(value)} is not a count")
    if not isinstance(state.get("pending", []), list):
        raise _state_error(path, segment, run, "pending is not a list of draws")
    return state


def _state_error(path: str, segment: int, run: str, why: str) -> StageError:
    return StageError(
        f"segment {segment}: the buffer state {path}: {why}",
        field=f"online of iter_{segment}",
        hint=f"make it again from the segment before: eva stage online --run {run} "
        f"--iteration {segment - 1} --force",
    )


@stage(
    "online",
    # 2: records whether each completion finished; cut ones train nothing by default.
    # 3: the buffer state beside the checkpoint names the seeds it was drawn over (a digest).
    version=3,
    inputs={"seeds": PROMPT_COLUMNS, "heldout": ("prompt_id",), "policy": MODEL},
    outputs=LOG_COLUMNS,
)
def online(
    ctx: StageContext, config: OnlineConfig, seeds: pa.Table, heldout: pa.Table
) -> StageOutput:
    assert ctx.iteration is not None and ctx.iteration >= 1, "segments are numbered from 1"
    policy_dir = ctx.model_dir("policy")
    state_path = os.path.join(policy_dir, STATE_FILE)
    records = seeds.select(list(PROMPT_COLUMNS)).to_pylist()
    config.check_budget(len(records))  # the edge checks it where D is a file it can count
    if config.reward is None or (config.buffer.evolve and config.evolver is None):
        missing = "online.reward" if config.reward is None else "online.evolver"
        raise StageError(f"segment {ctx.iteration}: {missing} is not set", field=missing)
    evolver = config.evolver.load() if config.buffer.evolve and config.evolver else None
    options: dict[str, Any] = dict(
        executor=ThreadPoolExecutor(max_workers=1, thread_name_prefix="eva-evolve"),
        evolve_lag=config.evolve_lag,
        max_chars=config.max_chars,
        exclude_ids=frozenset(heldout.column("prompt_id").to_pylist()),
        categorize=getattr(evolver, "category_of", None),
    )
    state: dict[str, Any] = {}
    if ctx.iteration > 1:  # segment 1 starts a creator, whatever checkpoint theta_0 is
        state = read_state(state_path, ctx.iteration, ctx.run.run)
        rewriter = rewriter_of(evolver) if evolver is not None else None
        creator = Creator.from_state(records, state["creator"], rewriter=rewriter, **options)
    else:
        creator = config.buffer.creator(records, ctx.run.seed, evolver, **options)
    done = int(state.get("trained_steps", 0))
    steps = min(config.steps_per_segment, config.total_steps(len(records)) - done)
    if steps <= 0:  # `eva stage online` past the last segment, or a budget lowered since
        raise StageError(
            f"segment {ctx.iteration}: the budget was used up by earlier segments ({done} of "
            f"{config.total_steps(len(records))} steps trained)",
            field="online.budget",
            hint="raise online.budget to train further",
        )
    try:
        loop = OnlineLoop(creator, config.reward.load(), state=state)
    except (ValueError, KeyError, TypeError) as exc:
        raise _state_error(state_path, ctx.iteration, ctx.run.run, f"{exc}") from None
    out_dir = os.path.join(ctx.scratch, "model")
    started = time.perf_counter()
    # The trainer (TRL) is imported here: reading an online config needs none of it.
    from tasks.backends.train.online_trainer import segment_stats

    solver = config.solver.load(_tensorboard_dir(ctx, config.solver))
    try:
        metrics = solver.train_segment(policy_dir, loop, steps, out_dir, ctx.seed, ctx.progress)
    finally:
        loop.close()
        options["executor"].shutdown(wait=True)
    logs = _tensorboard_dir(ctx, config.solver)
    if logs is not None and not ctx.store.is_local and os.path.isdir(logs):
        ctx.store.fs.put(logs.rstrip("/") + "/", ctx.store.path(ctx.iteration, "online_logs"),
                         recursive=True)  # fmt: skip
    seconds = time.perf_counter() - started
    signal = _reward_signal(ctx.artifact, loop.log, config)
    endpoint = getattr(getattr(config.evolver, "llm", None), "base_url", None)
    if endpoint is not None:
        check_failures(
            ctx.artifact, creator.stats.failed_parents, creator.stats.parents,
            "the evolver returned no usable rewrite", config.max_failed_share,
            "online.max_failed_share", endpoint,
        )  # fmt: skip
    trained = done + steps
    with open(os.path.join(out_dir, STATE_FILE), "w") as f:
        json.dump({**loop.state(), "trained_steps": trained}, f)

    log = loop.log
    rewards = np.array([r for row in log for r in row["rewards"]], dtype=np.float64)
    info = np.array([row["informativeness"] for row in log], dtype=np.float64)
    pending = sum(len(d.records) for d in loop.pending)
    buffer = creator.buffer
    stats = {
        "steps": steps,
        "trained_steps": trained,
        "phase": buffer.phase,
        "budget": round((buffer.consumed - pending) / len(records), 4),
        "seeds_left": buffer.seeds_left,
        "refilled": buffer.refilled,
        "mean_reward": finite_mean(rewards),
        "mean_informativeness": finite_mean(info),
        **signal,
        **_buffer_stats(buffer),
        **loop.report(),
        "backend_seconds": round(seconds, 3),
        **segment_stats(config.solver.kind, metrics, [row["rewards"] for row in log]),
    }
    top = sorted(buffer.entries, key=lambda e: -e.priority)[:20]
    parents = {r["prompt_id"]: r["prompt"] for r in records}
    parents.update({row["prompt_id"]: row["prompt"] for row in log})
    ui = {
        "buffer": [
            {
                "prompt": e.record["prompt"],
                "priority": round(e.priority, 4),
                "parent": parents.get(e.record["parent_id"], e.record["parent_id"]),
                "method": e.record["evolve_method"],
                "depth": e.record["depth"],
                "category": e.record["category"],
            }
            for e in top
        ],
        "trained": [
            {k: row[k] for k in ("step", "phase", "prompt", "from_buffer", "informativeness")}
            for row in log[-20:]
        ],
    }
    notes = {
        "buffer": f"top {len(top)} of the {len(buffer.entries)} prompts in the buffer B, "
        "by priority",
        "trained": f"last {len(ui['trained'])} of the {len(log)} prompts this segment trained on",
    }
    return StageOutput(
        _log_table(log), stats=stats, model_dir=out_dir, ui_tables=ui, ui_notes=notes
    )


def _tensorboard_dir(ctx: StageContext, solver: Any) -> str | None:
    """Where TensorBoard's event files go when the solver reports to it: the run's
    ``{iteration}/online_logs`` (a remote run's in the stage's scratch, uploaded after)."""
    if "tensorboard" not in getattr(solver, "report_to", ()):
        return None
    if ctx.store.is_local:
        return ctx.store.path(ctx.iteration, "online_logs")
    return os.path.join(ctx.scratch, "online_logs")


def _reward_signal(
    artifact: str, log: list[dict[str, Any]], config: OnlineConfig
) -> dict[str, int]:
    """The offline annotate stage's rules over the prompts a segment trained on: a prompt with
    no finite reward is unscored (more than ``max_unscored_share`` of them fails the segment),
    one whose finite rewards are all equal is tied (all of them fails it under
    ``fail_on_no_signal``)."""
    scored = tied = 0
    for row in log:
        finite = [r for r in row["rewards"] if math.isfinite(r)]
        scored += bool(finite)
        tied += bool(finite) and max(finite) == min(finite)
    n = len(log)
    check_failures(
        artifact, n - scored, n, "the reward gave no finite score (unscored)",
        config.max_unscored_share, "online.max_unscored_share",
    )  # fmt: skip
    if config.fail_on_no_signal and n and tied == scored:
        raise StageError(
            f"{artifact}: every scored prompt's rewards are equal ({tied} of {n}): no signal, "
            "the policy did not move (online.fail_on_no_signal)",
            field="online.reward",
        )
    return {"unscored_prompts": n - scored, "tied_prompts": tied}


def _buffer_stats(buffer: PromptBuffer) -> dict[str, Any]:
    """B's composition as stats (one level of breakdown each): its size and priorities, and its
    prompts by category and by depth."""
    composition = buffer.composition()
    categories, depths = composition.pop("categories"), composition.pop("depths")
    return {"buffer": composition, "buffer_categories": categories, "buffer_depths": depths}

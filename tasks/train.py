"""Stage ``train``: the solver step, theta_{t-1} -> theta_t on the pairs of X_t.

Incremental, as in the paper's offline protocol: each iteration starts from the last
checkpoint, which is also the reference model of the DPO-family objectives.

Optionally the chosen responses are first rewritten by an LLM (appendix H.2.1), and training can
run in this process or under ``accelerate launch`` (several GPUs, DeepSpeed ZeRO-3).

The solver is one of the TRL objectives or one of yours (``kind: python``), called through the
``Solver`` protocol either way. A TRL solver's metrics reach the trackers its ``report_to``
names; TensorBoard's event files are kept in the run, beside the iteration's artifacts.
"""

from __future__ import annotations

import os
import time
from typing import Annotated, Literal

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, model_validator

from eva_runtime.engines import ENGINES
from eva_runtime.errors import StageError
from eva_runtime.follow import request_dir
from eva_runtime.progress import ScaledProgress
from tasks.backends.python import Builds, PythonComponent
from tasks.backends.train import SolverBackend, load_solver
from tasks.backends.train.dpo import DPOSolverConfig, TRLSolverConfig, batch_layout
from tasks.backends.train.launch import DEFAULT_ACCELERATE_CONFIG, NodesConfig, launch_train
from tasks.backends.train.rewriter import RewriterConfig
from tasks.content_hashes import HUB
from tasks.context import StageContext, StageOutput
from tasks.stage import MODEL, stage
from tasks.store import RunStore


class TrainConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    solver: Annotated[SolverBackend, Builds("a solver", ("train",))] = Field(
        default_factory=DPOSolverConfig,
        description='Objective by "kind": dpo (default), simpo, orpo, sppo, dpo_nll; or python, '
        'a solver of yours: {kind: python, factory: "package.module:Name", options: {...}}, '
        "whose factory(**options) has train(policy_dir, prompts, chosen, rejected, output_dir, "
        "seed, progress).",
    )
    rewrite_chosen: RewriterConfig | None = Field(
        default=None, description="Rewrite chosen responses with an LLM before training."
    )
    launcher: Literal["inprocess", "accelerate"] = Field(
        default="inprocess", description='"accelerate" trains in a subprocess per device.'
    )
    num_processes: int = Field(
        default=1,
        ge=1,
        description="Processes (GPUs) for accelerate, in total over all machines (16 for 2 "
        "machines x 8 GPUs), as accelerate's --num_processes counts them.",
    )
    accelerate_config: str = Field(
        default=DEFAULT_ACCELERATE_CONFIG,
        description="accelerate yaml; a relative path missing here is read from the repo.",
    )
    nodes: NodesConfig = Field(
        default_factory=NodesConfig,
        description="Machines for accelerate (multi-node: every other machine runs "
        "`eva train-node`, and the run root must be a filesystem all of them mount).",
    )
    on_no_pairs: Literal["keep_policy", "fail"] = Field(
        default="keep_policy",
        description="When the pairs stage produced none (every prompt tied, or no chosen answer "
        "reached pairs.min_chosen_reward): keep_policy passes theta_{t-1} on unchanged, "
        "reported as steps 0 and no_pairs; fail stops the run.",
    )

    @property
    def processes(self) -> int:
        return self.num_processes if self.launcher == "accelerate" else 1

    @model_validator(mode="after")
    def _machines_fit(self) -> TrainConfig:
        machines = self.nodes.machines
        if machines > 1 and self.launcher != "accelerate":
            raise ValueError(f"nodes.machines={machines} needs launcher: accelerate")
        if self.processes % machines:
            raise ValueError(
                f"num_processes={self.num_processes} is the total over nodes.machines="
                f"{machines}: it must be a multiple of it (processes per machine x machines)"
            )
        return self

    @model_validator(mode="after")
    def _batch_divides(self) -> TrainConfig:
        # Checked here, at the edge, so a recipe that cannot make its batch fails before any GPU
        # hour is spent; the trainer derives the same layout again from its WORLD_SIZE.
        solver = self.solver
        if isinstance(solver, TRLSolverConfig):  # a solver of yours lays out its own batches
            per_device = solver.per_device_train_batch_size
            batch_layout(solver.effective_batch_size, per_device, self.processes)
        return self


@stage(
    "train",
    version=1,
    inputs={"pairs": ("prompt", "chosen", "rejected"), "policy": MODEL},
    outputs=("step",),
)
def train(ctx: StageContext, config: TrainConfig, pairs: pa.Table) -> StageOutput:
    policy_dir = ctx.model_dir("policy")
    if pairs.num_rows == 0:
        if config.on_no_pairs == "fail":
            raise StageError(
                "no preference pairs to train on, and on_no_pairs is fail",
                field="train.on_no_pairs",
                hint="the pairs stage's stats say why (every prompt tied, no chosen answer "
                "reached pairs.min_chosen_reward, or none finished before the length cap); "
                "keep_policy passes the policy on unchanged",
            )
        ctx.log.warning("no preference pairs: the policy is passed on unchanged")
        empty = pa.table({"step": pa.array([], pa.int64())})
        none = {"pairs": 0, "steps": 0, "no_pairs": True}
        kept = ctx.refs["policy"].model_uri or ""
        if kept.startswith(HUB):  # a Hub checkpoint stays where it is
            return StageOutput(empty, stats=none, external_model=kept)
        return StageOutput(empty, stats=none, model_dir=policy_dir)
    # Training needs the GPU that sampling engines kept for reuse, and their checkpoint is about
    # to be superseded: stop them (a served backend starts one on the new checkpoint).
    engines_stopped = ENGINES.stop_all()
    prompts = pairs.column("prompt").to_pylist()
    chosen = pairs.column("chosen").to_pylist()
    rejected = pairs.column("rejected").to_pylist()
    rewrite_stats: dict[str, int] = {}
    train_share = 1.0
    started = time.perf_counter()
    if config.rewrite_chosen is not None:
        # The progress bar gives rewriting its first tenth, so it never runs backwards.
        train_share = 0.9
        result = config.rewrite_chosen.load().rewrite(
            prompts, chosen, ScaledProgress(ctx.progress, 0.0, 0.1)
        )
        chosen, rewrite_stats = result.responses, result.stats()

    # Training's share of the bar; the step and loss reach the terminal through it.
    progress = ScaledProgress(ctx.progress, 1.0 - train_share, train_share)

    solver = config.solver
    layout: dict[str, int] = {}
    if isinstance(solver, TRLSolverConfig):
        per_device, accumulation = batch_layout(
            solver.effective_batch_size, solver.per_device_train_batch_size, config.processes
        )
        layout = {"effective_batch": solver.effective_batch_size,
                  "gradient_accumulation": accumulation}  # fmt: skip
        ctx.log.info(
            "%s: effective batch %d = %d per device x %d accumulation x %d processes",
            solver.kind, solver.effective_batch_size, per_device, accumulation, config.processes,
        )  # fmt: skip
    else:
        ctx.log.info("python solver %s: %d pairs", solver.factory, pairs.num_rows)
    out_dir = os.path.join(ctx.scratch, "model")
    logs = _tensorboard_dir(ctx, solver)
    if config.launcher == "accelerate":
        log = ctx.log
        metrics = launch_train(
            config.solver,
            policy_dir,
            prompts,
            chosen,
            rejected,
            out_dir,
            ctx.seed,
            scratch=os.path.join(ctx.scratch, "launch"),
            accelerate_config=config.accelerate_config,
            num_processes=config.num_processes,
            nodes=config.nodes,
            # Machine 0's request for the others lives in the run, which every machine mounts.
            request_dir=request_dir(ctx.store.base) if config.nodes.machines > 1 else None,
            log=lambda line: log.info("%s", line),
            progress=progress,
            logging_dir=logs,
        )
    else:
        metrics = load_solver(config.solver, logs).train(
            policy_dir, prompts, chosen, rejected, out_dir, ctx.seed, progress
        )
    if isinstance(solver, PythonComponent) and not os.path.isfile(
        os.path.join(out_dir, "config.json")
    ):
        raise StageError(
            f"train: the solver {solver.factory} saved no checkpoint (no config.json in the "
            "output_dir it was given)",
            hint="save the trained model and tokenizer there (save_pretrained)",
        )
    if logs is not None and not ctx.store.is_local:
        _upload_logs(ctx.store, logs, ctx.store.path(ctx.iteration, f"{ctx.artifact}_logs"))
    seconds = time.perf_counter() - started
    table = (
        pa.Table.from_pylist(metrics) if metrics else pa.table({"step": pa.array([], pa.int64())})
    )
    last = metrics[-1] if metrics else {}
    stats = {
        "pairs": pairs.num_rows,
        "steps": int(last.get("step", 0)),
        **layout,
        "backend_seconds": round(seconds, 3),
        **rewrite_stats,
        **({"engines_stopped": engines_stopped} if engines_stopped else {}),
        # The schedule's peak, not its last value (0.0 at the end of a cosine reads like a bug).
        **(
            {"peak_learning_rate": max(r.get("learning_rate", 0.0) for r in metrics)}
            if metrics
            else {}
        ),
        **{
            k: round(v, 4)
            for k, v in last.items()
            if k not in ("step", "learning_rate") and isinstance(v, float)
        },
    }
    return StageOutput(table, stats=stats, model_dir=out_dir)


def _tensorboard_dir(ctx: StageContext, solver: SolverBackend) -> str | None:
    """Where TensorBoard's event files go when the solver reports to it: the run's
    ``{iteration}/train_logs``, which ``tensorboard --logdir`` can watch during training; a run
    on a remote root writes them in the stage's scratch and uploads them after training."""
    if "tensorboard" not in getattr(solver, "report_to", ()):
        return None
    name = f"{ctx.artifact}_logs"
    if ctx.store.is_local:
        return ctx.store.path(ctx.iteration, name)
    return os.path.join(ctx.scratch, name)


def _upload_logs(store: RunStore, local: str, dest: str) -> None:
    if os.path.isdir(local):
        store.fs.put(local.rstrip("/") + "/", dest, recursive=True)

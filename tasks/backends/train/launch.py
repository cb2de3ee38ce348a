"""Multi-GPU training: run a solver under ``accelerate launch`` in a subprocess.

``launch_train`` writes the pairs to a parquet file and has ``eva_runtime.accelerate`` run
``accelerate launch --config_file <yaml> -m tasks.backends.train.launch <spec json>``, which
forwards every output line to a logger as it arrives; then it reads the metrics back. Every
process of the launch runs ``main`` below, which calls the same ``Solver.train`` as the
in-process path, so the two cannot drift apart. The default config
(``infra/accelerate/zero3.yaml``) is DeepSpeed ZeRO-3 on 8 GPUs; it needs the ``deepspeed``
package, which the CPU install does not carry.

This module is the method's side of the launch (what to train, and the entry point that trains
it); starting, following and stopping the processes, and the multi-node request files, are the
runtime's (``eva_runtime.accelerate``), which sees the spec only as a JSON string. Progress
crosses the process boundary as marker lines on rank 0's stdout (``eva_runtime.progress``,
written through ``eva_runtime.log.child_logger``); the metrics as a JSON file rank 0 writes after
the checkpoint is saved.

Several machines (``NodesConfig.machines > 1``): every machine must run ``accelerate launch``
with its own ``--machine_rank``. The stage is machine 0; before it launches, it writes a launch
request (``train-request.json``) into a folder every machine sees, and each other machine runs
``eva train-node``, which waits for the request and launches the same command with its own rank
(``eva_runtime/follow.py``). The paths in the request (pairs, policy, output) must therefore
mean the same on every machine: a run root on a shared filesystem mounted at the same path.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Literal

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, model_validator

from eva_runtime.accelerate import Launch, Nodes, run_launch
from eva_runtime.errors import EvaError
from eva_runtime.log import child_logger
from eva_runtime.progress import progress_line
from tasks.backends.protocols import Progress, no_progress
from tasks.backends.train import SolverBackend, load_solver

DEFAULT_ACCELERATE_CONFIG = "infra/accelerate/zero3.yaml"
ENTRY_MODULE = "tasks.backends.train.launch"  # what every launched process runs: main below


class NodesConfig(BaseModel):
    """The machines one training spans. Which machine this is (its rank) is not configured: the
    stage is always machine 0, and ``eva train-node`` on every other machine reads its rank from
    ``--machine-rank``, ``EVA_MACHINE_RANK`` or a Kubernetes indexed Job's index."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    machines: int = Field(
        default=1,
        ge=1,
        description="Machines (nodes) of one training; train.num_processes is the total over "
        "all of them, split evenly. Over 1, every other machine runs `eva train-node`.",
    )
    main_process_ip: str | None = Field(
        default=None,
        description="Address of machine 0, reachable from every machine (a stable DNS name, "
        "e.g. a Kubernetes headless service); required when machines > 1.",
    )
    main_process_port: int = Field(
        default=29500, ge=1, le=65535, description="Rendezvous port on machine 0."
    )
    same_network: bool = Field(
        default=True,
        description="Machines share a network: machine 0's address is the torch master address "
        "(false: it is a rendezvous endpoint, for rdzv_backend c10d across networks).",
    )
    rdzv_backend: Literal["static", "c10d"] = Field(
        default="static",
        description="torch.distributed.run rendezvous: static (fixed ranks, accelerate's "
        "default) or c10d.",
    )

    @model_validator(mode="after")
    def _address_when_several(self) -> NodesConfig:
        if self.machines > 1 and not self.main_process_ip:
            raise ValueError(
                f"machines={self.machines} needs main_process_ip (machine 0's address)"
            )
        return self


class LaunchError(EvaError, RuntimeError):
    """The launched training exited non-zero; the message ends with its last output lines."""


class LaunchSpec(BaseModel):
    """Everything the launched processes need, passed as one JSON argument."""

    model_config = ConfigDict(extra="forbid")

    solver: SolverBackend
    policy_dir: str
    pairs_path: str
    output_dir: str
    seed: int
    metrics_path: str
    logging_dir: str | None = None  # TensorBoard's event files (rank 0 writes them)


def launch_train(
    solver: SolverBackend,
    policy_dir: str,
    prompts: Sequence[str],
    chosen: Sequence[str],
    rejected: Sequence[str],
    output_dir: str,
    seed: int,
    *,
    scratch: str,
    accelerate_config: str = DEFAULT_ACCELERATE_CONFIG,
    num_processes: int = 1,
    nodes: NodesConfig | None = None,
    request_dir: str | None = None,
    log: Callable[[str], None] = print,
    progress: Progress = no_progress,
    tail_lines: int = 40,
    logging_dir: str | None = None,
) -> list[dict[str, float]]:
    """Train like ``solver.load().train(...)``, but in ``num_processes`` processes started by
    ``accelerate launch``; ``scratch`` receives the pairs file and the metrics file. With several
    ``nodes``, this is machine 0 and the request for the others is written to ``request_dir``."""
    nodes = nodes or NodesConfig()
    os.makedirs(scratch, exist_ok=True)
    spec = LaunchSpec(
        solver=solver,
        policy_dir=os.path.abspath(policy_dir),
        pairs_path=os.path.join(scratch, "pairs.parquet"),
        output_dir=os.path.abspath(output_dir),
        seed=seed,
        metrics_path=os.path.join(scratch, "metrics.json"),
        logging_dir=logging_dir,
    )
    table = pa.table({"prompt": list(prompts), "chosen": list(chosen), "rejected": list(rejected)})
    pq.write_table(table, spec.pairs_path)
    bf16 = getattr(solver, "bf16", False)  # a solver of yours sets up its own precision
    launch = _plain_launch(spec.model_dump_json(), accelerate_config, num_processes, bf16, nodes)
    returncode, tail = run_launch(
        launch, cwd=scratch, request_dir=request_dir, log=log, progress=progress,
        tail_lines=tail_lines,
    )  # fmt: skip
    if returncode != 0:
        raise LaunchError(
            f"accelerate launch exited with status {returncode}; last output:\n" + "\n".join(tail)
        )
    with open(spec.metrics_path) as f:
        rows: list[dict[str, float]] = json.load(f)
    progress(1.0)
    return rows


def accelerate_command(
    spec_json: str,
    *,
    accelerate_config: str,
    num_processes: int,
    bf16: bool,
    nodes: NodesConfig,
    machine_rank: int,
) -> list[str]:
    """The ``accelerate launch`` command of one machine (``eva_runtime.accelerate.Launch``)."""
    launch = _plain_launch(spec_json, accelerate_config, num_processes, bf16, nodes)
    return launch.command(machine_rank)


def _plain_launch(
    spec_json: str, accelerate_config: str, num_processes: int, bf16: bool, nodes: NodesConfig
) -> Launch:
    """The launch as the runtime takes it: plain values, the spec an opaque JSON string."""
    return Launch(
        module=ENTRY_MODULE,
        spec_json=spec_json,
        accelerate_config=accelerate_config,
        num_processes=num_processes,
        bf16=bf16,
        nodes=Nodes(**nodes.model_dump()),
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of every launched process."""
    args = list(sys.argv[1:] if argv is None else argv)
    log = child_logger("eva.launch")  # stdout, which the stage forwards to its log
    if len(args) != 1:
        log.error("usage: python -m tasks.backends.train.launch '<LaunchSpec json>'")
        return 2
    spec = LaunchSpec.model_validate_json(args[0])
    # Output goes to a log line by line: tqdm bars (checkpoint loading) would only add noise.
    # Imported here, in the launched process: every eva command imports this module's config.
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    rank0 = int(os.environ.get("RANK", "0")) == 0
    pairs = pq.read_table(spec.pairs_path)

    def report(fraction: float) -> None:
        if rank0:
            log.info(progress_line(fraction=fraction))

    rows = load_solver(spec.solver, spec.logging_dir).train(
        spec.policy_dir,
        pairs.column("prompt").to_pylist(),
        pairs.column("chosen").to_pylist(),
        pairs.column("rejected").to_pylist(),
        spec.output_dir,
        spec.seed,
        report,
    )
    if rank0:  # written last: its presence means the checkpoint is complete
        tmp = spec.metrics_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(rows, f)
        os.replace(tmp, spec.metrics_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Multi-GPU training: run a solver under ``accelerate launch`` in a subprocess.

``launch_train`` writes the pairs to a parquet file, starts ``accelerate launch --config_file
<yaml> -m tasks.backends.train.launch <spec json>``, forwards every output line to a logger as it
arrives, and reads the metrics back. Every process of the launch runs ``main`` below, which
calls the same ``Solver.train`` as the in-process path, so the two cannot drift apart. The
default config (``infra/accelerate/zero3.yaml``) is DeepSpeed ZeRO-3 on 8 GPUs; it needs the
``deepspeed`` package, which the CPU install does not carry.

Progress crosses the process boundary as marker lines on rank 0's stdout; the metrics as a JSON
file rank 0 writes after the checkpoint is saved.

Several machines (``NodesConfig.machines > 1``): every machine must run ``accelerate launch``
with its own ``--machine_rank``. The stage is machine 0; before it launches, it writes a launch
request (``train-request.json``) into a folder every machine sees, and each other machine runs
``eva train-node``, which waits for the request and launches the same command with its own rank
(``tasks/backends/follow.py``). The paths in the request (pairs, policy, output) must therefore
mean the same on every machine: a run root on a shared filesystem mounted at the same path.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, model_validator
from transformers.utils import logging as hf_logging

from eva_runtime.errors import EvaError
from tasks.backends.protocols import Progress, no_progress
from tasks.backends.train import SolverBackend

REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_ACCELERATE_CONFIG = "infra/accelerate/zero3.yaml"
_PROGRESS = "@@eva-progress "  # a line rank 0 prints; never forwarded to the log
REQUEST_FILE = "train-request.json"  # what machine 0 publishes for the others (multi-node)
END_FILE = "run-finished.json"  # written when the run finished: the followers exit


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


def resolve_config(path: str) -> str:
    """``path`` as given when it exists, else relative to the repository (the default is a
    repo-relative path that must work whatever the working directory is)."""
    if os.path.exists(path) or os.path.isabs(path):
        return os.path.abspath(path)
    return str(REPO_ROOT / path)


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
    )
    table = pa.table({"prompt": list(prompts), "chosen": list(chosen), "rejected": list(rejected)})
    pq.write_table(table, spec.pairs_path)
    cmd = accelerate_command(
        spec.model_dump_json(),
        accelerate_config=accelerate_config,
        num_processes=num_processes,
        bf16=solver.bf16,
        nodes=nodes,
        machine_rank=0,
    )
    request = None
    if nodes.machines > 1:
        if request_dir is None:
            raise ValueError("several machines need a request_dir every machine can read")
        request = write_request(request_dir, spec, accelerate_config, num_processes, nodes)
    try:
        returncode, tail = _stream(cmd, child_env(), scratch, log, progress, tail_lines)
    finally:
        if request is not None:  # a machine whose follower starts later must not join it
            Path(request).unlink(missing_ok=True)
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
    """The ``accelerate launch`` command of one machine. Everything eva decides is on the
    command line, so the yaml cannot disagree with the run's config."""
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",  # the venv's accelerate, whatever PATH says
        "--config_file",
        resolve_config(accelerate_config),
        # The total over all machines (accelerate splits it evenly across them).
        "--num_processes",
        str(num_processes),
        # Always given: a yaml written for two machines must not turn a one-machine run into
        # half of a two-machine one that waits for a partner forever.
        "--num_machines",
        str(nodes.machines),
        "--machine_rank",
        str(machine_rank),
        # The solver config decides precision; a yaml that disagrees would make the Trainer
        # and DeepSpeed disagree, so the command line overrides it.
        "--mixed_precision",
        "bf16" if bf16 else "no",
    ]
    if nodes.machines > 1:
        cmd += [
            "--main_process_ip",
            str(nodes.main_process_ip),
            "--main_process_port",
            str(nodes.main_process_port),
            # accelerate 1.x takes neither of these two from the yaml (their command-line
            # defaults are not None, so the yaml's value never applies): they must be flags.
            "--rdzv_backend",
            nodes.rdzv_backend,
            *(["--same_network"] if nodes.same_network else []),
        ]
    return [*cmd, "-m", "tasks.backends.train.launch", spec_json]


def child_env() -> dict[str, str]:
    """The launched processes' environment: unbuffered, and this checkout importable."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    return env


def write_request(
    request_dir: str,
    spec: LaunchSpec,
    accelerate_config: str,
    num_processes: int,
    nodes: NodesConfig,
) -> str:
    """Publish machine 0's launch for the other machines; returns the request's path."""
    return _publish(
        request_dir,
        REQUEST_FILE,
        {
            "spec": spec.model_dump(mode="json"),
            "accelerate_config": accelerate_config,
            "num_processes": num_processes,
            "nodes": nodes.model_dump(mode="json"),
        },
    )


def write_run_finished(request_dir: str) -> str:
    """Tell the other machines that the run finished (every iteration done), so their
    followers exit; returns the marker's path. Each finish gets a new id: a follower started
    after an earlier finish of the same run waits for the next one."""
    return _publish(request_dir, END_FILE, {})


def _publish(request_dir: str, name: str, body: dict[str, Any]) -> str:
    """Write ``{"id": <new>, **body}`` as ``name`` in ``request_dir``, whole (a rename), so a
    follower never reads half of it; returns its path."""
    os.makedirs(request_dir, exist_ok=True)
    path = os.path.join(request_dir, name)
    new_id = uuid.uuid4().hex
    tmp = f"{path}.tmp-{new_id[:8]}"
    with open(tmp, "w") as f:
        json.dump({"id": new_id, **body}, f)
    os.replace(tmp, path)
    return path


def _stream(
    cmd: list[str],
    env: dict[str, str],
    cwd: str,
    log: Callable[[str], None],
    progress: Progress,
    tail_lines: int,
) -> tuple[int, list[str]]:
    """Run ``cmd``, handing each output line to ``log`` as soon as it is written."""
    tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
    # stderr merged into stdout: tracebacks and warnings arrive in order with the rest.
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        bufsize=1,
        env=env,
        cwd=cwd,
    )
    try:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.rstrip("\n")
            if line.startswith(_PROGRESS):
                progress(float(line[len(_PROGRESS) :]))
                continue
            if line.strip():
                tail.append(line)
                log(line)
        return proc.wait(), list(tail)
    finally:
        if proc.poll() is None:  # the caller was interrupted: leave no training behind
            proc.kill()
            proc.wait()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of every launched process."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m tasks.backends.train.launch '<LaunchSpec json>'", file=sys.stderr)
        return 2
    spec = LaunchSpec.model_validate_json(args[0])
    # Output goes to a log line by line: tqdm bars (checkpoint loading) would only add noise.
    hf_logging.disable_progress_bar()
    rank0 = int(os.environ.get("RANK", "0")) == 0
    pairs = pq.read_table(spec.pairs_path)

    def report(fraction: float) -> None:
        if rank0:
            print(f"{_PROGRESS}{fraction:.4f}", flush=True)

    rows = spec.solver.load().train(
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

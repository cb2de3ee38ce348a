"""Multi-GPU training: run a solver under ``accelerate launch`` in a subprocess.

``launch_train`` writes the pairs to a parquet file, starts ``accelerate launch --config_file
<yaml> -m tasks.backends.launch <spec json>``, forwards every output line to a logger as it
arrives, and reads the metrics back. Every process of the launch runs ``main`` below, which
calls the same ``Solver.train`` as the in-process path, so the two cannot drift apart. The
default config (``infra/accelerate/zero3.yaml``) is DeepSpeed ZeRO-3 on 8 GPUs; it needs the
``deepspeed`` package, which the CPU install does not carry.

Progress crosses the process boundary as marker lines on rank 0's stdout; the metrics as a JSON
file rank 0 writes after the checkpoint is saved.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict
from transformers.utils import logging as hf_logging

from tasks.backends.protocols import Progress, no_progress
from tasks.backends.solver import SolverBackend

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_ACCELERATE_CONFIG = "infra/accelerate/zero3.yaml"
_PROGRESS = "@@eva-progress "  # a line rank 0 prints; never forwarded to the log


class LaunchError(RuntimeError):
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
    log: Callable[[str], None] = print,
    progress: Progress = no_progress,
    tail_lines: int = 40,
) -> list[dict[str, float]]:
    """Train like ``solver.load().train(...)``, but in ``num_processes`` processes started by
    ``accelerate launch``; ``scratch`` receives the pairs file and the metrics file."""
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
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",  # the venv's accelerate, whatever PATH says
        "--config_file",
        resolve_config(accelerate_config),
        "--num_processes",
        str(num_processes),
        # The solver config decides precision; a yaml that disagrees would make the Trainer
        # and DeepSpeed disagree, so the command line overrides it.
        "--mixed_precision",
        "bf16" if solver.bf16 else "no",
        "-m",
        "tasks.backends.launch",
        spec.model_dump_json(),
    ]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    returncode, tail = _stream(cmd, env, scratch, log, progress, tail_lines)
    if returncode != 0:
        raise LaunchError(
            f"accelerate launch exited with status {returncode}; last output:\n" + "\n".join(tail)
        )
    with open(spec.metrics_path) as f:
        rows: list[dict[str, float]] = json.load(f)
    progress(1.0)
    return rows


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
        print("usage: python -m tasks.backends.launch '<LaunchSpec json>'", file=sys.stderr)
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

"""``eva train-node``: machines 1..N-1 of a multi-node training.

accelerate needs ``accelerate launch`` started on every machine, each with its own
``--machine_rank``, and all of them with the same script arguments. The train stage runs on
machine 0 and publishes its launch as a request file (``launch.write_request``) in the run's
``.launch`` folder; a follower on every other machine waits for that file, starts the same
command with its own rank, and waits for the next one, so one follower serves every train
stage of a run, and exits once the run has finished (a finished ``eva run`` writes
``run-finished.json`` there). The run root must be a filesystem every machine mounts at the
same path (the request names the pairs, the policy and the output folder by path).

The follower never writes an artifact: only global rank 0 (on machine 0) saves the checkpoint
and the metrics, and the stage on machine 0 publishes them.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable

from eva_runtime.errors import EvaError
from tasks.backends.protocols import no_progress
from tasks.backends.train.launch import (
    END_FILE,
    REQUEST_FILE,
    LaunchSpec,
    NodesConfig,
    _stream,
    accelerate_command,
    child_env,
)

RANK_ENV = "EVA_MACHINE_RANK"
# A Kubernetes indexed Job numbers its pods 0..completions-1: run the followers as one with
# machines - 1 completions, and pod i is machine i + 1 (machine 0 is the flow run's pod).
INDEX_ENV = "JOB_COMPLETION_INDEX"


class FollowError(EvaError, RuntimeError):
    """A follower cannot take part (no rank, a rank out of range, no request in time)."""


def request_dir(run_base: str) -> str:
    """Where machine 0 publishes its launch requests: inside the run, which every machine
    mounts at the same path."""
    return os.path.join(run_base, ".launch")


def machine_rank(given: int | None, machines: int, environ: dict[str, str] | None = None) -> int:
    """This machine's rank: ``given`` (``--machine-rank``), else ``EVA_MACHINE_RANK``, else
    ``JOB_COMPLETION_INDEX`` + 1. Machine 0 is the train stage itself, so a follower is
    1..machines-1."""
    env = os.environ if environ is None else environ
    where = "--machine-rank"
    if given is None and env.get(RANK_ENV):
        given, where = _int(env[RANK_ENV], RANK_ENV), RANK_ENV
    elif given is None and env.get(INDEX_ENV):
        given, where = _int(env[INDEX_ENV], INDEX_ENV) + 1, f"{INDEX_ENV} + 1"
    if given is None:
        raise FollowError(f"no machine rank: pass --machine-rank or set {RANK_ENV}")
    if not 1 <= given < machines:
        raise FollowError(
            f"{where}: machine rank {given} is not one of 1..{machines - 1} (the run trains on "
            f"{machines} machines; machine 0 is the train stage itself)"
        )
    return given


def _int(text: str, name: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise FollowError(f"{name}={text!r} is not a whole number") from None


def _read(folder: str, name: str) -> dict | None:
    try:
        with open(os.path.join(folder, name)) as f:
            found = json.load(f)
    except FileNotFoundError:
        return None
    return found if isinstance(found, dict) else None


def follow(
    folder: str,
    *,
    rank: int | None = None,
    once: bool = False,
    wait_s: float | None = None,
    poll_s: float = 1.0,
    log: Callable[[str], None] = print,
) -> int:
    """Serve machine 0's launch requests in ``folder`` as machine ``rank`` (see
    ``machine_rank``) until the run finishes (0), or, with ``once``, return the first launch's
    exit status; ``wait_s`` bounds the wait for a request (None: forever)."""
    served: set[str] = set()
    # A finish written before this follower started is an earlier launch's: wait for the next.
    earlier = (_read(folder, END_FILE) or {}).get("id")
    deadline = None if wait_s is None else time.monotonic() + wait_s
    log(f"waiting for launch requests in {folder}")
    while True:
        request = _read(folder, REQUEST_FILE)
        if request is not None and request.get("id") not in served:
            served.add(request["id"])
            status = _launch(request, rank, log)
            if once:
                return status
            deadline = None if wait_s is None else time.monotonic() + wait_s
        elif (finished := _read(folder, END_FILE)) is not None and finished.get("id") != earlier:
            log(f"the run finished after {len(served)} launch(es): nothing more to join")
            return 0
        elif deadline is not None and time.monotonic() > deadline:
            raise FollowError(f"no launch request in {folder} within {wait_s:g} s")
        time.sleep(poll_s)


def _launch(request: dict, rank: int | None, log: Callable[[str], None]) -> int:
    nodes = NodesConfig.model_validate(request["nodes"])
    spec = LaunchSpec.model_validate(request["spec"])
    this = machine_rank(rank, nodes.machines)
    cmd = accelerate_command(
        spec.model_dump_json(),
        accelerate_config=request["accelerate_config"],
        num_processes=int(request["num_processes"]),
        bf16=spec.solver.bf16,
        nodes=nodes,
        machine_rank=this,
    )
    log(f"launch {request['id'][:8]}: machine {this} of {nodes.machines}")
    # A private working folder: launchers may write files into it (DeepSpeed's .deepspeed_env).
    with tempfile.TemporaryDirectory(prefix="eva-train-node-") as cwd:
        status, _ = _stream(cmd, child_env(), cwd, log, no_progress, 1)
    log(f"launch {request['id'][:8]}: machine {this} exited with status {status}")
    return status

"""``eva train-node``: machines 1..N-1 of a multi-node training.

accelerate needs ``accelerate launch`` started on every machine, each with its own
``--machine_rank``, and all of them with the same script arguments. The train stage runs on
machine 0 and publishes its launch as a request file (``eva_runtime.accelerate``) in the run's
``.launch`` folder; a follower on every other machine waits for that file, starts the same
command with its own rank, and waits for the next one, so one follower serves every train
stage of a run, and exits once the run has finished (a finished ``eva run`` writes
``run-finished.json`` there). The run root must be a filesystem every machine mounts at the
same path (the request names the pairs, the policy and the output folder by path).

The follower never writes an artifact: only global rank 0 (on machine 0) saves the checkpoint
and the metrics, and the stage on machine 0 publishes them. It knows nothing of training
either: a request is a ``Launch`` of plain values (the entry module and an opaque spec).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from functools import partial
from typing import Any

from eva_runtime.accelerate import END_FILE, REQUEST_FILE, Launch, read_published, run_launch
from eva_runtime.errors import EvaError
from eva_runtime.poll import PollTimeout, wait_until

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


def _next(folder: str, served: set[str], earlier: str | None) -> tuple[str, dict] | None:
    """A request not served yet, else this run's finish (not the ``earlier`` one), else None."""
    request = read_published(folder, REQUEST_FILE)
    if request is not None and request.get("id") not in served:
        return "request", request
    finished = read_published(folder, END_FILE)
    if finished is not None and finished.get("id") != earlier:
        return "finished", finished
    return None


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
    exit status; ``wait_s`` bounds each wait for a request (None: forever)."""
    served: set[str] = set()
    # A finish written before this follower started is an earlier launch's: wait for the next.
    earlier = (read_published(folder, END_FILE) or {}).get("id")
    log(f"waiting for launch requests in {folder}")
    while True:
        try:
            kind, found = wait_until(
                partial(_next, folder, served, earlier), wait_s, interval_s=poll_s,
                what=f"launch request in {folder}",
            )  # fmt: skip
        except PollTimeout as exc:
            raise FollowError(f"no launch request in {folder} within {exc.timeout_s:g} s") from None
        if kind == "finished":
            log(f"the run finished after {len(served)} launch(es): nothing more to join")
            return 0
        served.add(found["id"])
        status = _launch(found, rank, log)
        if once:
            return status


def _launch(request: dict[str, Any], rank: int | None, log: Callable[[str], None]) -> int:
    launch = Launch.from_json(request["launch"])
    this = machine_rank(rank, launch.nodes.machines)
    log(f"launch {request['id'][:8]}: machine {this} of {launch.nodes.machines}")
    # A private working folder: launchers may write files into it (DeepSpeed's .deepspeed_env).
    with tempfile.TemporaryDirectory(prefix="eva-train-node-") as cwd:
        status, _ = run_launch(launch, cwd=cwd, machine_rank=this, log=log, tail_lines=1)
    log(f"launch {request['id'][:8]}: machine {this} exited with status {status}")
    return status

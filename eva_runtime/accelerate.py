"""``accelerate launch`` as eva runs it: the command, the running launch, the multi-node files.

This is the process side of multi-GPU training; what the launched processes do is the method's
(``tasks.backends.train.launch``), and it reaches this module only as plain values: the entry
module every launched process runs and the training spec as an opaque JSON string (``Launch``).

A launch runs as a ``ManagedProcess`` (``eva_runtime.process``) with its output piped: each line
goes to the caller's ``log`` as it arrives, progress marker lines (``eva_runtime.progress``)
become ``progress`` calls instead, and the last lines are kept for the error message. Like a
server, the training never outlives eva: an interrupted stage stops it, and so does the guard
when eva is killed outright.

Several machines (``Nodes.machines > 1``): every machine must run ``accelerate launch`` with its
own ``--machine_rank``. Machine 0 publishes its ``Launch`` as a request file in a folder every
machine sees before it starts, and withdraws it after; ``eva train-node`` on every other machine
(``eva_runtime.follow``) waits for the request and runs the same launch with its own rank. A
finished run writes ``run-finished.json`` there, and the followers exit.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from eva_runtime.process import ManagedProcess
from eva_runtime.progress import read_progress

REPO_ROOT = Path(__file__).resolve().parents[1]
REQUEST_FILE = "train-request.json"  # what machine 0 publishes for the others (multi-node)
END_FILE = "run-finished.json"  # written when the run finished: the followers exit
STOP_GRACE_S = 10.0  # an interrupted launch: SIGTERM (torchrun passes it on), then SIGKILL


def _ignore(_: float) -> None:
    return None


@dataclass(frozen=True)
class Nodes:
    """The machines one launch spans (the train config's ``nodes``, as plain values)."""

    machines: int = 1
    main_process_ip: str | None = None
    main_process_port: int = 29500
    same_network: bool = True
    rdzv_backend: str = "static"


@dataclass(frozen=True)
class Launch:
    """One training launch, the same on every machine: ``python -m accelerate.commands.launch
    ... -m <module> <spec_json>``."""

    module: str
    spec_json: str
    accelerate_config: str
    num_processes: int
    bf16: bool
    nodes: Nodes = field(default_factory=Nodes)

    def command(self, machine_rank: int) -> list[str]:
        """The ``accelerate launch`` command of one machine. Everything eva decides is on the
        command line, so the yaml cannot disagree with the run's config."""
        nodes = self.nodes
        cmd = [
            sys.executable,
            "-m",
            "accelerate.commands.launch",  # the venv's accelerate, whatever PATH says
            "--config_file",
            resolve_config(self.accelerate_config),
            # The total over all machines (accelerate splits it evenly across them).
            "--num_processes",
            str(self.num_processes),
            # Always given: a yaml written for two machines must not turn a one-machine run
            # into half of a two-machine one that waits for a partner forever.
            "--num_machines",
            str(nodes.machines),
            "--machine_rank",
            str(machine_rank),
            # The solver config decides precision; a yaml that disagrees would make the
            # Trainer and DeepSpeed disagree, so the command line overrides it.
            "--mixed_precision",
            "bf16" if self.bf16 else "no",
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
        return [*cmd, "-m", self.module, self.spec_json]

    def to_json(self) -> dict[str, Any]:
        """The launch as JSON-able values (what a launch request holds)."""
        return asdict(self)

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> Launch:
        """A launch as ``to_json`` wrote it (a request read back on another machine)."""
        plain = {k: body[k] for k in ("module", "spec_json", "accelerate_config", "bf16")}
        return cls(**plain, num_processes=int(body["num_processes"]), nodes=Nodes(**body["nodes"]))


def resolve_config(path: str) -> str:
    """``path`` as given when it exists, else relative to the repository (the default is a
    repo-relative path that must work whatever the working directory is)."""
    if os.path.exists(path) or os.path.isabs(path):
        return os.path.abspath(path)
    return str(REPO_ROOT / path)


def child_env() -> dict[str, str]:
    """The launched processes' environment: unbuffered, and this checkout importable."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    return env


def stream(
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: str,
    log: Callable[[str], None],
    progress: Callable[[float], None] = _ignore,
    tail_lines: int = 40,
    stop_s: float = STOP_GRACE_S,
) -> tuple[int, list[str]]:
    """Run ``argv`` to its end (``env`` over eva's own), handing each output line to ``log``
    as soon as it is written and each progress mark's fraction to ``progress``; returns the
    exit status and the last ``tail_lines`` lines. Interrupted, it stops the whole tree."""
    tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
    # stderr merged into stdout: tracebacks and warnings arrive in order with the rest.
    proc = ManagedProcess(argv, env=env, cwd=cwd, stop_s=stop_s, pipe=True)
    try:
        for line in proc.lines():
            if (mark := read_progress(line)) is not None:
                if mark.fraction is not None:
                    progress(mark.fraction)
                continue
            if line.strip():
                tail.append(line)
                log(line)
        return proc.wait(), list(tail)
    finally:
        proc.stop()  # after the end: whatever it left; interrupted: the training itself


def run_launch(
    launch: Launch,
    *,
    cwd: str,
    machine_rank: int = 0,
    request_dir: str | None = None,
    log: Callable[[str], None] = print,
    progress: Callable[[float], None] = _ignore,
    tail_lines: int = 40,
) -> tuple[int, list[str]]:
    """Run this machine's part of ``launch`` in ``cwd`` (see ``stream``). Machine 0 of several
    first publishes the launch in ``request_dir`` for the others, and withdraws it once its own
    part has ended (a machine whose follower starts later must not join it)."""
    request = None
    if machine_rank == 0 and launch.nodes.machines > 1:
        if request_dir is None:
            raise ValueError("several machines need a request_dir every machine can read")
        request = write_request(request_dir, launch)
    try:
        return stream(launch.command(machine_rank), child_env(), cwd, log, progress, tail_lines)
    finally:
        if request is not None:
            Path(request).unlink(missing_ok=True)


def write_request(request_dir: str, launch: Launch) -> str:
    """Publish machine 0's launch for the other machines; returns the request's path."""
    return _publish(request_dir, REQUEST_FILE, {"launch": launch.to_json()})


def write_run_finished(request_dir: str) -> str:
    """Tell the other machines that the run finished (every iteration done), so their
    followers exit; returns the marker's path. Each finish gets a new id: a follower started
    after an earlier finish of the same run waits for the next one."""
    return _publish(request_dir, END_FILE, {})


def read_published(request_dir: str, name: str) -> dict[str, Any] | None:
    """A request or finish marker (``{"id": ..., ...}``), None while there is none."""
    try:
        with open(os.path.join(request_dir, name)) as f:
            found = json.load(f)
    except FileNotFoundError:
        return None
    return found if isinstance(found, dict) else None


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

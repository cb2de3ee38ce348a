"""Run a stage's backend as a Ray job on a cluster: where a stage runs, not how it samples.

A stage whose config sets ``ray: {address: http://HEAD:8265, workers: 4}`` submits
``tasks.backends.ray_job`` through Ray's Jobs API (``JobSubmissionClient``) instead of loading
its backend here. The job runs in the cluster's own environment (vLLM cannot share one with
prefect 3.8; a job's runtime env need not), reads the stage's input from the run root, runs the
backend on ``workers`` Ray Data workers and writes long-form parquet to a staging folder under
the run root. Meanwhile this side forwards the job's log to the stage's (Prefect) logger and its
progress to the stage's progress bar; then it checks the staging output row by row, hands the
stage lists shaped exactly as the in-process backend's, and removes the staging folder. The
stage builds, validates and publishes its artifact as always, so a job that fails, a cluster
that cannot be reached, or output that does not add up fails the stage with one line and leaves
no artifact (a killed stage's staging folder is a ``*.tmp-*`` that the next launch sweeps).

What the cluster needs: the run root readable and writable from every node (S3, or a shared
filesystem for a local root; ``storage_options`` travel in the job's entrypoint, visible in the
Ray dashboard: credentials belong in the cluster's environment), and eva's dependencies in its
Python (``python``) or its ``runtime_env``; this side uploads the ``tasks`` and ``eva_core``
packages with each job (``py_modules``), so the cluster runs the code this run hashed into its
cache keys.
"""

from __future__ import annotations

import json
import shlex
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, field_validator

from eva_runtime.errors import StageError, first_line
from eva_runtime.poll import PollTimeout, wait_until
from eva_runtime.progress import read_progress
from tasks.backends.ray_job import ERROR_MARK, VALUE_COLUMNS, JobSpec
from tasks.context import StageContext
from tasks.run_paths import iteration_dir

_PACKAGES = [
    str(Path(__file__).resolve().parents[2] / p)
    for p in ("tasks", "eva_core", "eva_runtime", "eva_world")
]
_TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


class RayJob(BaseModel):
    """Run this stage as a job on a Ray cluster (``pip install 'eva[ray]'`` on this side)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    address: str = Field(
        description="The cluster's Jobs API: its dashboard address, http://HEAD:8265 (what "
        "`ray job submit --address` takes; not a ray:// client address)."
    )
    workers: int = Field(
        default=2,
        ge=1,
        description="Ray Data workers, each with its own copy of the backend: transformers "
        "(or reward) actors, or vLLM engine replicas of tensor_parallel_size GPUs each; Ray "
        "places them across the cluster's nodes.",
    )
    cpus_per_worker: float = Field(
        default=1.0, gt=0, description="CPUs each worker reserves (and its torch threads)."
    )
    gpus_per_worker: float = Field(
        default=0.0,
        ge=0,
        description="GPUs each transformers or reward worker reserves (vLLM replicas take "
        "the backend's tensor_parallel_size).",
    )
    rows_per_task: int = Field(
        default=256,
        ge=1,
        description="Input rows a worker takes at a time: smaller balances load and updates "
        "progress more often, larger loads the backend with bigger batches.",
    )
    python: str = Field(
        default="python", description="The cluster's Python that runs the job's driver."
    )
    runtime_env: dict[str, Any] = Field(
        default_factory=dict,
        description="Ray runtime_env for the job, e.g. {pip: [vllm==0.31.0, ...]} or "
        "{image_uri: ...}; eva's packages are added to its py_modules. Part of the config "
        "(manifests, hashes): no secrets in env_vars.",
    )
    connect_timeout_s: float = Field(
        default=10.0, gt=0, description="Fail the stage if the address does not answer in time."
    )
    timeout_s: float | None = Field(
        default=None, gt=0, description="Stop the job and fail the stage after this long."
    )
    poll_s: float = Field(
        default=1.0, gt=0, description="Seconds between reads of the job's status and log."
    )

    @field_validator("address")
    @classmethod
    def _http(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(
                f"{value!r} is not a Jobs API address: give the dashboard's http://HOST:8265"
            )
        return value.rstrip("/")

    def job_runtime_env(self) -> dict[str, Any]:
        """The user's runtime_env plus eva's packages, and Ray's log dedup off: each
        worker's progress lines must reach the stage, not one line "repeated 2x"."""
        env = dict(self.runtime_env)
        env["py_modules"] = [*env.get("py_modules", []), *_PACKAGES]
        env["env_vars"] = {"RAY_DEDUP_LOGS": "0", **env.get("env_vars", {})}
        env["excludes"] = [*env.get("excludes", []), "__pycache__"]
        return env


def run_on_ray(
    ctx: StageContext,
    ray: RayJob,
    task: Literal["generate", "annotate"],
    table: str,
    backend: BaseModel,
    counts: Sequence[int],
    *,
    n: int = 1,
    model: str | None = None,
) -> tuple[dict[str, list[list[Any]]], dict[str, Any]]:
    """Run ``backend`` on the stage input ``table`` as a Ray job; return each value column of
    the task (``VALUE_COLUMNS``: generate's responses and whether each finished, annotate's
    rewards) as one list per input row, ``counts[i]`` values long, exactly as the in-process
    backend returns them, and stats."""
    spec = JobSpec(
        task=task,
        root=ctx.run.root,
        run=ctx.run.run,
        storage_options=ctx.run.storage_options,
        input=ctx.refs[table].uri,
        output=f"{iteration_dir(ctx.iteration)}/{ctx.artifact}.parquet.tmp-ray-{_token()}",
        backend=backend.model_dump(mode="json"),
        n=n,
        seed=ctx.seed,
        model_uri=ctx.refs[model].model_uri if model else None,
        model_hash=ctx.refs[model].content_hash if model else None,
        workers=ray.workers,
        cpus_per_worker=ray.cpus_per_worker,
        gpus_per_worker=ray.gpus_per_worker,
        rows_per_task=ray.rows_per_task,
    )
    stats: dict[str, Any] = {"ray_workers": ray.workers}
    if not counts:
        return {column: [] for column in VALUE_COLUMNS[task]}, stats
    staging = ctx.store.resolve(spec.output)
    try:
        stats.update(_submit_and_follow(ctx, ray, spec, total=sum(counts)))
        return _assemble(ctx, staging, VALUE_COLUMNS[task], counts), stats
    finally:
        if ctx.store.fs.exists(staging):
            ctx.store.fs.rm(staging, recursive=True)


def _token() -> str:
    return uuid.uuid4().hex[:8]


def _submit_and_follow(ctx: StageContext, ray: RayJob, spec: JobSpec, total: int) -> dict[str, Any]:
    """Submit the job, follow it to its end; its id and timings, or a one-line StageError."""
    try:
        from ray.job_submission import JobSubmissionClient
    except ImportError:
        raise StageError(
            f"{ctx.artifact}: ray is set but Ray is not installed here: pip install 'eva[ray]'"
        ) from None
    what = f"{ctx.artifact}: Ray cluster at {ray.address}"
    try:  # the client has no timeout of its own: a silent address would hang the stage
        httpx.get(f"{ray.address}/api/version", timeout=ray.connect_timeout_s).raise_for_status()
    except httpx.HTTPError as exc:
        raise StageError(f"{what} is unreachable ({first_line(exc)})") from None
    job_id = f"eva-{ctx.run.run}-{iteration_dir(ctx.iteration)}-{ctx.artifact}-{_token()}"
    try:
        client = JobSubmissionClient(ray.address)
        client.submit_job(
            entrypoint=f"{ray.python} -m tasks.backends.ray_job "
            + shlex.quote(spec.model_dump_json()),
            submission_id=job_id,
            runtime_env=ray.job_runtime_env(),
        )
    except Exception as exc:  # a runtime_env it rejects, a version it does not speak
        raise StageError(f"{what} refused the job: {first_line(exc)}") from None
    ctx.log.info("%s: submitted Ray job %s to %s", ctx.artifact, job_id, ray.address)
    follower = _LogFollower(ctx, total, time.monotonic())
    status = "PENDING"

    def ended() -> bool:
        nonlocal status
        status = str(client.get_job_status(job_id).value)
        follower.feed(client.get_job_logs(job_id))
        return status in _TERMINAL

    try:
        wait_until(ended, ray.timeout_s, interval_s=ray.poll_s, what=f"end of Ray job {job_id}")
        follower.feed(client.get_job_logs(job_id), final=True)
        info_message = client.get_job_info(job_id).message if status != "SUCCEEDED" else None
    except PollTimeout as exc:
        raise StageError(f"{ctx.artifact}: Ray job {job_id} ran past {exc.timeout_s:g} s") from None
    except StageError:
        raise
    except Exception as exc:  # the cluster went away mid-job
        raise StageError(f"{what} failed while following {job_id}: {first_line(exc)}") from None
    finally:
        if status not in _TERMINAL:  # a stage that gives up (or is cancelled) stops its job
            try:
                client.stop_job(job_id)
            except Exception as stop_exc:
                ctx.log.warning("could not stop Ray job %s: %s", job_id, first_line(stop_exc))
    if status != "SUCCEEDED":
        # The job's own error line; else its log's last line (a shell's "python: not found");
        # else Ray's message.
        message = first_line(RuntimeError(info_message or "no message"), with_type=False)
        reason = follower.error or follower.last_line or message
        raise StageError(f"{ctx.artifact}: Ray job {job_id} {status.lower()}: {reason}")
    return {"ray_job": job_id, **follower.timings()}


class _LogFollower:
    """Forwards the job's new log lines to the stage's logger, turns its progress marks into
    the stage's progress, keeps the error line the job prints when it fails, and times the
    marks: a job's start-up (submission, driver, workers loading the backend) is fixed, its
    throughput once the workers are up is what more workers buy."""

    def __init__(self, ctx: StageContext, total: int, submitted: float):
        self.ctx, self.total, self.submitted = ctx, total, submitted
        self.seen, self.done = 0, 0
        self.error: str | None = None
        self.last_line: str | None = None
        self.first: tuple[float, int] | None = None  # (when, values done) at the first mark
        self.last = submitted

    def timings(self) -> dict[str, float]:
        """``ray_startup_s``: submission to the first values done (within ``poll_s``);
        ``ray_steady_per_s``: values per second after that, when there was an after."""
        if self.first is None:
            return {}
        out = {"ray_startup_s": round(self.first[0] - self.submitted, 2)}
        if self.last > self.first[0] and self.done > self.first[1]:
            out["ray_steady_per_s"] = round(
                (self.done - self.first[1]) / (self.last - self.first[0]), 1
            )
        return out

    def feed(self, text: str, final: bool = False) -> None:
        end = len(text) if final else text.rfind("\n") + 1  # whole lines only, until the end
        lines, self.seen = text[self.seen : end].splitlines(), max(self.seen, end)
        now = time.monotonic()
        for line in lines:
            if (mark := read_progress(line)) is not None:
                self.done += mark.done or 0
                self.ctx.progress(min(1.0, self.done / self.total))
                self.last = now
            elif ERROR_MARK in line and self.error is None:  # the first: a worker's, if any
                error = json.loads(line.split(ERROR_MARK, 1)[1])
                self.error = first_line(
                    RuntimeError(f"{error['type']}: {error['message']}"), with_type=False
                )
            elif line.strip():
                self.ctx.log.info("[ray] %s", line)
                self.last_line = line.strip()
        if self.first is None and self.done:
            self.first = (now, self.done)


def _assemble(
    ctx: StageContext, staging: str, columns: Sequence[str], counts: Sequence[int]
) -> dict[str, list[list[Any]]]:
    """The job's long-form output, each of ``columns`` as one list per input row, after checking
    that it holds exactly ``counts[i]`` values for row ``i``, each once, and nothing else."""
    try:
        table = pq.read_table(staging, filesystem=ctx.store.fs)
    except (FileNotFoundError, pa.ArrowInvalid) as exc:
        raise StageError(
            f"{ctx.artifact}: the Ray job wrote no output ({first_line(exc)})"
        ) from None
    table = table.sort_by([("row", "ascending"), ("sample", "ascending")])
    want = np.asarray(counts, dtype=np.int64)
    rows = np.repeat(np.arange(len(want)), want)
    samples = np.arange(rows.size) - np.repeat(np.cumsum(want) - want, want)
    got_rows = table.column("row").to_numpy()
    got_samples = table.column("sample").to_numpy()
    if got_rows.size != rows.size or (got_rows != rows).any() or (got_samples != samples).any():
        raise StageError(
            f"{ctx.artifact}: the Ray job returned {table.num_rows} values for "
            f"{int(want.sum())} expected ({len(want)} rows): missing or duplicated shards"
        )
    bounds = list(zip(np.cumsum(want).tolist(), want.tolist(), strict=True))
    out: dict[str, list[list[Any]]] = {}
    for column in columns:
        values = table.column(column).to_pylist()
        out[column] = [values[b - c : b] for b, c in bounds]
    return out

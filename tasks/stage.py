"""The one mechanism every stage shares: cache, check, run, persist, publish.

A stage module writes a plain function ``fn(ctx, config, **input_tables) -> StageOutput`` and
declares, distilabel-style, the columns it needs from each named input and the columns it
writes. ``@stage`` turns it into a Prefect task that

1. keys the stage on its config, its inputs' content hashes, the run seed and its code;
2. returns the stored artifact as a *Cached* state when a complete one has that key, so a new
   flow run (after a crash, a kill, or a UI retry) re-executes only unfinished stages;
3. otherwise reads the input parquet files, checks their columns, runs ``fn``, writes the
   output atomically (manifest last) and publishes a summary, tables and progress to the UI.

Why not Prefect's own cache policy: the artifacts must stay the source of truth (a run root on
S3 outlives any Prefect database, and ``eva stage --force`` must be able to overrule it), and
Prefect's key would have to hash inputs it cannot see (file contents behind URIs).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import inspect
import json
import logging
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
from prefect import task
from prefect.cache_policies import NONE
from prefect.states import Completed
from pydantic import BaseModel, ConfigDict, Field, model_validator

from eva_core.schema import missing_columns
from eva_runtime.errors import StageError
from eva_runtime.prefect_ui import (
    ProgressArtifact,
    artifact_key,
    link_reused,
    publish_stage,
    readable,
)
from tasks.store import Ref, RunStore, checkpoint_hash, iteration_dir

MODEL = None  # an input that is consumed as a checkpoint, not read as a table
_PACKAGES = ("eva", "prefect", "torch", "transformers", "trl", "pyarrow", "numpy")


class _WithoutTraceback(logging.Filter):
    """Prefect logs a failed task run, and the flow run it fails, with the traceback. A
    StageError's message already says what is wrong and what to do; three tracebacks through
    Prefect's engine (terminal and UI) would only bury it. The log line itself stays."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], StageError):
            record.exc_info, record.exc_text = None, None
        return True


for _logger in ("prefect.task_runs", "prefect.flow_runs"):
    logging.getLogger(_logger).addFilter(_WithoutTraceback())


class Plan(BaseModel):
    """Which stages to force, reuse only, or skip; the default runs whatever is not cached.

    ``eva stage NAME --iteration T`` sets ``target``: everything before it must already be
    cached, the target runs (again, with ``force``), and everything after it is skipped unless
    ``downstream``, in which case it runs too, forced when ``force`` is set (in Algorithm 1's
    linear order, what follows a stage is exactly what depends on it). ``order`` is the order in
    which the flow calls its artifacts within an iteration: the flow declares it (the framework
    knows no stage names), so a new stage is added where the flow calls it.
    """

    model_config = ConfigDict(frozen=True)
    target_iteration: int | None = None
    target: str | None = None
    force: bool = True
    downstream: bool = False
    order: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _target_in_order(self) -> Plan:
        if self.target is not None and self.target not in self.order:
            raise ValueError(f"target {self.target!r} is not one of the flow's {self.order}")
        return self

    def _position(self, artifact: str) -> int:
        if artifact not in self.order:
            raise StageError(f"{artifact}: not in the flow's declared stage order {self.order}")
        return self.order.index(artifact)

    def decide(
        self, iteration: int | None, artifact: str
    ) -> Literal["auto", "force", "cached", "skip"]:
        if self.target is None:
            return "auto"
        here = (-1 if iteration is None else iteration, self._position(artifact))
        mark = (
            -1 if self.target_iteration is None else self.target_iteration,
            self._position(self.target),
        )
        if here < mark:
            return "cached"
        if here > mark and not self.downstream:
            return "skip"
        return "force" if self.force else "auto"


class RunContext(BaseModel):
    """What every stage needs to know about the run it belongs to."""

    model_config = ConfigDict(frozen=True)
    root: str
    run: str
    seed: int
    storage_options: dict[str, Any] = Field(default_factory=dict)
    plan: Plan = Field(default_factory=Plan)

    def store(self) -> RunStore:
        return RunStore(self.root, self.run, self.storage_options)


@dataclass
class StageOutput:
    table: pa.Table
    stats: dict[str, Any] = field(default_factory=dict)
    model_dir: str | None = None  # a local checkpoint to publish as {iter}/model
    external_model: str | None = None  # a checkpoint used where it is (never copied)
    ui_tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # What each UI table shows, e.g. "top 20 of 200 prompts by informativeness, descending".
    ui_notes: dict[str, str] = field(default_factory=dict)


@dataclass
class StageContext:
    """Handed to a stage function: where it is, its seed, its inputs' refs, and sinks."""

    run: RunContext
    iteration: int | None
    artifact: str
    seed: int
    refs: Mapping[str, Ref]
    scratch: str  # a private temporary directory, removed after the stage
    store: RunStore
    progress: Callable[[float], None]

    def model_dir(self, name: str) -> str:
        ref = self.refs[name]
        if ref.model_uri is None:
            raise StageError(f"{self.artifact}: input '{name}' carries no checkpoint")
        return self.store.local_model(ref.model_uri, ref.content_hash)

    @property
    def log(self) -> logging.Logger | logging.LoggerAdapter:
        try:
            from prefect import get_run_logger

            return get_run_logger()
        except Exception:
            return logging.getLogger(f"eva.{self.artifact}")


StageFn = Callable[..., StageOutput]


class Stage:
    """A stage function wrapped as a Prefect task; call it from a flow like a function."""

    def __init__(
        self,
        name: str,
        fn: StageFn,
        inputs: Mapping[str, Sequence[str] | None],
        outputs: Sequence[str],
        extra_key: Callable[[Any], dict[str, Any]] | None = None,
    ):
        self.name, self.fn, self.inputs, self.outputs = name, fn, dict(inputs), tuple(outputs)
        self.extra_key = extra_key
        _DECLARED.append(fn.__module__)

        # One function per stage: Prefect keys a task on its function's qualified name, so a
        # shared `_execute` would make every stage the same task in the UI's views and filters.
        def execute(
            run: RunContext,
            iteration: int | None,
            config: BaseModel,
            artifact: str,
            refs: dict[str, Ref],
        ) -> Any:
            return self._execute(run, iteration, config, artifact, refs)

        execute.__name__ = execute.__qualname__ = name
        self.task: Any = task(
            name=name, cache_policy=NONE, persist_result=False, task_run_name=_task_run_name
        )(execute)

    def __call__(
        self,
        run: RunContext,
        iteration: int | None,
        config: BaseModel,
        artifact: str | None = None,
        **refs: Ref,
    ) -> Ref:
        state = self.task(run, iteration, config, artifact or self.name, refs, return_state=True)
        return state.result()

    def cache_key(
        self,
        run: RunContext,
        iteration: int | None,
        config: BaseModel,
        artifact: str,
        refs: Mapping[str, Ref],
    ) -> str:
        _hash_declared()
        payload = {
            "stage": self.name,
            "artifact": artifact,
            "iteration": iteration,
            "seed": run.seed,
            "config": config.model_dump(mode="json"),
            "inputs": {k: refs[k].content_hash for k in sorted(refs)},
            "extra": self.extra_key(config) if self.extra_key else {},
            "code": _code_hash(self.fn.__module__),
            "user_code": _user_code(config),
        }
        return _sha(json.dumps(payload, sort_keys=True, default=str))

    def _execute(
        self,
        run: RunContext,
        iteration: int | None,
        config: BaseModel,
        artifact: str,
        refs: dict[str, Ref],
    ) -> Any:
        decision = run.plan.decide(iteration, artifact)
        if decision == "skip" or any(r.skipped for r in refs.values()):
            return Completed(name="Skipped", data=Ref(artifact, iteration, "", "", 0, skipped=True))
        unknown = set(refs) ^ set(self.inputs)
        if unknown:
            raise StageError(
                f"{artifact}: expected inputs {sorted(self.inputs)}, got {sorted(refs)}"
            )
        store = run.store()
        key = self.cache_key(run, iteration, config, artifact, refs)
        if decision != "force":
            manifest = store.read_manifest(iteration, artifact)
            if manifest and manifest["key"] == key and store.is_complete(manifest):
                link_reused(run.run, iteration, artifact, manifest)
                return Completed(
                    name="Cached", message=f"reused {manifest['uri']}", data=_ref(manifest)
                )
            if decision == "cached":
                raise StageError(
                    f"{artifact} of {iteration_dir(iteration)} has no finished artifact for "
                    "this config; run `eva run` for this run first"
                )

        started = time.perf_counter()
        tables = {}
        for name, columns in self.inputs.items():
            if columns is MODEL:
                continue
            table = store.read_table(refs[name].uri)
            if missing := missing_columns(table, columns):
                raise StageError(
                    f"{artifact}: input '{name}' ({refs[name].uri}) lacks column(s) "
                    f"{', '.join(missing)}"
                )
            tables[name] = table

        store.invalidate(iteration, artifact)
        progress = ProgressArtifact(artifact_key(run.run, iteration, artifact, "progress"))
        # Scratch lives in the run's own scratch area, which the next launch sweeps: a killed
        # stage leaves nothing in the system's temporary folder.
        with tempfile.TemporaryDirectory(prefix=f"{artifact}-", dir=store.scratch_dir()) as scratch:
            ctx = StageContext(
                run,
                iteration,
                artifact,
                stage_seed(run.seed, iteration, artifact),
                refs,
                scratch,
                store,
                progress,
            )
            out = self.fn(ctx, config, **tables)
            if missing := missing_columns(out.table, self.outputs):
                raise StageError(
                    f"{artifact}: output lacks declared column(s) {', '.join(missing)}"
                )
            uri, table_hash, nbytes = store.write_table(iteration, artifact, out.table)
            model_uri, model_hash = None, None
            if out.model_dir:
                model_uri, model_hash = store.publish_model(iteration, out.model_dir)
            elif out.external_model:
                model_uri, model_hash = out.external_model, checkpoint_hash(out.external_model)
        if progress.started:  # close the bar of a stage that reported progress
            progress(1.0)
        seconds = time.perf_counter() - started
        content_hash = _sha(table_hash + (model_hash or ""))
        manifest = {
            "stage": self.name, "artifact": artifact, "iteration": iteration, "key": key,
            "uri": uri, "bytes": nbytes, "rows": out.table.num_rows,
            "content_hash": content_hash, "model_uri": model_uri,
            "config": config.model_dump(mode="json"),
            "config_hash": _sha(json.dumps(config.model_dump(mode="json"), sort_keys=True)),
            "inputs": {k: {"uri": r.uri, "content_hash": r.content_hash} for k, r in refs.items()},
            "seconds": round(seconds, 3), "stats": out.stats, "versions": _versions(),
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }  # fmt: skip
        store.write_manifest(iteration, artifact, manifest)
        ctx.log.info(
            "%s %s: %d rows in %.1f s; %s", artifact, iteration_dir(iteration),
            out.table.num_rows, seconds, readable(out.stats),
        )  # fmt: skip
        publish_stage(run.run, iteration, artifact, manifest, out.ui_tables, out.ui_notes)
        return _ref(manifest)


def stage(
    name: str,
    *,
    inputs: Mapping[str, Sequence[str] | None],
    outputs: Sequence[str],
    extra_key: Callable[[Any], dict[str, Any]] | None = None,
) -> Callable[[StageFn], Stage]:
    """Declare a stage: ``inputs`` maps input names to required columns (``MODEL`` for a
    checkpoint), ``outputs`` lists the columns it writes."""
    return lambda fn: Stage(name, fn, inputs, outputs, extra_key)


def check_failures(
    artifact: str,
    failed: int,
    total: int,
    what: str,
    limit: float,
    setting: str,
    endpoint: str | None = None,
) -> None:
    """Fail the stage (no manifest, so a rerun retries it) when more than ``limit`` of its
    ``total`` items failed; fewer failures are the caller's to count in its stats.

    A backend that is down must not pass for a stage that found nothing to do: an evolver that
    kept 0 of 200 prompts because its endpoint refused every request would otherwise be cached
    as a finished stage and never retried.
    """
    if total and failed / total > limit:
        at = f" at {endpoint}" if endpoint else ""
        raise StageError(
            f"{artifact}: {what} for {failed} of {total}{at}, more than {setting} = {limit:g} "
            "allows; fix the backend and run again (this stage left no artifact)"
        )


def stage_seed(run_seed: int, iteration: int | None, artifact: str) -> int:
    """A per-stage seed, so re-running one stage reproduces it without replaying the others."""
    return int(_sha(f"{run_seed}/{iteration}/{artifact}")[:8], 16)


def _ref(m: dict[str, Any]) -> Ref:
    return Ref(
        m["artifact"], m["iteration"], m["uri"], m["content_hash"], m["rows"], m.get("model_uri")
    )


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


_PROJECT = ("eva_core", "tasks", "flows")
_DECLARED: list[str] = []  # the module of every stage declared in this process


@cache
def _hash_declared() -> None:
    """Hash the code of every stage declared so far, on a process's first cache key: their
    closures share most modules, and the flow's first stage runs before any iteration, so this
    once-per-process parse is not paid by whichever iteration first meets a stage."""
    for module in _DECLARED:
        _code_hash(module)


@cache
def _code_hash(module: str) -> str:
    """Hash of the code a stage runs: its module and every project module it imports,
    directly or not (at top level or inside a function). Editing one backend reruns the
    stages that can call it, not the bootstrap SFT."""
    return _sha("".join(_module_file(m).read_text() for m in sorted(_closure(module))))


@cache
def _closure(module: str) -> frozenset[str]:
    seen: set[str] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += _imports(name)
    return frozenset(seen)


@cache
def _imports(module: str) -> tuple[str, ...]:
    """The project modules ``module`` imports. Parsed once per process: the stages' closures
    share most modules, and parsing them again for each stage added up."""
    found: list[str] = []
    for node in ast.walk(ast.parse(_module_file(module).read_text())):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # "from pkg import mod" may name a module as well as an attribute
            targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        found += [t for t in targets if t.split(".")[0] in _PROJECT and _is_module(t)]
    return tuple(found)


@cache
def _is_module(name: str) -> bool:
    try:  # "pkg.mod.Name" (an attribute, not a module) raises rather than returning None
        return importlib.util.find_spec(name) is not None
    except (ImportError, AttributeError, ValueError):
        return False


@cache
def _module_file(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin, name
    return Path(spec.origin)


def _user_code(config: BaseModel) -> dict[str, str]:
    """Hashes of user code a config names (``package.module:function`` rewards), so editing
    that code reruns the stages that call it."""
    from tasks.backends.reward.function import CallableReward, resolve_function

    out: dict[str, str] = {}

    def visit(value: Any) -> None:
        if isinstance(value, CallableReward):
            source = inspect.getsourcefile(resolve_function(value.function))
            out[value.function] = _sha(Path(source).read_text()) if source else "?"
        elif isinstance(value, BaseModel):
            for name in type(value).model_fields:
                visit(getattr(value, name))
        elif isinstance(value, (list, tuple)):
            for item in value:
                visit(item)

    visit(config)
    return out


@cache
def _versions() -> dict[str, str]:
    out = {}
    for pkg in _PACKAGES:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            continue
    return out


def _task_run_name() -> str:
    from prefect.runtime import task_run

    p = task_run.parameters
    return f"{p['artifact']}-{iteration_dir(p['iteration']).replace('_', '-')}"

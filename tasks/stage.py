"""The one mechanism every stage shares: cache, check, run, persist, publish.

A stage module writes a plain function ``fn(ctx, config, **input_tables) -> StageOutput`` and
declares, distilabel-style, the columns it needs from each named input and the columns it
writes. ``@stage`` turns it into a Prefect task that

1. keys the stage on its declared version, its config, its inputs' content hashes, the run
   seed and the versions of what it runs (``tasks.keys``), never on the text of eva's code;
2. returns the stored artifact as a *Cached* state when a complete one has that key, so a new
   flow run (after a crash, a kill, or a UI retry) re-executes only unfinished stages;
3. otherwise reads the input parquet files, checks their columns, runs ``fn``, writes the
   output atomically (manifest last) and publishes a summary, tables and progress to the UI.

What a stage says in the log is ``tasks.stage_log``; what its manifest records of its inputs,
and the ``Ref`` it hands on, ``tasks.provenance``.

Why not Prefect's own cache policy: the artifacts must stay the source of truth (a run root on
S3 outlives any Prefect database, and ``eva stage --force`` must be able to overrule it), and
Prefect's key would have to hash inputs it cannot see (file contents behind URIs).
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from eva_core.schema import missing_columns
from eva_runtime.errors import StageError
from eva_runtime.prefect_ui import ProgressArtifact, artifact_key, link_reused, publish_stage
from eva_runtime.progress import TerminalProgress
from tasks.content_hashes import checkpoint_hash
from tasks.context import (
    RunContext,
    StageContext,
    StageOutput,
    check_stats,
    recorded_stats,
    stage_seed,
)
from tasks.keys import cache_key, recorded_versions, sha
from tasks.provenance import checkpoint_input, ref_of, skipped_ref, table_input
from tasks.run_lock import ensure_held
from tasks.run_paths import iteration_dir
from tasks.stage_log import headline, reported
from tasks.store import Ref

MODEL = None  # an input that is consumed as a checkpoint, not read as a table


StageFn = Callable[..., StageOutput]


class Stage:
    """A stage function wrapped as a Prefect task; call it from a flow like a function."""

    def __init__(
        self,
        name: str,
        fn: StageFn,
        *,
        version: int,
        inputs: Mapping[str, Sequence[str] | None],
        outputs: Sequence[str],
        extra_key: Callable[[Any], dict[str, Any]] | None = None,
        libraries: Sequence[str] = (),
    ):
        self.name, self.fn, self.inputs, self.outputs = name, fn, dict(inputs), tuple(outputs)
        self.version, self.extra_key, self.libraries = version, extra_key, tuple(libraries)

    @functools.cached_property
    def task(self) -> Any:
        """The Prefect task, made when a flow first calls the stage: importing a stage (for its
        config, by ``eva config`` or ``eva show``) does not import Prefect."""
        from prefect import task
        from prefect.cache_policies import NONE

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

        execute.__name__ = execute.__qualname__ = self.name
        return task(
            name=self.name, cache_policy=NONE, persist_result=False, task_run_name=_task_run_name
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
        # A finished stage's Ref is in hand: Prefect's state.result() would fetch it through its
        # event loop thread (a thread round trip per stage). Anything else goes through it.
        kept = getattr(state.data, "result", None) if state.is_completed() else None
        return kept if isinstance(kept, Ref) else state.result()

    def cache_key(
        self,
        run: RunContext,
        iteration: int | None,
        config: BaseModel,
        artifact: str,
        refs: Mapping[str, Ref],
    ) -> str:
        return cache_key(
            stage=self.name,
            version=self.version,
            artifact=artifact,
            iteration=iteration,
            seed=run.seed,
            config=config,
            inputs={k: r.content_hash for k, r in refs.items()},
            extra=self.extra_key(config) if self.extra_key else {},
            libraries=self.libraries,
        )

    def _execute(
        self,
        run: RunContext,
        iteration: int | None,
        config: BaseModel,
        artifact: str,
        refs: dict[str, Ref],
    ) -> Any:
        from prefect.states import Completed  # inside a flow: Prefect is imported by then

        plan = run.plan
        decision = plan.decide(iteration, artifact, refs)
        skipped = sorted(name for name, r in refs.items() if r.skipped)
        if skipped and plan.is_target(iteration, artifact):
            raise StageError(
                f"{artifact} of {iteration_dir(iteration)}: its input {skipped[0]!r} has no "
                "finished artifact for this config; run `eva run` for this run first"
            )
        if decision == "skip" or skipped:
            return Completed(name="Skipped", data=skipped_ref(artifact, iteration))
        unknown = set(refs) ^ set(self.inputs)
        if unknown:
            raise StageError(
                f"{artifact}: expected inputs {sorted(self.inputs)}, got {sorted(refs)}"
            )
        # Made by the target of `eva stage`, or from something that was: what depends on it
        # knows from this flag (tasks/plan.py).
        rerun = plan.is_target(iteration, artifact) or any(r.rerun for r in refs.values())
        store = run.store()
        key = self.cache_key(run, iteration, config, artifact, refs)
        if decision != "force":
            manifest = store.read_manifest(iteration, artifact)
            if manifest and manifest["key"] == key and store.is_complete(manifest):
                link_reused(run.run, iteration_dir(iteration), artifact, manifest)
                return Completed(
                    name="Cached",
                    message=f"reused {manifest['uri']}",
                    data=ref_of(manifest, rerun),
                )
            if decision == "reuse":  # neither the target nor downstream of it: never computed
                return Completed(name="Skipped", data=skipped_ref(artifact, iteration))

        started = time.perf_counter()
        tables = {}
        read = {}  # what each input table is as read now, for the manifest
        for name, columns in self.inputs.items():
            if columns is MODEL:
                continue
            table, digest = store.read_table_hashed(refs[name].uri)
            read[name] = table_input(artifact, iteration, name, refs[name], digest)
            if missing := missing_columns(table, columns):
                raise StageError(
                    f"{artifact}: input '{name}' ({refs[name].uri}) lacks column(s) "
                    f"{', '.join(missing)}"
                )
            tables[name] = table

        where = iteration_dir(iteration)
        # The stage's first write (its manifest withdrawn) and its scratch in the run: a launch
        # that lost the run's lock makes neither.
        ensure_held(store, f"{artifact} {where}")
        store.invalidate(iteration, artifact)
        bar = ProgressArtifact(artifact_key(run.run, where, artifact, "progress"))
        progress = TerminalProgress(f"{artifact} {where}", bar)
        # Scratch lives in the run's own scratch area, which the next launch sweeps: a killed
        # stage leaves nothing in the system's temporary folder.
        with (
            reported(store, where, artifact, progress),
            tempfile.TemporaryDirectory(prefix=f"{artifact}-", dir=store.scratch_dir()) as scratch,
        ):
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
            check_stats(artifact, out.stats)
            stats = recorded_stats(out.stats)
            if missing := missing_columns(out.table, self.outputs):
                raise StageError(
                    f"{artifact}: output lacks declared column(s) {', '.join(missing)}"
                )
            # A launch that lost the run's lock while this stage ran writes nothing.
            ensure_held(store, f"{artifact} {iteration_dir(iteration)}")
            uri, table_hash, nbytes = store.write_table(iteration, artifact, out.table)
            model_uri, model_hash = None, None
            if out.model_dir:
                model_uri, model_hash = store.publish_model(
                    iteration, out.model_dir, move=_inside(out.model_dir, scratch)
                )
            elif out.external_model:
                model_uri, model_hash = out.external_model, checkpoint_hash(out.external_model)
        if bar.started:  # close the bar of a stage that reported progress
            bar(1.0)
        seconds = time.perf_counter() - started
        content_hash = sha(table_hash + (model_hash or ""))
        config_json = config.model_dump(mode="json")
        manifest = {
            "stage": self.name, "version": self.version, "artifact": artifact,
            "iteration": iteration, "key": key, "uri": uri, "bytes": nbytes,
            "rows": out.table.num_rows, "content_hash": content_hash, "model_uri": model_uri,
            "config": config_json, "config_hash": sha(json.dumps(config_json, sort_keys=True)),
            "inputs": {k: read.get(k) or checkpoint_input(r) for k, r in refs.items()},
            "seconds": round(seconds, 3), "stats": stats, "versions": recorded_versions(),
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }  # fmt: skip
        ensure_held(store, f"{artifact} {where}'s manifest")
        store.write_manifest(iteration, artifact, manifest)
        ctx.log.info(
            "%s %s: %s (%d rows, %.1f s)", artifact, where, headline(self.name, stats),
            out.table.num_rows, seconds,
        )  # fmt: skip
        publish_stage(run.run, where, artifact, manifest, out.ui_tables, out.ui_notes)
        return ref_of(manifest, rerun)


def stage(
    name: str,
    *,
    version: int,
    inputs: Mapping[str, Sequence[str] | None],
    outputs: Sequence[str],
    extra_key: Callable[[Any], dict[str, Any]] | None = None,
    libraries: Sequence[str] = (),
) -> Callable[[StageFn], Stage]:
    """Declare a stage: ``version`` (bump it when a change can change what the stage writes),
    ``inputs`` maps input names to required columns (``MODEL`` for a checkpoint), ``outputs``
    lists the columns it writes, ``libraries`` the packages it computes with beyond its
    backends' (their versions key it too), ``extra_key`` what its config points at."""
    return lambda fn: Stage(
        name,
        fn,
        version=version,
        inputs=inputs,
        outputs=outputs,
        extra_key=extra_key,
        libraries=libraries,
    )


def _inside(path: str, folder: str) -> bool:
    """``path`` lies within ``folder`` (a checkpoint written in the stage's scratch, which is
    removed after the stage: it can be moved into the run rather than copied)."""
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return os.path.commonpath([path, folder]) == folder and path != folder


def _task_run_name() -> str:
    from prefect.runtime import task_run

    p = task_run.parameters
    return f"{p['artifact']}-{iteration_dir(p['iteration']).replace('_', '-')}"

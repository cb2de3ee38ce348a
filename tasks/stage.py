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

Why not Prefect's own cache policy: the artifacts must stay the source of truth (a run root on
S3 outlives any Prefect database, and ``eva stage --force`` must be able to overrule it), and
Prefect's key would have to hash inputs it cannot see (file contents behind URIs).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from prefect import task
from prefect.cache_policies import NONE
from prefect.states import Completed
from pydantic import BaseModel

from eva_core.schema import missing_columns
from eva_runtime.errors import EvaError, StageError, first_line
from eva_runtime.prefect_ui import (
    ProgressArtifact,
    artifact_key,
    link_reused,
    publish_stage,
    readable,
)
from eva_runtime.progress import TerminalProgress
from tasks.context import (
    RunContext,
    StageContext,
    StageOutput,
    check_stats,
    stage_seed,
)
from tasks.keys import cache_key, recorded_versions, sha
from tasks.run_lock import ensure_held
from tasks.store import Ref, RunStore, checkpoint_hash, iteration_dir

MODEL = None  # an input that is consumed as a checkpoint, not read as a table


class _WithoutTraceback(logging.Filter):
    """Prefect logs a failed task run, and the flow run it fails, with the traceback. A
    StageError's message already says what is wrong and what to do, and any other exception
    a stage raised has its traceback kept in the run's logs/ (``_reported``); three tracebacks
    through Prefect's engine (terminal and UI) would only bury it. The log line itself stays.

    A stage that finished has just logged its own line (its headline stats): Prefect's
    "Finished in state Completed()" after it would only double every stage's lines."""

    def filter(self, record: logging.LogRecord) -> bool:
        failed = record.exc_info[1] if record.exc_info else None
        if isinstance(failed, StageError) or hasattr(failed, FAILURE):
            record.exc_info, record.exc_text = None, None
        return not (record.name == "prefect.task_runs" and record.getMessage() == _COMPLETED)


_COMPLETED = "Finished in state Completed()"


for _logger in ("prefect.task_runs", "prefect.flow_runs"):
    logging.getLogger(_logger).addFilter(_WithoutTraceback())


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
        plan = run.plan
        decision = plan.decide(iteration, artifact, refs)
        skipped = sorted(name for name, r in refs.items() if r.skipped)
        if skipped and plan.is_target(iteration, artifact):
            raise StageError(
                f"{artifact} of {iteration_dir(iteration)}: its input {skipped[0]!r} has no "
                "finished artifact for this config; run `eva run` for this run first"
            )
        if decision == "skip" or skipped:
            return Completed(name="Skipped", data=_skipped(artifact, iteration))
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
                    data=_ref(manifest, rerun),
                )
            if decision == "reuse":  # neither the target nor downstream of it: never computed
                return Completed(name="Skipped", data=_skipped(artifact, iteration))

        started = time.perf_counter()
        tables = {}
        read = {}  # what each input table is as read now, for the manifest
        for name, columns in self.inputs.items():
            if columns is MODEL:
                continue
            table, digest = store.read_table_hashed(refs[name].uri)
            read[name] = _read_input(artifact, iteration, name, refs[name], digest)
            if missing := missing_columns(table, columns):
                raise StageError(
                    f"{artifact}: input '{name}' ({refs[name].uri}) lacks column(s) "
                    f"{', '.join(missing)}"
                )
            tables[name] = table

        store.invalidate(iteration, artifact)
        where = iteration_dir(iteration)
        bar = ProgressArtifact(artifact_key(run.run, where, artifact, "progress"))
        progress = TerminalProgress(f"{artifact} {where}", bar)
        # Scratch lives in the run's own scratch area, which the next launch sweeps: a killed
        # stage leaves nothing in the system's temporary folder.
        with (
            _reported(store, where, artifact, progress),
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
            "inputs": {k: read.get(k) or _input(r) for k, r in refs.items()},
            "seconds": round(seconds, 3), "stats": out.stats, "versions": recorded_versions(),
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }  # fmt: skip
        ensure_held(store, f"{artifact} {where}'s manifest")
        store.write_manifest(iteration, artifact, manifest)
        ctx.log.info(
            "%s %s: %s (%d rows, %.1f s)", artifact, where, headline(self.name, out.stats),
            out.table.num_rows, seconds,
        )  # fmt: skip
        publish_stage(run.run, where, artifact, manifest, out.ui_tables, out.ui_notes)
        return _ref(manifest, rerun)


# The few stats a stage's log line shows, by stage name (the manifest and the UI keep them
# all); a stage not listed here, or whose stats have none of its names, shows its first four.
HEADLINE: dict[str, tuple[str, ...]] = {
    "prompts": ("prompts",),
    "heldout": ("prompts",),
    "bootstrap": ("checkpoint", "steps", "final_loss"),
    "generate": ("prompts", "responses"),
    "annotate": ("mean_reward", "unscored"),
    "score": ("mean_informativeness", "zero_informativeness"),
    "sample": ("selected", "prompts"),
    "evolve": ("parents", "kept"),
    "mix": ("size", "evolved", "original"),
    "complexity": ("mean_complexity", "unscored"),
    "pairs": ("pairs", "skipped_tied"),
    "train": ("pairs", "steps", "loss"),
    "evaluate": ("score", "solved"),
    "reference": ("references", "missing"),
    "judge": ("win_rate", "ci_low", "ci_high", "unjudged"),
    "online": ("steps", "mean_reward", "mean_informativeness", "budget"),
}


def headline(stage_name: str, stats: Mapping[str, Any]) -> str:
    """The stats that matter for ``stage_name``, as ``score 0.0951, solved 0``."""
    names = [k for k in HEADLINE.get(stage_name, ()) if k in stats]
    if not names:  # fall back to the first few numbers and words (no breakdowns)
        names = [k for k, v in stats.items() if not isinstance(v, Mapping)][:4]
    return ", ".join(f"{k} {readable(stats[k])}" for k in names) or "done"


# The attribute a stage's failure carries: the one line the CLI prints for it.
FAILURE = "eva_failure"


@contextmanager
def _reported(
    store: RunStore, where: str, artifact: str, progress: TerminalProgress
) -> Iterator[None]:
    """A stage that fails says so in one line: which stage, the cause, and where its full
    traceback is (``logs/<iteration>-<artifact>.log`` in the run). The exception goes on as it
    is (callers still catch its type), carrying that line as ``FAILURE``; Prefect's engine logs
    it without the traceback (``_WithoutTraceback``). A StageError the stage raised itself
    already says what is wrong and passes untouched."""
    try:
        yield
    except StageError:
        raise
    except Exception as exc:
        path = f"{store.base}/logs/{where}-{artifact}.log"
        try:
            store.fs.makedirs(f"{store.base}/logs", exist_ok=True)
            with store.fs.open(path, "w") as f:
                f.write("".join(traceback.format_exception(exc)))
            kept = f"full traceback in {store.uri(path)}"
        except Exception as unwritten:  # the run root itself failing: say so, lose nothing else
            kept = f"no traceback written: {first_line(unwritten)}"
        cause = first_line(exc, with_type=not isinstance(exc, EvaError))
        setattr(exc, FAILURE, f"{artifact} of {where} failed: {cause} ({kept})")
        raise
    finally:
        progress.close()


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


def _input(ref: Ref) -> dict[str, Any]:
    """What a manifest records of an input the stage did not read as a table (a checkpoint):
    the hash its own manifest gives it."""
    return {"uri": ref.uri, "content_hash": ref.content_hash}


def _read_input(
    artifact: str, iteration: int | None, name: str, ref: Ref, digest: str
) -> dict[str, Any]:
    """What a manifest records of an input table: the hash of the bytes this stage read
    (``sha256``) and the content hash they make (as the input's own manifest computes it), not
    the hash that manifest recorded: a table edited by hand since (then said in one line) is
    what this stage's output comes from. An input that also carries a checkpoint keeps that
    part of its recorded hash (a checkpoint is not hashed again on every read)."""
    content_hash = sha(digest) if ref.model_uri is None else ref.content_hash
    if ref.model_uri is None and content_hash != ref.content_hash:
        _log(artifact).warning(
            "%s %s: its input %s (%s) is not the table its manifest recorded (changed since it "
            "was written): this stage reads it as it is now, and its manifest says so",
            artifact, iteration_dir(iteration), name, ref.uri,
        )  # fmt: skip
    return {"uri": ref.uri, "content_hash": content_hash, "sha256": digest}


def _log(artifact: str) -> logging.Logger | logging.LoggerAdapter:
    """The task run's logger inside a task (the UI shows the line), else the stage's."""
    try:
        from prefect import get_run_logger

        return get_run_logger()
    except Exception:
        return logging.getLogger(f"eva.{artifact}")


def _ref(m: dict[str, Any], rerun: bool = False) -> Ref:
    return Ref(
        m["artifact"],
        m["iteration"],
        m["uri"],
        m["content_hash"],
        m["rows"],
        m.get("model_uri"),
        rerun=rerun,
    )


def _skipped(artifact: str, iteration: int | None) -> Ref:
    return Ref(artifact, iteration, "", "", 0, skipped=True)


def _task_run_name() -> str:
    from prefect.runtime import task_run

    p = task_run.parameters
    return f"{p['artifact']}-{iteration_dir(p['iteration']).replace('_', '-')}"

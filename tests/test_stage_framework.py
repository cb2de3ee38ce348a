"""The stage mechanism on real stages and small tables: caching, checks, atomicity, S3."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from pydantic import ValidationError

from eva_core.schema import seed_records
from tasks.context import RunContext
from tasks.keys import sha
from tasks.mix import MixConfig, mix
from tasks.plan import Plan
from tasks.sample import SampleConfig, sample
from tasks.score import ScoreConfig, score
from tasks.stage import StageError
from tasks.store import Ref, RunStore

pytestmark = pytest.mark.usefixtures("prefect_api")


def _annotated(n: int = 8) -> pa.Table:
    base = seed_records([f"{i}+{i}=" for i in range(n)], ["add"] * n)
    responses = [[str(i), "x", "y"] for i in range(n)]
    rewards = [[i / n, 0.0, 0.5] for i in range(n)]
    return base.append_column("responses", pa.array(responses)).append_column(
        "rewards", pa.array(rewards, pa.list_(pa.float64()))
    )


def _input(store: RunStore, iteration: int, name: str, table: pa.Table) -> Ref:
    """A finished input as a stage hands it on: its content hash made from its table's bytes
    as a stage makes it (a stage reading it records the hash of what it read)."""
    uri, digest, _ = store.write_table(iteration, name, table)
    return Ref(name, iteration, uri, sha(digest), table.num_rows)


def _run(tmp_path, **kw) -> RunContext:
    return RunContext(root=str(tmp_path), run="r", seed=1, **kw)


def test_cached_in_a_new_call_and_rerun_on_config_change(tmp_path) -> None:
    run = _run(tmp_path)
    store = run.store()
    annotated = _input(store, 1, "creator_annotate", _annotated())
    first = score(run, 1, ScoreConfig(), annotated=annotated)
    state = score.task(run, 1, ScoreConfig(), "score", {"annotated": annotated}, return_state=True)
    assert state.name == "Cached" and state.result() == first
    # What it reused is listed, with the other cached stages of its flow run, in one table
    # posted when the run closes (this plain call has no flow: posted here).
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterType
    from prefect.client.schemas.sorting import ArtifactSort

    from eva_runtime.prefect_ui import POSTER, REUSED

    assert REUSED.flush() >= 1  # rows of earlier tests' plain calls may be pending too
    assert POSTER.flush(timeout_s=30)  # the tables go out through the UI poster
    with get_client(sync_client=True) as client:
        tables = client.read_artifacts(
            artifact_filter=ArtifactFilter(type=ArtifactFilterType(any_=["table"])),
            sort=ArtifactSort.CREATED_DESC,  # the API pages: the newest first, not the suite's
            limit=20,  # first 200 (the CI run that had more tables than that failed here)
        )
    # The suite shares one API: find this stage's row among the reused tables posted lately.
    rows = [
        row
        for t in tables
        if (t.description or "").startswith("reused (Cached): ")
        for row in json.loads(str(t.data))
    ]
    assert {
        "iteration": "iter_1", "stage": "score", "reused": "iter_1/score.parquet", "rows": 8,
        "made": store.read_manifest(1, "score")["created_at"], "summary artifact": "r-iter-1-score",
    } in rows  # fmt: skip
    created = store.read_manifest(1, "score")["created_at"]
    # A different metric is a different key: the stage runs again and its output changes.
    state = score.task(
        run, 1, ScoreConfig(metric="a_avg"), "score", {"annotated": annotated}, return_state=True
    )
    assert state.name == "Completed"
    assert state.result().content_hash != first.content_hash
    manifest = store.read_manifest(1, "score")
    assert manifest["config"]["metric"] == "a_avg" and manifest["created_at"] >= created
    # Manifest carries what a user needs to trust and trace the artifact.
    assert manifest["inputs"]["annotated"]["content_hash"] == annotated.content_hash
    assert {"eva", "prefect", "pyarrow"} <= set(manifest["versions"])
    assert manifest["rows"] == 8 and manifest["stats"]["metric"] == "a_avg"


def test_each_stage_is_its_own_task_and_logs_its_stats_readably(tmp_path, caplog) -> None:
    from eva_runtime.prefect_ui import readable

    # Prefect keys a task on its function: one per stage, so the UI can filter by stage.
    assert score.task.task_key != sample.task.task_key
    assert (score.task.name, sample.task.name) == ("score", "sample")
    assert readable(0.123456) == "0.1235" and readable(1234567.0) == "1.235e+06"
    assert readable({"a": 2, "b": None, "c": [0.5, "x"]}) == "a: 2, b: -, c: [0.5, x]"
    assert readable(float("nan")) == "nan" and readable(True) == "true"
    run = _run(tmp_path)
    annotated = _input(run.store(), 1, "creator_annotate", _annotated())
    with caplog.at_level("INFO"):
        score(run, 1, ScoreConfig(), annotated=annotated)
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("score iter_1")]
    # The line shows score's headline stats (tasks.stage_log.HEADLINE); the manifest keeps them all.
    assert logged and "(8 rows, " in logged[0] and "mean_informativeness 0." in logged[0]
    assert "metric" not in logged[0]


def test_a_manifest_records_the_hash_of_the_input_it_read(tmp_path, caplog) -> None:
    import hashlib

    import pyarrow.parquet as pq

    run = _run(tmp_path)
    store = run.store()
    annotated = _input(store, 1, "creator_annotate", _annotated())
    score(run, 1, ScoreConfig(), annotated=annotated)
    path = store.resolve(annotated.uri)
    read = store.read_manifest(1, "score")["inputs"]["annotated"]
    written = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    assert read == {"uri": annotated.uri, "content_hash": annotated.content_hash, "sha256": written}
    # The input edited by hand, then a forced rerun: the manifest names what this run read.
    pq.write_table(_annotated(6), path, compression="zstd")
    edited = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    forced = _run(tmp_path, plan=Plan(target_iteration=1, target="score", force=True))
    with caplog.at_level("WARNING"):
        score(forced, 1, ScoreConfig(), annotated=annotated)
    read = store.read_manifest(1, "score")["inputs"]["annotated"]
    assert read == {"uri": annotated.uri, "content_hash": sha(edited), "sha256": edited}
    assert store.read_manifest(1, "score")["rows"] == 6
    said = [
        r.getMessage() for r in caplog.records if "is not the table its manifest" in r.getMessage()
    ]
    assert said == [
        "score iter_1: its input annotated (iter_1/creator_annotate.parquet) is not the table its "
        "manifest recorded (changed since it was written): this stage reads it as it is now, and "
        "its manifest says so"
    ]


def test_missing_input_column_is_named_and_nothing_written(tmp_path) -> None:
    run = _run(tmp_path)
    store = run.store()
    bad = _input(store, 1, "creator_annotate", _annotated().drop_columns(["rewards"]))
    with pytest.raises(StageError, match=r"score: input 'annotated' .* lacks column\(s\) rewards"):
        score(run, 1, ScoreConfig(), annotated=bad)
    assert store.read_manifest(1, "score") is None
    assert not os.path.exists(store.path(1, "score.parquet"))


def test_crash_mid_stage_leaves_no_complete_artifact(tmp_path, monkeypatch) -> None:
    run = _run(tmp_path)
    store = run.store()
    annotated = _input(store, 1, "creator_annotate", _annotated())
    scores = score(run, 1, ScoreConfig(), annotated=annotated)
    # Re-run with a config change, and crash while writing the output parquet.
    import tasks.store as store_mod

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(store_mod.pq, "write_table", boom)
    with pytest.raises(OSError, match="disk full"):
        score(run, 1, ScoreConfig(metric="var"), annotated=annotated)
    monkeypatch.undo()
    # The old manifest was withdrawn first, so neither config counts as complete.
    assert store.read_manifest(1, "score") is None
    state = score.task(run, 1, ScoreConfig(), "score", {"annotated": annotated}, return_state=True)
    assert state.name == "Completed" and state.result().content_hash == scores.content_hash
    leftovers = [f for f in os.listdir(os.path.dirname(store.path(1, "x"))) if ".tmp-" in f]
    assert leftovers == []


def _strict_json(text: str) -> dict:
    """``text`` read as standard JSON: Python's json takes NaN and Infinity, other readers
    (jq, a browser, Go, Rust) refuse them."""

    def refuse(name: str) -> None:
        raise ValueError(f"not standard JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def test_a_stat_that_is_not_a_finite_number_is_recorded_as_its_name(tmp_path) -> None:
    # A solver's loss that diverged, a gradient norm that overflowed: the stage finishes, and
    # its manifest says so in standard JSON.
    from tasks.context import StageOutput
    from tasks.stage import Stage

    def diverged(ctx, config) -> StageOutput:
        stats = {"loss": float("nan"), "rows": 1, "grad": {"norm": float("inf"), "min": -1e999}}
        return StageOutput(pa.table({"x": [1]}), stats=stats)

    run = _run(tmp_path)
    Stage("diverged", diverged, version=1, inputs={}, outputs=("x",))(run, 1, ScoreConfig())
    with open(run.store().path(1, "diverged.manifest.json")) as f:
        manifest = _strict_json(f.read())
    assert manifest["stats"] == {"loss": "nan", "rows": 1, "grad": {"norm": "inf", "min": "-inf"}}


def test_run_json_is_written_strict_or_not_at_all(tmp_path) -> None:
    store = RunStore(str(tmp_path), "r")
    path = f"{store.base}/x.json"
    with pytest.raises(ValueError, match="not written as JSON: Out of range float"):
        store.write_json(path, {"a": {"b": float("inf")}})
    with pytest.raises(ValueError, match="not written as JSON"):
        store.write_manifest(1, "x", {"stats": {"loss": float("nan")}})
    assert not os.path.exists(path) and store.read_manifest(1, "x") is None
    store.write_json(path, {"a": 1.5})
    with open(path) as f:
        assert _strict_json(f.read()) == {"a": 1.5}


def test_a_launch_that_lost_the_lock_starts_no_stage_and_writes_nothing(tmp_path) -> None:
    # A holder that resumes between two stages, after another launch took the run over: the
    # next stage it would run withdrew that launch's manifest and wrote a traceback in logs/.
    from tasks.run_lock import RunLockLost, lock_path, run_lock

    run = _run(tmp_path)
    store = run.store()
    annotated = _input(store, 1, "creator_annotate", _annotated())
    with run_lock(store) as owner:
        score(run, 1, ScoreConfig(), annotated=annotated)
        theirs = store.read_manifest(1, "score")
        with open(lock_path(store), "w") as f:
            json.dump({**owner, "token": "taken-over", "pid": 1, "host": "elsewhere"}, f)
        before = sorted(os.listdir(store.base)), sorted(os.listdir(store.scratch_dir()))
        with pytest.raises(RunLockLost, match=r"lost the run's lock to pid 1 on elsewhere"):
            score(run, 1, ScoreConfig(metric="var"), annotated=annotated)
        assert store.read_manifest(1, "score") == theirs
        assert (sorted(os.listdir(store.base)), sorted(os.listdir(store.scratch_dir()))) == before


def test_plan_targets_one_stage_and_follows_refs_not_order(tmp_path) -> None:
    run = _run(tmp_path)
    store = run.store()
    annotated = _input(store, 1, "creator_annotate", _annotated())
    scores = score(run, 1, ScoreConfig(), annotated=annotated)
    subset = sample(run, 1, SampleConfig(fraction=0.5), scores=scores)
    plan = Plan(target_iteration=1, target="sample")
    plan_run = _run(tmp_path, plan=plan)
    # Neither the target nor made from it: reused, never computed.
    state = score.task(
        plan_run, 1, ScoreConfig(), "score", {"annotated": annotated}, return_state=True
    )
    assert state.name == "Cached" and not state.result().rerun
    state = sample.task(
        plan_run, 1, SampleConfig(fraction=0.5), "sample", {"scores": scores}, return_state=True
    )
    assert state.name == "Completed" and plan.met()
    rerun_subset = state.result()
    assert rerun_subset.rerun  # what reads it knows it was made by the target
    # What reads the target is skipped unless asked for (no order: its refs say so).
    current = _input(store, 0, "mix", seed_records(["a", "b"]))
    refs = {"current": current, "evolved": rerun_subset}
    state = mix.task(plan_run, 1, MixConfig(), "mix", refs, return_state=True)
    assert state.name == "Skipped" and state.result().skipped
    # A stage that does not read the target and never finished is skipped, not computed...
    refs = {"current": current, "evolved": subset}
    state = mix.task(plan_run, 1, MixConfig(), "mix", refs, return_state=True)
    assert state.name == "Skipped" and store.read_manifest(1, "mix") is None
    # ... and with --downstream, what reads the target runs, forced.
    down = _run(tmp_path, plan=Plan(target_iteration=1, target="sample", downstream=True))
    refs = {"current": current, "evolved": rerun_subset}
    state = mix.task(down, 1, MixConfig(), "mix", refs, return_state=True)
    assert state.name == "Completed" and state.result().rerun
    # An upstream stage that is not cached cannot be silently recomputed: it is skipped, and
    # the target fails naming that input, logged as its one line without Prefect's traceback.
    skipped = score(plan_run, 1, ScoreConfig(metric="var"), annotated=annotated)
    assert skipped.skipped
    missing = "sample of iter_1: its input 'scores' has no finished artifact"
    with _records("prefect.task_runs") as logged, pytest.raises(StageError, match=missing):
        sample(plan_run, 1, SampleConfig(fraction=0.5), scores=skipped)
    failed = [r for r in logged if "no finished artifact" in r.getMessage()]
    assert failed and all(r.exc_info is None for r in failed)
    # A target the flow never calls is never met: the CLI names it (test_run_e2e).
    elsewhere = Plan(target_iteration=2, target="sample")
    sample(_run(tmp_path, plan=elsewhere), 1, SampleConfig(fraction=0.5), scores=scores)
    assert not elsewhere.met() and elsewhere.called_at(1) == ["sample"]


def test_s3_root_through_a_local_s3_server(tmp_path, capsys, local_s3) -> None:
    opts = local_s3
    run = RunContext(root="s3://eva-bucket/runs", run="r", seed=1, storage_options=opts)
    store = run.store()
    annotated = _input(store, 1, "creator_annotate", _annotated())
    assert annotated.uri.startswith("iter_1/")  # relative: the run can move
    ref = score(run, 1, ScoreConfig(), annotated=annotated)
    assert ref.uri == "iter_1/score.parquet"
    assert store.absolute(ref.uri) == "s3://eva-bucket/runs/r/iter_1/score.parquet"
    assert store.read_table(ref.uri).num_rows == 8
    state = score.task(run, 1, ScoreConfig(), "score", {"annotated": annotated}, return_state=True)
    assert state.name == "Cached"
    with store.fs.open("eva-bucket/runs/r/iter_1/score.manifest.json") as f:
        assert json.load(f)["content_hash"] == ref.content_hash
    # `eva show` opens the run with the endpoint given on the command line, then uses the
    # run's stored options (here: the credentials) for everything else.
    from flows import cli
    from flows.config import RunConfig
    from flows.runs import stored_config

    stored = RunConfig(root="s3://eva-bucket/runs", run="r", storage_options=opts)
    with store.fs.open("eva-bucket/runs/r/config.json", "w") as f:
        f.write(stored.model_dump_json())
    argv = ["show", "--run", "r", "--root", "s3://eva-bucket/runs", "--iteration", "1"]
    assert cli.main([*argv, "--stage", "score", "--storage-options", json.dumps(opts)]) == 0
    printed = capsys.readouterr().out
    assert '"rows": 8' in printed and '"uri": "iter_1/score.parquet"' in printed
    assert stored_config("s3://eva-bucket/runs", "r", opts).storage_options == opts


def test_init_checkpoint_local_or_hub_id(tmp_path) -> None:

    from tasks.bootstrap import BootstrapConfig, _checkpoint_key
    from tasks.content_hashes import is_hub_id

    assert is_hub_id("google/gemma-2-9b-it") and not is_hub_id("/nope") and not is_hub_id("./a")
    hub = BootstrapConfig(init_checkpoint="google/gemma-2-9b-it")  # not fetched at validation
    assert _checkpoint_key(hub) != _checkpoint_key(BootstrapConfig(init_checkpoint="google/x"))
    with pytest.raises(ValidationError, match=r"no checkpoint at '\./missing'"):
        BootstrapConfig(init_checkpoint="./missing")
    (tmp_path / "config.json").write_text("{}")
    local = _checkpoint_key(BootstrapConfig(init_checkpoint=str(tmp_path)))
    (tmp_path / "config.json").write_text('{"changed": 1}')
    assert _checkpoint_key(BootstrapConfig(init_checkpoint=str(tmp_path))) != local


def test_keys_follow_declared_versions_not_code_text(tmp_path, monkeypatch) -> None:
    """A stage's key is its version, config, inputs and the versions of what it runs: eva's own
    version is not in it (an upgrade reruns nothing), a component's declared version is."""
    from tasks.annotate import AnnotateConfig, annotate
    from tasks.keys import components

    run = RunContext(root=str(tmp_path), run="r", seed=0)
    world = {"kind": "python", "factory": "eva_world.components:WorldVerifier"}
    config = AnnotateConfig.model_validate({"reward": world})
    key = annotate.cache_key(run, 1, config, "annotate", {})
    assert dict(components(config))["eva_world.components:WorldVerifier"].version == 1
    import importlib.metadata as metadata

    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda p: "99.0" if p == "eva" else real(p))
    assert annotate.cache_key(run, 1, config, "annotate", {}) == key  # an eva upgrade
    from eva_world.components import WorldVerifier

    monkeypatch.setattr(WorldVerifier, "version", 2)  # the world's verifier changed
    assert annotate.cache_key(run, 1, config, "annotate", {}) != key
    monkeypatch.undo()
    monkeypatch.setattr(annotate, "version", annotate.version + 1)  # the stage itself changed
    assert annotate.cache_key(run, 1, config, "annotate", {}) != key


def test_every_stage_and_component_matches_its_recorded_version() -> None:
    """The CI check behind versioned keys: code that changed without a version bump (or a
    recorded fingerprint) fails here, naming it (`python -m tasks.versions`)."""
    from tasks.versions import check

    assert check() == []


def test_a_code_change_without_a_version_bump_is_caught(tmp_path, monkeypatch) -> None:
    import json

    from tasks import versions

    lock = tmp_path / "versions.lock.json"
    monkeypatch.setattr(versions, "LOCK", lock)
    versions.write()
    assert versions.check() == []
    recorded = json.loads(lock.read_text())
    recorded["stage:score@tasks.score"]["code"] = "0" * 16  # as if score.py had been edited
    lock.write_text(json.dumps(recorded))
    assert versions.check() == [
        "stage:score@tasks.score: its code changed but its version is still 1: bump it if what "
        "it writes can change; if it cannot, record it: python -m tasks.versions --write"
    ]
    recorded["stage:score@tasks.score"]["version"] = 0  # bumped in code, not yet recorded
    lock.write_text(json.dumps(recorded))
    assert versions.check()[0].startswith("stage:score@tasks.score: version 1 is not recorded")
    # Comments, docstrings and layout are not code: the fingerprint ignores them.
    plain = versions.code_of("def f(x):\n    return x + 1\n")
    noted = '"""Doc."""\ndef f(x):\n    """Adds one."""\n    return (x +\n 1)  # why\n'
    assert versions.code_of(noted) == plain != versions.code_of("def f(x):\n    return x + 2\n")


def test_editing_a_user_reward_function_changes_the_annotate_key(tmp_path, monkeypatch) -> None:
    from tasks.annotate import AnnotateConfig, annotate
    from tasks.context import RunContext

    module = tmp_path / "my_reward.py"
    module.write_text("def score(prompt, response):\n    return 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    config = AnnotateConfig.model_validate(
        {"reward": {"kind": "callable", "function": "my_reward:score"}}
    )
    run = RunContext(root=str(tmp_path), run="r", seed=0)
    key = annotate.cache_key(run, 1, config, "annotate", {})
    assert annotate.cache_key(run, 1, config, "annotate", {}) == key
    module.write_text("def score(prompt, response):\n    return 0.5\n")
    assert annotate.cache_key(run, 1, config, "annotate", {}) != key


def test_ui_tables_show_lineage_the_creators_decision_and_the_distribution() -> None:
    import logging
    from types import SimpleNamespace

    from eva_core.evolution import evolved_records

    ctx = SimpleNamespace(seed=3, log=logging.getLogger("t"), iteration=1)
    # a_min of rows [i/8, 0, 0.5]: 0.5 for i <= 4, then 0.625, 0.75, 0.875 (sum 4.75).
    scored = score.fn(ctx, ScoreConfig(), annotated=_annotated())
    dist = scored.ui_tables["distribution"]
    assert [r["prompts"] for r in dist] == [5, 0, 0, 1, 0, 0, 1, 0, 0, 1]
    assert (dist[0]["from"], dist[-1]["to"], dist[0]["share"]) == (0.5, 0.875, 0.625)
    top = scored.ui_tables["most-informative"]
    assert top[0]["informativeness"] == 0.875 and top[0]["prompt"] == "7+7="
    assert top[0]["root_id"] == top[0]["prompt_id"] and top[0]["depth"] == 0
    assert scored.ui_notes["most-informative"] == (
        "top 8 of 8 prompts by informativeness (a_min), descending"
    )
    drawn = sample.fn(ctx, SampleConfig(fraction=0.5), scores=scored.table)
    rows = drawn.ui_tables["drawn"]
    assert [r["draw_rank"] for r in rows] == [0, 1, 2, 3]
    assert all(r["weight_share"] == pytest.approx(r["informativeness"] / 4.75) for r in rows)
    # At temperature 0.5 the odds are the squares: 5 x 0.25 + 0.390625 + 0.5625 + 0.765625.
    sharp = sample.fn(ctx, SampleConfig(fraction=0.5, temperature=0.5), scores=scored.table)
    assert all(
        r["weight_share"] == pytest.approx(r["informativeness"] ** 2 / 2.96875)
        for r in sharp.ui_tables["drawn"]
    )
    # mix: which originals X_t keeps, with their lineage.
    evolved, _ = evolved_records(drawn.table, [[(f"{p} again", "m")] for p in "abcd"], 1)
    current = _annotated().select(list(evolved.schema.names))
    mixed = mix.fn(ctx, MixConfig(), current=current, evolved=evolved)
    kept = mixed.ui_tables["originals-kept"]
    assert kept and all(r["depth"] == 0 and r["parent_id"] is None for r in kept)
    assert mixed.ui_notes["originals-kept"].endswith("beside 4 evolved ones, in X_t's order")
    # X_1 holds prompts evolved in iteration 1: mixed into X_2, they are kept ones, not new.
    older, _ = evolved_records(current.slice(0, 2), [[("older a", "m")], [("older b", "m")]], 1)
    x1 = pa.concat_tables([current, older])
    newer, _ = evolved_records(drawn.table, [[(f"{p} anew", "m")] for p in "abcd"], 2)
    size = x1.num_rows + newer.num_rows
    mixed = mix.fn(ctx, MixConfig(ratio_evolved=4 / size, size=size), current=x1, evolved=newer)
    kept = mixed.ui_tables["originals-kept"]
    assert len(kept) == x1.num_rows and sum(r["depth"] == 1 for r in kept) == 2
    assert mixed.ui_notes["originals-kept"] == (
        f"first {x1.num_rows} of the {x1.num_rows} prompts of X_t-1 kept beside 4 evolved ones, "
        "in X_t's order"
    )


@contextlib.contextmanager
def _records(name: str) -> Iterator[list[logging.LogRecord]]:
    """The records logger ``name`` passes to its handlers (after its own filters)."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep()
    logging.getLogger(name).addHandler(handler)
    try:
        yield records
    finally:
        logging.getLogger(name).removeHandler(handler)


def test_only_stage_errors_lose_their_traceback_in_prefects_run_logs() -> None:
    for name in ("prefect.task_runs", "prefect.flow_runs"):
        with _records(name) as logged:
            for error in (StageError("mix: input lacks prompt"), ValueError("a bug")):
                try:
                    raise error
                except Exception as exc:
                    logging.getLogger(name).error("failed: %r", exc, exc_info=True)
        assert [r.exc_info is None for r in logged] == [True, False]
        assert logged[0].getMessage() == "failed: StageError('mix: input lacks prompt')"


def test_sample_temperature_keys_a_stage_only_when_set_and_only_for_weighted() -> None:
    from tasks.keys import keyed_config

    assert "temperature" not in keyed_config(SampleConfig())  # earlier runs keep their keys
    assert keyed_config(SampleConfig(temperature=0.5))["temperature"] == 0.5
    with pytest.raises(ValidationError, match="temperature: applies to method weighted only"):
        SampleConfig(method="greedy", temperature=0.5)
    with pytest.raises(ValidationError, match="greater than 0"):
        SampleConfig(temperature=0)

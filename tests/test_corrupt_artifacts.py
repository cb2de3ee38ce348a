"""A run whose manifest or table was damaged on disk: a relaunch redoes exactly that stage,
``eva show`` names the file in one line."""

from __future__ import annotations

import json
import os
import time

import pytest

from flows.cli import main
from flows.config import validate_config
from tasks.store import RunStore, UnreadableArtifact
from tests.conftest import tiny_run_config

pytestmark = pytest.mark.usefixtures("prefect_api")


def _state(store: RunStore) -> dict[tuple, tuple[str, bytes]]:
    """Every finished stage of a run: its manifest's creation time and its parquet's bytes."""
    out = {}
    for t in (None, *store.iterations()):
        for artifact in store.artifacts(t):
            m = store.read_manifest(t, artifact)
            assert m is not None
            with open(store.resolve(m["uri"]), "rb") as f:
                out[(t, artifact)] = (m["created_at"], f.read())
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished run of the setup and iteration 0 (generate, annotate, pairs, train,
    evaluate), relaunched by each test after it damaged one file."""
    from flows.run import eva_run

    root = str(tmp_path_factory.mktemp("runs"))
    config = validate_config(tiny_run_config(root, run="c", iterations=0))
    eva_run(config)
    return config


def _relaunch_after(config, damage, capsys) -> tuple[set[tuple], dict, dict, str]:
    from flows.run import eva_run

    store = RunStore(config.root, config.run)
    before = _state(store)
    damage(store)
    # eva show names the damaged file in one line, no traceback.
    capsys.readouterr()
    assert main(["show", "--run", config.run, "--root", config.root]) == 2
    err = capsys.readouterr().err.strip()
    time.sleep(1.1)  # created_at has one-second resolution
    eva_run(config)
    after = _state(store)
    assert set(after) == set(before)
    changed = {k for k in after if after[k][0] != before[k][0]}
    return changed, before, after, err


def test_an_unreadable_manifest_is_redone_alone_and_shown_in_one_line(run, capsys, caplog) -> None:
    def garble(store: RunStore) -> None:
        with open(store.path(None, "evaluate.manifest.json"), "w") as f:
            f.write("{garbage\n")

    changed, before, after, err = _relaunch_after(run, garble, capsys)
    path = RunStore(run.root, run.run).path(None, "evaluate.manifest.json")
    assert err.startswith(f"eva: error: {path} is not a readable manifest (Expecting property")
    assert "\n" not in err and "launch the run again" in err
    assert changed == {(None, "evaluate")}
    assert after[(None, "evaluate")][1] == before[(None, "evaluate")][1]  # byte-identical
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert said == [
        f"{path} was unreadable (Expecting property name enclosed in double quotes): "
        "removed, its stage is redone"
    ]


def test_a_manifest_missing_its_key_is_redone_alone(run, capsys) -> None:
    def strip_key(store: RunStore) -> None:
        path = store.path(0, "pairs.manifest.json")
        with open(path) as f:
            manifest = json.load(f)
        del manifest["key"]
        with open(path, "w") as f:
            json.dump(manifest, f)
        with pytest.raises(UnreadableArtifact, match=r"pairs.manifest.json is not a readable "
                           r"manifest \(no key\) \(launch the run again"):  # fmt: skip
            store.read_manifest(0, "pairs")

    changed, before, after, _ = _relaunch_after(run, strip_key, capsys)
    assert changed == {(0, "pairs")}
    assert after[(0, "pairs")][1] == before[(0, "pairs")][1]


def test_a_truncated_table_is_redone_alone_and_shown_in_one_line(run, capsys) -> None:
    def truncate(store: RunStore) -> None:
        path = store.resolve(store.read_manifest(0, "evaluate")["uri"])  # type: ignore[index]
        os.truncate(path, os.path.getsize(path) // 2)

    changed, before, after, err = _relaunch_after(run, truncate, capsys)
    path = RunStore(run.root, run.run).path(0, "evaluate.parquet")
    assert err.startswith(f"eva: error: {path} is not a readable table (")
    assert "\n" not in err
    assert changed == {(0, "evaluate")}
    assert after[(0, "evaluate")][1] == before[(0, "evaluate")][1]


def test_sweep_removes_only_unreadable_manifests_on_s3(local_s3) -> None:
    store = RunStore("s3://eva-bucket/runs", "r", local_s3)
    good = {"artifact": "a", "iteration": 1, "key": "k", "uri": "iter_1/a.parquet", "bytes": 1,
            "rows": 1, "content_hash": "h"}  # fmt: skip
    store.write_manifest(1, "a", good)
    store.write_json(store.path(1, "b.manifest.json"), [1, 2])  # JSON, not a manifest
    with store.fs.open(store.path(None, "c.manifest.json"), "wb") as f:
        f.write(b"\xff{")
    for name in ("a", "b", "d"):  # d: a table whose stage failed before its manifest
        store.fs.pipe_file(store.path(1, f"{name}.parquet"), b"PAR1")
    removed = store.sweep()
    assert sorted(p.rsplit("/", 2)[-2] + "/" + p.rsplit("/", 1)[-1] for p in removed) == [
        "iter_1/b.manifest.json",
        "iter_1/d.parquet",
        "setup/c.manifest.json",
    ]
    assert store.read_manifest(1, "a") == good
    assert store.artifacts(1) == ["a"] and store.artifacts(None) == []
    # b's table is left to b's rerun, which overwrites it: one line said b is redone.
    assert store.fs.exists(store.path(1, "a.parquet")) and store.fs.exists(
        store.path(1, "b.parquet")
    )

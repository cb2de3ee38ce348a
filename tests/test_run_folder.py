"""A run folder is the run: a run copied, renamed or moved is shown, rerun and resumed where it
now is (its config.json still names the folder it came from), and the folder it came from is
never read, written or locked; a forced rerun records the hash of the input it read, also when
that input was edited by hand. Each command is the real ``eva``, in a process of its own."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tasks.keys import sha
from tests.conftest import tiny_run_config

PROJECT = str(Path(__file__).resolve().parents[1])


def _eva(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``eva ARGV`` in a process of its own, reporting to the suite's Prefect API."""
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "PYTHONPATH": PROJECT, "PREFECT_API_URL": str(PREFECT_API_URL.value())}
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", *argv],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def _copy(source: Path, to: Path) -> None:
    """``cp -a``, as a user copies a run."""
    to.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-a", str(source), str(to)], check=True)


def _hashes(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` with the sha256 of its bytes."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _manifest(run: Path, where: str, stage: str) -> dict:
    return json.loads((run / where / f"{stage}.manifest.json").read_text())


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory, policy_dir: str, prefect_api: None) -> Path:
    """A finished tiny run (setup and iteration 0 on the suite's tiny policy), made once by
    ``eva run``; each test copies it before it touches anything."""
    top = tmp_path_factory.mktemp("made")
    theta_0 = {"init_checkpoint": policy_dir}
    config = tiny_run_config(str(top / "runs"), "demo", iterations=0, bootstrap=theta_0)
    (top / "demo.json").write_text(json.dumps(config))
    done = _eva("run", "--config", str(top / "demo.json"), cwd=top)
    assert done.returncode == 0, done.stderr[-3000:]
    return top / "runs" / "demo"


@pytest.mark.parametrize("how", ["copy", "rename", "move"])
@pytest.mark.usefixtures("prefect_api")
def test_a_copied_renamed_or_moved_run_is_the_folder_it_is_in(made, tmp_path, how) -> None:
    original = tmp_path / "runs" / "demo"
    _copy(made, original)
    kept = _hashes(original)
    target = {
        "copy": tmp_path / "runs" / "demo2",
        "rename": tmp_path / "runs" / "renamed",
        "move": tmp_path / "elsewhere" / "runs" / "demo",
    }[how]
    target.parent.mkdir(parents=True, exist_ok=True)
    if how == "copy":
        _copy(original, target)
    else:
        original.rename(target)
    copied = (target / "config.json").read_text()
    assert json.loads(copied)["run"] == "demo"  # as it was
    where = ("--run", target.name, "--root", str(target.parent))

    # show: the target's own manifest (marked by hand), not the original's.
    manifest = _manifest(target, "setup", "evaluate")
    (target / "setup" / "evaluate.manifest.json").write_text(
        json.dumps({**manifest, "seconds": 4242})
    )
    done = _eva("show", *where, "--iteration", "setup", "--stage", "evaluate", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert '"seconds": 4242' in done.stdout

    # stage --force: rewrites the target's artifact, under the target's name and root.
    done = _eva("stage", "evaluate", "--iteration", "setup", "--force", *where, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    redone = _manifest(target, "setup", "evaluate")
    assert redone["created_at"] >= manifest["created_at"] and redone["seconds"] != 4242
    stored = json.loads((target / "config.json").read_text())
    assert (stored["run"], stored["root"]) == (target.name, str(target.parent))

    # run, from the copy's own config.json as it was copied (naming the original's folder):
    # resumes the target (everything reused), nothing else.
    (target / "config.json").write_text(copied)
    before = _hashes(target)
    done = _eva("run", "--config", str(target / "config.json"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"eva run '{target.name}' under {target.parent}" in done.stdout
    assert json.loads((target / "config.json").read_text())["run"] == target.name
    after = _hashes(target)
    assert {k: v for k, v in after.items() if k != "config.json"} == {
        k: v for k, v in before.items() if k != "config.json"
    }  # every stage reused

    if how == "copy":
        assert _hashes(original) == kept  # the original's files keep their hashes
    else:
        assert not original.exists()  # nothing recreated where the run was


def _edit_keeping_size(path: Path) -> None:
    """Change the first prompt of a table by hand (one digit), as a user editing the parquet
    would, keeping the file's size: a stage then still counts the table as finished."""
    table, size = pq.read_table(path), path.stat().st_size
    column = table.column_names.index("prompt")
    prompts = table.column("prompt").to_pylist()
    for digit in "0123456789":
        edited_prompt = prompts[0][:-2] + digit + prompts[0][-1:]
        if edited_prompt == prompts[0]:
            continue
        edited = table.set_column(
            column, table.schema.field(column), pa.array([edited_prompt, *prompts[1:]], pa.string())
        )
        pq.write_table(edited, path, compression="zstd")
        if path.stat().st_size == size:
            return
    pytest.fail(f"no one-digit edit of {path} keeps its size")


@pytest.mark.usefixtures("prefect_api")
def test_a_forced_rerun_records_the_hash_of_the_input_it_read(made, tmp_path) -> None:
    run = tmp_path / "runs" / "demo"
    _copy(made, run)
    heldout = run / "setup" / "heldout.parquet"
    recorded = _manifest(run, "setup", "heldout")["content_hash"]
    _edit_keeping_size(heldout)
    edited = hashlib.sha256(heldout.read_bytes()).hexdigest()
    assert sha(edited) != recorded  # the heldout manifest still describes the old table

    where = ("--run", "demo", "--root", str(run.parent))
    done = _eva("stage", "evaluate", "--iteration", "setup", "--force", *where, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    read = _manifest(run, "setup", "evaluate")["inputs"]["heldout"]
    assert read == {"uri": "setup/heldout.parquet", "content_hash": sha(edited), "sha256": edited}
    assert "its input heldout (setup/heldout.parquet) is not the table its manifest" in done.stderr
    assert _manifest(run, "setup", "heldout")["content_hash"] == recorded  # left as it was


def test_a_run_folders_config_names_that_folders_run_and_a_recipe_is_read_as_it_is(
    tmp_path,
) -> None:
    from flows.config import load_config

    stored = {"run": "demo", "root": "/where/it/was", "iterations": 3}
    copy = tmp_path / "runs" / "demo2"
    (copy / "setup").mkdir(parents=True)
    (copy / "config.json").write_text(json.dumps(stored))
    config = load_config(str(copy / "config.json"))
    assert (config.run, config.root, config.iterations) == ("demo2", str(tmp_path / "runs"), 3)
    # --run/--root (--set) still choose: a new run from a run's config.
    config = load_config(str(copy / "config.json"), ["run=fresh"])
    assert (config.run, config.root) == ("fresh", str(tmp_path / "runs"))
    # A config.json that is no run's (no run folder around it) says where its run is.
    recipe = tmp_path / "recipes" / "config.json"
    recipe.parent.mkdir()
    recipe.write_text(json.dumps(stored))
    assert (load_config(str(recipe)).run, load_config(str(recipe)).root) == (
        "demo",
        "/where/it/was",
    )

"""One launch per run: a second launch is refused while the first runs, a killed one's lock is
taken over, on a local disk and on S3 (moto)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import pytest
import yaml

from flows.cli import main
from flows.config import validate_config
from tasks import run_lock as lock_module
from tasks.run_lock import RunLocked, lock_path, read_owner, run_lock
from tasks.store import RunStore
from tests.conftest import tiny_run_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOLDER = """
import json, sys, time
from tasks.run_lock import run_lock
from tasks.store import RunStore
store = RunStore(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]))
with run_lock(store) as owner:
    print(owner["token"], flush=True)
    time.sleep(float(sys.argv[4]))
"""


def _holder(root: str, run: str, options: dict[str, Any], seconds: float, **env: str):
    """Another process holding the run's lock for ``seconds``; returns it and its token."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, root, run, json.dumps(options), str(seconds)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )
    assert proc.stdout is not None
    token = proc.stdout.readline().strip()
    assert token, f"the holder exited with {proc.wait()}"
    return proc, token


def _kill_9(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_second_launch_is_refused_and_a_killed_holder_is_taken_over(
    where, tmp_path, request
) -> None:
    if where == "s3":
        options, root = request.getfixturevalue("local_s3"), "s3://eva-bucket/runs"
    else:
        options, root = {}, str(tmp_path)
    store = RunStore(root, "r", options)
    proc, token = _holder(root, "r", options, 60)
    try:
        with pytest.raises(RunLocked) as refused, run_lock(store):
            pass
        line = refused.value.line()
        assert f"another launch holds this run (pid {proc.pid} on {socket.gethostname()}" in line
        assert f"delete {lock_path(store)}" in line and "\n" not in line
        assert read_owner(store)["token"] == token  # the refusal left the holder's lock alone
    finally:
        _kill_9(proc)
    # kill -9 released nothing: the lock is still there, and its holder is gone.
    assert read_owner(store)["token"] == token
    with run_lock(store) as owner:
        assert read_owner(store) == owner and owner["pid"] == os.getpid()
    assert read_owner(store) is None  # released on exit


def test_a_holder_that_ends_releases_and_a_child_shares_the_hold(tmp_path) -> None:
    store = RunStore(str(tmp_path), "r")
    proc, _ = _holder(str(tmp_path), "r", {}, 0)
    assert proc.wait() == 0 and read_owner(store) is None
    with run_lock(store) as owner:
        # A process the holder starts inherits its token and opens the run without waiting;
        # its exit leaves the holder's lock in place.
        child, token = _holder(str(tmp_path), "r", {}, 0)
        assert child.wait() == 0 and token == owner["token"]
        assert read_owner(store)["token"] == owner["token"]
        with run_lock(store):  # nested in one process: the same hold
            pass
        assert read_owner(store)["token"] == owner["token"]
    assert read_owner(store) is None and "EVA_RUN_LOCK" not in os.environ


def test_another_hosts_lock_is_taken_over_once_its_heartbeat_is_stale(tmp_path) -> None:
    store = RunStore(str(tmp_path), "r")
    os.makedirs(store.base)
    now = time.time()
    theirs = {"host": "elsewhere", "pid": 1, "token": "t", "started": now - 600,
              "where": store.uri(store.base)}  # fmt: skip
    with open(lock_path(store), "w") as f:
        json.dump({**theirs, "heartbeat": now - 5}, f)
    stale = r"pid 1 on elsewhere since .* heartbeat 5 s ago"
    with pytest.raises(RunLocked, match=stale), run_lock(store):
        pass
    with open(lock_path(store), "w") as f:
        json.dump({**theirs, "heartbeat": now - lock_module.STALE_S - 1}, f)
    with run_lock(store) as owner:
        assert read_owner(store)["token"] == owner["token"] != "t"
    # A lock file that does not parse names no holder: taken over, and held by this launch.
    with open(lock_path(store), "w") as f:
        f.write("{garbage")
    with run_lock(store) as owner:
        assert read_owner(store)["token"] == owner["token"] and owner["pid"] == os.getpid()
    # What a launch killed mid-heartbeat or mid-takeover left beside the lock is removed.
    for left in (".lock.json.tmp-1a2b3c4d", ".lock.json.stale-5e6f"):
        open(os.path.join(store.base, left), "w").close()
    with run_lock(store):
        assert os.listdir(store.base) == [".lock.json"]
    assert os.listdir(store.base) == []


def test_the_heartbeat_is_refreshed_while_held(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(lock_module, "HEARTBEAT_S", 0.1)
    store = RunStore(str(tmp_path), "r")
    with run_lock(store) as owner:
        first = read_owner(store)["heartbeat"]
        assert first == owner["started"]
        deadline = time.time() + 10
        while read_owner(store)["heartbeat"] == first:
            assert time.time() < deadline, "the heartbeat was never refreshed"
            time.sleep(0.05)
        assert read_owner(store)["token"] == owner["token"]


@pytest.mark.usefixtures("prefect_api")
def test_eva_run_and_eva_stage_refuse_a_held_run_in_one_line(tmp_path, capsys) -> None:
    root = str(tmp_path / "runs")
    cfg = tiny_run_config(root, run="held")
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    store = RunStore(root, "held")
    os.makedirs(store.base)
    with open(f"{store.base}/config.json", "w") as f:
        json.dump(validate_config(cfg).model_dump(mode="json"), f)
    proc, token = _holder(root, "held", {}, 60)
    try:
        for argv in (
            ["run", "--config", str(path)],
            ["stage", "prompts", "--run", "held", "--root", root, "--iteration", "setup"],
        ):
            assert main(argv) == 2
            err = capsys.readouterr().err.strip()
            assert err.startswith(f"eva: error: {lock_path(store)}: another launch holds this")
            assert f"pid {proc.pid}" in err and "\n" not in err
        # A deployment's flow run (no CLI before it) is refused by the lock the flow takes.
        from flows.run import eva_run

        with pytest.raises(RunLocked, match=f"pid {proc.pid} on "):
            eva_run(validate_config(cfg))
        assert sorted(os.listdir(store.base)) == [".lock.json", "config.json"]  # nothing ran
        assert read_owner(store)["token"] == token
    finally:
        _kill_9(proc)


def test_a_paused_holder_taken_over_stops_before_its_next_write(tmp_path) -> None:
    # A real `eva run` is stopped (SIGSTOP) mid-run and its lock taken over, as a second launch
    # does once the heartbeat is STALE_S old; resumed, it writes nothing more and fails.
    root = str(tmp_path / "runs")
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(tiny_run_config(root, run="paused")))
    store = RunStore(root, "paused")
    eva = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "run", "--config", str(path)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        first = os.path.join(store.base, "setup", "prompts.manifest.json")
        deadline = time.time() + 240
        while not os.path.exists(first):  # the run is under way: it holds the lock
            assert eva.poll() is None and time.time() < deadline, "the run never started"
            time.sleep(0.2)
        os.kill(eva.pid, signal.SIGSTOP)
        ours = read_owner(store)
        assert ours is not None and ours["pid"] == eva.pid
        written = {p: os.path.getmtime(p) for p in _manifest_files(store)}
        theirs = {**ours, "pid": 1, "host": "elsewhere", "token": "taken-over"}
        with open(lock_path(store), "w") as f:
            json.dump(theirs, f)
        taken_over = _everything(store)
        os.kill(eva.pid, signal.SIGCONT)
        out, _ = eva.communicate(timeout=240)
    finally:
        if eva.poll() is None:
            eva.kill()
            eva.wait()
    assert eva.returncode != 0, out
    assert "lost the run's lock to pid 1 on elsewhere" in out and "stopped before writing" in out
    # Not one manifest was written or rewritten after the takeover, and the new holder's lock
    # was left in place.
    assert {p: os.path.getmtime(p) for p in _manifest_files(store)} == written
    assert read_owner(store)["token"] == "taken-over"
    # Nor anything else: no traceback in logs/, no scratch. All it removed is the scratch of
    # the stage it was in, its own, under .scratch/ (which every run has from its launch on).
    # The one exception is a table whose check passed just before the pause: a stage reads the
    # lock, then writes its table, and SIGSTOP can fall between the two. It lands without its
    # manifest, so it is no stage's result, and the new holder's stage writes it again.
    left = _everything(store)
    late = left - taken_over
    assert len(late) <= 1, sorted(late)
    for p in late:
        assert p.endswith(".parquet") and p.removesuffix(".parquet") + ".manifest.json" not in left
    gone = {p for p in taken_over - left if not p.startswith(".scratch/")}
    assert all(p.split(".tmp-")[0] in late for p in gone), sorted(gone)  # the late table's
    assert not os.path.exists(os.path.join(store.base, "logs"))


def _everything(store: RunStore) -> set[str]:
    """Every file and folder of the run, relative to it."""
    found = set()
    for d, dirs, files in os.walk(store.base):
        found |= {os.path.relpath(os.path.join(d, n), store.base) for n in dirs + files}
    return found


def _manifest_files(store: RunStore) -> list[str]:
    return [
        os.path.join(d, f)
        for d, _, files in os.walk(store.base)
        for f in files
        if f.endswith(".manifest.json")
    ]


def test_a_lock_path_that_is_a_directory_is_one_line(tmp_path) -> None:
    store = RunStore(str(tmp_path), "r")
    os.makedirs(lock_path(store))
    with pytest.raises(RunLocked) as refused, run_lock(store):
        pass
    line = refused.value.line()
    assert "is a directory, where eva keeps the run's lock file" in line and "rm -r" in line


def test_ensure_held_raises_once_the_lock_is_another_launchs(tmp_path) -> None:
    from tasks.run_lock import RunLockLost, ensure_held

    store = RunStore(str(tmp_path), "r")
    ensure_held(store, "x")  # no hold in this process: nothing to check
    with run_lock(store) as owner:
        ensure_held(store, "x")
        with open(lock_path(store), "w") as f:
            json.dump({**owner, "token": "other", "pid": 7}, f)
        with pytest.raises(RunLockLost, match=r"lost the run's lock to pid 7 .* writing x"):
            ensure_held(store, "x")
    assert read_owner(store)["token"] == "other"  # the release left the new holder's lock

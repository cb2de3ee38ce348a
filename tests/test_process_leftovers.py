"""What a killed eva leaves in the temporary folder (a managed process's private log) is
removed by the next eva that starts a process; a log kept after a failure stays."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile

import pytest

from eva_runtime import process

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STARTER = """
import sys, time
from eva_runtime.process import ManagedProcess
p = ManagedProcess(["sleep", "60"], stop_s=1)
print(p.log_path, flush=True)
time.sleep(60)
"""


def test_a_killed_evas_log_folder_is_removed_by_the_next_start(tmp_path, monkeypatch) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    eva = subprocess.Popen(
        [sys.executable, "-c", STARTER], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
    )
    assert eva.stdout is not None
    log_path = eva.stdout.readline().strip()
    killed = os.path.dirname(log_path)
    assert os.path.dirname(killed) == str(tmp_path)
    os.kill(eva.pid, signal.SIGKILL)
    eva.wait()
    # The guard stops the command; nobody is left to remove the folder.
    assert os.path.isfile(log_path)

    # A log kept after a failure (its path is in the error) is not the sweep's to remove.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(process, "_swept", False)
    failing = process.ManagedProcess(["sh", "-c", "echo boom; exit 3"], stop_s=1)
    with pytest.raises(process.ServerStartError, match="boom"):
        failing.wait_until(lambda: None, 10)
    kept = os.path.dirname(failing.log_path)
    assert os.path.isdir(kept) and os.listdir(kept) == ["output.log"]

    monkeypatch.setattr(process, "_swept", False)
    mine = process.ManagedProcess(["sleep", "60"], stop_s=1)
    try:
        ours = os.path.dirname(mine.log_path)
        assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(p) for p in (kept, ours))
        # A folder of a live eva (this one) is left alone by another sweep.
        assert process.sweep_orphaned_logs(str(tmp_path)) == []
    finally:
        mine.stop()
    assert sorted(os.listdir(tmp_path)) == [os.path.basename(kept)]

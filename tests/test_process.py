"""The one managed-process lifecycle, with real processes: the stop takes the whole tree (also
what moved to a session of its own, as Ray's job drivers do), the guard does the same when eva
is killed with SIGKILL, readiness fails fast with the output's tail, output can be piped."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from eva_runtime.poll import wait_until
from eva_runtime.process import ManagedProcess, ServerStartError

REPO = str(Path(__file__).resolve().parents[1])
# A command with a worker in its own process group and one in a session of its own; it writes
# "<worker pid> <detached pid>" to the file it is given, then waits.
TREE = [
    sys.executable, "-c",
    "import subprocess, sys, time\n"
    "sleep = [sys.executable, '-c', 'import time; time.sleep(300)']\n"
    "worker = subprocess.Popen(sleep)\n"
    "detached = subprocess.Popen(sleep, start_new_session=True)\n"
    "open(sys.argv[1] + '.tmp', 'w').write(f'{worker.pid} {detached.pid}')\n"
    "import os; os.replace(sys.argv[1] + '.tmp', sys.argv[1])\n"
    "print('up', flush=True); time.sleep(300)",
]  # fmt: skip


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def all_gone(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(alive(p) for p in pids)


def pids_in(path: Path) -> list[int]:
    text = wait_until(lambda: path.exists() and path.read_text(), 60, what=f"pids in {path}")
    return [int(p) for p in text.split()]


def test_stop_takes_the_whole_tree_even_what_left_the_session(tmp_path: Path) -> None:
    proc = ManagedProcess([*TREE, str(tmp_path / "pids")], stop_s=5.0)
    worker, detached = pids_in(tmp_path / "pids")
    assert os.getsid(detached) == detached != proc.pid == os.getsid(worker)
    members = proc.members()
    assert {proc.pid, worker, detached} <= set(members)
    log_dir = os.path.dirname(proc.log_path)
    assert proc.running and os.path.isdir(log_dir)
    proc.stop()
    assert proc.stopped and not proc.running and proc.process.returncode is not None
    assert not [p for p in members if alive(p)]  # the stop returns once all are gone
    assert not os.path.exists(log_dir)  # a clean stop removes its temporary folder
    proc.stop()  # idempotent


KILLED_EVA = """
import sys, time
from eva_runtime.process import ManagedProcess
proc = ManagedProcess(sys.argv[1:], stop_s=1.0)
print(proc.pid, flush=True)
time.sleep(300)
"""


def test_a_sigkill_of_eva_leaves_nothing_of_the_tree_behind(tmp_path: Path) -> None:
    eva = subprocess.Popen(
        [sys.executable, "-c", KILLED_EVA, *TREE, str(tmp_path / "pids")],
        stdout=subprocess.PIPE, cwd=REPO, text=True,
    )  # fmt: skip
    try:
        assert eva.stdout is not None
        guard = int(eva.stdout.readline())
        worker, detached = pids_in(tmp_path / "pids")
        command = [c.pid for c in psutil.Process(guard).children()]
        tree = [guard, *command, worker, detached]
        assert len(tree) == 4 and all(alive(p) for p in tree)
    finally:
        eva.kill()  # SIGKILL: no finalizer of eva's runs; only the guard is left to act
        eva.wait()
    assert all_gone(tree, 15.0), [p for p in tree if alive(p)]


def test_a_process_that_exits_before_it_is_ready_fails_with_its_tail(tmp_path: Path) -> None:
    lines = "; ".join(f"print('line {i}')" for i in range(40))
    proc = ManagedProcess([sys.executable, "-c", f"{lines}; raise SystemExit(3)"])
    with pytest.raises(ServerStartError, match="the thing exited with code 3") as err:
        proc.wait_until(lambda: False, 30, what="the thing")
    assert err.value.returncode == 3 and "line 39" in str(err.value)
    assert "line 10" in str(err.value) and "line 9\n" not in str(err.value)  # the last 30
    assert os.path.exists(err.value.log_path) and proc.stopped  # kept for a post-mortem
    os.remove(err.value.log_path)
    os.rmdir(os.path.dirname(err.value.log_path))


@pytest.mark.parametrize(
    ("code", "says"),
    [
        # A traceback, then more lines (a server logs "startup failed" after it): the exception.
        ("import logging; logging.basicConfig(); "
         "logging.error('boom', exc_info=(KeyError, KeyError('k'), None)); "
         "print('Application startup failed. Exiting.'); raise SystemExit(3)",
         "the thing exited with code 3 before it was ready (KeyError: 'k'); command: "),
        ("print('listening...'); print('bye'); raise SystemExit(3)",
         "the thing exited with code 3 before it was ready (bye); command: "),
        ("raise SystemExit(3)",
         "the thing exited with code 3 before it was ready, having written nothing; command: "),
    ],
)  # fmt: skip
def test_the_line_a_failed_start_prints_says_what_its_output_ends_with(code, says) -> None:
    # It used to end in "... ends with:" and the output on the lines below, which the CLI's one
    # line leaves out: an empty cause, whatever the output said.
    proc = ManagedProcess([sys.executable, "-c", code])
    with pytest.raises(ServerStartError) as err:
        proc.wait_until(lambda: False, 30, what="the thing")
    line = err.value.line()
    assert line.startswith(says), line
    assert line.endswith("is empty" if "nothing" in says else "ends with:"), line
    os.remove(err.value.log_path)
    os.rmdir(os.path.dirname(err.value.log_path))


def test_a_stop_escalates_to_sigkill_after_the_grace_period() -> None:
    stubborn = [
        sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ignoring SIGTERM', flush=True); time.sleep(300)",
    ]  # fmt: skip
    proc = ManagedProcess(stubborn, stop_s=0.5, pipe=True)
    assert next(proc.lines()) == "ignoring SIGTERM"
    (child,) = psutil.Process(proc.pid).children()
    started = time.monotonic()
    proc.stop()
    assert time.monotonic() - started < 10 and not alive(child.pid)
    assert proc.tail() == "ignoring SIGTERM"

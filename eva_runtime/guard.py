"""Run a command and take its whole process tree down when eva dies, however eva dies.

eva cannot clean up after a SIGKILL or the OOM killer: its finalizers never run, and a ``vllm
serve``, a Ray head or an ``accelerate launch`` it started would hold the GPUs until someone
finds them. So eva never starts such a command directly; it starts this guard (a plain script,
standard library only, so it runs under any interpreter in a few milliseconds) in a session of
its own, with a pipe on stdin whose write end only eva holds, and the guard starts the command
in that session::

    python guard.py GRACE_SECONDS -- vllm serve CKPT --port 8000 ...

The kernel closes eva's end of the pipe when eva exits for any reason, so end-of-file on stdin
means "eva is gone". eva's own orderly stop closes the pipe too: either way the guard stops the
tree (``stop_tree``) and exits. When the command exits on its own, the guard exits with its
code, so eva sees the command's exit status.

The tree is every process of the guard's session and every descendant of one, found through
``/proc`` before anything is signalled and kept by pid and start time while it goes down: a Ray
job driver runs in a session of its own, and a worker is reparented once its parent dies, yet
both are stopped. ``stop_tree`` sends SIGTERM, waits the grace period for the tree to go, then
sends SIGKILL to what is left; eva calls the same function after the guard has exited, for
whatever the guard could not reach.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import subprocess
import sys
import time

KILL_ROUNDS = 5  # SIGKILL passes: a process may fork while its tree goes down

log = logging.getLogger("eva.guard")


def _stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, ppid, session, start time in clock ticks) of a process, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[1]), int(fields[3]), int(fields[19])


def start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot), None when it is not running."""
    stat = _stat(pid)
    return None if stat is None else stat[3]


def collect(session: int, known: dict[int, int], leader_start: int | None = None) -> None:
    """Add to ``known`` (pid -> start time) every process of ``session`` and every descendant
    of a process in ``known``. ``leader_start``: the session leader's start time; when a process
    with the session's id started at another time, the id has been reused and the session is
    not ours (its members are then not collected)."""
    stats = {int(e): s for e in os.listdir("/proc") if e.isdigit() and (s := _stat(int(e)))}
    leader = stats.get(session)
    ours = leader_start is None or leader is None or leader[3] == leader_start
    children: dict[int, list[int]] = {}
    for pid, (_, ppid, sid, started) in stats.items():
        children.setdefault(ppid, []).append(pid)
        if ours and sid == session and pid not in known:
            known[pid] = started
    todo = [pid for pid, started in known.items() if stats.get(pid, ("", 0, 0, -1))[3] == started]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in known:
                known[child] = stats[child][3]
                todo.append(child)


def alive(known: dict[int, int], exclude: int | None = None) -> list[int]:
    """The pids of ``known`` still running as the same process (zombies count as gone: some
    container inits never reap an orphan)."""
    out = []
    for pid, started in known.items():
        stat = _stat(pid)
        if pid != exclude and stat is not None and stat[3] == started and stat[0] not in "ZX":
            out.append(pid)
    return out


def _signal(pids: list[int], known: dict[int, int], sig: signal.Signals) -> None:
    for pid in pids:
        if start_time(pid) == known[pid]:  # not a new process that got a freed pid
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)


def stop_tree(
    session: int,
    grace_s: float,
    known: dict[int, int] | None = None,
    *,
    leader_start: int | None = None,
    exclude: int | None = None,
    reap: subprocess.Popen[bytes] | None = None,
) -> dict[int, int]:
    """SIGTERM the tree of ``session`` (see ``collect``), wait up to ``grace_s`` for it to go,
    then SIGKILL what is left; ``exclude`` (the caller) is never signalled, ``reap`` (a child of
    the caller) is reaped as it exits. Returns every process it found (pid -> start time).
    Without ``/proc`` (not Linux) it signals the session's process group instead."""
    known = {} if known is None else known
    if not os.path.isdir("/proc"):
        _stop_group(session, grace_s, reap)
        return known
    collect(session, known, leader_start)
    _signal(alive(known, exclude), known, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while True:
        if reap is not None:
            reap.poll()
        collect(session, known, leader_start)  # started meanwhile: it goes down too
        running = alive(known, exclude)
        if not running or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    for _ in range(KILL_ROUNDS):
        if not running:
            break
        _signal(running, known, signal.SIGKILL)
        time.sleep(0.05)
        if reap is not None:
            reap.poll()
        collect(session, known, leader_start)
        running = alive(known, exclude)
    return known


def _stop_group(pgid: int, grace_s: float, reap: subprocess.Popen[bytes] | None) -> None:
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 1.0)):
        deadline = time.monotonic() + wait_s
        try:
            os.killpg(pgid, sig)
            while time.monotonic() < deadline:
                if reap is not None:
                    reap.poll()
                os.killpg(pgid, 0)  # raises once the group is gone
                time.sleep(0.05)
        except ProcessLookupError:
            return
        except PermissionError:
            continue


class _Stderr(logging.StreamHandler):
    """The guard's lines, ``eva guard: ...`` on stderr: the command's log, which eva keeps or
    reads. It may be a pipe nobody reads any more (eva is gone): a line it refuses is dropped."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)
        self.setFormatter(logging.Formatter("eva guard: %(message)s"))

    def handleError(self, record: logging.LogRecord) -> None:
        pass


def main(argv: list[str]) -> int:
    log.addHandler(_Stderr())
    log.setLevel(logging.INFO)
    log.propagate = False
    if len(argv) < 3 or argv[1] != "--":
        log.error("usage: guard.py GRACE_SECONDS -- COMMAND [ARG...]")
        return 2
    grace_s, command = float(argv[0]), argv[2:]
    try:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL)  # in our session
    except OSError as exc:
        log.error("cannot start %r: %s", command[0], exc)
        return 127
    asked: list[int] = []  # a SIGTERM to the guard asks for the same stop as eva's going
    signal.signal(signal.SIGTERM, lambda signum, frame: asked.append(signum))
    stdin = sys.stdin.fileno()
    while child.poll() is None:
        # No reader thread: one blocked in read() aborts the interpreter at exit.
        readable, _, _ = select.select([stdin], [], [], 0.2)
        # eva never writes: only EOF (eva gone, or eva stopping us) makes stdin readable.
        if asked or (readable and not os.read(stdin, 4096)):
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            log.info("stopping the command and everything it started")
            stop_tree(os.getsid(0), grace_s, exclude=os.getpid(), reap=child)
            child.poll()
            break
    code = child.returncode if child.returncode is not None else -signal.SIGKILL
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

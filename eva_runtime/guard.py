"""Run a server command and take it down when eva dies, however eva dies.

eva cannot clean up after a SIGKILL or the OOM killer: its finalizers never run, and a ``vllm
serve`` it started in its own session would hold the GPU until someone finds it. So eva never
starts the server directly; it starts this guard (a plain script, standard library only, so it
runs under any interpreter in a few milliseconds) with a pipe on stdin whose write end only eva
holds, and the guard starts the server in its own process group::

    python engine_guard.py GRACE_SECONDS -- vllm serve CKPT --port 8000 ...

The kernel closes eva's end of the pipe when eva exits for any reason, so end-of-file on stdin
means "eva is gone": the guard then sends SIGTERM to its process group (the server and every
worker it forked), waits GRACE_SECONDS, and sends SIGKILL to whatever is left. When the server
exits on its own, the guard exits with its code, so eva sees the server's exit status.

eva's own orderly stop signals the whole group (guard included) as before; the guard lets
SIGTERM end it, and the server and its workers get the same signal.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time


def _stop_group(grace_s: float, server: subprocess.Popen[bytes]) -> None:
    """SIGTERM the group (the guard ignores it), then SIGKILL it after the grace period."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    group = os.getpgid(0)
    os.killpg(group, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.wait(timeout=grace_s)
    time.sleep(min(grace_s, 0.5))  # workers may outlive the leader by a moment
    os.killpg(group, signal.SIGKILL)  # the guard too: nothing of the group may outlive eva


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: engine_guard.py GRACE_SECONDS -- COMMAND [ARG...]", file=sys.stderr)
        return 2
    grace_s, command = float(argv[0]), argv[2:]
    try:
        server = subprocess.Popen(command, stdin=subprocess.DEVNULL)  # same process group as us
    except OSError as exc:
        print(f"engine_guard: cannot start {command[0]!r}: {exc}", file=sys.stderr, flush=True)
        return 127
    stdin = sys.stdin.fileno()
    while server.poll() is None:
        # No reader thread: one blocked in read() aborts the interpreter at exit.
        readable, _, _ = select.select([stdin], [], [], 0.2)
        if readable and not os.read(stdin, 4096):  # eva never writes: only EOF makes it readable
            print("engine_guard: eva is gone; stopping the server", file=sys.stderr, flush=True)
            _stop_group(grace_s, server)
    return server.returncode if server.returncode >= 0 else 128 - server.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

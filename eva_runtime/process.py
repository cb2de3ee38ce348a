"""Every process eva starts and must not leave behind: one lifecycle.

vLLM servers, the temporary Prefect server, a local Ray head and ``accelerate launch`` all hold
something (GPUs, a port, a database) for as long as they run, and each forks processes of its
own. A ``ManagedProcess`` is one such command, started the one way that can always be undone:

- **under the guard** (``eva_runtime.guard``), in a session of its own: if eva dies, even by
  SIGKILL or the OOM killer, the guard sees its stdin close and stops the whole tree;
- **output** to a log file (a private temporary folder unless a path is given; removed after a
  clean stop, kept and named in the error after a failure; one that eva left when it was killed
  is removed by the next eva that starts a process), or, with ``pipe=True``, read line by
  line by the caller (``lines()``: an ``accelerate launch`` forwards each line to the stage's
  logger as it arrives);
- **readiness** through the one poll helper (``wait_until``): it fails as soon as the process
  exits, and stops it (its log kept) on a timeout, an error or an interrupt;
- **an idempotent stop** (``stop()``, a finalizer at garbage collection and interpreter exit):
  eva closes the guard's stdin, so the guard sends SIGTERM to the tree, waits the grace period
  and sends SIGKILL; then eva stops, the same way, whatever is still left. The tree is the
  session and every descendant of one of its processes (a Ray job driver runs in a session of
  its own), so one stop serves every command;
- **error messages** that name the command and end with the last lines of its output.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from eva_runtime import guard, poll
from eva_runtime.errors import EvaError

log = logging.getLogger(__name__)

T = TypeVar("T")
TAIL_LINES = 30
LOG_PREFIX = "eva-process-"  # a private log folder in the system's temporary folder
OWNER = "owner"  # in it: the pid and start time of the eva that owns it, while it may
GUARD_MARGIN_S = 5.0  # how much longer than the grace period the guard may take to stop


class ServerStartError(EvaError, RuntimeError):
    """The process exited, refused us, or did not become ready in time; the message ends with
    the last lines of its output."""

    def __init__(
        self,
        message: str,
        *,
        pid: int,
        returncode: int | None,
        log_path: str,
        hint: str | None = None,
    ):
        super().__init__(message, hint=hint)
        self.pid = pid
        self.returncode = returncode  # None: it was still running (and has been stopped)
        self.log_path = log_path


def free_port() -> int:
    """A localhost port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def log_tail(path: str, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file ('' when there is none)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


# The last line of a Python traceback: an exception's (dotted) name and its message.
_RAISED = re.compile(r"(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt)\b:? ?.*")
CAUSE_CHARS = 300


def last_cause(tail: str) -> str:
    """What an output's tail says went wrong, in one line: its last exception (a traceback's
    last line; a server usually logs more after it, such as "Application startup failed"),
    else its last line that is not blank; '' for an output with nothing in it."""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    raised = [line for line in lines if _RAISED.fullmatch(line)]
    found = (raised or lines or [""])[-1]
    return found if len(found) <= CAUSE_CHARS else found[: CAUSE_CHARS - 3] + "..."


@dataclass
class _State:
    """What stopping needs; held by the finalizer, so it must not refer to the process object."""

    process: subprocess.Popen[Any]
    stop_s: float
    started: int | None  # the guard's start time: its session id is ours only while it matches
    temp_dir: str | None  # removed after a clean stop
    keep_log: bool = False
    found: dict[int, int] = field(default_factory=dict)  # what eva's own sweep found


def _stop(state: _State) -> None:
    """Have the guard stop the tree (EOF on its stdin), then stop whatever is left from here."""
    process = state.process
    if process.stdin is not None:
        with contextlib.suppress(OSError):
            process.stdin.close()
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=state.stop_s + GUARD_MARGIN_S)
    if os.path.isdir("/proc"):
        guard.collect(process.pid, state.found, state.started)
        if left := guard.alive(state.found):  # the guard had exited already, or was stuck
            log.warning("stopping %d process(es) the guard left (pid %d)", len(left), process.pid)
            guard.stop_tree(process.pid, state.stop_s, state.found, leader_start=state.started)
    else:  # no /proc to find the tree in: the session's process group
        guard.stop_tree(process.pid, state.stop_s)
    process.wait()
    if process.stdout is not None:
        process.stdout.close()
    if state.temp_dir is not None and not state.keep_log:
        shutil.rmtree(state.temp_dir, ignore_errors=True)
    elif state.temp_dir is not None:  # a log named in an error: no later sweep removes it
        with contextlib.suppress(OSError):
            os.remove(os.path.join(state.temp_dir, OWNER))


_swept = False


def _private_log_dir() -> str:
    """A private folder for a process's log, marked with its owner (this eva); the first one
    of this eva removes the folders of an eva that is gone (killed before its cleanup ran)."""
    global _swept
    if not _swept:
        _swept = True
        sweep_orphaned_logs()
    folder = tempfile.mkdtemp(prefix=LOG_PREFIX)
    with open(os.path.join(folder, OWNER), "w") as f:
        f.write(f"{os.getpid()} {_started(os.getpid())}")
    return folder


def sweep_orphaned_logs(parent: str | None = None) -> list[str]:
    """Remove the private log folders under ``parent`` (the system's temporary folder) whose
    owner no longer runs; returns them. Logs kept after a failure carry no owner and stay."""
    parent = parent or tempfile.gettempdir()
    removed = []
    for name in sorted(os.listdir(parent)):
        folder = os.path.join(parent, name)
        if not name.startswith(LOG_PREFIX):
            continue
        try:
            with open(os.path.join(folder, OWNER)) as f:
                pid, started = f.read().split()
        except (OSError, ValueError):
            continue  # not ours, a kept log, or one being created right now
        if not pid.isdigit() or _started(int(pid)) == started:
            continue  # its eva still runs
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def _started(pid: int) -> str:
    """When ``pid`` started ('-' where /proc cannot tell), 'gone' when it is not running."""
    if os.path.isdir("/proc"):
        started = guard.start_time(pid)
        return "gone" if started is None else str(started)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "gone"
    except PermissionError:
        pass
    return "-"


class ManagedProcess:
    """One command running under the guard, in a session of its own. ``env`` is added to eva's
    environment; ``stop_s`` is the grace period between SIGTERM and SIGKILL. Output goes to
    ``log_path`` (default: a file in a private temporary folder), or with ``pipe`` to
    ``lines()``. ``stop()`` is idempotent; the process is stopped at garbage collection or
    interpreter exit otherwise."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stop_s: float = 10.0,
        pipe: bool = False,
        log_path: str | None = None,
        tail_lines: int = TAIL_LINES,
    ):
        self.argv = list(argv)
        self.pipe = pipe
        self._tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
        temp_dir = None
        if not pipe and log_path is None:
            temp_dir = _private_log_dir()
            log_path = os.path.join(temp_dir, "output.log")
        self.log_path = log_path or ""
        command = [sys.executable, guard.__file__, str(stop_s), "--", *self.argv]
        try:
            with contextlib.ExitStack() as files:
                out = None if pipe else files.enter_context(open(self.log_path, "wb"))
                self.process: subprocess.Popen[Any] = subprocess.Popen(
                    command,
                    stdin=subprocess.PIPE,  # its other end is the guard's "eva is alive" line
                    stdout=subprocess.PIPE if pipe else out,
                    stderr=subprocess.STDOUT,
                    text=pipe,
                    errors="replace" if pipe else None,
                    env={**os.environ, **(env or {})},
                    cwd=cwd,
                    start_new_session=True,  # the guard leads the session: its tree is ours
                )
        except OSError as exc:
            if temp_dir is not None:
                shutil.rmtree(temp_dir, ignore_errors=True)
            raise ServerStartError(
                f"cannot start the guard for {self.argv[0]!r}: {exc}", pid=-1, returncode=None,
                log_path="",
            ) from exc  # fmt: skip
        started = guard.start_time(self.process.pid) if os.path.isdir("/proc") else None
        self._state = _State(self.process, stop_s, started, temp_dir)
        self._finalizer = weakref.finalize(self, _stop, self._state)  # also runs at exit
        where = "piped" if pipe else f"log {self.log_path}"
        log.info("started %s (pid %d, %s)", " ".join(self.argv), self.process.pid, where)

    @property
    def pid(self) -> int:
        """The guard's pid, which is also the id of the session the command runs in."""
        return int(self.process.pid)

    @property
    def stopped(self) -> bool:
        """Stopped by eva (``stop()``, a pool, exit), as opposed to a process that died."""
        return not self._finalizer.alive

    @property
    def running(self) -> bool:
        return not self.stopped and self.process.poll() is None

    def poll(self) -> int | None:
        """The command's exit status once it has exited (None while it runs)."""
        return self.process.poll()

    def wait(self) -> int:
        """Wait for the command to exit; its exit status (128 + N when signal N ended it)."""
        return int(self.process.wait())

    def stop(self, *, keep_log: bool = False) -> None:
        """Stop the command and every process it started (idempotent); ``keep_log`` keeps
        the log file of a temporary folder for a post-mortem."""
        self._state.keep_log = self._state.keep_log or keep_log
        self._finalizer()

    def members(self) -> list[int]:
        """The pids of the running tree: the session and every descendant of one of its
        processes (whatever session they moved to)."""
        if not os.path.isdir("/proc"):
            return [self.pid]
        known: dict[int, int] = {}
        guard.collect(self.pid, known, self._state.started)
        return guard.alive(known)

    def lines(self) -> Iterator[str]:
        """The output, line by line as it is written (``pipe=True``), until the command and
        everything that holds its output has exited; the last ones are kept for ``tail``."""
        assert self.process.stdout is not None, "lines() needs pipe=True"
        for raw in self.process.stdout:
            line = raw.rstrip("\n")
            if line.strip():
                self._tail.append(line)
            yield line

    def tail(self) -> str:
        """The last lines of the output: the log file's, or the last lines read."""
        return "\n".join(self._tail) if self.pipe else log_tail(self.log_path)

    def fail(self, message: str, hint: str | None = None) -> ServerStartError:
        """An error naming the command and quoting the output's tail; the log is kept. Its
        first line, the one the CLI prints, carries the cause the output ends with."""
        self._state.keep_log = True
        where = "output" if self.pipe else f"log {self.log_path}"
        tail = self.tail()
        cause = last_cause(tail)
        head = f"{message} ({cause})" if cause else f"{message}, having written nothing"
        quoted = f"ends with:\n{tail}" if cause else "is empty"
        return ServerStartError(
            f"{head}; command: {' '.join(self.argv)}; {where} {quoted}",
            pid=self.pid,
            returncode=self.process.poll(),
            log_path=self.log_path,
            hint=hint,
        )

    def wait_until(
        self,
        check: Callable[[], T | None],
        timeout_s: float,
        *,
        what: str = "the server",
        hint: str | None = None,
        interval_s: float = 0.1,
    ) -> T:
        """Wait until the process is ready: poll ``check()`` (``eva_runtime.poll``) until it is
        truthy and return that; raise (the process stopped, its log kept) when the process
        exits, ``check`` raises, or ``timeout_s`` seconds pass (``hint``: the setting to
        raise)."""
        try:
            try:
                return poll.wait_until(
                    check, timeout_s, interval_s=interval_s, what=what,
                    abort=lambda: self._exited(what),
                )  # fmt: skip
            except poll.PollTimeout as exc:
                raise self.fail(f"{what} was not ready after {exc.timeout_s:g} s", hint) from None
        except BaseException:  # a timeout, a dead process, or an interrupt: never leave it up
            self.stop(keep_log=True)
            raise

    def _exited(self, what: str) -> ServerStartError | None:
        code = self.process.poll()
        if code is None:
            return None
        return self.fail(f"{what} exited with code {code} before it was ready")

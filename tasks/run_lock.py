"""One launch per run at a time: a lock file in the run's folder, held while a flow has it open.

Two launches of one run (a second ``eva run`` in another terminal, ``eva stage`` while the run
goes on, a deployment triggered twice) would compute the same stages twice and race on their
artifacts. The lock is ``{run}/.lock.json`` under any fsspec root (a local disk, S3 through
s3fs): it names its holder (host, pid, a random token, when it started, where the run was) and
a heartbeat that a thread of the holder refreshes. A launch refuses a lock held by another
launch, unless that holder is gone:

- on the same host, its process no longer exists (it was killed, ``kill -9`` included);
- or its heartbeat is older than ``STALE_S`` (another machine that died, or went away; a run
  copied with the lock of a launch still running is taken over once that heartbeat is old).

A local disk creates the lock exclusively (a hard link to a complete file, which fails where
one exists); an object store has no such create, so the launch writes its lock, waits
``SETTLE_S`` and reads it back: of two launches that both found no lock, only the last writer
finds its own token (unless one took more than ``SETTLE_S`` between its look and its write).

The processes a launch starts (accelerate's trainers, servers) never open the run, so they
never wait on it; a process that does and inherits the holder's token in ``EVA_RUN_LOCK`` (a
child of the holder) shares the hold.

A holder that was paused (SIGSTOP, a suspended laptop, a stalled VM) longer than ``STALE_S`` is
taken over like a dead one. When it resumes it must not write into the run the new holder now
owns: every stage calls ``ensure_held`` before it writes (its table, its checkpoint, its
manifest), which reads the lock back and raises ``RunLockLost`` if another launch holds it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from eva_runtime.errors import EvaError
from tasks.store import RunStore

log = logging.getLogger("eva.lock")

LOCK_NAME = ".lock.json"
HEARTBEAT_S = 15.0  # how often the holder refreshes its heartbeat
STALE_S = 120.0  # a heartbeat this old is a holder that is gone (another host's included)
SETTLE_S = 1.0  # object stores: how long a writer waits before reading its lock back
INHERITED = "EVA_RUN_LOCK"  # the holder's token, in the environment of what it starts


class RunLocked(EvaError, RuntimeError):
    """Another launch holds the run."""


class RunLockLost(EvaError, RuntimeError):
    """This launch held the run, and another launch took the lock over (this one was paused
    or cut off longer than ``STALE_S``): it stops before writing anything more."""


@dataclass
class _Hold:
    store: RunStore
    path: str
    owner: dict[str, Any]
    count: int = 1
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    lost: bool = False  # another launch took the lock over: never write again


_HELD: dict[str, _Hold] = {}  # lock uri -> this process's hold (a nested open shares it)
_GUARD = threading.Lock()


@contextlib.contextmanager
def run_lock(store: RunStore) -> Iterator[dict[str, Any]]:
    """Hold ``store``'s run for the body; ``RunLocked`` (one line: who holds it, how to clear
    it) when another live launch does. Yields the owner record."""
    hold = _acquire(store)
    try:
        yield hold.owner
    finally:
        _release(hold)


def refuse_if_held(store: RunStore) -> None:
    """``RunLocked`` when another live launch holds the run: what a command checks before it
    starts a flow (the flow takes the lock itself; this only refuses early, in one line)."""
    try:
        found = read_owner(store)
    except Exception:  # an unreachable root: the launch itself says why, in its own words
        return
    if found is None or store.uri(store.base) in _HELD:
        return
    inherited = os.environ.get(INHERITED)
    if not (inherited and found.get("token") == inherited) and stale_reason(found) is None:
        raise _refusal(found, lock_path(store))


def lock_path(store: RunStore) -> str:
    return f"{store.base}/{LOCK_NAME}"


def read_owner(store: RunStore) -> dict[str, Any] | None:
    """The lock's record, None when there is none (an unreadable one reads as gone)."""
    path = lock_path(store)
    try:
        with store.fs.open(path, "rb") as f:
            owner = json.loads(f.read())
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise RunLocked(
            f"{path} is a directory, where eva keeps the run's lock file",
            hint=f"remove it (rm -r {path}) if nothing of yours is in it, then launch again",
        ) from None
    except ValueError:
        return {}
    return owner if isinstance(owner, dict) else {}


def ensure_held(store: RunStore, writing: str) -> None:
    """``RunLockLost`` when this process held ``store``'s run and another launch has taken
    the lock over since; nothing when it holds it, or holds no lock of that run (a test or a
    tool writing outside a launch). Called before every write of a stage: one small read."""
    if may_write(store):
        return
    hold = _HELD[store.uri(store.base)]
    found = read_owner(store) or {}
    who = f"pid {found.get('pid')} on {found.get('host')}" if found else "nobody (removed)"
    raise RunLockLost(
        f"{hold.path}: this launch lost the run's lock to {who} (it was paused or cut off for "
        f"more than {STALE_S:.0f} s); stopped before writing {writing}",
        hint="the other launch owns the run now; launch again once it has finished",
    )


def may_write(store: RunStore) -> bool:
    """Whether this process may write into ``store``'s run: it holds its lock, or holds no lock
    of that run (outside a launch). False once another launch has taken the lock over, which
    this reads from the lock file (one small read)."""
    hold = _HELD.get(store.uri(store.base))
    if hold is None:
        return True
    if not hold.lost and (read_owner(store) or {}).get("token") == hold.owner["token"]:
        return True
    hold.lost = True
    return False


def stale_reason(owner: dict[str, Any], now: float | None = None) -> str | None:
    """Why a lock's holder is gone, or None while it may still be running."""
    if not owner.get("token"):
        return "the lock file is unreadable"
    if owner.get("host") == socket.gethostname() and not _alive(int(owner.get("pid", 0))):
        return f"process {owner.get('pid')} no longer exists"
    age = (time.time() if now is None else now) - float(owner.get("heartbeat", 0))
    if age > STALE_S:
        return f"its heartbeat is {age:.0f} s old"
    return None


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _acquire(store: RunStore) -> _Hold:
    path = lock_path(store)
    where = store.uri(store.base)
    with _GUARD:
        if (hold := _HELD.get(where)) is not None:
            hold.count += 1
            return hold
        now = time.time()
        owner: dict[str, Any] = {
            "host": socket.gethostname(), "pid": os.getpid(), "token": secrets.token_hex(8),
            "started": now, "heartbeat": now, "where": where,
        }  # fmt: skip
        found = read_owner(store)
        inherited = os.environ.get(INHERITED)
        if found is not None and inherited and found.get("token") == inherited:
            owner = found  # a child of the holder: it shares the hold and never releases it
            hold = _Hold(store, path, owner, count=1 << 30)
        else:
            if found is not None:
                reason = stale_reason(found)
                if reason is None:
                    raise _refusal(found, path)
                log.warning("taking over the lock of %s: %s", where, reason)
            _write_new(store, path, owner, found)
            hold = _Hold(store, path, owner)
            _remove_leftovers(store, path, owner["token"])
            hold.thread = threading.Thread(
                target=_beat, args=(hold,), name="eva-run-lock", daemon=True
            )
            hold.thread.start()
            os.environ[INHERITED] = str(owner["token"])
        _HELD[where] = hold
        return hold


def _write_new(store: RunStore, path: str, owner: dict[str, Any], stale: dict | None) -> None:
    data = json.dumps(owner, indent=2, sort_keys=True).encode()
    store.fs.makedirs(store.base, exist_ok=True)
    if not store.is_local:
        store.fs.pipe_file(path, data)
        time.sleep(SETTLE_S)
        found = read_owner(store) or {}
        if found.get("token") != owner["token"]:
            raise _refusal(found, path)
        return
    if stale is not None:  # set the stale lock aside; of two launches taking over, one does
        aside = f"{path}.stale-{owner['token']}"
        with contextlib.suppress(FileNotFoundError):
            os.rename(path, aside)
            with open(aside, "rb") as f:
                moved = f.read()
            with contextlib.suppress(FileExistsError):
                if _token(moved) != stale.get("token"):  # a fresh lock, taken meanwhile
                    os.link(aside, path)
            os.remove(aside)
    # Written whole under a private name, then linked into place: the link fails if a lock
    # exists, and the lock is never seen half-written.
    tmp = f"{path}.tmp-{owner['token']}"
    with open(tmp, "wb") as f:
        f.write(data)
    try:
        os.link(tmp, path)
    except (FileExistsError, FileNotFoundError):  # another launch was first
        raise _refusal(read_owner(store) or {}, path) from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)


def _remove_leftovers(store: RunStore, path: str, token: str) -> None:
    """Staging copies of the lock that a killed launch left (a heartbeat's, a takeover's)."""
    for left in store.fs.glob(f"{path}.*"):
        if token not in left:
            with contextlib.suppress(FileNotFoundError):
                store.fs.rm(left)


def _token(data: bytes) -> Any:
    try:
        owner = json.loads(data)
    except ValueError:
        return None
    return owner.get("token") if isinstance(owner, dict) else None


def _refusal(owner: dict[str, Any], path: str) -> RunLocked:
    started = owner.get("started")
    since = time.strftime(" since %H:%M:%S UTC", time.gmtime(started)) if started else ""
    beat = time.time() - float(owner.get("heartbeat", 0))
    return RunLocked(
        f"{path}: another launch holds this run (pid {owner.get('pid')} on "
        f"{owner.get('host')}{since}, heartbeat {beat:.0f} s ago)",
        hint=(
            f"wait for it or stop it; if it is gone, delete {path} (a holder whose heartbeat is "
            f"older than {STALE_S:.0f} s is taken over)"
        ),
    )


def _beat(hold: _Hold) -> None:
    """Refresh the heartbeat until released; stop (loudly) if another launch took over."""
    while not hold.stop.wait(HEARTBEAT_S):
        try:
            found = read_owner(hold.store)
            if (found or {}).get("token") != hold.owner["token"]:
                hold.lost = True  # the next write raises RunLockLost (ensure_held)
                log.error("%s: the run's lock was taken over by %s", hold.path, found)
                return
            hold.owner["heartbeat"] = time.time()
            hold.store.write_json(hold.path, hold.owner)
        except Exception as exc:  # a storage hiccup: the next beat tries again
            log.warning("%s: heartbeat not written (%s)", hold.path, exc)


def _release(hold: _Hold) -> None:
    where = hold.owner["where"]
    with _GUARD:
        hold.count -= 1
        if hold.count > 0:
            return
        _HELD.pop(where, None)
        hold.stop.set()
        if hold.thread is not None:
            hold.thread.join()
        if os.environ.get(INHERITED) == hold.owner["token"]:
            del os.environ[INHERITED]
        with contextlib.suppress(Exception):
            if (read_owner(hold.store) or {}).get("token") == hold.owner["token"]:
                hold.store.fs.rm(hold.path)

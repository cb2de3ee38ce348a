"""A cache of folders built once from a file or a checkpoint and reused by every later stage: a
GGUF file's Hugging Face folder (``tasks.checkpoints``), a checkpoint's CTranslate2 model
(``tasks.backends.generate.ctranslate2``).

A folder is named by the content it was built from (``key``) and is *intact* when its marker,
written last, lists every file with its size and they are all there: a build killed midway
leaves no marker, and a folder whose weights were deleted by hand no longer matches its
marker; either is built again, never used. Building holds an exclusive lock on
``<key>.lock`` (``fcntl.flock``, released by the kernel when its holder dies), so two processes
that need the same folder build it once: the second waits and finds it built. A build goes to
``<key>.tmp-<pid>-<random>`` and is moved into place whole. A staging folder whose key no
process holds locked is left by a build that died; every build sweeps those first, so a
kill -9 leaves nothing behind for longer than the next build.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import uuid
from collections.abc import Callable, Iterator

from eva_runtime.errors import EvaError

MARKER = "eva-cache.json"
STAGING = ".tmp-"


class CacheError(EvaError, OSError):
    """The cache folder cannot hold what it is asked to."""


def cache_dir(kind: str) -> str:
    """``$EVA_CACHE_DIR/<kind>`` (default ``~/.cache/eva/<kind>``)."""
    base = os.environ.get("EVA_CACHE_DIR") or os.path.expanduser(os.path.join("~", ".cache", "eva"))
    return os.path.join(base, kind)


def check_cache_dir(root: str) -> None:
    """A ``CacheError`` naming EVA_CACHE_DIR when ``root`` cannot be a folder (a file is in its
    way), before anything is built into it."""
    path = root
    while path and not os.path.exists(path):
        path = os.path.dirname(path)
    if path and not os.path.isdir(path):
        raise CacheError(
            f"{path} is a file, so the cache folder {root} cannot be made",
            field="EVA_CACHE_DIR",
            hint="point EVA_CACHE_DIR at a folder (default ~/.cache/eva)",
        )


def intact(folder: str) -> bool:
    """Whether ``folder`` is a finished build whose files are all there, at their sizes."""
    try:
        with open(os.path.join(folder, MARKER)) as f:
            files = json.load(f)["files"]
        return all(
            os.path.getsize(os.path.join(folder, name)) == size for name, size in files.items()
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def cached_folder(
    root: str, key: str, build: Callable[[str], None], source: dict[str, str]
) -> tuple[str, bool]:
    """The folder ``root/key``: as found when intact, else built by ``build(staging)`` now
    (``source`` goes into the marker, saying what it was built from). Returns the folder and
    whether this call built it."""
    folder = os.path.join(root, key)
    if intact(folder):
        return folder, False
    check_cache_dir(root)
    os.makedirs(root, exist_ok=True)
    with _locked(folder):
        if intact(folder):  # another process built it while this one waited
            return folder, False
        sweep(root, held=key)
        staging = f"{folder}{STAGING}{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            build(staging)
            _write_marker(staging, source)
            shutil.rmtree(folder, ignore_errors=True)  # a copy left unfinished or damaged
            os.replace(staging, folder)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return folder, True


def sweep(root: str, held: str | None = None) -> list[str]:
    """Remove the staging folders of builds no longer running (their key's lock is free; the
    caller's own ``held`` key's are all leftovers). Returns what it removed."""
    removed = []
    for name in sorted(os.listdir(root)):
        key, sep, _ = name.partition(STAGING)
        path = os.path.join(root, name)
        if not sep or not os.path.isdir(path):
            continue
        if key == held:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
            continue
        with _locked(os.path.join(root, key), wait=False) as free:
            if free:
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
    return removed


@contextlib.contextmanager
def _locked(folder: str, wait: bool = True) -> Iterator[bool]:
    """Hold ``<folder>.lock``; with ``wait=False``, yield False at once when another holds it."""
    with open(f"{folder}.lock", "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _write_marker(folder: str, source: dict[str, str]) -> None:
    files = {}
    for dirpath, _, names in os.walk(folder):
        for name in names:
            full = os.path.join(dirpath, name)
            files[os.path.relpath(full, folder)] = os.path.getsize(full)
    with open(os.path.join(folder, MARKER), "w") as f:
        json.dump({"source": source, "files": dict(sorted(files.items()))}, f, indent=1)

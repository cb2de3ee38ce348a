"""How a run's artifacts are written, so that a crash never fakes completion, and read back
(where they lie: ``tasks.run_paths``; the hashes of checkpoints and files:
``tasks.content_hashes``).

A stage is complete only when its manifest exists, names the stage's cache key and matches the
parquet's size. Writes go to a temporary name and are moved into place (an atomic rename on a
local disk; on S3 an object only appears once its upload finished), and the manifest is written
last, after the old one was removed, so a kill at any point leaves either the old complete
artifact, or one that is visibly incomplete and re-run.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from eva_runtime.errors import StageError
from tasks.content_hashes import HUB, hash_directory
from tasks.run_paths import RunPaths
from tasks.table_memo import TABLES

# What a stage's manifest must name for a stage to be reused from it (tasks/stage.py).
MANIFEST_KEYS = ("artifact", "iteration", "key", "uri", "bytes", "rows", "content_hash")
REDO_HINT = "launch the run again: it redoes that stage"


class UnreadableArtifact(StageError):
    """A manifest or table that exists but cannot be read (truncated, edited, corrupted)."""


@dataclass(frozen=True)
class Ref:
    """A finished stage's output, as flows pass it from stage to stage."""

    stage: str
    iteration: int | None
    uri: str
    content_hash: str
    rows: int
    model_uri: str | None = None  # checkpoint directory, for stages that produce a policy
    skipped: bool = False  # the plan skipped this stage: nothing was made
    rerun: bool = False  # made by the target of `eva stage`, or from something that was


def json_bytes(obj: Any) -> bytes:
    """``obj`` as the standard JSON a run's manifests and config.json are: a number that is not
    finite (which Python's json would write as a bare ``NaN`` or ``Infinity``, refused by
    other readers) is a ``ValueError`` before anything is written. The config is checked for
    them at the edge (``flows.config.check_finite``) and a stage's stats record them as text
    (``tasks.context.recorded_stats``): reaching this is a bug, said where it happens."""
    try:
        return json.dumps(obj, indent=2, sort_keys=True, default=str, allow_nan=False).encode()
    except ValueError as exc:
        raise ValueError(f"not written as JSON: {exc}") from None


class RunStore(RunPaths):
    """Reads and writes one run's artifacts under ``{root}/{run}`` (their paths: ``RunPaths``)."""

    def sweep(self) -> list[str]:
        """Remove what a killed process left behind: staging copies (``*.tmp-*``) of
        manifests, tables and checkpoints, stale stage scratch, and manifests that cannot be
        read (their stage is redone, as one whose parquet was cut short is) and the tables
        they leave without one. Call at launch,
        with the run's lock held; returns what was removed."""
        removed = [p for p in self.fs.glob(f"{self.base}/*/*.tmp-*") if "/.scratch/" not in p]
        for path in removed:
            self.fs.rm(path, recursive=True)
        unreadable = self._sweep_unreadable_manifests()
        removed += unreadable + self._sweep_orphaned_tables(set(unreadable))
        scratch = self.scratch_dir()
        for name in sorted(os.listdir(scratch)):
            shutil.rmtree(os.path.join(scratch, name), ignore_errors=True)
            removed.append(os.path.join(scratch, name))
        return removed

    # -- manifests ---------------------------------------------------------------------------
    def read_manifest(self, iteration: int | None, stage: str) -> dict[str, Any] | None:
        """A stage's manifest, None when it has none; ``UnreadableArtifact`` (one line naming
        the file) when it is there but not a manifest (a launch removes such a one first)."""
        path = self.path(iteration, f"{stage}.manifest.json")
        try:
            with open(path, "rb") if self.is_local else self.fs.open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        manifest, why = _parse_manifest(data)
        if manifest is None:
            raise UnreadableArtifact(
                f"{self.uri(path)} is not a readable manifest ({why})", hint=REDO_HINT
            )
        return manifest

    def _sweep_orphaned_tables(self, redone: set[str]) -> list[str]:
        """Remove every stage table without a manifest: a stage that failed (or was killed)
        after writing its table never made it complete, and its rerun writes it anew. The
        tables of the ``redone`` manifests (said already) are left to their rerun."""
        found = set(self.fs.glob(f"{self.base}/*/*.parquet"))
        manifests = set(self.fs.glob(f"{self.base}/*/*.manifest.json")) | redone
        orphans = sorted(
            p for p in found if p.removesuffix(".parquet") + ".manifest.json" not in manifests
        )
        for path in orphans:
            _log().warning("%s has no manifest (its stage did not finish): removed", path)
            self.fs.rm(path)
        return orphans

    def _sweep_unreadable_manifests(self) -> list[str]:
        """Remove every manifest that does not parse, saying so in one line each: without a
        manifest the stage is unfinished, so this launch redoes it."""
        paths = self.fs.glob(f"{self.base}/*/*.manifest.json")
        if not paths:
            return []
        found = self.fs.cat(list(paths), on_error="return")  # one round of requests on S3
        removed = []
        for path in sorted(found):
            data = found[path]
            if isinstance(data, FileNotFoundError):
                continue
            why = f"{type(data).__name__}" if isinstance(data, BaseException) else None
            if why is None:
                manifest, why = _parse_manifest(data)
                if manifest is not None:
                    continue
            _log().warning("%s was unreadable (%s): removed, its stage is redone", path, why)
            self.fs.rm(path)
            removed.append(path)
        return removed

    def artifacts(self, iteration: int | None) -> list[str]:
        """The artifacts with a manifest in ``iteration`` (None: setup), sorted."""
        found = self.fs.glob(self.path(iteration, "*.manifest.json"))
        return sorted(p.rsplit("/", 1)[-1].removesuffix(".manifest.json") for p in found)

    def iterations(self) -> list[int]:
        """The iterations (online: segments) that have a folder, in order."""
        names = [p.rsplit("/", 1)[-1] for p in self.fs.glob(f"{self.base}/iter_*")]
        return sorted(int(n[5:]) for n in names if n[5:].isdigit())

    def is_complete(self, manifest: dict[str, Any]) -> bool:
        """The manifest's parquet (and checkpoint) are present at the recorded size."""
        try:
            if self.fs.size(self.resolve(manifest["uri"])) != manifest["bytes"]:
                return False
            model = manifest.get("model_uri")
            if model is None or model.startswith(HUB):
                return True
            if model.startswith("/"):  # a user's local checkpoint, wherever the run root is
                return os.path.isfile(os.path.join(model, "config.json"))
            return self.fs.exists(self.resolve(model) + "/config.json")
        except FileNotFoundError:
            return False

    def invalidate(self, iteration: int | None, stage: str) -> None:
        """Remove a stage's manifest before it is rewritten (the first step of any write)."""
        path = self.path(iteration, f"{stage}.manifest.json")
        if self.is_local:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
        elif self.fs.exists(path):
            self.fs.rm(path)

    def write_manifest(self, iteration: int | None, stage: str, manifest: dict[str, Any]) -> None:
        self._atomic_write(self.path(iteration, f"{stage}.manifest.json"), json_bytes(manifest))

    # -- tables ------------------------------------------------------------------------------
    def write_table(
        self, iteration: int | None, stage: str, table: pa.Table
    ) -> tuple[str, str, int]:
        """Write ``table`` atomically; return (its uri relative to the run, sha256 of the bytes,
        size in bytes)."""
        buf = io.BytesIO()
        pq.write_table(table, buf, compression="zstd")
        data = buf.getvalue()
        path = self.path(iteration, f"{stage}.parquet")
        self._atomic_write(path, data)
        digest = hashlib.sha256(data).hexdigest()
        if self.is_local:  # the next stage reads it from memory (tasks/table_memo.py)
            TABLES.put(path, _as_read(table, data), digest)
        return self.relative(path), digest, len(data)

    def read_table(self, uri: str) -> pa.Table:
        """A stage's table; ``UnreadableArtifact`` naming the file when it is missing or
        not a whole parquet file."""
        path = self.resolve(uri)
        with self._readable(path):
            if self.is_local:  # Arrow's own reader, not fsspec's Python file object
                if (kept := TABLES.get(path)) is not None:
                    return kept
                table = pq.read_table(path)
                TABLES.put(path, table)
                return table
            with self.fs.open(path, "rb") as f:
                return parquet_table(f.read())

    def read_table_hashed(self, uri: str) -> tuple[pa.Table, str]:
        """A stage's table and the sha256 of the bytes it was read from: what a stage that
        reads it records as its input (its manifest may be older than the file, edited by
        hand since). The file is read once, whole, and parsed from memory; a table this
        process wrote or read so is served from memory while its file is unchanged."""
        path = self.resolve(uri)
        with self._readable(path):
            data: bytes | pa.Buffer
            if self.is_local:
                if (kept := TABLES.get_hashed(path)) is not None:
                    return kept
                with pa.OSFile(path) as f:  # into a buffer Arrow owns (``parquet_table``)
                    data = f.read_buffer()
            else:
                with self.fs.open(path, "rb") as f:
                    data = f.read()
            digest = hashlib.sha256(data).hexdigest()
            table = parquet_table(data)
            if self.is_local:
                TABLES.put(path, table, digest)
            return table, digest

    @contextlib.contextmanager
    def _readable(self, path: str) -> Iterator[None]:
        """A table that cannot be read as ``UnreadableArtifact``, one line naming the file."""
        try:
            yield
        except (OSError, pa.ArrowException) as exc:  # a cut-short file is ArrowInvalid
            why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UnreadableArtifact(
                f"{self.uri(path)} is not a readable table ({why})", hint=REDO_HINT
            ) from None

    def write_json(self, path: str, obj: Any) -> None:
        self._atomic_write(path, json_bytes(obj))

    def _atomic_write(self, path: str, data: bytes) -> None:
        parent = path.rsplit("/", 1)[0]
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        if self.is_local:
            os.makedirs(parent, exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)  # atomic on POSIX
            return
        self.fs.makedirs(parent, exist_ok=True)
        with self.fs.open(tmp, "wb") as f:
            f.write(data)
        self.fs.mv(tmp, path)

    # -- checkpoints -------------------------------------------------------------------------
    def publish_model(
        self, iteration: int | None, local_dir: str, move: bool = False
    ) -> tuple[str, str]:
        """Copy a finished local checkpoint to ``{iter}/model`` (``move``: move it there, for a
        checkpoint in the stage's own scratch, removed after the stage anyway); return (its uri
        relative to the run, content hash)."""
        digest = hash_directory(local_dir)
        dest = self.path(iteration, "model")
        if self.is_local:
            staging = f"{dest}.tmp-{uuid.uuid4().hex[:8]}"
            (shutil.move if move else shutil.copytree)(local_dir, staging)
            if os.path.exists(dest):
                shutil.rmtree(dest)
            os.replace(staging, dest)
        else:
            if self.fs.exists(dest):
                self.fs.rm(dest, recursive=True)
            self.fs.put(local_dir.rstrip("/") + "/", dest, recursive=True)
        return self.relative(dest), digest

    def local_model(self, model_uri: str, content_hash: str) -> str:
        """What ``from_pretrained`` loads the checkpoint from: a local directory (downloaded
        once if it is remote), or a Hub id, which the Hub's own cache serves.

        The download cache is keyed on the checkpoint's content hash, so a retrained
        checkpoint at the same URI is never served stale.
        """
        if model_uri.startswith(HUB):
            return model_uri.removeprefix(HUB)
        if model_uri.startswith(("/", "file://")):
            return model_uri.removeprefix("file://")
        if self.is_local and "://" not in model_uri:
            return self.resolve(model_uri)
        cache = os.path.join(tempfile.gettempdir(), "eva-models", content_hash[:16])
        if not os.path.exists(os.path.join(cache, "config.json")):
            staging = f"{cache}.tmp-{uuid.uuid4().hex[:8]}"
            self.fs.get(self.resolve(model_uri).rstrip("/") + "/", staging, recursive=True)
            if os.path.exists(cache):
                shutil.rmtree(cache)
            os.replace(staging, cache)
        return cache


def parquet_table(data: bytes | pa.Buffer) -> pa.Table:
    """A parquet file's table from its bytes, parsed from a buffer Arrow owns (``data`` is
    copied into one unless it is one).

    Never hand ``pq.read_table`` a source that is a Python object (a file object, fsspec's
    included, or ``bytes`` under ``pa.BufferReader``): Arrow's reader passes its source to its
    own thread pool, which may drop the last reference to it on a worker thread after the read
    returned. Dropping a Python object takes the GIL; a worker that asks for it while the
    interpreter is exiting is stopped (``pthread_exit``) inside Arrow's C++ code, and the
    process aborts with SIGABRT ("terminate called without an active exception") after its
    work is done. Measured here (pyarrow 26): 17 of 200 processes that exited right after
    reading an fsspec file, 8 of 200 after reading ``bytes``; none of 200 each after reading a
    path, an Arrow-owned buffer, or these bytes copied into one (tests/test_exit_status.py)."""
    if not isinstance(data, pa.Buffer):
        sink = pa.BufferOutputStream()
        sink.write(data)
        data = sink.getvalue()
    return pq.read_table(pa.BufferReader(data))


def _as_read(table: pa.Table, data: bytes) -> pa.Table | None:
    """``table`` as reading its parquet bytes ``data`` gives it (Parquet names a list's item
    ``element``: a cast, no copy of the values), None when a lossless cast cannot give it."""
    schema = pq.read_schema(pa.BufferReader(data))
    if table.schema.equals(schema, check_metadata=True):
        return table
    try:
        cast = table.cast(schema)  # safe: raises rather than change a value
    except (pa.ArrowException, ValueError):
        return None
    return cast if cast.schema.equals(schema, check_metadata=True) else None


def _parse_manifest(data: bytes) -> tuple[dict[str, Any] | None, str]:
    """A manifest from its bytes, or None and why it is not one."""
    try:
        manifest = json.loads(data)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError alike
        return None, getattr(exc, "msg", None) or type(exc).__name__
    if not isinstance(manifest, dict):
        return None, f"a JSON {type(manifest).__name__}, not an object"
    if missing := [k for k in MANIFEST_KEYS if k not in manifest]:
        return None, f"no {', '.join(missing)}"
    return manifest, ""


def _log() -> logging.Logger | logging.LoggerAdapter:
    """The flow's logger inside a flow (so the UI shows the line), else eva's."""
    try:
        from prefect import get_run_logger

        return get_run_logger()
    except Exception:
        return logging.getLogger("eva.store")

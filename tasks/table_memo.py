"""Stage tables this process wrote or read on a local run root, kept in memory for the next
stage that reads them.

Each stage hands its output to the next as a parquet file: without this, every stage would
decode again a table the process wrote a moment before (the held-out set, every iteration).
A kept table is served only while its file is the one it was kept for: same inode, size and
modification time, checked with one ``stat`` on every read (an atomic rewrite is a new inode),
so a file replaced, cut short or removed since is read (and its error raised) as before. A
written table is kept only when the file's schema is the table's own (or a lossless cast gives
it: Parquet names a list's item ``element``), so what is served equals what reading the file
gives. A table kept with the sha256 of its file's bytes (written, or read whole, by this
process) serves that hash too: a stage's manifest records the hash of the bytes it read
(tasks/provenance.py) without reading them again. Memory is bounded: the least recently used tables
go first.
"""

from __future__ import annotations

import os
import threading
from typing import NamedTuple

import pyarrow as pa
from cachetools import LRUCache

# What the kept tables may hold in memory together (their buffers), in bytes.
LIMIT_BYTES = 256 * 2**20


class _Kept(NamedTuple):
    table: pa.Table
    identity: tuple[int, ...]  # the file's, when the table was kept
    nbytes: int
    digest: str | None  # the sha256 of the file's bytes, where known


class TableMemo:
    """Tables by local path, each with its file's identity (device, inode, size, mtime) and,
    where known, the sha256 of its bytes: cachetools' LRU, bounded on the tables' bytes."""

    def __init__(self, limit_bytes: int = LIMIT_BYTES):
        self.limit_bytes = limit_bytes
        self._tables: LRUCache[str, _Kept] = LRUCache(limit_bytes, getsizeof=_size)
        self._lock = threading.Lock()  # cachetools' caches are not thread-safe

    def put(self, path: str, table: pa.Table | None, digest: str | None = None) -> None:
        """Keep ``table`` as the content of the file at ``path`` as it is now, ``digest`` the
        sha256 of its bytes when known (None: forget what was kept for it)."""
        if table is None:
            with self._lock:
                self._tables.pop(path, None)
            return
        nbytes = table.get_total_buffer_size()
        try:
            st = os.stat(path)
        except OSError:
            return
        with self._lock:
            self._tables.pop(path, None)
            if nbytes <= self.limit_bytes:  # a larger one is never kept (LRUCache refuses it)
                self._tables[path] = _Kept(table, _identity(st), nbytes, digest)

    def get(self, path: str) -> pa.Table | None:
        """The table kept for ``path`` if its file is unchanged since, else None."""
        kept = self._get(path)
        return kept.table if kept else None

    def get_hashed(self, path: str) -> tuple[pa.Table, str] | None:
        """The table kept for ``path`` and its file's sha256, if its file is unchanged since
        and it was kept with its hash, else None."""
        kept = self._get(path)
        return (kept.table, kept.digest) if kept and kept.digest is not None else None

    def _get(self, path: str) -> _Kept | None:
        with self._lock:
            kept = self._tables.get(path)  # a hit is the most recently used from now on
            if kept is None:
                return None
            try:
                st = os.stat(path)
            except OSError:
                st = None
            if st is None or _identity(st) != kept.identity:
                self._tables.pop(path, None)
                return None
            return kept

    def clear(self) -> None:
        with self._lock:
            self._tables.clear()

    def __len__(self) -> int:
        return len(self._tables)


def _size(kept: _Kept) -> int:
    return kept.nbytes


def _identity(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


TABLES = TableMemo()

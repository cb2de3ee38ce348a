"""Content hashes of what a stage's key and manifest name beyond the run's own tables: a file, a
folder, a checkpoint (a local folder, or a Hub id by the commit the local Hub cache holds), and
how a Hub id is told from a local path and recorded in a manifest.
"""

from __future__ import annotations

import hashlib
import os
import re
from typing import Any

import fsspec

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# How a manifest records a Hub checkpoint: a bare "org/name" reads like a path inside the run.
HUB = "hub:"


def is_hub_id(ref: str) -> bool:
    """``org/name`` that is not a local path: a Hugging Face Hub model id (a ``.gguf`` name is
    a file, never a model id)."""
    if ref.lower().endswith(".gguf"):
        return False
    return bool(_HUB_ID.match(ref)) and not os.path.exists(ref)


def hub_ref(model_id: str) -> str:
    """A Hub id as a manifest records it (``hub:org/name``)."""
    return HUB + model_id


def checkpoint_hash(ref: str) -> str:
    """Content hash of a local checkpoint; a Hub id's is its id and the commit the local Hub
    cache holds for it (the id alone while it holds none), so a newer download of the model
    reruns what used the older one."""
    model_id = ref.removeprefix(HUB)
    if ref.startswith(HUB) or is_hub_id(ref):
        from eva_runtime.hub import cached_revision

        commit = cached_revision(model_id)
        named = f"hub:{model_id}" if commit is None else f"hub:{model_id}@{commit}"
        return hashlib.sha256(named.encode()).hexdigest()
    return hash_directory(ref)


def hash_directory(path: str, storage_options: dict[str, Any] | None = None) -> str:
    """sha256 over a directory's files (names and bytes), in sorted order; a local folder or
    one at any fsspec URL."""
    h = hashlib.sha256()
    if "://" not in path:
        for dirpath, _, files in sorted(os.walk(path)):
            for name in sorted(files):
                full = os.path.join(dirpath, name)
                h.update(os.path.relpath(full, path).encode())
                with open(full, "rb") as f:
                    _update(h, f)
        return h.hexdigest()
    fs, root = fsspec.core.url_to_fs(path, **(storage_options or {}))
    for full in sorted(fs.find(root)):
        h.update(full[len(root) :].lstrip("/").encode())
        with fs.open(full, "rb") as f:
            _update(h, f)
    return h.hexdigest()


def hash_file(uri: str, storage_options: dict[str, Any] | None = None) -> str:
    """sha256 of a file at any fsspec URL (used to key stages on user-supplied inputs)."""
    h = hashlib.sha256()
    with fsspec.open(uri, "rb", **(storage_options or {})) as f:
        _update(h, f)
    return h.hexdigest()


def _update(h: Any, f: Any) -> None:
    while block := f.read(1 << 20):
        h.update(block)

"""Where a run's files are: the layout of a run folder, and the paths and URIs of its files.

Layout under any fsspec URL (a local path, ``s3://bucket/prefix`` through s3fs, ...)::

    {root}/{run}/config.json                 the run's config, as last launched
    {root}/{run}/setup/{stage}.parquet       X_0, held-out set, theta_0 metrics
    {root}/{run}/setup/model/                theta_0
    {root}/{run}/iter_{t}/{stage}.parquet    one file per stage of iteration t
    {root}/{run}/iter_{t}/{stage}.manifest.json
    {root}/{run}/iter_{t}/model/             the checkpoint trained in iteration t

A manifest records the files of its run relative to the run folder (``RunPaths.relative``), so
a run copied to another root still finds them; ``resolve`` and ``absolute`` turn what it
recorded back into a path or a URI. ``tasks.store.RunStore`` reads and writes the files.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from typing import Any

import fsspec


def iteration_dir(iteration: int | None) -> str:
    """The folder of an iteration's files (None: the setup's)."""
    return "setup" if iteration is None else f"iter_{iteration}"


class RunPaths:
    """The paths and URIs of one run's files under ``{root}/{run}``."""

    def __init__(self, root: str, run: str, storage_options: dict[str, Any] | None = None):
        self.fs, base = fsspec.core.url_to_fs(root, **(storage_options or {}))
        self.protocol = (
            self.fs.protocol if isinstance(self.fs.protocol, str) else self.fs.protocol[0]
        )
        self.base = f"{base.rstrip('/')}/{run}"
        self.is_local = self.protocol in ("file", "local")

    def path(self, iteration: int | None, name: str) -> str:
        return f"{self.base}/{iteration_dir(iteration)}/{name}"

    def uri(self, path: str) -> str:
        return path if self.is_local else f"{self.protocol}://{path}"

    def strip(self, uri: str) -> str:
        return self.fs._strip_protocol(uri)

    def relative(self, path: str) -> str:
        """What a manifest records for ``path``: relative to the run folder, so a run copied
        to another root (another disk, S3, a colleague's machine) still finds its files."""
        prefix = self.base + "/"
        return path[len(prefix) :] if path.startswith(prefix) else self.uri(path)

    def resolve(self, uri: str) -> str:
        """The filesystem path of a recorded uri (relative ones lie inside this run)."""
        if "://" in uri or uri.startswith("/"):
            return self.strip(uri)
        return f"{self.base}/{uri}"

    def absolute(self, uri: str) -> str:
        """A recorded uri as a full URI, for use outside this run (another run's input)."""
        return self.uri(self.resolve(uri))

    def scratch_dir(self) -> str:
        """A local folder for this run's stage scratch: inside the run for a local root, under
        the system's temporary folder (one per run) for a remote one."""
        if self.is_local:
            path = f"{self.base}/.scratch"
        else:
            digest = hashlib.sha256(self.uri(self.base).encode()).hexdigest()[:16]
            path = os.path.join(tempfile.gettempdir(), "eva-scratch", digest)
        os.makedirs(path, exist_ok=True)
        return path

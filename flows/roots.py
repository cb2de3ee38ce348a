"""Whether a run root can be written (a local folder) or reached (a remote URL), checked before
a run writes anything, without leaving anything behind and without waiting on an endpoint that
does not answer."""

from __future__ import annotations

import inspect
import os
import shutil
import tempfile
import threading
from typing import Any

import fsspec

from eva_runtime.errors import ConfigError, first_line

ROOT_TIMEOUT_S = 20.0

# Filesystems whose constructor's **kwargs reach only fsspec's base class, which takes these and
# ignores the rest: there an option no __init__ of the class names is a typo that would be
# silently dropped. (Others, such as http's, pass **kwargs on to their client: not checked.)
CHECKED_PROTOCOLS = frozenset({"file", "local", "s3", "s3a", "memory", "hf"})
BASE_OPTIONS = frozenset({
    "skip_instance_cache", "use_listings_cache", "listings_expiry_time", "max_paths",
    "asynchronous", "loop",
})  # fmt: skip


def check_storage_options(url: str, options: dict[str, Any], field: str) -> None:
    """Refuse an option the filesystem of ``url`` does not take (``field`` names the setting)."""
    if not options or "::" in url:  # a chained URL's options are per layer
        return
    protocol = fsspec.core.split_protocol(url)[0] or "file"
    if protocol not in CHECKED_PROTOCOLS:
        return
    try:
        cls = fsspec.get_filesystem_class(protocol)
    except (ImportError, ValueError) as exc:
        raise ConfigError(f"{url}: {first_line(exc, with_type=False)}", field=field) from None
    known = set(BASE_OPTIONS)
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is not None:
            params = inspect.signature(init).parameters.values()
            known |= {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    known.discard("self")
    if unknown := sorted(set(options) - known):
        raise ConfigError(
            f"{cls.__name__} ({protocol}://) takes no option {unknown[0]!r}",
            field=field,
            hint=f"it takes {', '.join(sorted(known))}",
        )


def check_root(root: str, storage_options: dict[str, Any]) -> None:
    """The run root can be written (a local folder) or reached (a remote URL), checked without
    leaving anything behind and without waiting on an endpoint that does not answer."""
    check_storage_options(root, storage_options, "storage_options")
    if "://" not in root:
        _check_local_root(root)
        return
    outcome: list[BaseException | None] = []

    options = dict(storage_options)
    if root.startswith(("s3://", "s3a://")):
        # One quick attempt for the probe only: botocore's default retries and back-off made a
        # dead endpoint take 40 s to report (the run itself keeps the user's settings).
        quick = {"connect_timeout": 5, "read_timeout": 10, "retries": {"max_attempts": 1}}
        options["config_kwargs"] = {**quick, **options.get("config_kwargs", {})}
        options["skip_instance_cache"] = True

    def probe() -> None:
        try:
            fs, path = fsspec.core.url_to_fs(root, **options)
            fs.exists(path)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=probe, daemon=True)  # a hung endpoint must not hang us
    thread.start()
    thread.join(ROOT_TIMEOUT_S)
    endpoint = storage_options.get("endpoint_url") or (
        storage_options.get("client_kwargs") or {}
    ).get("endpoint_url")
    where = f"{root}" + (f" (endpoint {endpoint})" if endpoint else "")
    if not outcome:
        raise ConfigError(f"no answer from {where} within {ROOT_TIMEOUT_S:g} s", field="root")
    if (exc := outcome[0]) is not None:
        raise ConfigError(f"cannot reach {where}: {first_line(exc, with_type=False)}", field="root")


def _check_local_root(root: str) -> None:
    if os.path.exists(root) and not os.path.isdir(root):
        raise ConfigError(f"{root} is a file, not a folder", field="root")
    # Absolute first: the parent of a relative "runs" is "", which never exists.
    existing = os.path.abspath(root)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    try:  # a real write, removed at once: os.access cannot see read-only mounts or /proc
        shutil.rmtree(tempfile.mkdtemp(prefix=".eva-write-check-", dir=existing))
    except OSError as exc:
        raise ConfigError(f"cannot write under {root} ({exc.strerror})", field="root") from None

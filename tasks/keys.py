"""A stage's cache key: what it is, what it was asked, what it read, and what it runs.

The key of a stage call is a hash of

* the stage's name, artifact, iteration, the run seed and the stage's declared ``version``;
* its config and what the config points at (``extra_key``: a prompt file's bytes, a local
  checkpoint's bytes);
* its inputs' content hashes (not their keys: a rerun that reproduces the same bytes leaves
  everything downstream cached);
* the components its config selects, each by its declared version (a backend config class's
  ``version``; a ``package.module:name`` of the user's by the version it declares, else by the
  text of its module, which is the user's code, edited while experimenting);
* the versions of the libraries the stage and those components declare they compute with.

It is never the text of eva's own modules: editing a progress bar, a log line or eva's runtime,
or upgrading eva between launches, keeps every finished stage. A stage's or backend's code
that can change what it writes bumps its ``version``; ``python -m tasks.versions`` (run by the
test suite) fails when the code of a stage or backend changed and its version did not.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Iterator, Mapping, Sequence
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from tasks.backends.python import resolve

# What a manifest records beside the key (not in it): the software a run was made with.
RECORDED_PACKAGES = ("eva", "prefect", "torch", "transformers", "trl", "pyarrow", "numpy")


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def cache_key(
    *,
    stage: str,
    version: int,
    artifact: str,
    iteration: int | None,
    seed: int,
    config: BaseModel,
    inputs: Mapping[str, str],
    extra: Mapping[str, Any],
    libraries: Sequence[str],
) -> str:
    """The key of one stage call (``inputs``: input name -> content hash)."""
    selected = list(components(config))
    used = [*libraries, *(lib for _, obj in selected for lib in getattr(obj, "libraries", ()))]
    payload = {
        "stage": stage,
        "version": version,
        "artifact": artifact,
        "iteration": iteration,
        "seed": seed,
        "config": config.model_dump(mode="json"),
        "inputs": dict(sorted(inputs.items())),
        "extra": dict(extra),
        "components": {name: version_of(obj) for name, obj in selected},
        "libraries": library_versions(used),
    }
    return sha(json.dumps(payload, sort_keys=True, default=str))


def components(config: BaseModel) -> Iterator[tuple[str, Any]]:
    """``(name, component)`` for every component a config selects: a backend config (a model
    with a ``kind``) or a Python object/function it names by import path."""
    for value in _walk(config):
        if isinstance(value, BaseModel) and is_component(type(value)):
            cls = type(value)
            yield f"{cls.__module__}:{cls.__qualname__}", cls
            for path in _named_code(value):
                yield path, resolve(path)


def is_component(cls: type[BaseModel]) -> bool:
    """A backend config: a model that selects an implementation (``kind``) or builds one
    (``load``), as opposed to plain settings (an endpoint, a Ray job, a buffer)."""
    return "kind" in cls.model_fields or callable(getattr(cls, "load", None))


def version_of(obj: Any) -> str:
    """A component's declared ``version``; for code that declares none (a user's reward
    function), the hash of the module that defines it, so editing it reruns what calls it."""
    declared = getattr(obj, "version", None)
    if isinstance(declared, int | str):
        return str(declared)
    return "source:" + _source_hash(inspect.getsourcefile(obj) or "")


def library_versions(names: Sequence[str]) -> dict[str, str]:
    return {name: _installed(name) for name in sorted(set(names))}


def recorded_versions() -> dict[str, str]:
    """The software a manifest records (not part of any key)."""
    found = {name: _installed(name) for name in RECORDED_PACKAGES}
    return {k: v for k, v in found.items() if v != "absent"}


def _named_code(model: BaseModel) -> list[str]:
    """The import paths a component config names (``factory``, ``function``, and the
    verifiable reward's ``extract``, which decides what its majority vote counts)."""
    fields = ("factory", "function", "extract")
    return [getattr(model, f) for f in fields if isinstance(getattr(model, f, None), str)]


def _walk(value: Any) -> Iterator[Any]:
    yield value
    if isinstance(value, BaseModel):
        for name in type(value).model_fields:
            yield from _walk(getattr(value, name))
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _walk(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _walk(item)


@cache
def _installed(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "absent"


def _source_hash(path: str) -> str:
    try:
        return sha(Path(path).read_text())[:16]
    except OSError:
        return "unknown"

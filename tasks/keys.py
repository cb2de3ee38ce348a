"""A stage's cache key: what it is, what it was asked, what it read, and what it runs.

The key of a stage call is a hash of

* the stage's name, artifact, iteration, the run seed and the stage's declared ``version``;
* its config (``keyed_config``) and what the config points at (the stage's ``extra_key``: a
  prompt file's bytes, a local checkpoint's bytes, a Hub checkpoint's commit; a component
  config's own ``extra_key()``: the verifiable reward's answers file);
* its inputs' content hashes (not their keys: a rerun that reproduces the same bytes leaves
  everything downstream cached);
* the components its config selects, each by its declared version (a backend config class's
  ``version``; a ``package.module:name`` of the user's by the version it declares, else by the
  text of its module and of the user's own modules that module imports, which is the user's
  code, edited while experimenting);
* the versions of the libraries the stage and those components declare they compute with.

It is never the text of eva's own modules: editing a progress bar, a log line or eva's runtime,
or upgrading eva between launches, keeps every finished stage. A stage's or backend's code
that can change what it writes bumps its ``version``; ``python -m tasks.versions`` (run by the
test suite) fails when the code of a stage or backend changed and its version did not.

A config field added after runs were keyed is declared ``json_schema_extra=UNLESS_DEFAULT``
(``{"key": "unless default"}``): the key leaves it out while it holds its default, so adding
it keeps every finished stage, and setting it reruns what it changes.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
import sysconfig
from collections.abc import Iterator, Mapping, Sequence
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from tasks import source
from tasks.backends.python import resolve
from tasks.config_tree import Node, get_path, walk

# What a manifest records beside the key (not in it): the software a run was made with.
RECORDED_PACKAGES = ("eva", "prefect", "torch", "transformers", "trl", "pyarrow", "numpy")
# The one rule for a field added to a config after runs were keyed (see the module's docstring).
UNLESS_DEFAULT = {"key": "unless default"}
# eva's own packages: never part of a user's code in a key (eva's code text keys nothing).
EVA_PACKAGES = ("eva_core", "eva_adapters", "tasks", "flows", "eva_runtime", "eva_world", "bench")
# The most of a user's modules one component is keyed by: its own and those it imports.
MAX_USER_MODULES = 64


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
        "config": keyed_config(config),
        "inputs": dict(sorted(inputs.items())),
        "extra": dict(extra),
        "components": {name: version_of(obj) for name, obj in selected},
        "libraries": library_versions(used),
    }
    return sha(json.dumps(payload, sort_keys=True, default=str))


def keyed_config(config: BaseModel) -> dict[str, Any]:
    """A config as its key holds it: its JSON dump, without the fields declared
    ``UNLESS_DEFAULT`` that hold their default, with what each model's ``extra_key()`` adds.

    The walk of the models finds what changes and the dump is edited at the same keys; a
    place the dump does not hold as the models do (a field excluded from it) stays as dumped."""
    keyed = config.model_dump(mode="json")
    extras: list[Node] = []
    for node in walk(config, descend=lambda node: not _left_out(node)):
        if _left_out(node):
            section = get_path(keyed, node.keys[:-1])
            if isinstance(section, dict):
                section.pop(node.keys[-1], None)
        elif isinstance(node.value, BaseModel) and callable(getattr(node.value, "extra_key", None)):
            extras.append(node)
    # Each model after those it holds (the walk's order reversed): a model's extra_key() adds
    # to its part of the dump once that part is final, as a key made field by field would.
    for node in reversed(extras):
        section = get_path(keyed, node.keys)
        if isinstance(section, dict):
            section.update(node.value.extra_key())
    return keyed


def components(config: BaseModel) -> Iterator[tuple[str, Any]]:
    """``(name, component)`` for every component a config selects: a backend config (a model
    with a ``kind``) or a Python object/function it names by import path."""
    for node in walk(config):
        value = node.value
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
    function), the hash of the module that defines it and of the user's modules it imports,
    so editing either reruns what calls it."""
    declared = getattr(obj, "version", None)
    if isinstance(declared, int | str):
        return str(declared)
    return "source:" + _user_code_hash(obj)


def library_versions(names: Sequence[str]) -> dict[str, str]:
    return {name: _installed(name) for name in sorted(set(names))}


def recorded_versions() -> dict[str, str]:
    """The software a manifest records (not part of any key)."""
    found = {name: _installed(name) for name in RECORDED_PACKAGES}
    return {k: v for k, v in found.items() if v != "absent"}


def _left_out(node: Node) -> bool:
    """A field declared ``UNLESS_DEFAULT`` that holds its default: not in the key."""
    owner, field = node.owner, node.field
    if owner is None or field is None:
        return False
    name = str(node.keys[-1])
    return _unless_default(type(owner), name, field) and node.value == field.get_default(
        call_default_factory=True
    )


def _unless_default(cls: type, name: str, field: FieldInfo) -> bool:
    extra = field.json_schema_extra
    if not isinstance(extra, dict) or "key" not in extra:
        return False
    if extra["key"] != UNLESS_DEFAULT["key"]:  # a typo would put the field in every key
        raise TypeError(
            f"{cls.__name__}.{name}: json_schema_extra {extra!r}; the one key rule is "
            f"{UNLESS_DEFAULT!r} (tasks/keys.py)"
        )
    return True


def _named_code(model: BaseModel) -> list[str]:
    """The import paths a component config names (``factory``, ``function``, and the
    verifiable reward's ``extract``, which decides what its majority vote counts)."""
    fields = ("factory", "function", "extract")
    return [getattr(model, f) for f in fields if isinstance(getattr(model, f, None), str)]


@cache
def _installed(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "absent"


# -- a user's code ----------------------------------------------------------------------------


def _user_code_hash(obj: Any) -> str:
    """The text of the module defining ``obj`` and of the user's modules it imports (a module
    alone hashes as its text did before imports were followed, so its keys hold)."""
    path = inspect.getsourcefile(obj) or ""
    module = getattr(obj, "__module__", None) or ""
    files = user_modules(module, Path(path)) if path else [(module, Path(path))]
    texts = [(name, _text(file)) for name, file in files]
    if len(texts) == 1:
        return "unknown" if texts[0][1] is None else sha(texts[0][1])[:16]
    return sha("".join(f"{name}\n{sha(text or 'unknown')}\n" for name, text in texts))[:16]


def user_modules(module: str, path: Path) -> list[tuple[str, Path]]:
    """``module`` (at ``path``) and the modules of the user's it imports, transitively, at most
    ``MAX_USER_MODULES``: those whose files lie outside the standard library, installed
    packages and eva. Read, not imported; an import inside a function counts too."""
    found = {module: path}
    todo = [(module, path)]
    while todo and len(found) < MAX_USER_MODULES:
        name, file = todo.pop(0)
        try:
            tree = ast.parse(_text(file) or "")
        except (SyntaxError, ValueError):
            continue
        for imported in sorted(set(source.imported(tree, source.module_package(name, file)))):
            if imported in found or source.under(imported, EVA_PACKAGES):
                continue
            where = source.locate(imported)
            if where is not None and _is_users(where) and len(found) < MAX_USER_MODULES:
                found[imported] = where
                todo.append((imported, where))
    return list(found.items())


def _is_users(path: Path) -> bool:
    """A file of the user's project: not the standard library's, nor an installed package's."""
    resolved = path.resolve()
    if {"site-packages", "dist-packages"} & set(resolved.parts):
        return False
    return not any(resolved.is_relative_to(p) for p in _library_dirs())


@cache
def _library_dirs() -> tuple[Path, ...]:
    paths = sysconfig.get_paths()
    keys = ("stdlib", "platstdlib", "purelib", "platlib")
    return tuple({Path(paths[k]).resolve() for k in keys if k in paths})


def _text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None

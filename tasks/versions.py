"""The check that keeps declared versions honest: ``python -m tasks.versions [--write]``.

Cache keys follow declared versions, never code text (``tasks.keys``), so a change to what a
stage or a component computes must come with a version bump, or finished runs would reuse
artifacts the new code would not make. This module fingerprints that code and compares it with
``tasks/versions.lock.json``:

* a stage: its module, and the ``eva_core`` and ``tasks`` modules it imports (the method's
  arithmetic, a prompt file reader), but not the stage framework (``tasks.stage``,
  ``tasks.context``, ``tasks.keys``, ``tasks.plan``, ``tasks.store``) nor the components it
  selects, which are versioned on their own;
* a component (a backend config class, a class of the world that configs name): its module
  and the component and method modules it imports, ``eva_core``, ``tasks.backends`` and
  ``eva_world`` (not ``eva_runtime``: how bytes travel does not change what they say).

A fingerprint is the module's syntax tree without docstrings: comments, formatting and
docstrings never count. When one changed, ``python -m tasks.versions`` (and the test suite)
fails naming it and what to do: bump its ``version`` if what it writes can change, then
``python -m tasks.versions --write``; if it cannot (a rename, a log line), ``--write`` alone
records the new fingerprint, visibly, in the lock file's diff.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib
import importlib.util
import inspect
import json
import pkgutil
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel

LOCK = Path(__file__).with_name("versions.lock.json")
# Where stages and components live: the method's stages and backends, the world, the bench arms.
PACKAGES = ("tasks", "eva_world")
MODULES = ("bench.arms",)
# What a fingerprint may include besides the module itself, and what it never includes.
STAGE_CLOSURE = ("eva_core", "tasks")
COMPONENT_CLOSURE = ("eva_core", "tasks.backends", "eva_world")
FRAMEWORK = (
    "tasks.stage",
    "tasks.context",
    "tasks.keys",
    "tasks.plan",
    "tasks.store",
    "tasks.versions",
)
SKIP = ("tasks.versions",)  # not stage or component code


def declared() -> dict[str, tuple[int, str]]:
    """Every stage and component: name -> (declared version, code fingerprint)."""
    from tasks.keys import is_component
    from tasks.stage import Stage

    out: dict[str, tuple[int, str]] = {}
    for module in _modules():
        for name, obj in vars(module).items():
            if isinstance(obj, Stage) and obj.fn.__module__ == module.__name__:
                key = f"stage:{obj.name}@{module.__name__}"
                code = fingerprint(module.__name__, STAGE_CLOSURE, (*FRAMEWORK, "tasks.backends"))
                out[key] = (obj.version, code)
            elif _is_component_class(obj, module.__name__, is_component):
                key = f"component:{module.__name__}:{name}"
                version = getattr(obj, "version", None)
                if not isinstance(version, int):
                    version = -1  # refused by check(): a component must declare one
                out[key] = (version, fingerprint(module.__name__, COMPONENT_CLOSURE, FRAMEWORK))
    return dict(sorted(out.items()))


def check() -> list[str]:
    """What is stale or undeclared, one line each (empty when everything matches the lock)."""
    lock = json.loads(LOCK.read_text()) if LOCK.exists() else {}
    problems = []
    for name, (version, code) in declared().items():
        recorded = lock.get(name)
        if version < 0:
            problems.append(f"{name}: declares no version (add `version = 1`)")
        elif recorded is None:
            problems.append(f"{name}: not in {LOCK.name}")
        elif recorded["code"] != code and recorded["version"] == version:
            problems.append(
                f"{name}: its code changed but its version is still {version}: bump it if "
                "what it writes can change, then record it"
            )
        elif recorded["version"] != version:
            problems.append(f"{name}: version {version} is not recorded (lock: {recorded})")
    problems += [f"{name}: in {LOCK.name} but gone" for name in set(lock) - set(declared())]
    return problems


def write() -> None:
    lock = {k: {"version": v, "code": c} for k, (v, c) in declared().items()}
    LOCK.write_text(json.dumps(lock, indent=1, sort_keys=True) + "\n")


def fingerprint(module: str, within: tuple[str, ...], outside: tuple[str, ...] = ()) -> str:
    """The code of ``module`` and of the modules it imports under ``within`` (and not under
    ``outside``), docstrings and comments left out."""
    h = hashlib.sha256()
    for name in sorted(_closure(module, within, outside)):
        h.update(name.encode())
        h.update(_tree(name).encode())
    return h.hexdigest()[:16]


def _is_component_class(obj: Any, module: str, is_component: Any) -> bool:
    if not isinstance(obj, type) or obj.__module__ != module:
        return False
    if issubclass(obj, BaseModel):
        return bool(is_component(obj)) and not inspect.isabstract(obj)
    # A class a config builds by import path (the world's): it declares its version.
    return module.startswith("eva_world") and "version" in vars(obj)


def _modules() -> Iterator[Any]:
    for package in PACKAGES:
        root = importlib.import_module(package)
        yield root
        for info in pkgutil.walk_packages(root.__path__, f"{package}."):
            if info.name not in SKIP:
                yield importlib.import_module(info.name)
    yield from (importlib.import_module(name) for name in MODULES)


@cache
def _closure(module: str, within: tuple[str, ...], outside: tuple[str, ...]) -> frozenset[str]:
    seen, todo = set(), [module]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        tree = ast.parse(Path(_file(name)).read_text())
        for node in ast.walk(tree):
            found: list[str] = []
            if isinstance(node, ast.Import):
                found = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            todo += [
                f for f in found if _under(f, within) and not _under(f, outside) and _is_module(f)
            ]
    return frozenset(seen)


def _under(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


@cache
def _tree(module: str) -> str:
    return code_of(Path(_file(module)).read_text())


def code_of(source: str) -> str:
    """Python source as its syntax tree, without docstrings, comments or layout."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and _is_docstring(body[0]):
            node.body = body[1:] or [ast.Pass()]  # type: ignore[attr-defined]
    return ast.dump(tree, include_attributes=False)


def _is_docstring(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    )


@cache
def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, AttributeError, ValueError):
        return False


def _file(name: str) -> str:
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin, name
    return spec.origin


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tasks.versions", description=__doc__)
    p.add_argument("--write", action="store_true", help="record the current versions")
    args = p.parse_args(argv)
    if args.write:
        write()
        print(f"wrote {LOCK}")
        return 0
    problems = check()
    for line in problems:
        print(line, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

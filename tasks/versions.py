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
  ``eva_world`` (not ``eva_runtime`` as a whole: how bytes travel does not change what they
  say);
* and, in every fingerprint, the code outside those modules that decides what is written
  (``OUTPUT_CODE``): the seed derivations (``eva_runtime.seeds``: a stage's seed, which the
  framework hands every stage, and an LLM request's), and, where the fingerprinted code imports
  the LLM client, the few client functions that decide what an answer becomes (a failed
  request's ``""``, a null content's ``""``, the order of the choices, the request's body);
  not the client's retries, breaker, threads or logs.

A fingerprint is the code's syntax tree without docstrings: comments, formatting and
docstrings never count. When one changed, ``python -m tasks.versions`` (and the test suite)
fails naming it and what to do: bump its ``version`` if what it writes can change, then
``python -m tasks.versions --write``; if it cannot (a rename, a log line), ``--write`` alone
records the new fingerprint, visibly, in the lock file's diff.

A launch runs the cheap half of the check (``edited_stages``): the stages its config calls
whose code, or whose selected components' code, differs from the lock while the version is
the one recorded. Their finished artifacts are reused as they are; the launch says so in one
line (``flows.launch``).
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
# Code outside a fingerprint's modules that decides what a stage writes, as module -> the
# functions of it that do ((): the whole module). ``eva_runtime.seeds`` is in every fingerprint
# (every stage gets its seed from it); the others are in the fingerprints whose modules import
# them (directly or through another entry here), by function: what a request's answer becomes,
# not how it travels. A function that moves or is renamed fails the check until this follows.
SEEDS = "eva_runtime.seeds"
OUTPUT_CODE: dict[str, tuple[str, ...]] = {
    SEEDS: (),
    "eva_runtime.llm_client": (
        "LLMClient.answers",  # a failed request answers "" (a configuration error raises)
        "LLMClient.chat_reply",  # the request's body
        "LLMClient.completion_reply",
        "LLMClient._reply",  # the choices in index order, a null content as ""
    ),
    "eva_runtime.distilabel_llm": (
        "ClientLLM.generate",  # the sampling a distilabel task asks for
        "ClientLLM._one",  # a request's seed, a failed request's ""
        "ClientLLM._empty",
    ),
}


def declared() -> dict[str, tuple[int, str]]:
    """Every stage and component: name -> (declared version, code fingerprint)."""
    from tasks.keys import is_component
    from tasks.stage import Stage

    out: dict[str, tuple[int, str]] = {}
    for module in _modules():
        for name, obj in vars(module).items():
            if isinstance(obj, Stage) and obj.fn.__module__ == module.__name__:
                out[_stage_key(obj)] = (obj.version, stage_code(module.__name__))
            elif _is_component_class(obj, module.__name__, is_component):
                key = f"component:{module.__name__}:{name}"
                version = getattr(obj, "version", None)
                if not isinstance(version, int):
                    version = -1  # refused by check(): a component must declare one
                out[key] = (version, component_code(module.__name__))
    return dict(sorted(out.items()))


def stage_code(module: str) -> str:
    """The fingerprint of the stages defined in ``module``."""
    return fingerprint(module, STAGE_CLOSURE, (*FRAMEWORK, "tasks.backends"))


def component_code(module: str) -> str:
    """The fingerprint of the components defined in ``module`` (or ``module:Class``)."""
    return fingerprint(module.partition(":")[0], COMPONENT_CLOSURE, FRAMEWORK)


def check() -> list[str]:
    """What is stale or undeclared, one line each (empty when everything matches the lock)."""
    lock = _lock()
    try:
        entries = declared()
    except OutputCodeMissing as exc:
        return [str(exc)]
    problems = []
    for name, (version, code) in entries.items():
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
    problems += [f"{name}: in {LOCK.name} but gone" for name in set(lock) - set(entries)]
    return problems


def edited_stages(config: BaseModel) -> dict[str, list[str]]:
    """The stages ``config`` calls whose code, or the code of a component it selects for them,
    is not the code recorded for their version: stage name -> what changed (``score``'s own
    code, or a component as ``module:Class``). Cheap enough for every launch: it looks only at
    the stages already imported (a launch imports those it calls) and the components the config
    selects, reads their source and imports nothing. A version that differs from the recorded
    one is no edit here: it changes the keys, so nothing old is reused."""
    from tasks.keys import components

    lock = _lock()
    out: dict[str, list[str]] = {}
    for stage, configs in _called_stages(config):
        key, module = _stage_key(stage), stage.fn.__module__
        changed = ["its code"] if _edited(lock, key, stage.version, stage_code(module)) else []
        for sub in configs:
            for _, obj in components(sub):
                if not isinstance(obj, type):
                    continue  # a user's function: keyed by its own source (tasks.keys)
                where = f"{obj.__module__}:{obj.__qualname__}"
                key, version = f"component:{where}", getattr(obj, "version", None)
                if where not in changed and _edited(lock, key, version, component_code(where)):
                    changed.append(where)
        if changed:
            out[stage.name] = changed
    return out


def edited_line(edited: dict[str, list[str]], finished: set[str]) -> str | None:
    """The launch's one line on ``edited_stages`` that have ``finished`` artifacts (None when
    none has: nothing made by older code is reused)."""
    reused = sorted(set(edited) & finished)
    if not reused:
        return None
    what = "; ".join(f"{name}: {', '.join(edited[name])}" for name in reused)
    return (
        f"code edited without a version bump ({what}): this launch reuses the finished "
        f"artifacts of {', '.join(reused)} as they are (keys follow versions, not code); bump "
        "the version if the edit changes what they write, else record it: python -m "
        "tasks.versions --write"
    )


def _edited(lock: dict[str, Any], key: str, version: Any, code: str) -> bool:
    """The code differs from what the lock records for the same version. What the lock does
    not know (a user's class, keyed by its own source) is no edit here."""
    recorded = lock.get(key)
    return recorded is not None and recorded["version"] == version and recorded["code"] != code


def _called_stages(config: BaseModel) -> Iterator[tuple[Any, list[BaseModel]]]:
    """The imported stages whose config ``config`` holds (a field or a property of it, as
    ``RunConfig.evaluation``), each with those sub-configs."""
    from tasks.stage import Stage

    names = [*type(config).model_fields]
    names += [n for n, v in vars(type(config)).items() if isinstance(v, property)]
    subs = [v for v in (getattr(config, n) for n in names) if isinstance(v, BaseModel)]
    seen: set[int] = set()
    for name in sorted(sys.modules):
        module = sys.modules[name]
        if not _under(name, (*PACKAGES, *MODULES)) or _under(name, SKIP) or module is None:
            continue
        for obj in list(vars(module).values()):
            if isinstance(obj, Stage) and id(obj) not in seen and obj.fn.__module__ == name:
                seen.add(id(obj))
                wanted = _config_class(obj)
                found = [s for s in subs if wanted is not None and isinstance(s, wanted)]
                if found:
                    yield obj, found


def _config_class(stage: Any) -> type | None:
    """The class of the config a stage function takes (its second parameter)."""
    try:
        params = list(inspect.signature(stage.fn, eval_str=True).parameters.values())
    except Exception:  # an annotation that does not resolve: the stage is not matched
        return None
    annotation = params[1].annotation if len(params) > 1 else None
    return annotation if isinstance(annotation, type) else None


def _stage_key(stage: Any) -> str:
    return f"stage:{stage.name}@{stage.fn.__module__}"


def _lock() -> dict[str, Any]:
    return json.loads(LOCK.read_text()) if LOCK.exists() else {}


def write() -> None:
    lock = {k: {"version": v, "code": c} for k, (v, c) in declared().items()}
    LOCK.write_text(json.dumps(lock, indent=1, sort_keys=True) + "\n")


def fingerprint(module: str, within: tuple[str, ...], outside: tuple[str, ...] = ()) -> str:
    """The code of ``module`` and of the modules it imports under ``within`` (and not under
    ``outside``), with the code that decides outputs from elsewhere (``OUTPUT_CODE``),
    docstrings and comments left out."""
    h = hashlib.sha256()
    modules = _closure(module, within, outside)
    for name in sorted(modules):
        h.update(name.encode())
        h.update(_tree(name).encode())
    for name, functions in sorted(_output_code(modules).items()):
        if name in modules:
            continue  # hashed whole already
        h.update(name.encode())
        if not functions:
            h.update(_tree(name).encode())
        for qualname in functions:
            h.update(qualname.encode())
            h.update(_function(name, qualname).encode())
    return h.hexdigest()[:16]


class OutputCodeMissing(LookupError):
    """A function ``OUTPUT_CODE`` names is no longer where it says."""


def _output_code(modules: frozenset[str]) -> dict[str, tuple[str, ...]]:
    """The ``OUTPUT_CODE`` entries that apply to a fingerprint of ``modules``: the seeds, and
    those imported by the modules or by another entry that applies."""
    found = {SEEDS}
    todo = [*modules, SEEDS]
    while todo:
        for name in _imports(todo.pop()):
            if name in OUTPUT_CODE and name not in found:
                found.add(name)
                todo.append(name)
    return {name: OUTPUT_CODE[name] for name in found}


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
        todo += [f for f in _imports(name) if _under(f, within) and not _under(f, outside)]
    return frozenset(seen)


@cache
def _imports(module: str) -> frozenset[str]:
    """The modules ``module`` imports (any import, also one inside a function)."""
    found: list[str] = []
    for node in ast.walk(_parsed(module)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return frozenset(f for f in found if _is_module(f))


def _under(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


@cache
def _tree(module: str) -> str:
    return ast.dump(_parsed(module), include_attributes=False)


def _function(module: str, qualname: str) -> str:
    """The code of one function or class of ``module`` (``Class.method``; a class nested in a
    function is found too)."""
    first, *rest = qualname.split(".")
    nodes = [n for n in ast.walk(_parsed(module)) if getattr(n, "name", None) == first]
    for part in rest:
        nodes = [n for p in nodes for n in getattr(p, "body", []) if getattr(n, "name", 0) == part]
    if len(nodes) != 1:
        raise OutputCodeMissing(
            f"{module} has {'no' if not nodes else 'more than one'} {qualname}: update "
            "OUTPUT_CODE in tasks/versions.py to name the code that decides what is written"
        )
    return ast.dump(nodes[0], include_attributes=False)


@cache
def _parsed(module: str) -> ast.Module:
    """``module``'s syntax tree without docstrings (parsed once, never changed after)."""
    return _without_docstrings(ast.parse(_source(module)))


def _source(module: str) -> str:
    """The one place the check reads code (tests hand it edited copies)."""
    return Path(_file(module)).read_text()


def code_of(source: str) -> str:
    """Python source as its syntax tree, without docstrings, comments or layout."""
    return ast.dump(_without_docstrings(ast.parse(source)), include_attributes=False)


def _without_docstrings(tree: ast.Module) -> ast.Module:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and _is_docstring(body[0]):
            node.body = body[1:] or [ast.Pass()]  # type: ignore[attr-defined]
    return tree


def _is_docstring(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    )


@cache
def _is_module(name: str) -> bool:
    return _find(name) is not None


def _file(name: str) -> str:
    found = _find(name)
    assert found is not None, name
    return str(found)


@cache
def _find(name: str) -> Path | None:
    """The source file of module ``name``, found without importing anything (an import of a
    backend module would import torch or TRL); None when ``name`` is no module (an object
    imported from one) or not Python source."""
    top, *rest = name.split(".")
    try:
        spec = importlib.util.find_spec(top)  # a top-level name: searched, not imported
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if not rest:
        return Path(spec.origin) if spec.origin and spec.origin.endswith(".py") else None
    for folder in spec.submodule_search_locations or ():
        path = Path(folder).joinpath(*rest[:-1])
        if rest[:-1] and not (path / "__init__.py").is_file():
            continue
        for candidate in (path / rest[-1] / "__init__.py", path / f"{rest[-1]}.py"):
            if candidate.is_file():
                return candidate
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tasks.versions", description=__doc__)
    p.add_argument("--write", action="store_true", help="record the current versions")
    args = p.parse_args(argv)
    if args.write:
        try:
            write()
        except OutputCodeMissing as exc:
            print(exc, file=sys.stderr)
            return 1
        print(f"wrote {LOCK}")
        return 0
    problems = check()
    for line in problems:
        print(line, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

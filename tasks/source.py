"""Python code read as text, never imported: where a module's file is, what it imports, and its
code as a syntax tree without docstrings.

The version check (``tasks.versions``) fingerprints eva's stages and components this way, and
the key builder (``tasks.keys``) a user's code and the modules of theirs it imports: importing
a backend module to read it would import torch or TRL, and importing a user's module runs it.

Code is its syntax tree: comments, layout and docstrings are not code. eva's modules are read
once per process (``read`` is the one place, which tests replace to hand in edited copies); a
user's files are read again on every call, since they are edited while a process runs.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path

MODULE_LEVEL = "<module>"  # the name of a module's code outside its functions and classes


def read(module: str) -> str:
    """The source of eva's module ``module`` (the one place the check reads code)."""
    found = find(module)
    assert found is not None, module
    return found.read_text()


@cache
def parsed(module: str) -> ast.Module:
    """``module``'s syntax tree without docstrings (parsed once, never changed after)."""
    return without_docstrings(ast.parse(read(module)))


@cache
def tree(module: str) -> str:
    return ast.dump(parsed(module), include_attributes=False)


@cache
def imports(module: str) -> frozenset[str]:
    """The modules ``module`` imports (any import, also one inside a function)."""
    names = imported(parsed(module), module_package(module, find(module)))
    return frozenset(n for n in names if _find(n) is not None)


def clear_caches() -> None:
    for cached in (parsed, tree, imports, definitions, definition):
        cached.cache_clear()


def code_of(source: str) -> str:
    """Python source as its syntax tree, without docstrings, comments or layout."""
    return ast.dump(without_docstrings(ast.parse(source)), include_attributes=False)


@cache
def definitions(module: str) -> dict[str, str]:
    """Every function and class of ``module`` by qualified name (``Class.method``), each as a
    short hash of its code: a class without its methods (each an entry of its own), a function
    with what it nests; the rest of the module (imports, constants) as ``MODULE_LEVEL``."""
    out: dict[str, str] = {}
    rest: list[ast.stmt] = []
    for node in parsed(module).body:
        if isinstance(node, _DEFS):
            out.update(_hashed(node, ""))
        else:
            rest.append(node)
    out[MODULE_LEVEL] = short_hash(ast.dump(ast.Module(rest, []), include_attributes=False))
    return out


@cache
def definition(module: str, qualname: str) -> str:
    """The code of one function or class of ``module`` (``Class.method``; a class nested in a
    function is found too); a ``LookupError`` naming what is missing or ambiguous."""
    first, *rest = qualname.split(".")
    nodes = [n for n in ast.walk(parsed(module)) if getattr(n, "name", None) == first]
    for part in rest:
        nodes = [n for p in nodes for n in getattr(p, "body", []) if getattr(n, "name", 0) == part]
    if len(nodes) != 1:
        raise LookupError(f"{module} has {'no' if not nodes else 'more than one'} {qualname}")
    return ast.dump(nodes[0], include_attributes=False)


def find(name: str) -> Path | None:
    """The source file of eva's module ``name``, found without importing anything (and
    remembered); None when ``name`` is no module (an object imported from one) or not Python
    source."""
    return _find(name)


def locate(name: str) -> Path | None:
    """``find``, not remembered: for a user's modules, which come and go while a process runs.
    A module already imported is the file it was imported from (the code that runs)."""
    loaded = sys.modules.get(name)
    file = getattr(loaded, "__file__", None) if loaded is not None else None
    if isinstance(file, str):
        return Path(file) if file.endswith(".py") else None
    return _locate(name)


def is_module(name: str) -> bool:
    return _find(name) is not None


def under(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def imported(tree: ast.Module, package: str) -> Iterator[str]:
    """The names a syntax tree imports that may be modules (``from m import x``: ``m`` and
    ``m.x``), relative imports resolved against ``package``; the caller keeps the modules."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, package)
            if base:
                yield base
                yield from (f"{base}.{a.name}" for a in node.names)


def module_package(module: str, path: Path | None) -> str:
    """The package a module's relative imports start from."""
    return _package(module, path)


def without_docstrings(tree: ast.Module) -> ast.Module:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and _is_docstring(body[0]):
            node.body = body[1:] or [ast.Pass()]  # type: ignore[attr-defined]
    return tree


_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _hashed(node: ast.stmt, prefix: str) -> dict[str, str]:
    name = f"{prefix}{node.name}"  # type: ignore[attr-defined]
    if not isinstance(node, ast.ClassDef):
        return {name: short_hash(ast.dump(node, include_attributes=False))}
    out: dict[str, str] = {}
    own = [n for n in node.body if not isinstance(n, _DEFS)]
    for child in node.body:
        if isinstance(child, _DEFS):
            out.update(_hashed(child, f"{name}."))
    shell = ast.ClassDef(
        name=node.name,
        bases=node.bases,
        keywords=node.keywords,
        body=own or [ast.Pass()],
        decorator_list=node.decorator_list,
    )
    return {name: short_hash(ast.dump(shell, include_attributes=False)), **out}


def short_hash(code: str) -> str:
    return hashlib.sha256(code.encode()).hexdigest()[:12]


def _absolute(node: ast.ImportFrom, package: str) -> str | None:
    """The module ``from ... import`` names, relative dots resolved (None: above the top)."""
    if node.level == 0:
        return node.module or ""
    parts = package.split(".") if package else []
    if node.level - 1 >= len(parts):
        return None
    base = ".".join(parts[: len(parts) - (node.level - 1)])
    return f"{base}.{node.module}" if node.module else base


def _package(module: str, path: Path | None) -> str:
    if path is not None and path.name == "__init__.py":
        return module
    return module.rpartition(".")[0]


def _is_docstring(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    )


@cache
def _find(name: str) -> Path | None:
    return _locate(name)


def _locate(name: str) -> Path | None:
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

"""The stages and components eva's code declares, found by reading it, never by importing it.

The version check lists every stage and component with its declared version. Importing every
module to find them would import torch, TRL and vLLM (many seconds); reading the syntax trees
(``tasks.source``) takes a fraction of one. What counts, as the stage framework and the key
builder see it:

* a stage: a module-level function decorated ``@stage("name", version=N, ...)``;
* a component: a class defined in the module that is a pydantic model and selects an
  implementation (a ``kind`` field) or builds one (a ``load`` method), itself or through a base
  class (``tasks.keys.is_component``); or a class of the world (``eva_world``) whose body
  declares ``version`` (configs build it by import path).

A version is the literal the code declares (a base class's when the class declares none); -1
where there is none, which the check refuses. ``tests/test_version_check.py`` checks that this
finds exactly what importing every module finds.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache

from tasks import source

# The packages whose classes a component's bases are followed into (others: not a model).
FOLLOWED = ("tasks", "eva_world", "eva_core", "eva_runtime", "bench")
_PYDANTIC = ("pydantic", "pydantic.main")


@dataclass(frozen=True)
class Declared:
    kind: str  # "stage" or "component"
    name: str  # the stage's name or the class's
    version: int  # -1: none declared


def modules(packages: tuple[str, ...], extra: tuple[str, ...], skip: tuple[str, ...]) -> list[str]:
    """Every module of ``packages`` (and the ``extra`` modules), by walking their folders."""
    out: list[str] = []
    for package in packages:
        init = source.find(package)
        assert init is not None and init.name == "__init__.py", package
        root = init.parent
        for folder, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if (root / folder / d / "__init__.py").is_file())
            rel = os.path.relpath(folder, root)
            prefix = package if rel == "." else f"{package}.{rel.replace(os.sep, '.')}"
            for name in sorted(files):
                stem = name.removesuffix(".py")
                if name.endswith(".py") and stem.isidentifier():
                    out.append(prefix if stem == "__init__" else f"{prefix}.{stem}")
    return sorted({m for m in [*out, *extra] if m not in skip})


def declared_in(module: str) -> Iterator[Declared]:
    """The stages and components ``module`` defines."""
    tree = source.parsed(module)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for call in node.decorator_list:
                if isinstance(call, ast.Call) and _is_stage_call(call):
                    yield Declared(
                        "stage", _stage_name(call, node.name), _stage_version(call, tree)
                    )
        elif isinstance(node, ast.ClassDef) and _is_component(module, node):
            yield Declared("component", node.name, _version(module, node))


def _is_stage_call(node: ast.Call) -> bool:
    func = node.func
    return (isinstance(func, ast.Name) and func.id == "stage") or (
        isinstance(func, ast.Attribute) and func.attr == "stage"
    )


def _stage_name(call: ast.Call, default: str) -> str:
    first = call.args[0] if call.args else None
    named = isinstance(first, ast.Constant) and isinstance(first.value, str)
    return first.value if named else default  # type: ignore[union-attr]


def _stage_version(call: ast.Call, tree: ast.Module) -> int:
    for keyword in call.keywords:
        if keyword.arg == "version":
            return _int(keyword.value, tree)
    return -1


def _int(node: ast.expr | None, tree: ast.Module) -> int:
    """A literal int, or a module-level name bound to one; -1 otherwise."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.Name):
        for stmt in tree.body:
            if isinstance(stmt, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == node.id for t in stmt.targets
            ):
                return _int(stmt.value, ast.Module([], []))
    return -1


# -- classes ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Class:
    module: str
    node: ast.ClassDef


_MODEL = "pydantic.BaseModel"


def _is_component(module: str, node: ast.ClassDef) -> bool:
    cls = _Class(module, node)
    if _is_model(cls):
        fields = {name for c in _mro(cls) for name in _fields(c.node)}
        return "kind" in fields or any("load" in _methods(c.node) for c in _mro(cls))
    return module.startswith("eva_world") and "version" in _assigned(node)


def _version(module: str, node: ast.ClassDef) -> int:
    for cls in _mro(_Class(module, node)):
        value = _assigned(cls.node).get("version")
        if value is not None:
            return _int(value, source.parsed(cls.module))
    return -1


def _is_model(cls: _Class) -> bool:
    return any(base == _MODEL or (isinstance(base, _Class) and _is_model(base))
               for base in _bases(cls))  # fmt: skip


def _mro(cls: _Class) -> list[_Class]:
    """The class and its followed bases, depth first (enough for one ``version`` or ``kind``)."""
    out, todo = [], [cls]
    while todo:
        current = todo.pop(0)
        if current not in out:
            out.append(current)
            todo[:0] = [b for b in _bases(current) if isinstance(b, _Class)]
    return out


def _bases(cls: _Class) -> list[_Class | str | None]:
    return [_resolve(cls.module, base) for base in cls.node.bases]


def _resolve(module: str, expr: ast.expr) -> _Class | str | None:
    if isinstance(expr, ast.Subscript):  # Generic[T], a parametrized model
        return _resolve(module, expr.value)
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
        return _MODEL if (expr.value.id, expr.attr) == ("pydantic", "BaseModel") else None
    return _named(module, expr.id) if isinstance(expr, ast.Name) else None


@cache
def _named(module: str, name: str) -> _Class | str | None:
    """The class ``name`` means in ``module``: defined there, or imported from where it is."""
    tree = source.parsed(module)
    for stmt in tree.body:
        if isinstance(stmt, ast.ClassDef) and stmt.name == name:
            return _Class(module, stmt)
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
            continue
        for alias in node.names:
            if (alias.asname or alias.name) != name:
                continue
            if node.module in _PYDANTIC and alias.name == "BaseModel":
                return _MODEL
            if source.under(node.module, FOLLOWED) and source.is_module(node.module):
                return _named(node.module, alias.name)
    return None


def _fields(node: ast.ClassDef) -> set[str]:
    """Annotated names of a class body that pydantic makes fields (not ``ClassVar``)."""
    return {
        stmt.target.id
        for stmt in node.body
        if isinstance(stmt, ast.AnnAssign)
        and isinstance(stmt.target, ast.Name)
        and "ClassVar" not in ast.unparse(stmt.annotation)
    }


def _methods(node: ast.ClassDef) -> set[str]:
    return {s.name for s in node.body if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef)}


def _assigned(node: ast.ClassDef) -> dict[str, ast.expr | None]:
    """Names a class body binds, with the value bound (None: annotated only)."""
    out: dict[str, ast.expr | None] = {}
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            out[stmt.target.id] = stmt.value
        elif isinstance(stmt, ast.Assign):
            out.update({t.id: stmt.value for t in stmt.targets if isinstance(t, ast.Name)})
    return out


def clear_caches() -> None:
    _named.cache_clear()

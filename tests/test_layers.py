"""The house, drawn and checked: three layers whose imports run one way (docs/architecture.md).

    eva_world, bench   the demo world and the benchmarks
          |
    eva_core, tasks, flows   the method: pure algorithms, stages, flows (and the CLI);
    eva_adapters             eva_core on RL frameworks' seams (imports eva_core only)
          |
    eva_runtime        processes, HTTP clients, Prefect posting

A module may import its own layer and the layers below it, never one above: the method never
imports the world (the world plugs in by import path, from configs/world.yaml), and the runtime
never imports the method. ``eva_core`` is the method's pure part: it imports no other layer's
code at all. Every import counts, also one inside a function.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[1]
LAYER = {
    "eva_runtime": 0,
    "eva_core": 1,
    "eva_adapters": 1,
    "tasks": 1,
    "flows": 1,
    "eva_world": 2,
    "bench": 2,
}


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found & set(LAYER)


def _modules(package: str) -> list[Path]:
    return sorted((PROJECT / package).rglob("*.py"))


@pytest.mark.parametrize("package", sorted(LAYER))
def test_imports_run_one_way(package: str) -> None:
    upward = {
        str(path.relative_to(PROJECT)): sorted(
            other for other in _imports(path) if LAYER[other] > LAYER[package]
        )
        for path in _modules(package)
    }
    assert {k: v for k, v in upward.items() if v} == {}


def test_the_pure_method_imports_no_other_package() -> None:
    impure = {
        str(path.relative_to(PROJECT)): sorted(_imports(path) - {"eva_core"})
        for path in _modules("eva_core")
    }
    assert {k: v for k, v in impure.items() if v} == {}


def test_the_adapters_import_only_the_pure_method() -> None:
    """eva_adapters installs into a trainer's environment with eva_core alone (creator/)."""
    beyond = {
        str(path.relative_to(PROJECT)): sorted(_imports(path) - {"eva_core", "eva_adapters"})
        for path in _modules("eva_adapters")
    }
    assert {k: v for k, v in beyond.items() if v} == {}


def test_every_package_is_placed_in_a_layer() -> None:
    packages = {p.parent.name for p in PROJECT.glob("*/__init__.py")}
    assert packages - {"tests"} == set(LAYER)


def test_the_creator_parses_as_its_python_floor() -> None:
    """``eva-creator`` (eva_core, eva_adapters) declares Python >= 3.10: its syntax is 3.10's
    (``tests/test_creator_install.py`` runs it there)."""
    floor = (PROJECT / "creator" / "pyproject.toml").read_text()
    assert 'requires-python = ">=3.10"' in floor
    for package in ("eva_core", "eva_adapters"):
        for path in _modules(package):
            ast.parse(path.read_text(), str(path), feature_version=(3, 10))

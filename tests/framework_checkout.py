"""The source of an RL framework that is not on the package registry (slime, NeMo-RL), for the
adapter tests that drive eva through the framework's own classes.

Each framework's Python packages are exported unchanged at one commit into the shared vendor
folder beside the repository, ``../shared/vendor/<folder>`` (its ``README.md`` names the commit
of each); a variable (``EVA_SLIME_SRC``, ``EVA_NEMO_RL_SRC``) may name another source root, a
folder holding the framework's package (a git working tree is one too), to try another commit.
That folder goes on ``sys.path``. Without one the tests fail, saying where they looked: the
default suite runs them. ``activated`` does it for a test session's fixture, with the side
packages (``tests/side_env.py``) the framework needs.

Also here: ``load_functions``, which builds a module from some top-level functions of a file
of the source, for the few functions a framework's module imports lazily from modules that
cannot import in eva's environment (a version pin that eva's own packages break).
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tempfile
import types
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests import side_env

VENDOR = Path(__file__).resolve().parents[1].parent / "shared" / "vendor"


@dataclass(frozen=True)
class Framework:
    name: str  # as the tests name it
    title: str  # as people name it
    repo: str  # owner/name on GitHub
    env: str  # the variable naming another source root
    folder: str  # its folder under VENDOR
    package: str  # its top-level package


FRAMEWORKS = {
    "slime": Framework("slime", "slime", "THUDM/slime", "EVA_SLIME_SRC", "slime", "slime"),
    "nemo_rl": Framework(
        "nemo_rl",
        "NeMo-RL (the registry's nemo-rl is a 0.0.0 placeholder)",
        "NVIDIA-NeMo/RL",
        "EVA_NEMO_RL_SRC",
        "nemo-rl",
        "nemo_rl",
    ),
}


@dataclass(frozen=True)
class Checkout:
    framework: Framework
    root: Path  # the folder holding the framework's package (goes on sys.path)
    commit: str  # the commit its files are, as the vendor README or git says


def _root(fw: Framework) -> Path:
    return Path(os.environ.get(fw.env) or VENDOR / fw.folder)


def describe(name: str) -> str:
    """The commit the tests of ``name`` run, for their ids (``absent`` without its source)."""
    fw = FRAMEWORKS[name]
    root = _root(fw)
    if not (root / fw.package).is_dir():
        return "absent"
    return _commit(fw, root)[:9]


def _commit(fw: Framework, root: Path) -> str:
    """The vendored commit (the README's table), or what git says of a working tree."""
    if root == VENDOR / fw.folder:
        readme = (VENDOR / "README.md").read_text(encoding="utf-8")
        found = re.search(
            rf"^\| `{re.escape(fw.folder)}/`.*?\| ([0-9a-f]{{7,40}}) \|", readme, re.M
        )
        return found.group(1) if found else "unknown (not in the vendor README)"
    git = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                         text=True)  # fmt: skip
    return git.stdout.strip() if git.returncode == 0 else "unknown (not a git checkout)"


def locate(name: str) -> Checkout:
    """The source root of framework ``name``; fails the test, saying where it looked."""
    fw = FRAMEWORKS[name]
    root = _root(fw)
    if not (root / fw.package).is_dir():
        given = f"{fw.env}={root}" if os.environ.get(fw.env) else str(root)
        pytest.fail(
            f"{fw.title} is not on the package registry: its sources are vendored in "
            f"{VENDOR / fw.folder} ({fw.repo}); {given} holds no {fw.package}/ package"
        )
    return Checkout(fw, root, _commit(fw, root))


def activate(checkout: Checkout) -> None:
    """Make the checkout's packages importable (first on ``sys.path``: the framework's own
    code, not an older copy some wheel may ship)."""
    if str(checkout.root) not in sys.path:
        sys.path.insert(0, str(checkout.root))


@contextmanager
def activated(
    request: pytest.FixtureRequest, name: str, side: Sequence[str], needs: str
) -> Iterator[Checkout]:
    """Framework ``name``'s source, importable, with the packages ``side`` it imports that
    eva's environment lacks (installed once into a side folder, ``tests/side_env.py``), for a
    session fixture: the test fails without the source and skips, saying why, where pip cannot
    install ``side`` (``needs`` says what needs them); the commit that runs is printed. The side
    folder leaves ``sys.path`` at the end; the source stays (its modules are imported)."""
    found = locate(name)
    cache = getattr(request.config, "cache", None)  # absent under -p no:cacheprovider
    root = Path(cache.mkdir("frameworks") if cache else tempfile.gettempdir())
    try:
        folder = side_env.install(side, root / f"side-{name.replace('_', '-')}")
    except RuntimeError as exc:
        pytest.skip(f"{needs} {tuple(side)}, which pip could not install: {exc}")
    side_env.activate(folder)
    activate(found)
    print(f"\n{found.framework.repo} at {found.commit} ({found.root})")
    try:
        yield found
    finally:
        side_env.deactivate(folder)


def load_functions(
    module: str, source: Path, names: Sequence[str], namespace: dict[str, Any]
) -> types.ModuleType:
    """A module named ``module`` holding the top-level functions (and constants) ``names`` of
    the file ``source``, exactly as written there, executed over ``namespace`` (the names
    their bodies use that the file imported)."""
    tree = ast.parse(source.read_text(encoding="utf-8"))
    wanted = set(names)
    body: list[ast.stmt] = []
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            defined = {node.name}
        elif isinstance(node, ast.Assign):
            defined = {t.id for t in node.targets if isinstance(t, ast.Name)}
        else:
            continue
        if defined & wanted:
            body.append(node)
            found |= defined & wanted
    if missing := wanted - found:
        raise LookupError(f"{source} defines no {sorted(missing)}")
    mod = types.ModuleType(module)
    mod.__file__ = str(source)
    mod.__dict__.update(namespace)
    code = compile(ast.Module(body=body, type_ignores=[]), str(source), "exec")
    exec(code, mod.__dict__)
    return mod

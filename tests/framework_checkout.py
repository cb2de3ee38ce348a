"""The source of an RL framework that is not on the package registry (slime, NeMo-RL), for the
adapter tests that drive eva through the framework's own classes.

Each framework is found through an environment variable naming a checkout of its repository
(a working tree, or a bare git directory); without one, the fetched mirror this project's
machines keep is tried. A git directory is exported (``git archive``) once per commit into a
cache folder the caller gives (the tests use pytest's cache, which git ignores) and put on
``sys.path``. Where nothing is found, ``locate`` says why, so a test can skip with that reason
(a fresh clone in CI has neither the variable nor the mirror). ``activated`` does all of it for
a test session's fixture, with the side packages (``tests/side_env.py``) the framework needs.

Also here: ``load_functions``, which builds a module from some top-level functions of a file
of the checkout, for the few functions a framework's module imports lazily from modules that
cannot import in eva's environment (a version pin that eva's own packages break).
"""

from __future__ import annotations

import ast
import os
import shutil
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


@dataclass(frozen=True)
class Framework:
    name: str  # as the tests name it
    title: str  # as people name it
    repo: str  # owner/name on GitHub
    env: str  # the variable naming a checkout
    mirror: str  # the fetched mirror (a bare git directory), tried without the variable
    packages: tuple[str, ...]  # top-level folders to export


FRAMEWORKS = {
    "slime": Framework(
        "slime",
        "slime",
        "THUDM/slime",
        "EVA_SLIME_SRC",
        "/work/.mirror/THUDM+slime/repo",
        ("slime",),
    ),
    "nemo_rl": Framework(
        "nemo_rl",
        "NeMo-RL (the registry's nemo-rl is a 0.0.0 placeholder)",
        "NVIDIA-NeMo/RL",
        "EVA_NEMO_RL_SRC",
        "/work/.mirror/NVIDIA-NeMo+RL/repo",
        ("nemo_rl",),
    ),
}


@dataclass(frozen=True)
class Checkout:
    framework: Framework
    root: Path  # the folder holding the framework's packages (goes on sys.path)
    commit: str  # the commit exported, or what git says of the working tree


def _git(git_dir: Path, *args: str) -> str:
    run = subprocess.run(
        ["git", f"--git-dir={git_dir}", *args], capture_output=True, text=True, timeout=120
    )
    if run.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {run.stderr.strip()[-300:]}")
    return run.stdout.strip()


def _git_dir(path: Path) -> Path | None:
    """``path`` itself when it is a bare git directory, its ``.git`` when a working tree."""
    if (path / "HEAD").is_file() and (path / "objects").is_dir():
        return path
    if (path / ".git").exists():
        return path / ".git"
    return None


def describe(name: str) -> str:
    """The commit (12 digits) the tests of ``name`` would run, for their ids: read without
    exporting anything; ``absent`` without a checkout."""
    fw = FRAMEWORKS[name]
    path = Path(os.environ.get(fw.env) or fw.mirror)
    git_dir = _git_dir(path) if path.exists() else None
    if git_dir is None or shutil.which("git") is None:
        return "absent" if not path.exists() else "unversioned"
    try:
        return _git(git_dir, "rev-parse", "HEAD")[:12]
    except (RuntimeError, OSError, subprocess.TimeoutExpired):
        return "unreadable"


def locate(name: str, cache: Path) -> Checkout | str:
    """The checkout of framework ``name`` (exported under ``cache`` when it is a git directory),
    or the reason there is none."""
    fw = FRAMEWORKS[name]
    given = os.environ.get(fw.env)
    path = Path(given or fw.mirror)
    if not path.exists():
        return (
            f"{fw.title} is not on the package registry; set {fw.env} to a checkout of "
            f"{fw.repo} ({'no ' + str(path) if given else 'no mirror at ' + fw.mirror})"
        )
    git_dir = _git_dir(path)
    if git_dir is not None and shutil.which("git") is None:
        return f"{path} is a git directory and git is not installed"
    if given and git_dir is not None and (path / fw.packages[0]).is_dir():
        # A working tree: use it as it is (uncommitted edits included).
        commit = _git(git_dir, "rev-parse", "HEAD")
        dirty = subprocess.run(["git", "-C", str(path), "status", "--porcelain"],
                               capture_output=True, text=True).stdout.strip()  # fmt: skip
        return Checkout(fw, path, commit + (" (with uncommitted changes)" if dirty else ""))
    if git_dir is None:
        if not (path / fw.packages[0]).is_dir():
            return f"{fw.env}={path} holds no {fw.packages[0]}/ package"
        return Checkout(fw, path, "unknown (not a git checkout)")
    commit = _git(git_dir, "rev-parse", "HEAD")
    target = cache / f"{fw.name}-{commit[:12]}"
    if not (target / ".complete").exists():
        shutil.rmtree(target, ignore_errors=True)
        tmp = cache / f".{fw.name}-{commit[:12]}.{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        archive = subprocess.run(
            ["git", f"--git-dir={git_dir}", "archive", "--format=tar", commit, *fw.packages],
            capture_output=True, timeout=300,
        )  # fmt: skip
        if archive.returncode != 0:
            return f"git archive of {git_dir} failed: {archive.stderr.decode()[-300:]}"
        subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive.stdout, check=True)
        (tmp / ".complete").write_text(commit + "\n")
        try:
            tmp.rename(target)
        except OSError:  # another process exported it meanwhile
            shutil.rmtree(tmp, ignore_errors=True)
    return Checkout(fw, target, commit)


def activate(checkout: Checkout) -> None:
    """Make the checkout's packages importable (first on ``sys.path``: the framework's own
    code, not an older copy some wheel may ship)."""
    if str(checkout.root) not in sys.path:
        sys.path.insert(0, str(checkout.root))


@contextmanager
def activated(
    request: pytest.FixtureRequest, name: str, side: Sequence[str], needs: str
) -> Iterator[Checkout]:
    """Framework ``name``'s checkout, importable, with the packages ``side`` it imports that
    eva's environment lacks (installed once into a side folder, ``tests/side_env.py``), for a
    session fixture: the test skips, saying why, where there is no checkout or pip cannot
    install ``side`` (``needs`` says what needs them); the commit that runs is printed. The
    side folder leaves ``sys.path`` at the end; the checkout stays (its modules are imported)."""
    cache = getattr(request.config, "cache", None)  # absent under -p no:cacheprovider
    root = Path(cache.mkdir("frameworks") if cache else tempfile.gettempdir())
    found = locate(name, root)
    if isinstance(found, str):
        pytest.skip(found)
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

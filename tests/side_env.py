"""A side environment for a framework whose pins clash with eva's: its packages installed with
``pip install --no-deps --target DIR`` and appended to ``sys.path``, so eva's own packages (torch,
transformers, numpy, ...) win every clash and the framework runs on them.

The folder is cached by the hash of its requirement list (under pytest's cache, which git
ignores), so a second run installs nothing. Top-level folders that some wheels ship beside their
package (``tests``, ``scripts``, ...) are removed: on ``sys.path`` they would shadow eva's own.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

# Folders wheels ship at the top level that are not importable packages of theirs.
STRAY = ("tests", "scripts", "recipe", "tutorial", "examples", "docs", "bin")


def install(requirements: Sequence[str], root: Path, timeout: float = 300) -> Path:
    """The folder holding ``requirements`` (pinned ``name==version``), installed there once.
    Raises ``RuntimeError`` with pip's last lines when pip fails (no registry, no wheel)."""
    key = hashlib.sha256("\n".join(sorted(requirements)).encode()).hexdigest()[:12]
    target = root / key
    done = target / ".complete"
    if done.exists():
        return target
    # Installed beside the target and moved there whole, so that a process that finds the
    # folder (another test worker's) finds it complete, and two installing at once both end.
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"{key}.", dir=root))
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "--quiet"]
    cmd = [*pip, "--disable-pip-version-check", "--target", str(work), *requirements]
    try:
        try:
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"pip install took over {timeout:.0f} s") from exc
        if run.returncode != 0:
            tail = "\n".join((run.stderr or run.stdout).strip().splitlines()[-5:])
            raise RuntimeError(f"pip install {' '.join(requirements)} failed:\n{tail}")
        for name in STRAY:
            shutil.rmtree(work / name, ignore_errors=True)
        (work / ".complete").write_text("\n".join(requirements) + "\n")
        try:
            work.rename(target)
        except OSError:  # a folder is there: another process's finished copy, or one unfinished
            if not done.exists():  # a finished copy is never removed: a process may import it
                shutil.rmtree(target, ignore_errors=True)
                with contextlib.suppress(OSError):  # another process moved its copy there first
                    work.rename(target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def activate(target: Path) -> None:
    """Make ``target``'s packages importable after eva's own (appended to ``sys.path``)."""
    if str(target) not in sys.path:
        sys.path.append(str(target))


def deactivate(target: Path) -> None:
    while str(target) in sys.path:
        sys.path.remove(str(target))

"""The creator installs into a trainer's environment without eva's pipeline: the ``eva-creator``
distribution (``creator/``) pulls numpy and pyarrow only, every module of ``eva_core`` imports
there, and pip resolves it beside verl 0.9.1's pins (transformers<5.11, which eva's pipeline
cannot share). Needs the package registry; skipped, with the reason, where pip cannot reach it."""

from __future__ import annotations

import json
import os
import subprocess
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE_MODULES = sorted(p.stem for p in (ROOT / "eva_core").glob("*.py") if p.stem != "__init__")


def _pip(python: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    return subprocess.run(
        [str(python), "-m", "pip", *args], capture_output=True, text=True, timeout=timeout,
        env=env,
    )  # fmt: skip


@pytest.fixture(scope="module")
def creator_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("creator-env")
    venv.create(where, with_pip=True)
    python = where / "bin" / "python"
    done = _pip(python, "install", "-q", str(ROOT / "creator"))
    if done.returncode != 0:
        if "No matching distribution" in done.stderr or "Could not fetch" in done.stderr:
            pytest.skip(f"pip cannot reach the package registry: {done.stderr.strip()[-200:]}")
        raise AssertionError(done.stderr)
    return python


def test_the_creator_environment_holds_numpy_and_pyarrow_only(creator_env: Path) -> None:
    listed = _pip(creator_env, "list", "--format=freeze").stdout.split()
    names = {line.split("==")[0].lower() for line in listed} - {"pip", "setuptools"}  # the venv's
    assert names == {"eva-creator", "numpy", "pyarrow"}


def test_every_eva_core_module_imports_there(creator_env: Path) -> None:
    assert "creator" in CORE_MODULES and len(CORE_MODULES) >= 10
    code = "; ".join(f"import eva_core.{m}" for m in CORE_MODULES) + "; import eva_adapters.common"
    done = subprocess.run(
        [str(creator_env), "-c", code], capture_output=True, text=True, cwd="/", timeout=120
    )
    assert done.returncode == 0, done.stderr


def test_it_resolves_beside_verl_0_9_1_and_its_transformers_pin(creator_env: Path) -> None:
    done = _pip(
        creator_env, "install", "--dry-run", "--quiet", "--report", "-", "--ignore-installed",
        str(ROOT / "creator"), "verl==0.9.1", "transformers>=5.5.3,<5.11", timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    chosen = {i["metadata"]["name"].lower(): i["metadata"]["version"]
              for i in json.loads(done.stdout)["install"]}  # fmt: skip
    assert chosen["verl"] == "0.9.1" and chosen["eva-creator"] == "0.1.0"
    assert (
        chosen["transformers"].startswith("5.") and int(chosen["transformers"].split(".")[1]) < 11
    )
    assert "prefect" not in chosen and "trl" not in chosen  # eva's pipeline is not pulled in

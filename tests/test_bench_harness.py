"""``eva bench run`` / ``report`` on tiny studies of the built-in world. Two arms, two seeds, one
iteration: killed (SIGKILL) once its first record is written and run again, the study ends with
the results file an uninterrupted run writes, and its report judges the claim from that file.
At equal generated responses, every arm's every iteration spends exactly the budget. And every
measure the ported studies read works on a tiny run of its source."""

from __future__ import annotations

import fnmatch
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.measures import declared
from bench.report import write_report
from bench.runner import Results, run_study
from bench.study_file import load_study
from eva_runtime.errors import ConfigError
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


def test_at_equal_responses_every_iteration_generates_the_budget(tmp_path: Path) -> None:
    """G = 2 x |X_0| x N = 2 x 24 x 4 = 192 an iteration: fresh samples 48 new prompts; eva
    with the previous creator samples X_0 again at iteration 1 (its run has no solver readings
    yet: X_1 of 24) and nothing at iteration 2, where X_2 takes the whole budget (48)."""
    base: dict[str, Any] = tiny_run_config("unused")
    del base["run"], base["root"]
    path = tmp_path / "matched.yaml"
    path.write_text(yaml.safe_dump({
        "name": "matched", "seeds": [0], "base": base, "equalise": {"responses": "auto"},
        "arms": [
            {"name": "base", "iterations": 0},
            {"name": "fresh", "start": "base", "source": "fresh", "iterations": 2},
            {"name": "eva", "start": "base", "iterations": 2,
             "overrides": {"creator_rollouts": "previous"}},
        ],
        "measures": ["heldout", "yield"],
    }))  # fmt: skip
    results = tmp_path / "r.jsonl"
    assert run_study(load_study(str(path)), str(tmp_path / "runs"), str(results), say=print)
    got = {(r["arm"], r["iteration"]): r for r in Results(str(results)).records}
    for arm in ("fresh", "eva"):
        assert [got[arm, t]["responses"] for t in (1, 2)] == [192, 192]
    assert [got["fresh", t]["prompts"] for t in (1, 2)] == [48, 48]
    assert [got["eva", t]["creator_responses"] for t in (1, 2)] == [96, 0]
    assert [got["eva", t]["prompts"] for t in (1, 2)] == [24, 48]


def test_a_fresh_arm_on_a_prompt_file_trains_on_its_next_rows_each_once(tmp_path: Path) -> None:
    """A study of one's own prompt file (bench/studies/own-model.yaml's shape), its prompts in
    a column of another name: X_0 is the file's first 12 rows, and at equal generated
    responses fresh trains on the next 24 in iteration 1 and the 24 after them in iteration 2
    (read as X_0 was), spending the budget each time."""
    from eva_world import world
    from tasks.store import RunStore

    prompts = world.sample_prompts(world.SEED_DISTRIBUTION, 60, seed=3)
    assert len(set(prompts)) == 60
    rows = tmp_path / "prompts.jsonl"
    rows.write_text("".join(json.dumps({"instruction": p}) + "\n" for p in prompts))
    base: dict[str, Any] = tiny_run_config("unused")
    del base["run"], base["root"]
    base["prompts"] = {"path": str(rows), "limit": 12, "prompt_column": "instruction"}
    path = tmp_path / "own.yaml"
    path.write_text(yaml.safe_dump({
        "name": "own", "seeds": [0], "base": base, "equalise": {"responses": "auto"},
        "arms": [{"name": "base", "iterations": 0},
                 {"name": "fresh", "start": "base", "source": "fresh", "iterations": 2}],
    }))  # fmt: skip
    results = tmp_path / "r.jsonl"
    assert run_study(load_study(str(path)), str(tmp_path / "runs"), str(results), say=print)
    store = RunStore(str(tmp_path / "runs" / "own"), "s0-fresh")

    def trained_on(t: int | None) -> list[str]:
        table = store.read_table(store.read_manifest(t, "prompts")["uri"])
        return table.column("prompt").to_pylist()

    assert trained_on(None) == prompts[:12]
    assert [trained_on(1), trained_on(2)] == [prompts[12:36], prompts[36:60]]
    got = {r["iteration"]: r for r in Results(str(results)).records if r["arm"] == "fresh"}
    assert [got[t]["responses"] for t in (1, 2)] == [2 * 12 * 4, 2 * 12 * 4]


def test_every_measure_reads_a_tiny_run_of_each_source(tmp_path: Path) -> None:
    """The measures the ported studies read (answer-blind's labels, selection's rho, the
    online segments, a held-apart set), each on a tiny run of its kind."""
    base: dict[str, Any] = tiny_run_config("unused")
    del base["run"], base["root"]
    verifier = {"kind": "python", "factory": "eva_world.components:WorldVerifier"}
    blind = {
        "annotate": {"max_unscored_share": 1.0, "reward": {
            "kind": "verifiable", "function": "eva_world.components:match",
            "answers": "${answers:base}", "agreement": 0.5}},
        "evaluate": {"reward": verifier},
    }  # fmt: skip
    online = {
        "prompts": {"path": "${prompts:base}", "limit": 12},
        "heldout": {"path": "${heldout:base}"},
        "online": {"budget": 1.0, "steps_per_segment": 6, "buffer": {"size": 8},
                   "solver": {"num_generations": 3, "prompts_per_step": 2, "learning_rate": 1e-3,
                              "max_completion_length": 8}},
    }  # fmt: skip
    path = tmp_path / "measures.yaml"
    path.write_text(yaml.safe_dump({
        "name": "measures", "seeds": [0], "base": base,
        "arms": [
            {"name": "base", "iterations": 0},
            {"name": "eva", "start": "base"},
            {"name": "blind", "start": "base", "overrides": blind},
            {"name": "online", "start": "base@theta_0", "source": "online", "overrides": online},
        ],
        "measures": ["heldout", "trained", "curriculum", "yield", "online", "rho", "labels"],
        "held_apart": [{"name": "skill", "distribution": {"categories": {"add": 1}},
                        "size": 20, "draw": 5, "pass_at": 3}],
    }))  # fmt: skip
    results = tmp_path / "r.jsonl"
    assert run_study(load_study(str(path)), str(tmp_path / "runs"), str(results), say=print)
    got = {(r["arm"], r["iteration"]): r for r in Results(str(results)).records}
    assert set(got) == {("base", None), ("base", 0), ("eva", 1), ("blind", 1), ("online", 1)}
    eva, blinded, seg = got["eva", 1], got["blind", 1], got["online", 1]
    assert eva["responses"] == 2 * 24 * 4 and eva["children"] > 0 and -1 <= eva["rho"] <= 1
    assert eva["categories"] and eva["difficulty"] > 0 and eva["creator_responses"] == 96
    # The blind arm's labels, recomputed from its rollouts, are the rewards it stored: X_1's
    # kept originals by their known answers, every child by its majority or dropped.
    labels = blinded["annotate"]
    assert labels["reproduced"] and labels["known"] == 5  # 20% of 24 kept
    assert labels["known"] + labels["majority"] + labels["dropped"] == 24
    assert [r["threshold"] for r in blinded["sweep"]] == ["1/4", "2/4", "3/4", "4/4"]
    assert seg["steps"] == 6 and seg["responses"] == seg["trained_prompts"] * 3 == 36
    offline = [r for r in got.values() if r["arm"] != "online"]
    assert all(0 <= r["skill"] <= 1 for r in offline) and "skill" not in seg
    assert 0 <= got["base", 0]["pass@3"] <= 1
    assert got["base", None]["skill_set"]["size"] == 20
    # Every figure recorded is one its measures declare (what a study file's claims are checked by).
    study = load_study(str(path))
    names = declared(study.measures, study.held_apart)
    recorded = {k for r in got.values() for k in r} - {"seed", "arm", "iteration"}
    undeclared = {k for k in recorded if not any(fnmatch.fnmatchcase(k, n) for n in names)}
    assert recorded and not undeclared, undeclared


def test_a_refusal_names_where_the_study_file_wrote_the_field(tmp_path: Path) -> None:
    """A field an arm's config refuses is one line naming the study's key (base.<field>,
    arms.<arm>.overrides.<field>), not the run config's: when the study is read (a starting
    checkpoint with no config.json) and when a run checks it (one whose config.json is not
    JSON), before any record is written."""
    empty, broken = tmp_path / "empty", tmp_path / "broken"
    empty.mkdir()
    broken.mkdir()
    (broken / "config.json").write_text("{")
    study = yaml.safe_load(Path(tiny_study(tmp_path)).read_text())
    results = tmp_path / "r.jsonl"
    for where in ("base", "arms.fresh.overrides"):
        for checkpoint, said in (
            (empty, f"no checkpoint at '{empty}' (expected a directory with config.json)"),
            (broken, f"{broken}: no readable config.json (JSONDecodeError)"),
        ):
            start = {"bootstrap": {"init_checkpoint": str(checkpoint), "builder": None}}
            fresh = {"name": "fresh", "source": "fresh", "overrides": start}
            change = {"base": {**study["base"], **start}} if where == "base" else {"arms": [fresh]}
            path = tmp_path / "bad.yaml"
            path.write_text(yaml.safe_dump({**study, "claims": [], **change}))
            with pytest.raises(ConfigError) as caught:
                run_study(load_study(str(path)), str(tmp_path / "runs"), str(results), say=print)
            assert caught.value.field == f"{where}.bootstrap.init_checkpoint"
            assert caught.value.line().startswith(f"{where}.bootstrap.init_checkpoint: {said}")
    assert not results.exists()

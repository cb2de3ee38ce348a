"""Whole runs on the built-in world: resume, rerun one stage, kill -9, bad input."""

from __future__ import annotations

import asyncio
import glob
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from eva_world import world
from flows.cli import main
from flows.config import load_config, validate_config
from tasks.store import RunStore
from tests.conftest import tiny_run_config

pytestmark = pytest.mark.usefixtures("prefect_api")

SOLVER = ("generate", "annotate", "pairs", "train", "evaluate")
CREATOR = ("creator_generate", "creator_annotate", "score", "sample", "evolve", "mix", "complexity")
SETUP = ("prompts", "heldout", "bootstrap", "evaluate")


def mix_ids(store: RunStore) -> list[str]:
    return store.read_table(store.read_manifest(1, "mix")["uri"]).column("prompt_id").to_pylist()


def _manifests(store: RunStore) -> dict[tuple, dict]:
    """Every manifest of a run, by (iteration, artifact): what the run made, read from it."""
    return {
        (t, artifact): store.read_manifest(t, artifact)
        for t in (None, *store.iterations())
        for artifact in store.artifacts(t)
    }


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    from flows.run import eva_run

    root = str(tmp_path_factory.mktemp("runs"))
    config = validate_config(tiny_run_config(root, run="base"))
    rows = eva_run(config)
    return config, rows


def test_run_produces_every_artifact_and_summary(finished_run) -> None:
    config, rows = finished_run
    store = RunStore(config.root, config.run)
    manifests = _manifests(store)
    expected = {(None, s) for s in SETUP} | {(0, s) for s in SOLVER}
    assert set(manifests) == expected | {(1, s) for s in (*CREATOR, *SOLVER)}
    assert [r["iteration"] for r in rows] == ["theta_0", 0, 1]
    assert rows[2]["prompts"] == 24 and rows[2]["evolved_kept"] == round(0.8 * 24)
    assert all(0.0 <= r["heldout_score"] <= 1.0 for r in rows)
    # The win rate against theta_0's held-out answers, recomputed by hand from both tables.
    ref = store.read_table(store.read_manifest(None, "evaluate")["uri"]).to_pylist()
    cur = store.read_table(store.read_manifest(1, "evaluate")["uri"]).to_pylist()
    theirs = {r["prompt_id"]: r["reward"] for r in ref}
    wins = [(r["reward"] > theirs[r["prompt_id"]]) + 0.5 * (r["reward"] == theirs[r["prompt_id"]])
            for r in cur]  # fmt: skip
    assert rows[2]["win_vs_theta_0"] == round(sum(wins) / len(wins), 4)
    # Answers changed against the checkpoint before (iteration 0's for 1, theta_0's for 0).
    prev = store.read_table(store.read_manifest(0, "evaluate")["uri"]).to_pylist()
    before = {r["prompt_id"]: r["response"] for r in prev}
    changed = sum(r["response"] != before[r["prompt_id"]] for r in cur) / len(cur)
    assert rows[2]["answers_changed"] == round(changed, 4)
    assert rows[0].get("answers_changed") is None and rows[1]["answers_changed"] is not None
    # Every chart of the run is drawn from its artifacts.
    from flows.run_charts import run_charts

    charts = run_charts(store, config, rows)
    assert charts.count("](data:image/svg+xml;base64,") == 8 and "nothing to draw" not in charts
    # X_1's complexity (the world's difficulty) is charted; it matches the prompts it scored.
    scored = store.read_table(store.read_manifest(1, "complexity")["uri"])
    assert scored.column("prompt_id").to_pylist() == mix_ids(store)
    assert rows[2]["complexity"] == pytest.approx(
        sum(map(world.difficulty, scored.column("prompt").to_pylist())) / 24, abs=1e-3
    )
    mix = store.read_table(manifests[(1, "mix")]["uri"])
    evolved = [r for r in mix.to_pylist() if r["source"] == "evolved"]
    assert evolved and all(
        r["iteration"] == 1 and r["depth"] >= 1 and r["parent_id"] for r in evolved
    )
    assert os.path.isfile(os.path.join(config.root, "base", "iter_1", "model", "config.json"))
    # theta_1 differs from theta_0: training happened and was published.
    assert manifests[(1, "train")]["content_hash"] != manifests[(0, "train")]["content_hash"]


def test_second_launch_reuses_every_stage(finished_run) -> None:
    from flows.run import eva_run

    config, rows = finished_run
    store = RunStore(config.root, config.run)
    before = _manifests(store)
    started = time.perf_counter()
    again = eva_run(config)
    assert again == rows
    after = _manifests(store)
    assert {k: m["created_at"] for k, m in after.items()} == {
        k: m["created_at"] for k, m in before.items()
    }
    assert time.perf_counter() - started < 60
    # What the UI shows: the relaunch's stage runs are Cached in Prefect's own API.
    states = asyncio.run(_task_run_states(config.run))
    assert states.count("Cached") >= len(before) and "Failed" not in states


async def _task_run_states(run: str) -> list[str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterName,
        TaskRunFilter,
        TaskRunFilterFlowRunId,
    )

    async with get_client() as client:
        assert await client.read_flow_runs()  # no limit: the call the fastapi pin protects
        # The API pages (200 by default) and the suite shares it: ask for this run's flow runs.
        # The launch is named "{run} @{start time}", its iterations "{run}-iter-{t}".
        named = FlowRunFilter(name=FlowRunFilterName(like_=run))
        flow_runs = await client.read_flow_runs(flow_run_filter=named)
        ids = [f.id for f in flow_runs if f.name.startswith((f"{run} @", f"{run}-iter-"))]
        task_runs = await client.read_task_runs(
            task_run_filter=TaskRunFilter(flow_run_id=TaskRunFilterFlowRunId(any_=ids))
        )
    return [t.state.name for t in task_runs if t.state]


def _rerun_evolve(root: str, *extra: str) -> int:
    return main(
        ["stage", "evolve", "--run", "base", "--root", root, "--iteration", "1", "--force", *extra]
    )


def test_stage_rerun_touches_only_that_stage_then_downstream(finished_run, capsys) -> None:
    config, _ = finished_run
    store = RunStore(config.root, config.run)
    before = _manifests(store)
    time.sleep(1.1)  # created_at has one-second resolution
    assert _rerun_evolve(config.root) == 0
    after = _manifests(store)
    changed = {k for k in after if after[k]["created_at"] != before[k]["created_at"]}
    assert changed == {(1, "evolve")}
    # Deterministic: the forced rerun reproduces the same prompts.
    assert after[(1, "evolve")]["content_hash"] == before[(1, "evolve")]["content_hash"]

    time.sleep(1.1)
    assert _rerun_evolve(config.root, "--downstream") == 0
    again = _manifests(store)
    changed = {k for k in again if again[k]["created_at"] != after[k]["created_at"]}
    assert changed == {(1, s) for s in ("evolve", "mix", "complexity", *SOLVER)}


def test_edited_eva_code_keeps_a_finished_run_cached(finished_run, tmp_path) -> None:
    """Keys follow declared versions, not code text: with a comment line appended to every
    module of eva and a string of its UI changed (as an upgrade of eva would), relaunching a
    finished run from that copy of eva reruns nothing."""
    import shutil

    config, _ = finished_run
    store = RunStore(config.root, config.run)
    before = _manifests(store)
    project = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    copy = tmp_path / "eva"
    for package in ("eva_core", "tasks", "flows", "eva_runtime", "eva_world"):
        shutil.copytree(
            os.path.join(project, package),
            copy / package,
            ignore=shutil.ignore_patterns("__pycache__"),
        )
    for module in copy.rglob("*.py"):
        module.write_text(module.read_text() + "\n# edited after the run finished\n")
    ui = copy / "eva_runtime" / "prefect_ui.py"
    assert "### {artifact}" in ui.read_text()
    ui.write_text(ui.read_text().replace("### {artifact}", "#### stage {artifact}"))
    (tmp_path / "run.json").write_text(config.model_dump_json())
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "PYTHONPATH": str(copy), "PREFECT_API_URL": str(PREFECT_API_URL.value())}
    code = (
        "import flows.cli, sys; print(flows.cli.__file__); sys.exit(flows.cli.main(sys.argv[1:]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "run", "--config", str(tmp_path / "run.json")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith(str(copy / "flows" / "cli.py"))  # the edited copy ran
    after = _manifests(store)
    assert {k: m["created_at"] for k, m in after.items()} == {
        k: m["created_at"] for k, m in before.items()
    }


def test_a_version_bump_reruns_that_stage_and_what_reads_its_new_output(
    finished_run, tmp_path, monkeypatch
) -> None:
    """A stage whose code changed what it writes declares a new version: its artifact is
    recomputed, and so is everything that reads the new output; the rest is reused."""
    import dataclasses
    import shutil

    import numpy as np

    import tasks.sample
    from flows.run import eva_run

    config, _ = finished_run
    shutil.copytree(os.path.join(config.root, config.run), tmp_path / config.run)
    copied = config.model_copy(update={"root": str(tmp_path)})
    store = RunStore(copied.root, copied.run)
    before = _manifests(store)
    original = tasks.sample.select_subset

    def reversed_subset(*args, **kwargs):  # the "new code": the same draw, in reverse order
        subset = original(*args, **kwargs)
        return dataclasses.replace(subset, indices=np.asarray(subset.indices)[::-1])

    monkeypatch.setattr(tasks.sample, "select_subset", reversed_subset)
    bumped = tasks.sample.sample.version + 1
    monkeypatch.setattr(tasks.sample.sample, "version", bumped)
    time.sleep(1.1)
    eva_run(copied)
    after = _manifests(store)
    changed = {k for k in after if after[k]["created_at"] != before[k]["created_at"]}
    assert changed == {(1, s) for s in ("sample", "evolve", "mix", "complexity", *SOLVER)}
    assert after[(1, "sample")]["version"] == bumped


def test_downstream_follows_what_reads_a_stage_not_the_order(finished_run) -> None:
    """Nothing reads complexity (it charts X_t): rerunning it with --downstream reruns it alone,
    though generate, annotate, pairs and train come after it in the flow."""
    config, _ = finished_run
    store = RunStore(config.root, config.run)
    before = _manifests(store)
    time.sleep(1.1)
    args = ["--run", "base", "--root", config.root, "--iteration", "1", "--force", "--downstream"]
    assert main(["stage", "complexity", *args]) == 0
    after = _manifests(store)
    assert {k for k in after if after[k]["created_at"] != before[k]["created_at"]} == {
        (1, "complexity")
    }


def test_a_copied_run_is_shown_and_rerun_where_it_is_without_touching_the_original(
    finished_run, tmp_path, capsys
) -> None:
    import shutil

    config, rows = finished_run
    original = RunStore(config.root, config.run)
    copy_root = str(tmp_path / "elsewhere")
    shutil.copytree(original.base, os.path.join(copy_root, "base"))
    assert original.read_manifest(1, "evolve")["uri"] == "iter_1/evolve.parquet"  # relative
    assert original.read_manifest(1, "train")["model_uri"] == "iter_1/model"
    before = original.read_manifest(1, "evolve")["created_at"]
    time.sleep(1.1)
    assert _rerun_evolve(copy_root) == 0
    copy = RunStore(copy_root, "base")
    assert copy.read_manifest(1, "evolve")["created_at"] != before
    assert original.read_manifest(1, "evolve")["created_at"] == before
    capsys.readouterr()
    assert main(["show", "--run", "base", "--root", copy_root]) == 0
    assert f"{rows[-1]['heldout_score']:.3f}" in capsys.readouterr().out


def test_a_forced_bootstrap_that_reproduces_theta_0_reruns_nothing_downstream(
    finished_run,
) -> None:
    from flows.run import eva_run

    config, rows = finished_run
    store = RunStore(config.root, config.run)
    before = _manifests(store)
    boot = store.read_manifest(None, "bootstrap")
    time.sleep(1.1)  # created_at has one-second resolution
    args = ["stage", "bootstrap", "--run", "base", "--root", config.root, "--iteration", "setup"]
    assert main([*args, "--force"]) == 0
    again = store.read_manifest(None, "bootstrap")
    assert again["created_at"] != boot["created_at"]  # it did run again
    assert again["content_hash"] == boot["content_hash"]  # no wall-clock time in the table
    assert eva_run(config) == rows
    after = _manifests(store)
    downstream = [k for k in after if k != (None, "bootstrap")]
    assert [after[k]["created_at"] for k in downstream] == [
        before[k]["created_at"] for k in downstream
    ]


def test_sweep_removes_staging_copies_and_scratch_only(tmp_path) -> None:
    store = RunStore(str(tmp_path), "r")
    for name in ("iter_0/model.tmp-1a2b", "iter_0/train.manifest.json.tmp-3c4d"):
        os.makedirs(os.path.dirname(os.path.join(store.base, name)), exist_ok=True)
        open(os.path.join(store.base, name), "w").close()
    os.makedirs(os.path.join(store.base, "iter_0", "model"))
    os.makedirs(os.path.join(store.scratch_dir(), "train-xyz", "model"))
    removed = store.sweep()
    assert len(removed) == 3
    assert sorted(os.listdir(os.path.join(store.base, "iter_0"))) == ["model"]
    assert os.listdir(store.scratch_dir()) == []


def test_a_stage_that_does_not_run_there_is_refused(finished_run, capsys) -> None:
    config, _ = finished_run
    args = ["stage", "evolve", "--run", "base", "--root", config.root, "--iteration", "setup"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("eva: error: evolve does not run in setup of base (it runs prompts, ")
    assert "\n" not in err
    # A typo gets the artifact it most likely meant.
    args = ["stage", "evolv", "--run", "base", "--root", config.root, "--iteration", "1"]
    assert main(args) == 2
    assert capsys.readouterr().err.strip().endswith("(did you mean evolve?)")
    # Misuse of the command line is one line too, with the same exit code.
    assert main(["show", "--run", "base", "--root", config.root, "--rows", "-1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("eva: error: argument --rows: must be >= 0") and "\n" not in err
    assert main(["show", "--run", "base", "--root", __file__]) == 2  # a file, not a root
    assert capsys.readouterr().err.startswith("eva: error: --root ")
    assert main(["show", "--run", "../base", "--root", config.root]) == 2
    assert "a run name (letters, digits" in capsys.readouterr().err


def test_show_of_an_iteration_lists_what_it_holds_in_call_order(finished_run, capsys) -> None:
    config, _ = finished_run
    store = RunStore(config.root, config.run)
    assert main(["show", "--run", "base", "--root", config.root, "--iteration", "1"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "iteration 1 of base: add --stage NAME for an artifact's rows"
    names = [line.split()[0] for line in lines[1:]]
    assert names == [a for a in (*CREATOR, *SOLVER) if a in names] and set(names) == set(
        store.artifacts(1)
    )
    pairs = store.read_manifest(1, "pairs")
    assert lines[1 + names.index("pairs")].split()[1] == str(pairs["rows"])
    # An iteration the run does not have is refused as `eva stage` refuses it, not ignored.
    assert main(["show", "--run", "base", "--root", config.root, "--iteration", "7"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("eva: error: --iteration 7: run base has iterations 0 to 1")


def _cli(config_path: str, run: str) -> list[str]:
    return [sys.executable, "-m", "flows.cli", "run", "--config", config_path, "--run", run]


def test_kill_9_mid_run_resumes_to_identical_artifacts(tmp_path, finished_run) -> None:
    base_config, _ = finished_run
    cfg = tiny_run_config(base_config.root, run="killed")
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    store = RunStore(base_config.root, "killed")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    log = tmp_path / "first-launch.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            _cli(str(path), "killed"),
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    # Kill as soon as iteration 1's score is done: mid-creator step.
    deadline = time.time() + 600
    while store.read_manifest(1, "score") is None and proc.poll() is None:
        assert time.time() < deadline
        time.sleep(0.2)
    assert proc.poll() is None, f"the first launch ended early:\n{log.read_text()[-3000:]}"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done_before = {k for k, m in _manifests(store).items() if m}
    assert (1, "score") in done_before and (1, "train") not in done_before
    created = {k: store.read_manifest(*k)["created_at"] for k in done_before}

    result = subprocess.run(_cli(str(path), "killed"), env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    for key, stamp in created.items():  # nothing that had finished ran again
        assert store.read_manifest(*key)["created_at"] == stamp, key
    # What the kill left (staging copies, stage scratch) was swept by the relaunch.
    assert not glob.glob(os.path.join(store.base, "*", "*.tmp-*"))
    assert os.listdir(os.path.join(store.base, ".scratch")) == []
    base = RunStore(base_config.root, "base")
    for t, stage in [(1, "mix"), (0, "pairs"), (1, "pairs")]:
        assert (
            store.read_manifest(t, stage)["content_hash"]
            == base.read_manifest(t, stage)["content_hash"]
        ), (t, stage)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "score.metric=a_max"], "score.metric: Input should be 'a_min'"),
        (
            ["--set", "sample.fraction=1.5"],
            "sample.fraction: Input should be less than or equal to 1",
        ),
        (
            ["--set", "bootstrap.init_checkpoint=/nope"],
            "bootstrap.init_checkpoint: no checkpoint at",
        ),
        (["--set", "prompts.path=NOPROMPT"], "prompts.path: "),
        (["--set", "prompts.path=EMPTY"], "row 1: prompt is empty"),
    ],
)
def test_bad_input_one_line_error_and_nothing_written(tmp_path, capsys, args, message) -> None:
    no_prompt = tmp_path / "q.jsonl"
    no_prompt.write_text(json.dumps({"question": "hi"}) + "\n")
    empty = tmp_path / "e.jsonl"
    empty.write_text(json.dumps({"prompt": "hi"}) + "\n" + json.dumps({"prompt": "  "}) + "\n")
    args = [a.replace("NOPROMPT", str(no_prompt)).replace("EMPTY", str(empty)) for a in args]
    root = tmp_path / "runs"
    assert main(["run", "--root", str(root), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("eva: error: ") and message in err and "\n" not in err, err
    if "NOPROMPT" in " ".join(args) or "q.jsonl" in " ".join(args):
        assert "no column 'prompt'" in err
    assert not root.exists()


def _bad_files(tmp_path, policy_dir: str) -> dict[str, str]:
    """Files a new user might point eva at by mistake, by placeholder name."""
    files = {
        "HEADERONLY": ("h.csv", b"prompt,category\n"),
        "EMPTY": ("e.jsonl", b""),
        "INTPROMPTS": ("i.jsonl", b'{"prompt": 5}\n'),
        "LATIN1": ("l.jsonl", '{"prompt": "caf\u00e9"}\n'.encode("latin-1")),
        "BROKENJSON": ("b.jsonl", b'{"prompt": \n'),
        "YAMLERROR": ("y.yaml", b"seed: [1,\n"),
        "YAMLLATIN": ("ly.yaml", "run: caf\u00e9\n".encode("latin-1")),
        "LONGPROMPT": ("long.jsonl", json.dumps({"prompt": "1" * 60}).encode() + b"\n"),
        "INTARRAY": ("ints.json", b"[1, 2, 3]"),
        "COLUMNS": ("cols.json", b'{"prompt": ["1+2=", "2+3="]}'),
        "EXTENDSINT": ("ext.yaml", b"extends: 5\n"),
        "EXTENDSMISSING": ("extm.yaml", b"extends: nowhere.yaml\n"),
    }
    no_weights = tmp_path / "noweights"
    no_weights.mkdir()
    (no_weights / "config.json").write_text("{}")
    own = os.path.join(os.path.dirname(os.path.dirname(__file__)), "configs", "own-model.yaml")
    highlights = {
        "prompt": "Describe rain.",
        "kwargs": [{"num_highlights": -3}],
        "instruction_id_list": ["detectable_format:number_highlighted_sections"],
    }
    (tmp_path / "neg.jsonl").write_text(json.dumps(highlights) + "\n")
    out = {
        "SMOLLM2": os.path.join(os.path.dirname(own), "smollm2-if.yaml"),
        "NEGATIVEHIGHLIGHTS": str(tmp_path / "neg.jsonl"),
        "DIRECTORY": str(tmp_path),
        "POLICY": policy_dir,
        "NOWEIGHTS": str(no_weights),
        "OWNMODEL": own,
    }
    for key, (name, data) in files.items():
        (tmp_path / name).write_bytes(data)
        out[key] = str(tmp_path / name)
    return out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "prompts.path=HEADERONLY"], "h.csv: no prompts (0 rows)"),
        (["--set", "prompts.path=EMPTY"], "e.jsonl: no prompts (0 rows)"),
        (["--set", "generate.n=1"], "generate.n: Input should be greater than or equal to 2"),
        (["--set", "prompts.path=DIRECTORY"], "is a directory, not a prompt file"),
        (["--set", "prompts.path=INTPROMPTS"], "row 0: prompt is not text (got int 5)"),
        (["--set", "prompts.path=LATIN1"], "l.jsonl: not UTF-8 text"),
        (["--set", "prompts.path=BROKENJSON"], "b.jsonl: cannot be read as jsonl"),
        (["--config", "DIRECTORY"], "is a directory, not a YAML/JSON file"),
        (["--config", "YAMLERROR"], "y.yaml: line 2, column 1:"),
        (["--config", "YAMLLATIN"], "ly.yaml: not UTF-8 text"),
        (["--root", "/proc/eva"], "root: cannot write under /proc/eva"),  # the last --root wins
        (  # the world config refuses prompts its components cannot handle
            ["--set", "prompts.path=LONGPROMPT", "--set", "bootstrap.init_checkpoint=POLICY"],
            "long.jsonl: row 0 ('111111111111111111111111111111111111111111111111111111111111')"
            " is not a prompt of the built-in world",
        ),
        (  # your own model: prompts that do not fit its context
            [
                "--config",
                "OWNMODEL",
                "--set",
                "prompts.path=LONGPROMPT",
                "--set",
                "heldout.path=LONGPROMPT",
                "--set",
                "bootstrap.init_checkpoint=POLICY",
                "--set",
                "annotate.reward.model=POLICY",  # local: the Hub's reward model is not cached
                "--set",
                "generate.backend.max_new_tokens=10",
            ],
            "prompt row 0 has 60 tokens; with max_new_tokens 10 it exceeds the model's 64",
        ),
        # Found by a corpus of 156 bad inputs (2026-11-22): each used to pass or crash.
        (["--set", "prompts.path=INTARRAY"], "ints.json: row 0: expected an object or a string"),
        (["--set", "prompts.path=COLUMNS"], "cols.json: a JSON file must hold an array"),
        (["--set", "prompts.path="], "--set 'prompts.path=': empty value"),
        (["--set", "sample.fraction=[0.5"], "--set 'sample.fraction=[0.5':"),
        (["--config", "EXTENDSINT"], "ext.yaml: extends: expected a file name (got 5)"),
        (["--config", "EXTENDSMISSING"], "extm.yaml: extends: no file at"),
        (["--set", "bootstrap.init_checkpoint=NOWEIGHTS"], "noweights: no weights"),
        (["--set", "generate.backend.device=banana"], "unknown device 'banana'"),
        (["--set", "train.solver.optim=bogus"], "unknown optimizer 'bogus'"),
        (["--set", "train.solver.lr_scheduler_type=bogus"], "unknown scheduler 'bogus'"),
        (
            ["--set", "train.launcher=accelerate", "--set", "train.accelerate_config=/nope.yaml"],
            "train.accelerate_config: no file at '/nope.yaml'",
        ),
        (
            [
                "--set",
                "annotate.reward.kind=sequence_classifier",
                "--set",
                "annotate.reward.model=/nope-rm",
            ],
            "no checkpoint at '/nope-rm'",
        ),
        (
            [
                "--set",
                "generate.backend.kind=openai",
                "--set",
                "generate.backend.llm.api_key_env=EVA_TEST_UNSET_KEY",
            ],
            "generate.backend.llm.api_key_env: environment variable EVA_TEST_UNSET_KEY is unset",
        ),
        (["--seed", "abc"], "argument --seed: invalid int value: 'abc'"),
        # The key a user would type back, not pydantic's path through the union's tag.
        (["--set", "generate.backend.batch_size=0"], "generate.backend.batch_size: Input should"),
        # Found by trying bad inputs on issue 49's surfaces: a boolean is not a number, in any
        # section, a component's fields included.
        (
            ["--set", "train.solver.learning_rate=true"],
            "train.solver.learning_rate: true is a boolean, not a number",
        ),
        (["--set", "sample.temperature=yes"], "sample.temperature: true is a boolean, not a"),
        (
            ["--set", "generate.backend.temperature=false"],
            "generate.backend.temperature: false is a boolean",
        ),
        (["--run", "r" * 300], "run: 300 characters: at most 128"),
        (["--set", "prompts.path=/" + "p" * 100_000 + ".jsonl"], "...[99"),
        (
            ["--set", "prompts.path=NEGATIVEHIGHLIGHTS", "--config", "SMOLLM2"],
            "its checker does not take num_highlights -3",
        ),
    ],
)
def test_more_bad_input_is_one_line_and_writes_nothing(
    tmp_path, capsys, policy_dir, args, message
) -> None:
    files = _bad_files(tmp_path, policy_dir)
    args = [next((a.replace(k, v) for k, v in files.items() if k in a), a) for a in args]
    root = tmp_path / "runs"
    assert main(["run", "--root", str(root), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("eva: error: ") and message in err and "\n" not in err, err
    assert len(err) < 1000  # an echoed value is shortened, once
    assert not root.exists()


def test_eva_evaluate_scores_a_runs_checkpoints_on_another_heldout_set(
    finished_run, tmp_path, capsys
) -> None:
    import shutil

    config, _ = finished_run
    shutil.copytree(os.path.join(config.root, config.run), tmp_path / "copy")
    # As launched from another folder with relative prompt files: evaluate reads neither.
    stored = json.loads((tmp_path / "copy" / "config.json").read_text())
    for field, path in (("prompts", "data/p.jsonl"), ("heldout", "data/h.jsonl")):
        stored[field] = {**stored[field], "source": None, "path": path}
    (tmp_path / "copy" / "config.json").write_text(json.dumps(stored))
    heldout = tmp_path / "more.jsonl"
    heldout.write_text("".join(json.dumps({"prompt": p}) + "\n"
                               for p in ("3+4=", "12+5=", "r:abc=", "7+7=")))  # fmt: skip
    args = ["evaluate", "--run", "copy", "--root", str(tmp_path), "--heldout", str(heldout)]
    assert main(args) == 0
    out = capsys.readouterr().out
    table = [line for line in out.splitlines() if line.startswith("| ")]
    assert [line.split(" | ")[0] for line in table[1:]] == ["| theta_0", "| 0", "| 1"]
    store = RunStore(str(tmp_path), "copy")
    made = {t: store.read_manifest(t, "evaluate_heldout2") for t in (None, 0, 1)}
    assert all(m["rows"] == 4 and m["stats"]["unscored"] == 0 for m in made.values())
    assert store.read_manifest(None, "heldout_heldout2")["rows"] == 4
    # The world's reward scored them; the table's score is the stage's own.
    assert f"| 1 | {made[1]['stats']['score']:.3f} |" in out
    # Again, one checkpoint: reused, nothing made anew.
    assert main([*args, "--iteration", "1"]) == 0
    assert store.read_manifest(1, "evaluate_heldout2") == made[1]
    capsys.readouterr()
    for bad, says in (
        (["--iteration", "7"], "--iteration 7: run copy has iterations 0 to 1"),
        (["--set", "evaluate.nope=1"], "evaluate.nope: not a field of this section"),
        (["--set", "heldout.limit=0"], "heldout.limit: Input should be greater than or equal to 1"),
    ):
        assert main([*args, *bad]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("eva: error: ") and says in err and "\n" not in err, err
    assert main([*args[:-1], str(tmp_path / "none.jsonl")]) == 2
    assert "no file at" in capsys.readouterr().err


def test_prompt_files_as_json_arrays_are_read(tmp_path) -> None:
    from tasks.prompts import PromptsConfig, read_prompts

    (tmp_path / "s.json").write_text(json.dumps(["1+2=", "r:ab="]))
    (tmp_path / "o.json").write_text(json.dumps([{"prompt": "1+2=", "category": "add"}]))
    strings = read_prompts(PromptsConfig(path=str(tmp_path / "s.json")))
    objects = read_prompts(PromptsConfig(path=str(tmp_path / "o.json")))
    assert strings.column("prompt").to_pylist() == ["1+2=", "r:ab="]
    assert objects.column("category").to_pylist() == ["add"]


def test_show_prints_summary_and_stage_rows(finished_run, capsys) -> None:
    config, _ = finished_run
    assert main(["show", "--run", "base", "--root", config.root]) == 0
    out = capsys.readouterr().out
    assert "heldout_score" in out and "theta_0" in out
    args = ["--iteration", "1", "--stage", "evolve", "--rows", "2"]
    assert main(["show", "--run", "base", "--root", config.root, *args]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    rows = [json.loads(line) for line in lines[-2:]]
    assert all(r["source"] == "evolved" and r["parent_id"] for r in rows)


def test_deployment_spec_is_a_valid_run() -> None:
    root = os.path.join(os.path.dirname(__file__), "..", "infra", "prefect.yaml")
    with open(root) as f:
        spec = yaml.safe_load(f)
    (deployment,) = spec["deployments"]
    assert deployment["entrypoint"] == "flows/run.py:eva_run"
    from flows.serve import deployment_config

    resolved = validate_config(deployment_config(root, deployment["parameters"]))
    assert resolved.run == "scheduled" and deployment["parameters"]["advance"] == 1
    # The deployment runs the world demo, not bare paper defaults (a 9B model's solver).
    world = load_config(None)
    assert resolved.train == world.train and resolved.generate == world.generate
    assert deployment["schedules"][0]["active"] is False  # off until a user enables it


def test_subset_strategy_and_reused_rollouts(tmp_path) -> None:
    from flows.run import eva_run

    root = str(tmp_path)
    # No evolving, informativeness from the last solver step's rollouts: X_1 is the subset,
    # and the creator generates nothing.
    cfg = validate_config(
        tiny_run_config(root, run="sub", prompt_strategy="subset", creator_rollouts="previous")
    )
    eva_run(cfg)
    store = RunStore(root, "sub")
    assert store.read_manifest(1, "creator_generate") is None
    assert store.read_manifest(1, "evolve") is None
    score_inputs = store.read_manifest(1, "score")["inputs"]
    assert score_inputs["annotated"]["uri"].endswith("iter_0/annotate.parquet")
    subset = store.read_table(store.read_manifest(1, "sample")["uri"])
    rollouts = store.read_table(store.read_manifest(1, "generate")["uri"])
    assert rollouts.column("prompt_id").to_pylist() == subset.column("prompt_id").to_pylist()
    assert rollouts.num_rows == 6  # 25% of 24


def test_predicted_creator_scores_from_the_solver_history(tmp_path) -> None:
    import numpy as np

    from eva_core.informativeness import informativeness, reward_matrix
    from flows.run import eva_run

    root = str(tmp_path)
    cfg = validate_config(
        tiny_run_config(
            root, run="pred", iterations=2, creator_rollouts="predicted", predict={"min_pairs": 2}
        )
    )
    eva_run(cfg)
    store = RunStore(root, "pred")
    for t in (1, 2):
        assert store.read_manifest(t, "creator_generate") is None
    first, second = store.read_manifest(1, "score"), store.read_manifest(2, "score")
    assert first["stage"] == second["stage"] == "predict"
    # Iteration 1: one reading (iteration 0's solver rollouts), rho at its prior, and every
    # prompt at m + rho (y - m) of its a_min reading.
    assert first["inputs"]["recent"] == first["inputs"]["older"]
    assert first["inputs"]["recent"]["uri"].endswith("iter_0/annotate.parquet")
    assert first["stats"]["rho"] == 0.8 and not first["stats"]["rho_measured"]
    rollouts = store.read_table(first["inputs"]["recent"]["uri"])
    y = informativeness(reward_matrix(rollouts.column("rewards")), "a_min")
    predicted = store.read_table(first["uri"])
    expected = np.maximum(y.mean() + 0.8 * (y - y.mean()), 0.0)
    assert np.allclose(predicted.column("informativeness").to_numpy(), expected)
    assert set(predicted.column("estimate").to_pylist()) == {"history"}
    # Iteration 2: the originals X_1 kept from X_0 were read by both solver steps.
    assert second["inputs"]["recent"]["uri"].endswith("iter_1/annotate.parquet")
    assert second["inputs"]["older"]["uri"].endswith("iter_0/annotate.parquet")
    assert second["stats"]["read_twice"] > 0
    assert store.read_manifest(2, "evaluate") is not None


def test_a_dead_evolver_fails_the_run_and_is_retried_once_it_answers(
    tmp_path, capsys, monkeypatch
) -> None:
    """An evolver endpoint where nothing listens used to keep 0 of N prompts, exit 0 and be
    cached as done; now evolve fails without a manifest, naming the endpoint, and the same
    command succeeds once the endpoint answers. An unset API key variable stops it in one line
    before any request."""
    import socket

    import numpy as np

    from eva_world import world
    from tests.support.openai_server import OpenAICompatibleServer
    from tests.test_backend_evolve_paper import _GIVEN

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    cfg = tiny_run_config(str(tmp_path), run="dead")
    cfg["evolve"] = {
        "evolver": {
            "kind": "paper",
            "llm": {"base_url": url, "model": "tiny", "timeout_s": 2, "max_retries": 0},
            "scorer": "length",
        }
    }
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    store = RunStore(str(tmp_path), "dead")
    assert main(["run", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    # Nothing listens: the client's circuit breaker stops the stage after a few requests,
    # naming the endpoint (a live endpoint that rejects rewrites hits max_failed_share instead).
    assert err.startswith("eva: error: evolve of iter_1 failed: llm.base_url: ")
    assert url in err and "is down" in err
    assert store.read_manifest(1, "sample") is not None
    assert store.read_manifest(1, "evolve") is None

    monkeypatch.delenv("EVA_TEST_UNSET_KEY", raising=False)
    keyed = tmp_path / "keyed.yaml"
    cfg["evolve"]["evolver"]["llm"]["api_key_env"] = "EVA_TEST_UNSET_KEY"
    keyed.write_text(yaml.safe_dump(cfg))
    assert main(["run", "--config", str(keyed)]) == 2
    # Refused at the edge, in one line naming the field: nothing of the run is touched.
    err = capsys.readouterr().err.strip()
    assert (
        err.startswith(
            "eva: error: evolve.evolver.llm.api_key_env: environment variable EVA_TEST_UNSET_KEY"
        )
        and "\n" not in err
    )
    assert store.read_manifest(1, "evolve") is None

    def deepen(prompt: str, index: int, request: dict) -> str:
        given = _GIVEN.search(prompt).group(1).strip()  # type: ignore[union-attr]
        return world.evolve(given, "deepen_digits", np.random.default_rng(index)) or given

    with OpenAICompatibleServer(deepen, port=port):
        assert main(["run", "--config", str(path)]) == 0
    evolved = store.read_manifest(1, "evolve")
    assert evolved["stats"]["kept"] > 0 and evolved["stats"]["parents_without_rewrite"] == 0


def test_a_solver_of_your_own_trains_the_run(tmp_path, monkeypatch) -> None:
    """``train.solver: {kind: python}`` through ``eva run``: the user's module, written here,
    makes iteration 0's checkpoint; editing it reruns train and what reads its checkpoint."""
    from tests.test_own_solver import NUDGE

    (tmp_path / "code").mkdir()
    module = tmp_path / "code" / "eva_e2e_nudge.py"
    module.write_text(NUDGE)
    monkeypatch.syspath_prepend(str(tmp_path / "code"))
    solver = {"kind": "python", "factory": "eva_e2e_nudge:Nudge", "options": {"step": 0.01}}
    root = str(tmp_path / "runs")
    path = tmp_path / "own.yaml"
    path.write_text(
        yaml.safe_dump(tiny_run_config(root, run="own", iterations=0, train={"solver": solver}))
    )
    assert main(["run", "--config", str(path)]) == 0
    store = RunStore(root, "own")
    trained = store.read_manifest(0, "train")
    assert trained["stats"]["pairs"] > 0 and trained["stats"]["loss"] == 0.25
    generated = store.read_manifest(0, "generate")
    module.write_text(NUDGE.replace("self.step * len(prompts)", "self.step"))
    assert main(["run", "--config", str(path)]) == 0
    assert store.read_manifest(0, "train")["key"] != trained["key"]
    assert store.read_manifest(0, "generate") == generated  # upstream of the solver: reused

"""Bad input that used to pass or end in a traceback, each refused in one line naming the field:
a reward that scores nothing online, a step larger than the whole budget, an accelerator this
machine lacks, a launcher whose backend is not installed, a reward function that exits or raises,
an unknown storage option, a held-out set made of training prompts, a deployment file that cannot
be served, a number that is not finite, a dead Prefect API, a solver that cannot be built or
builds none; and what a run reads and draws under a sharp temperature or from a folder rewritten
with its mtimes kept."""

from __future__ import annotations

import json
import math
import sys

import pytest
import torch
import yaml

from eva_runtime.errors import EvaError
from flows.cli import main
from tasks.backends.reward.function import CallableReward, RewardFunctionError
from tasks.online import OnlineConfig
from tasks.store import RunStore
from tests.conftest import world_sft
from tests.test_online import tiny_online_config

NO_CUDA = not torch.cuda.is_available()


# --- reward functions of a user's, named by import path below ---------------------------------


def nan_reward(prompt: str, response: str) -> float:
    return math.nan


def exits_3(prompt: str, response: str) -> float:
    sys.exit(3)


def batched_exits(prompts: list[str], responses: list[list[str]]) -> list[list[float]]:
    sys.exit(3)


def batched_raises(prompts: list[str], responses: list[list[str]]) -> list[list[float]]:
    raise KeyError("no such column\nsecond line of the message")


HERE = "tests.test_edge_refusals"


def tiny(root: str, run: str, reward: str) -> dict[str, object]:
    """An online run of one step (2 of 12 prompts) on a theta_0 trained 2 steps, with the
    reward function ``reward`` of this module."""
    config = tiny_online_config(root, run=run, budget=2 / 12)
    config["bootstrap"] = world_sft(steps=2, examples=64)
    config["online"]["reward"] = {"kind": "callable", "function": f"{HERE}:{reward}"}
    return config


def eva(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """``eva ARGV`` in process: its exit status and what it wrote to stderr."""
    status = main(list(argv))
    return status, capsys.readouterr().err.strip()


def write_prompts(path: str, prompts: list[str]) -> str:
    with open(path, "w") as f:
        for p in prompts:
            f.write(json.dumps({"prompt": p}) + "\n")
    return path


SUMS = [f"{a}+{b}=" for a in range(10, 15) for b in range(20, 24)]  # 20 world prompts


# --- 2. online: a reward that scores nothing ---------------------------------------------------


@pytest.mark.usefixtures("prefect_api")
def test_online_with_an_all_nan_reward_fails_the_segment_and_keeps_no_policy(tmp_path, capsys):
    config = tiny(str(tmp_path / "runs"), "nan", "nan_reward")
    path = tmp_path / "nan.yaml"
    path.write_text(yaml.safe_dump(config))
    status, err = eva(capsys, "online", "--config", str(path))
    assert status == 2
    line = err.splitlines()[-1]
    assert line.startswith("eva: error: online: the reward gave no finite score (unscored)")
    assert "for 2 of 2" in line and "online.max_unscored_share = 0.5" in line
    store = RunStore(str(tmp_path / "runs"), "nan")
    assert store.read_manifest(1, "online") is None  # nothing cached: a rerun retries it
    # theta_0's evaluation with the same reward: a score of null, no bare NaN in the JSON.
    evaluated = store.read_manifest(None, "evaluate")
    assert evaluated is not None and evaluated["stats"]["score"] is None
    manifests = list((tmp_path / "runs").rglob("*.manifest.json"))
    assert len(manifests) >= 4  # prompts, heldout, bootstrap, evaluate
    for manifest in manifests:
        assert "NaN" not in manifest.read_text(), manifest


# --- 3. a step larger than the budget ---------------------------------------------------------


def test_a_step_larger_than_the_whole_budget_is_refused():
    config = OnlineConfig.model_validate({"solver": {"prompts_per_step": 5000}, "budget": 1})
    with pytest.raises(EvaError) as info:
        config.check_budget(1000)
    assert info.value.line() == (
        "online.solver.prompts_per_step: 5000 prompts a step exceed the whole budget, "
        "online.budget x |D| = 1 x 1000 = 1000 prompts: one step would train 5x the budget "
        "(set it to at most 1000, or raise online.budget)"
    )
    config.check_budget(5000)  # exactly one step of the budget: fine
    assert config.total_steps(5000) == 1


def test_the_edge_counts_a_prompt_file_against_the_budget(tmp_path, capsys):
    prompts = write_prompts(str(tmp_path / "p.jsonl"), SUMS)
    heldout = write_prompts(str(tmp_path / "h.jsonl"), ["1+1=", "2+2="])
    root = tmp_path / "runs"
    status, err = eva(
        capsys, "online", "--root", str(root), "--set", f"prompts.path={prompts}",
        "--set", f"heldout.path={heldout}", "--set", "online.solver.prompts_per_step=50",
        "--set", "online.budget=1",
    )  # fmt: skip
    assert status == 2 and "\n" not in err
    assert err.startswith("eva: error: online.solver.prompts_per_step: 50 prompts a step")
    assert "1 x 20 = 20 prompts: one step would train 2.5x the budget" in err
    assert not root.exists()


def test_a_relative_prompt_file_that_is_not_there_names_the_folder_it_was_read_from(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)  # as `eva run` resumed from another folder than its launch
    root = tmp_path / "runs"
    status, err = eva(capsys, "run", "--root", str(root), "--set", "prompts.path=data/p.jsonl")
    assert status == 2 and "\n" not in err
    assert err.startswith("eva: error: prompts.path: no file at 'data/p.jsonl'")
    assert f"read from the current folder, {tmp_path}" in err and not root.exists()
    status, err = eva(capsys, "run", "--root", str(root), "--set", f"prompts.path={tmp_path}/p")
    assert status == 2 and "current folder" not in err  # an absolute path: no such hint
    # A name without an extension is missing too, not of an unsupported type.
    assert err.startswith(f"eva: error: prompts.path: no file at '{tmp_path}/p'")
    status, err = eva(capsys, "run", "--root", str(root), "--set", "heldout.path=held")
    assert err.startswith("eva: error: heldout.path: no file at 'held'") and not root.exists()


# --- 4. an accelerator this machine lacks -----------------------------------------------------


@pytest.mark.skipif(not NO_CUDA, reason="a machine with CUDA accepts these")
@pytest.mark.parametrize(
    ("command", "setting", "head"),
    [
        ("online", "online.solver.use_vllm=true", "online.solver.use_vllm=true needs CUDA"),
        ("online", "online.solver.device=cuda", "online.solver.device=cuda needs CUDA"),
        ("run", "train.solver.device=cuda:1", "train.solver.device=cuda:1 needs CUDA"),
    ],
)
def test_an_accelerator_this_machine_lacks_is_refused_before_writing(
    tmp_path, capsys, command, setting, head
):
    root = tmp_path / "runs"
    status, err = eva(capsys, command, "--root", str(root), "--set", setting)
    assert status == 2 and "\n" not in err
    assert err.startswith(f"eva: error: {head}, which this machine does not have")
    assert not root.exists()


def test_a_launcher_whose_backend_is_not_installed_is_refused_naming_the_extra(
    tmp_path, capsys, monkeypatch
):
    import importlib.util

    from flows.config import load_config
    from flows.inputs import check_inputs

    find_spec = importlib.util.find_spec

    def without_deepspeed(name: str, *args: object) -> object:
        return None if name == "deepspeed" else find_spec(name, *args)  # type: ignore[arg-type]

    if find_spec("deepspeed") is not None:  # a GPU machine with the extra: as if without it
        monkeypatch.setattr(importlib.util, "find_spec", without_deepspeed)
    root = tmp_path / "runs"
    # The default accelerate config, infra/accelerate/zero3.yaml, is DeepSpeed ZeRO-3.
    status, err = eva(capsys, "run", "--root", str(root), "--set", "train.launcher=accelerate")
    assert status == 2 and "\n" not in err
    assert err == (
        "eva: error: train.accelerate_config: infra/accelerate/zero3.yaml trains with DeepSpeed "
        "(distributed_type: DEEPSPEED), which is not installed (pip install 'eva[gpu]' on every "
        "machine that trains, or name an accelerate config without DeepSpeed)"
    )
    assert not root.exists()
    # An accelerate config that needs nothing more passes the check.
    plain = tmp_path / "cpu.yaml"
    plain.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\n")
    sets = ["train.launcher=accelerate", f"train.accelerate_config={plain}", f"root={root}"]
    check_inputs(load_config(None, sets))


# --- 5. a reward function that exits or raises ------------------------------------------------


@pytest.mark.parametrize(
    ("function", "batched", "says"),
    [
        ("exits_3", False, "reward function tests.test_edge_refusals:exits_3 called sys.exit(3)"),
        ("batched_exits", True, "called sys.exit(3)"),
        ("batched_raises", True, "raised KeyError: 'no such column"),
    ],
)
def test_a_reward_function_that_exits_or_raises_is_one_line_naming_it(function, batched, says):
    scorer = CallableReward(function=f"{HERE}:{function}", batched=batched).load()
    with pytest.raises(RewardFunctionError) as info:
        scorer.score(["1+1="], [["2", "3"]])
    line = info.value.line()
    assert line.startswith("annotate.reward: ") and says in line and "\n" not in line
    assert f"{HERE}:{function}" in line


@pytest.mark.usefixtures("prefect_api")
def test_eva_online_with_a_reward_that_exits_says_so_and_exits_2(tmp_path, capsys):
    config = tiny(str(tmp_path / "runs"), "exit", "exits_3")
    path = tmp_path / "exit.yaml"
    path.write_text(yaml.safe_dump(config))
    status, err = eva(capsys, "online", "--config", str(path))
    assert status == 2  # not the user's 3: eva says why it stopped
    line = err.splitlines()[-1]  # theta_0's evaluation is the first to call it
    assert line.startswith("eva: error: ") and "annotate.reward: reward function " in line
    assert f"{HERE}:exits_3 called sys.exit(3)" in line


# --- 8. a held-out set made of training prompts -----------------------------------------------


def test_a_heldout_set_of_training_prompts_is_refused_and_mostly_warned(tmp_path, capsys):
    prompts = write_prompts(str(tmp_path / "p.jsonl"), SUMS)
    root = tmp_path / "runs"
    sets = ["--set", f"prompts.path={prompts}", "--set", "iterations=0"]
    status, err = eva(capsys, "config", "--set", f"prompts.path={prompts}")
    status, err = eva(capsys, "run", "--root", str(root), *sets, "--set", f"heldout.path={prompts}")
    assert status == 2 and "\n" not in err
    assert err == (
        "eva: error: heldout.path: 20 of 20 held-out prompts are training prompts too: it "
        "measures nothing training did not see (use prompts disjoint from prompts.path)"
    )
    assert not root.exists()
    mostly = write_prompts(str(tmp_path / "h.jsonl"), [*SUMS[:3], "1+1="])
    from flows.config import load_config
    from flows.inputs import check_inputs

    config = load_config(
        None, [f"root={root}", f"prompts.path={prompts}", f"heldout.path={mostly}"]
    )
    check_inputs(config)
    check_inputs(config)  # the flow checks again: the warning is said once
    err = capsys.readouterr().err.strip()
    assert err == (
        "eva: warning: heldout.path: 3 of 4 held-out prompts are training prompts too (75%): "
        "scores on it flatter training"
    )


# --- 6. a deployment file eva serve cannot serve ----------------------------------------------


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "--file: no file at {path} (eva serve reads infra/prefect.yaml of a checkout"),
        ("deployments: [\n", "--file: {path}: line 2, column 1: expected the node content"),
        ("a: 1\n", "--file: {path}: no deployment with entrypoint ...:eva_run under deploy"),
        (
            "deployments:\n- {name: x, entrypoint: 'flows/run.py:eva_run', "
            "parameters: {config: {sample: {fraction: 7}}}}\n",
            "{path}: parameters.config.sample.fraction: Input should be less than or equal to 1",
        ),
        (
            "deployments:\n- {name: x, entrypoint: 'flows/run.py:eva_run', "
            "schedules: [{cron: not a cron}]}\n",
            "{path}: schedules[0]: {{'cron': 'not a cron'}}: Invalid cron string",
        ),
        (
            "deployments:\n- {name: x, entrypoint: 'flows/run.py:eva_run', "
            "schedules: ['0 3 * * *']}\n",
            "{path}: schedules[0]: '0 3 * * *': expected a mapping (write it as {{cron: '0 3",
        ),
        (
            "deployments:\n- {name: x, entrypoint: 'flows/run.py:eva_run', "
            "schedules: [{interval: -5}]}\n",
            "{path}: schedules[0]: {{'interval': -5}}: interval is a number of seconds > 0",
        ),
        (
            "deployments:\n- {name: x, entrypoint: 'flows/run.py:eva_run', "
            "schedules: [{intervall: 60}]}\n",
            "{path}: schedules[0]: {{'intervall': 60}}: give exactly one of cron or interval",
        ),
        (
            "deployments:\n- {name: x, entrypoint: 'flows/run.py:eva_run', "
            "parameters: {advance: -1}}\n",
            "{path}: parameters.advance: -1 is not a whole number >= 0",
        ),
    ],
)
def test_eva_serve_refuses_a_file_it_cannot_serve_before_opening_an_api(
    tmp_path, capsys, monkeypatch, content, says
):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)  # nothing to reach: none is opened
    path = tmp_path / "prefect.yaml"
    if content is not None:
        path.write_text(content)
    status, err = eva(capsys, "serve", "--file", str(path))
    assert status == 2 and "\n" not in err
    assert err.startswith("eva: error: " + says.format(path=path))


# --- 7. an unknown storage option -------------------------------------------------------------


@pytest.mark.parametrize(
    ("root", "setting", "says"),
    [
        ("{tmp}/runs", "storage_options.auto_mkdr=true", "storage_options: LocalFileSystem (file"),
        ("s3://bucket/runs", "storage_options.endpoint=http://x", "storage_options: S3FileSystem"),
    ],
)
def test_an_option_the_filesystem_does_not_take_is_refused(tmp_path, capsys, root, setting, says):
    root = root.format(tmp=tmp_path)
    status, err = eva(capsys, "run", "--root", root, "--set", setting)
    assert status == 2 and "\n" not in err
    key = setting.split(".")[1].split("=")[0]
    assert err.startswith(f"eva: error: {says}") and f"takes no option '{key}'" in err
    assert not (tmp_path / "runs").exists()


def test_options_the_filesystem_takes_pass_and_prompt_files_are_checked_too(tmp_path, capsys):
    from flows.roots import check_storage_options

    check_storage_options("s3://b/runs", {"endpoint_url": "http://x", "anon": True}, "f")
    check_storage_options("/tmp/runs", {"auto_mkdir": True, "skip_instance_cache": True}, "f")
    check_storage_options("https://host/p.jsonl", {"headers": {"a": "b"}}, "f")  # not checked
    prompts = write_prompts(str(tmp_path / "p.jsonl"), SUMS)
    status, err = eva(
        capsys, "run", "--root", str(tmp_path / "runs"), "--set", f"prompts.path={prompts}",
        "--set", "prompts.storage_options={anon: true}",
    )  # fmt: skip
    assert status == 2
    assert err.startswith("eva: error: prompts.storage_options: LocalFileSystem (file://) takes")


@pytest.mark.usefixtures("prefect_api")
def test_a_heldout_file_of_the_prompts_a_source_drew_is_refused_by_its_stage(tmp_path, capsys):
    from eva_world.components import WorldPrompts

    drawn = [p for p, _ in WorldPrompts("seed", 4, seed=7).draw(0)]  # what the source draws
    heldout = write_prompts(str(tmp_path / "h.jsonl"), drawn)
    status, err = eva(
        capsys, "run", "--root", str(tmp_path / "runs"),
        "--set", "prompts.source.options={distribution: seed, size: 4, seed: 7}",
        "--set", "heldout.source=null", "--set", f"heldout.path={heldout}",
    )  # fmt: skip
    assert status != 0
    line = err.splitlines()[-1]
    assert "heldout: all 4 held-out prompts are training prompts too" in line


# --- 11. a Hub reward model that is neither cached nor reachable ------------------------------


def test_a_hub_reward_model_not_cached_and_unreachable_is_refused_before_writing(
    tmp_path, capsys, monkeypatch, policy_dir
):
    import socket

    from huggingface_hub import constants

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{closed}")
    prompts = write_prompts(str(tmp_path / "p.jsonl"), ["Write a poem.", "Explain tides."])
    heldout = write_prompts(str(tmp_path / "h.jsonl"), ["Name a planet."])
    root = tmp_path / "runs"
    status, err = eva(
        capsys, "run", "--config", "configs/own-model.yaml", "--root", str(root),
        "--set", f"bootstrap.init_checkpoint={policy_dir}",
        "--set", "annotate.reward.model=eva-test/not-a-cached-rm",
        "--set", f"prompts.path={prompts}", "--set", f"heldout.path={heldout}",
        "--set", "evolve.evolver.llm.base_url=http://127.0.0.1:9/v1",
        "--set", "evolve.evolver.llm.model=m",
    )  # fmt: skip
    assert status == 2 and "\n" not in err, err
    assert err.startswith(
        "eva: error: annotate.reward.model: eva-test/not-a-cached-rm: not in the local Hugging "
        f"Face cache, and http://127.0.0.1:{closed} cannot be reached"
    )
    assert not root.exists()


# --- a solver that would train on prompts laid out otherwise than generation fed them ---------


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        (["train.solver.chat_template=never"],
         "train.solver.chat_template is 'never' but generate.backend samples prompts as the chat "
         "template"),
        (["generate.backend.chat_template=never"],
         "train.solver.chat_template is 'auto' but generate.backend samples prompts as raw text"),
    ],
)  # fmt: skip
def test_a_solver_and_generation_that_lay_out_prompts_differently_are_refused(
    tmp_path, capsys, settings, says
):
    root = tmp_path / "runs"
    argv = ["run", "--root", str(root), *(a for s in settings for a in ("--set", s))]
    status, err = eva(capsys, *argv)
    assert status == 2 and "\n" not in err and err.startswith(f"eva: error: {says}"), err
    assert not root.exists()


# --- issue 43: a number that is not finite -----------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "field"),
    [
        ("sample.temperature=inf", "sample.temperature"),  # a float field: pydantic takes inf
        ("pairs.min_chosen_reward=-.inf", "pairs.min_chosen_reward"),
        ("evolve.evolver.options.rate=.nan", "evolve.evolver.options.rate"),  # a component's own
    ],
)
def test_a_number_that_is_not_finite_is_refused_before_anything_is_written(
    tmp_path, capsys, setting, field
):
    # It used to run, and write a bare Infinity (not JSON) into config.json and the manifests.
    root = tmp_path / "runs"
    status, err = eva(capsys, "run", "--root", str(root), "--set", setting)
    assert status == 2 and "\n" not in err, err
    assert err.startswith(f"eva: error: {field}: not a finite number (got ")
    assert not root.exists()


def test_a_flow_given_a_config_that_is_not_finite_refuses_it_too(tmp_path) -> None:
    # A flow's parameter (the UI, a deployment, Python) is a model pydantic built, not one the
    # CLI read: the run's own edge checks it before the run is opened.
    from flows.config import RunConfig
    from flows.run import eva_run
    from tests.conftest import tiny_run_config

    config = RunConfig.model_validate(
        tiny_run_config(str(tmp_path / "runs"), sample={"temperature": math.inf})
    )
    with pytest.raises(EvaError, match=r"^sample\.temperature: not a finite number \(got inf\)"):
        eva_run.fn(config)
    assert not (tmp_path / "runs").exists()


# --- issue 43: a configured Prefect API that does not answer ----------------------------------


def _closed_port() -> int:
    """A port on this machine nothing listens on: a dead Prefect API."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    "argv",
    [["serve"], ["run", "--set", "iterations=0"], ["online"]],
    ids=["serve", "run", "online"],
)
def test_a_dead_prefect_api_is_one_line_naming_it(tmp_path, argv):
    # eva serve used to end in a 101-line traceback ending in httpx.ConnectError, eva run in
    # one ending in "Failed to reach API": the client's, from inside Prefect's engine.
    import os
    import subprocess

    from tests.test_cli_first_hour import PROJECT

    url = f"http://127.0.0.1:{_closed_port()}/api"
    env = {**os.environ, "PREFECT_API_URL": url}
    root = tmp_path / "runs"
    more = [] if argv == ["serve"] else ["--root", str(root)]
    done = subprocess.run(
        [sys.executable, "-m", "flows.cli", *argv, *more],
        cwd=PROJECT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    err = done.stderr.strip()
    assert err == (
        f"eva: error: PREFECT_API_URL: the Prefect API at {url} does not answer (ConnectError: "
        "[Errno 111] Connection refused) (start that server (eva prefect-server), or unset "
        "PREFECT_API_URL and eva starts a temporary one)"
    )
    assert not root.exists()


# --- issue 43: a solver of yours that cannot be built, or builds no solver ---------------------

BROKEN_SOLVERS = """
class Fails:
    def __init__(self):
        raise RuntimeError("solver init failed: no GPU here")


def nothing():
    return None
"""


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("Fails", "raised RuntimeError: solver init failed: no GPU here (eva builds each"),
        ("nothing", "returned None (it must build a solver: an object with train())"),
    ],
)
def test_a_solver_that_cannot_be_built_or_builds_none_is_one_line(
    tmp_path, capsys, monkeypatch, name, says
):
    # The first ended in a traceback from check_inputs; the second passed the edge and failed
    # at the train stage, after generation and scoring, with an AttributeError on None.
    (tmp_path / "eva_broken_solvers.py").write_text(BROKEN_SOLVERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    root = tmp_path / "runs"
    solver = f"{{kind: python, factory: 'eva_broken_solvers:{name}'}}"
    status, err = eva(capsys, "run", "--root", str(root), "--set", f"train.solver={solver}")
    assert status == 2 and "\n" not in err, err
    assert err.startswith(f"eva: error: train.solver.factory: eva_broken_solvers:{name} {says}")
    assert not root.exists()


# --- issue 43: what a run reads and draws is what its config and key say -----------------------


@pytest.mark.usefixtures("prefect_api")
def test_the_smallest_temperature_draws_greedys_prompts_in_a_run(tmp_path, capsys):
    # sample.temperature=1e-6 drew 714 of 750 prompts from the zero-weight fill: its weights
    # raised to 1/T underflowed. A run at 1e-6 draws what greedy draws.
    from tests.conftest import tiny_run_config

    config = tiny_run_config(str(tmp_path / "runs"), run="sharp", sample={"temperature": 1e-6})
    path = tmp_path / "sharp.yaml"
    path.write_text(yaml.safe_dump(config))
    status, err = eva(capsys, "run", "--config", str(path))
    assert status == 0, err
    store = RunStore(str(tmp_path / "runs"), "sharp")
    scored = store.read_table(store.read_manifest(1, "score")["uri"])
    drawn = store.read_table(store.read_manifest(1, "sample")["uri"])
    weights = sorted(scored.column("informativeness").to_pylist(), reverse=True)
    picked = drawn.column("informativeness").to_pylist()
    assert sorted(picked, reverse=True) == weights[: len(picked)]  # greedy's, ties aside
    stats = store.read_manifest(1, "sample")["stats"]
    assert stats["zero_weight_filled"] == max(0, len(picked) - sum(w > 0 for w in weights))


@pytest.mark.usefixtures("prefect_api")
def test_a_data_files_folder_rewritten_with_its_mtimes_kept_yields_the_new_rows(
    tmp_path, capsys, monkeypatch
):
    # The prompts stage reran (its key is the folder's bytes) but read through the datasets
    # cache, which knows a file by its path, size and mtime: row 0 stayed r:iegh=.
    import os

    import datasets.config

    from eva_world.components import WorldPrompts
    from tests.conftest import tiny_run_config

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    folder = tmp_path / "prompts"
    folder.mkdir()
    drawn = [p for p, _ in WorldPrompts("seed", 24, seed=3).draw(0)]
    data = folder / "train.jsonl"
    write_prompts(str(data), ["r:iegh=", *drawn[1:]])
    config = tiny_run_config(str(tmp_path / "runs"), run="files", iterations=0)
    config.update(iteration0_dpo=False, prompts={"dataset": str(folder)})
    path = tmp_path / "files.yaml"
    path.write_text(yaml.safe_dump(config))
    store = RunStore(str(tmp_path / "runs"), "files")

    def first_rows() -> list[str]:
        status, err = eva(capsys, "run", "--config", str(path))
        assert status == 0, err
        table = store.read_table(store.read_manifest(None, "prompts")["uri"])
        return table.column("prompt").to_pylist()[:2]

    assert first_rows() == ["r:iegh=", drawn[1]]
    stamp = os.stat(data)
    data.write_text(data.read_text().replace("r:iegh=", "r:eigh="))  # the same size
    os.utime(data, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert first_rows() == ["r:eigh=", drawn[1]]

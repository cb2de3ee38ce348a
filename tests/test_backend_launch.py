"""The accelerate launcher: a real `accelerate launch` subprocess trains a tiny GPT-2 on CPU."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pyarrow as pa
import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM

from eva_runtime.accelerate import REPO_ROOT, resolve_config, stream
from tasks.backends.train.dpo import DPOSolverConfig
from tasks.backends.train.launch import LaunchError, launch_train
from tasks.train import TrainConfig, train

PROMPTS = [f"{a}+{b}=" for a in range(4) for b in range(3)]  # 12 pairs
FAST = {"learning_rate": 1e-3, "num_train_epochs": 1, "warmup_ratio": 0.0}


@pytest.fixture(autouse=True)
def _one_thread_children(monkeypatch: pytest.MonkeyPatch):
    # The launched process is a fresh interpreter: only the environment can keep it at one
    # thread, which on two shared cores is much faster than two.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="module")
def cpu_yaml(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("accelerate") / "cpu.yaml"
    # 'NO' quoted: bare NO is a YAML boolean.
    cfg = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "NO",
        "use_cpu": True,
        "num_processes": 1,
        "num_machines": 1,
        "machine_rank": 0,
        "mixed_precision": "no",
    }
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


class _Log:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, fmt: str, *args: Any) -> None:
        self.lines.append(fmt % args)


def test_stage_trains_through_accelerate_launch(policy_dir: str, cpu_yaml: str, tmp_path: Path):
    log, seen = _Log(), []
    ctx = SimpleNamespace(
        scratch=str(tmp_path / "scratch"),
        seed=0,
        progress=seen.append,
        log=log,
        model_dir=lambda name: policy_dir,
    )
    config = TrainConfig(
        solver=DPOSolverConfig(**FAST, effective_batch_size=6),
        launcher="accelerate",
        num_processes=1,
        accelerate_config=cpu_yaml,
    )
    pairs = pa.table({"prompt": PROMPTS, "chosen": ["abc"] * 12, "rejected": ["ghij"] * 12})
    out = train.fn(ctx, config, pairs=pairs)

    assert out.table.column("step").to_pylist() == [1, 2]
    assert out.stats["pairs"] == 12 and out.stats["steps"] == 2
    assert seen[-1] == 1.0 and 0 < seen[0] < 1  # rank 0's progress markers crossed over
    assert not any(line.startswith("@@eva-progress") for line in log.lines)
    # The stage says, once, how the effective batch is laid out on the processes.
    split = "dpo: effective batch 6 = 6 per device x 1 accumulation x 1 processes"
    assert log.lines.count(split) == 1
    before = AutoModelForCausalLM.from_pretrained(policy_dir).state_dict()
    after = AutoModelForCausalLM.from_pretrained(out.model_dir).state_dict()
    assert all(not torch.equal(before[k], after[k]) for k in before)


def test_a_failing_launch_raises_with_its_last_lines(tmp_path: Path, cpu_yaml: str):
    empty = tmp_path / "not-a-checkpoint"
    empty.mkdir()
    lines: list[str] = []
    with pytest.raises(LaunchError, match="exited with status 1") as err:
        launch_train(
            DPOSolverConfig(),
            str(empty),
            ["1+1="],
            ["2"],
            ["3"],
            str(tmp_path / "out"),
            0,
            scratch=str(tmp_path / "scratch"),
            accelerate_config=cpu_yaml,
            log=lines.append,
        )
    message = str(err.value)
    assert "Traceback" in message and str(empty) in message
    assert message.splitlines()[-1] == lines[-1]  # the tail is what was logged last
    assert not (tmp_path / "out").exists()


def test_output_is_streamed_line_by_line(tmp_path: Path):
    arrivals: list[tuple[str, float]] = []
    code = "import time; print('first', flush=True); time.sleep(1.0); print('second')"
    rc, tail = stream(
        [sys.executable, "-c", code],
        {},
        str(tmp_path),
        lambda line: arrivals.append((line, time.monotonic())),
        lambda _: None,
        tail_lines=1,
    )
    assert (rc, tail) == (0, ["second"])
    assert [a[0] for a in arrivals] == ["first", "second"]
    assert arrivals[1][1] - arrivals[0][1] > 0.5  # "first" arrived before the process ended


KILLED_EVA = """
import sys
from eva_runtime.accelerate import Launch, run_launch
launch = Launch(module="tests.support.sleeper", spec_json=sys.argv[1],
                accelerate_config=sys.argv[2], num_processes=1, bf16=False)
run_launch(launch, cwd=sys.argv[3], log=lambda line: print(line, flush=True),
           progress=lambda f: print(f"progress {f}", flush=True))
"""


def test_a_sigkill_of_eva_leaves_no_training_behind(tmp_path: Path, cpu_yaml: str):
    # A real `accelerate launch` of a stand-in training (tests/support/sleeper.py) that also
    # starts a worker in a session of its own; eva is killed outright while it runs, so only
    # the guard can stop them.
    pid_file = tmp_path / "pids"
    spec = json.dumps({"pids": str(pid_file)})
    eva = subprocess.Popen(
        [sys.executable, "-c", KILLED_EVA, spec, cpu_yaml, str(tmp_path)],
        stdout=subprocess.PIPE, cwd=REPO_ROOT, text=True,
    )  # fmt: skip
    try:
        assert eva.stdout is not None
        # The launch's lines reach eva's log as they are written; its marks become progress.
        assert [eva.stdout.readline() for _ in range(2)] == ["progress 0.5\n", "training\n"]
        launcher, training, worker = (int(p) for p in pid_file.read_text().split())
        (guard,) = psutil.Process(eva.pid).children()
        tree = [guard.pid, launcher, training, worker]
        assert all(psutil.pid_exists(p) for p in tree)
        assert psutil.Process(launcher).parent().pid == guard.pid  # accelerate's own process
    finally:
        eva.kill()  # SIGKILL: no finally, no finalizer of eva's runs
        eva.wait()
    deadline = time.monotonic() + 20
    while (left := [p for p in tree if _running(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"processes of the launch outlived eva: {left}"


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_default_config_is_zero3_and_resolves_from_anywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(tmp_path)
    path = resolve_config(TrainConfig().accelerate_config)
    assert path == str(REPO_ROOT / "infra/accelerate/zero3.yaml")
    cfg = yaml.safe_load(Path(path).read_text())
    assert cfg["distributed_type"] == "DEEPSPEED"
    assert cfg["deepspeed_config"]["zero_stage"] == 3
    assert cfg["deepspeed_config"]["zero3_save_16bit_model"] is True

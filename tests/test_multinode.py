"""Training on several machines: the accelerate command line of each machine, what accelerate
itself makes of it, the config's checks, the follower's rank, and a real two-machine launch on
this host (machine 0 the train stage, machine 1 `eva train-node`, both CPU processes)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pytest
import yaml

from eva_runtime.accelerate import REPO_ROOT, write_run_finished
from eva_runtime.follow import FollowError, follow, machine_rank
from eva_runtime.process import free_port
from flows.config import ConfigError, load_config, validate_config
from tasks.backends.train.dpo import DPOSolverConfig
from tasks.backends.train.launch import NodesConfig, accelerate_command
from tasks.train import TrainConfig, train
from tests.test_backend_launch import FAST, PROMPTS, _Log

PY = sys.executable
TWO = NodesConfig(machines=2, main_process_ip="eva-train-0.eva", main_process_port=29400)


def test_one_machine_command_line() -> None:
    cmd = accelerate_command(
        '{"x": 1}',
        accelerate_config="infra/accelerate/zero3.yaml",
        num_processes=8,
        bf16=True,
        nodes=NodesConfig(),
        machine_rank=0,
    )
    assert cmd == [
        PY, "-m", "accelerate.commands.launch",
        "--config_file", str(REPO_ROOT / "infra/accelerate/zero3.yaml"),
        "--num_processes", "8", "--num_machines", "1", "--machine_rank", "0",
        "--mixed_precision", "bf16",
        "-m", "tasks.backends.train.launch", '{"x": 1}',
    ]  # fmt: skip


def test_second_machine_command_line() -> None:
    cmd = accelerate_command(
        "{}",
        accelerate_config="infra/accelerate/zero3-2x8.yaml",
        num_processes=16,
        bf16=False,
        nodes=TWO.model_copy(update={"rdzv_backend": "c10d", "same_network": False}),
        machine_rank=1,
    )
    assert cmd == [
        PY, "-m", "accelerate.commands.launch",
        "--config_file", str(REPO_ROOT / "infra/accelerate/zero3-2x8.yaml"),
        "--num_processes", "16", "--num_machines", "2", "--machine_rank", "1",
        "--mixed_precision", "no",
        "--main_process_ip", "eva-train-0.eva", "--main_process_port", "29400",
        "--rdzv_backend", "c10d",
        "-m", "tasks.backends.train.launch", "{}",
    ]  # fmt: skip
    same = accelerate_command(
        "{}", accelerate_config="a.yaml", num_processes=16, bf16=False, nodes=TWO, machine_rank=1
    )
    assert same[-6:] == ["--rdzv_backend", "static", "--same_network", "-m",
                         "tasks.backends.train.launch", "{}"]  # fmt: skip


def test_accelerate_reads_the_command_line_as_meant() -> None:
    """accelerate's own parser and DeepSpeed launcher setup on machine 1's command: 8 local
    processes, node rank 1, machine 0 as master, whatever the yaml says."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_deepspeed_cmd_env

    cmd = accelerate_command(
        "{}",
        accelerate_config="infra/accelerate/zero3-2x8.yaml",
        num_processes=16,
        bf16=True,
        nodes=TWO,
        machine_rank=1,
    )
    args, _, _ = _validate_launch_command(launch_command_parser().parse_args(cmd[3:]))
    assert (args.use_deepspeed, args.deepspeed_multinode_launcher) == (True, "standard")
    args.deepspeed_fields_from_accelerate_config = ""  # what `accelerate launch` sets itself
    torchrun_cmd, env = prepare_deepspeed_cmd_env(args)
    # None: the standard launcher runs torch.distributed.run on this machine (no pdsh/ssh).
    assert torchrun_cmd is None
    assert (args.nproc_per_node, args.nnodes, args.node_rank) == ("8", "2", 1)
    assert (args.master_addr, args.master_port) == ("eva-train-0.eva", "29400")
    assert env["ACCELERATE_DEEPSPEED_ZERO_STAGE"] == "3"
    assert (args.module, args.training_script) == (True, "tasks.backends.train.launch")


@pytest.mark.parametrize("path", sorted((REPO_ROOT / "infra/accelerate").glob("*.yaml")))
def test_each_accelerate_yaml_is_consistent(path: Path) -> None:
    from accelerate.commands.config.config_args import load_config_from_file

    cfg = load_config_from_file(str(path))  # accelerate's own loader
    raw = yaml.safe_load(path.read_text())
    assert cfg.num_processes % cfg.num_machines == 0
    assert cfg.machine_rank == 0
    assert raw["deepspeed_config"]["zero_stage"] == 3
    if cfg.num_machines > 1:
        # Every machine launches itself: no ssh-based launcher inside pods.
        assert raw["deepspeed_config"]["deepspeed_multinode_launcher"] == "standard"
        assert cfg.main_process_ip and cfg.main_process_port
        # What eva would run there validates as a TrainConfig with the yaml's shape (the
        # paper's effective batch of 8 cannot be split over 16 GPUs: one per GPU is the least).
        TrainConfig(
            solver=DPOSolverConfig(effective_batch_size=cfg.num_processes),
            launcher="accelerate",
            accelerate_config=str(path),
            num_processes=cfg.num_processes,
            nodes=NodesConfig(machines=cfg.num_machines, main_process_ip=cfg.main_process_ip),
        )


@pytest.mark.parametrize(
    ("train", "message"),
    [
        ({"launcher": "accelerate", "num_processes": 16, "nodes": {"machines": 2}},
         "train.nodes: machines=2 needs main_process_ip (machine 0's address)"),
        ({"num_processes": 16, "nodes": {"machines": 2, "main_process_ip": "h"}},
         "train: nodes.machines=2 needs launcher: accelerate"),
        ({"launcher": "accelerate", "num_processes": 12,
          "nodes": {"machines": 5, "main_process_ip": "h"}},
         "train: num_processes=12 is the total over nodes.machines=5: it must be a multiple"),
        ({"nodes": {"machines": 0}}, "train.nodes.machines: Input should be greater than or"),
        ({"nodes": {"main_process_port": 70000}}, "train.nodes.main_process_port: Input should"),
    ],
)  # fmt: skip
def test_config_checks_name_the_field(train: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        validate_config({"train": train})
    assert str(err.value).startswith(message), str(err.value)
    assert "\n" not in str(err.value)


def test_a_shared_filesystem_root_is_required(tmp_path: Path) -> None:
    from flows.inputs import check_inputs

    nodes = '{"machines": 2, "main_process_ip": "h"}'
    sets = ["train.launcher=accelerate", "train.num_processes=2", f"train.nodes={nodes}"]
    config = load_config(None, [*sets, "root=s3://bucket/runs"])
    with pytest.raises(ConfigError, match=r"^train.nodes.machines=2 needs a run root on a "):
        check_inputs(config)
    # A path: fine (with an accelerate config that needs no DeepSpeed, which is not installed
    # here: tests/test_edge_refusals.py).
    plain = tmp_path / "multi-gpu.yaml"
    plain.write_text("distributed_type: MULTI_GPU\n")
    check_inputs(load_config(None, [*sets, f"train.accelerate_config={plain}", f"root={tmp_path}"]))


def test_the_follower_rank_comes_from_flag_env_or_job_index() -> None:
    assert machine_rank(2, 4, {}) == 2
    assert machine_rank(None, 4, {"EVA_MACHINE_RANK": "3"}) == 3
    assert machine_rank(1, 4, {"EVA_MACHINE_RANK": "3"}) == 1  # the flag wins
    # An indexed Job of machines-1 pods: pod 0 is machine 1 (machine 0 is the flow's pod).
    assert machine_rank(None, 3, {"JOB_COMPLETION_INDEX": "1"}) == 2
    for given, env, message in [
        (None, {}, "no machine rank: pass --machine-rank or set EVA_MACHINE_RANK"),
        (0, {}, "--machine-rank: machine rank 0 is not one of 1..1 (the run trains on 2"),
        (None, {"JOB_COMPLETION_INDEX": "1"}, "JOB_COMPLETION_INDEX + 1: machine rank 2 is not"),
        (None, {"EVA_MACHINE_RANK": "one"}, "EVA_MACHINE_RANK='one' is not a whole number"),
    ]:
        with pytest.raises(FollowError) as err:
            machine_rank(given, 2, env)
        assert str(err.value).startswith(message), str(err.value)


def test_a_follower_without_a_request_gives_up_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(FollowError, match=r"^no launch request in .* within 0.3 s$"):
        follow(str(tmp_path), rank=1, once=True, wait_s=0.3, poll_s=0.1, log=lambda _: None)
    done = subprocess.run(
        [PY, "-m", "flows.cli", "train-node", "--run", "r", "--root", "s3://b/runs"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr == (
        "eva: error: --root s3://b/runs: multi-node training needs a shared filesystem path\n"
    )


def test_a_follower_exits_when_the_run_finishes_not_an_earlier_launch(tmp_path: Path) -> None:
    folder = str(tmp_path / ".launch")
    write_run_finished(folder)  # an earlier launch of this run finished before we started
    lines: list[str] = []
    result: dict[str, int] = {}
    waiting = threading.Thread(
        target=lambda: result.update(status=follow(folder, rank=1, poll_s=0.05, log=lines.append)),
        daemon=True,
    )
    waiting.start()
    deadline = time.monotonic() + 10
    while not lines and time.monotonic() < deadline:  # it has read what was there and waits
        time.sleep(0.01)
    time.sleep(0.3)
    assert waiting.is_alive()  # that finish is not this launch's
    write_run_finished(folder)
    waiting.join(timeout=10)
    assert not waiting.is_alive() and result == {"status": 0}
    assert lines[-1] == "the run finished after 0 launch(es): nothing more to join"


def test_only_a_whole_multinode_run_that_finished_releases_the_followers(tmp_path: Path) -> None:
    from flows.launch import _finished
    from tasks.context import RunContext
    from tasks.plan import Plan

    train = {"launcher": "accelerate", "num_processes": 2,
             "nodes": {"machines": 2, "main_process_ip": "h"}}  # fmt: skip
    two = validate_config({"root": str(tmp_path), "run": "r", "train": train})
    one = validate_config({"root": str(tmp_path), "run": "r"})
    marker = tmp_path / "r" / ".launch" / "run-finished.json"
    order = ("generate", "train")
    target = Plan(target="train", target_iteration=1, order=order)  # eva stage train
    _finished(one, RunContext(root=str(tmp_path), run="r", seed=0))
    _finished(two, RunContext(root=str(tmp_path), run="r", seed=0, plan=target))
    assert not marker.exists()
    _finished(two, RunContext(root=str(tmp_path), run="r", seed=0))
    assert marker.exists()


def test_two_machines_train_together(
    policy_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Machine 0 is the train stage, machine 1 `eva train-node` in another process; without
    GPUs, accelerate's multi-GPU launcher runs torch.distributed.run over gloo on CPU, so the
    rendezvous, ranks and gradient all-reduce across the two launches are real."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    yaml_path = tmp_path / "cpu-2x1.yaml"
    yaml_path.write_text(
        yaml.safe_dump(
            {"compute_environment": "LOCAL_MACHINE", "distributed_type": "MULTI_GPU",
             "num_processes": 2, "num_machines": 2, "machine_rank": 0, "mixed_precision": "no"}
        )
    )  # fmt: skip
    run_base = tmp_path / "runs" / "r"
    follower = subprocess.Popen(
        [PY, "-m", "flows.cli", "train-node", "--run", "r", "--root", str(tmp_path / "runs"),
         "--once", "--wait", "120"],
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "EVA_MACHINE_RANK": "1"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        log = _Log()
        ctx = SimpleNamespace(
            scratch=str(tmp_path / "scratch"),
            seed=0,
            progress=lambda _: None,
            log=log,
            model_dir=lambda name: policy_dir,
            store=SimpleNamespace(base=str(run_base)),
        )
        config = TrainConfig(
            solver=DPOSolverConfig(**FAST, effective_batch_size=6),
            launcher="accelerate",
            num_processes=2,
            accelerate_config=str(yaml_path),
            nodes=NodesConfig(
                machines=2, main_process_ip="127.0.0.1", main_process_port=free_port()
            ),
        )
        pairs = pa.table({"prompt": PROMPTS, "chosen": ["abc"] * 12, "rejected": ["ghij"] * 12})
        out = train.fn(ctx, config, pairs=pairs)
        follower_out, _ = follower.communicate(timeout=120)
    finally:
        if follower.poll() is None:
            follower.kill()
    assert follower.returncode == 0, follower_out[-3000:]
    # Machine 0 could only finish with machine 1 in its rendezvous (static: both must join).
    assert "machine 1 of 2" in follower_out
    assert "machine 1 exited with status 0" in follower_out
    # One step a batch of 6 = 3 per device x 2 processes (one on each machine): 12 pairs, 2 steps.
    assert "dpo: effective batch 6 = 3 per device x 1 accumulation x 2 processes" in log.lines
    assert out.table.column("step").to_pylist() == [1, 2]
    assert os.path.isfile(os.path.join(out.model_dir, "config.json"))
    assert not (run_base / ".launch" / "train-request.json").exists()  # withdrawn afterwards

"""An online solver of the user's (``online.solver: {kind: python, ...}``), written by the test as
a real module that trains on the TRL bridge's seams, run through the online stage; and TRL's
online metrics to the trackers ``online.solver.report_to`` names, as offline solvers have it."""

from __future__ import annotations

import json
import textwrap
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
from pydantic import ValidationError
from transformers.integrations import integration_utils

from eva_core.schema import seed_records
from tasks.backends.train.online import OnlineSolverConfig, PythonOnlineSolver
from tasks.backends.train.online_trainer import build_online_trainer
from tasks.keys import keyed_config
from tasks.online import STATE_FILE, OnlineConfig, online
from tasks.online_loop import BufferConfig, OnlineLoop
from tasks.store import RunStore
from tests.test_online_skip_tied import SplitReward
from tests.test_own_solver import _Recorder

PROMPTS = [f"{i}+{i}=" for i in range(4)]  # SplitReward's prompts

MINE = '''
from trl import GRPOConfig, GRPOTrainer


class MyGRPO:
    """GRPO of the user's own, on the bridge's dataset, reward wrapper and callback."""

    version = 1

    def __init__(self, learning_rate: float = 1e-3):
        self.learning_rate = learning_rate

    def train_segment(self, policy_dir, feed, steps, output_dir, seed, progress=None):
        bridge = feed.feed

        def reward(prompts, completions, eva_row, **_):
            return feed.score(eva_row, prompts, completions)

        args = GRPOConfig(
            output_dir=output_dir + "-trainer", max_steps=steps, per_device_train_batch_size=4,
            num_generations=2, max_completion_length=3, learning_rate=self.learning_rate,
            use_cpu=True, report_to=[], save_strategy="no", disable_tqdm=True, seed=seed,
        )
        trainer = GRPOTrainer(
            model=policy_dir, args=args, train_dataset=bridge.dataset(),
            reward_funcs=[bridge.recording(reward)], callbacks=[bridge.callback()],
        )
        trainer.train()
        trainer.save_model(output_dir)
        trainer.processing_class.save_pretrained(output_dir)
        return [{"step": float(e["step"]), "loss": e["loss"]}
                for e in trainer.state.log_history if "loss" in e]
'''


def test_online_solver_configs_by_kind() -> None:
    mine = OnlineConfig.model_validate(
        {
            "solver": {
                "kind": "python",
                "factory": "tasks.backends.train.online:OnlineSolverConfig",
                "prompts_per_step": 8,
            }
        }
    ).solver
    assert isinstance(mine, PythonOnlineSolver) and mine.prompts_per_step == 8
    # without a kind: TRL's RLOO, as before (old configs read the same)
    assert isinstance(OnlineConfig.model_validate({"solver": {}}).solver, OnlineSolverConfig)
    assert OnlineConfig.model_validate({"solver": {"kind": "grpo"}}).solver.kind == "grpo"
    with pytest.raises(ValidationError, match="is not a class or function"):
        OnlineConfig.model_validate({"solver": {"kind": "python", "factory": "json:__doc__"}})
    with pytest.raises(ValidationError, match="unknown tracker 'nope'"):
        OnlineSolverConfig(report_to=["nope"])
    assert "report_to" not in keyed_config(OnlineSolverConfig())  # old cache keys hold


def test_an_online_solver_of_yours_trains_a_segment_through_the_stage(
    policy_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = f"eva_test_online_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(MINE))
    monkeypatch.syspath_prepend(str(tmp_path))
    config = OnlineConfig.model_validate({
        "solver": {"kind": "python", "factory": f"{name}:MyGRPO", "prompts_per_step": 2},
        "reward": {"kind": "python", "factory": "tests.test_online_skip_tied:SplitReward"},
        "buffer": {"evolve": False}, "budget": 1.5, "steps_per_segment": 3,
    })  # fmt: skip
    seeds = seed_records(PROMPTS)
    ctx = SimpleNamespace(
        iteration=1, artifact="online", seed=0, scratch=str(tmp_path / "scratch"),
        run=SimpleNamespace(seed=0), progress=lambda _: None, model_dir=lambda _: policy_dir,
        store=RunStore(str(tmp_path / "runs"), "r"),
    )  # fmt: skip
    out = online.fn(ctx, config, seeds, seeds.select(["prompt_id"]))
    # 3 steps of 2 prompts, each sampled twice, scored by the run's reward through feed.score
    assert out.stats["steps"] == 3 and out.stats["trained_prompts"] == 6
    assert [len(r) for r in out.table.column("rewards").to_pylist()] == [2] * 6
    state = json.loads((Path(out.model_dir) / STATE_FILE).read_text())
    assert state["trained_steps"] == 3 and [d["step"] for d in state["pending"]] == [3]
    assert (Path(out.model_dir) / "config.json").exists()


def test_report_to_reaches_the_online_trainer_and_its_logging_dir(
    policy_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(integration_utils.INTEGRATION_TO_CALLBACK, "tensorboard", _Recorder)
    config = OnlineSolverConfig(
        kind="rloo", learning_rate=1e-3, beta=0.0, num_generations=2, prompts_per_step=2,
        max_completion_length=3, device="cpu", report_to=["tensorboard"],
    )  # fmt: skip
    seeds = seed_records(PROMPTS).to_pylist()
    creator = BufferConfig(evolve=False).creator(seeds, 0, None, ThreadPoolExecutor(1))
    loop = OnlineLoop(creator, SplitReward())
    logs = tmp_path / "online_logs"
    trainer = build_online_trainer(config, policy_dir, loop, 2, str(tmp_path / "t"), 0,
                                   logging_dir=str(logs))  # fmt: skip
    assert trainer.args.report_to == ["tensorboard"]
    trainer.train()
    rows = [json.loads(x) for x in (logs / "rows.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2]


def test_the_online_stage_logs_to_tensorboard_in_the_run(
    policy_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(integration_utils.INTEGRATION_TO_CALLBACK, "tensorboard", _Recorder)
    config = OnlineConfig.model_validate({
        "solver": {"kind": "rloo", "learning_rate": 1e-3, "beta": 0.0, "num_generations": 2,
                   "prompts_per_step": 2, "max_completion_length": 3, "device": "cpu",
                   "report_to": ["tensorboard"]},
        "reward": {"kind": "python", "factory": "tests.test_online_skip_tied:SplitReward"},
        "buffer": {"evolve": False}, "budget": 1.0, "steps_per_segment": 2,
    })  # fmt: skip
    seeds = seed_records(PROMPTS)
    store = RunStore(str(tmp_path / "runs"), "r")
    ctx = SimpleNamespace(
        iteration=1, artifact="online", seed=0, scratch=str(tmp_path / "scratch"),
        run=SimpleNamespace(seed=0), progress=lambda _: None, model_dir=lambda _: policy_dir,
        store=store,
    )  # fmt: skip
    online.fn(ctx, config, seeds, seeds.select(["prompt_id"]))
    logged = tmp_path / "runs" / "r" / "iter_1" / "online_logs" / "rows.jsonl"
    rows = [json.loads(x) for x in logged.read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2]


def test_an_online_tracker_that_is_not_installed_is_refused_naming_its_key(monkeypatch) -> None:
    from eva_runtime.errors import ConfigError
    from flows.machine_checks import check_reporters
    from tasks.backends.train.dpo import REPORTERS

    monkeypatch.setitem(REPORTERS, "wandb", ("wandb", ("eva_no_such_module",)))
    with pytest.raises(ConfigError, match="wandb needs the wandb package") as refused:
        check_reporters(["wandb"], "online.solver.report_to")
    assert refused.value.field == "online.solver.report_to"

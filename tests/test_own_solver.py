"""A solver of the user's (``train.solver: {kind: python, ...}``), written by the test as a real
module, trained through the train stage and keyed by its code; and TRL's metrics to the trackers
``train.solver.report_to`` names (refused at the edge when a tracker is not installed)."""

from __future__ import annotations

import json
import os
import textwrap
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError
from transformers import AutoModelForCausalLM, TrainerControl, TrainerState, TrainingArguments
from transformers.integrations import TensorBoardCallback, integration_utils

from eva_runtime.errors import ConfigError, StageError
from flows.cli import main
from flows.config import validate_config
from flows.machine_checks import check_reporters
from tasks.backends.train import load_solver
from tasks.backends.train.dpo import REPORTERS, DPOSolverConfig
from tasks.backends.train.trl_solver import build_trainer
from tasks.context import RunContext
from tasks.keys import components
from tasks.store import RunStore
from tasks.train import TrainConfig, train
from tests.conftest import tiny_run_config

PROMPTS = [f"{a}+{b}=" for a in range(4) for b in range(3)]  # 12 pairs
PAIRS = pa.table({"prompt": PROMPTS, "chosen": ["abc"] * 12, "rejected": ["ghij"] * 12})
FAST = {"learning_rate": 1e-3, "num_train_epochs": 1, "warmup_ratio": 0.0}

NUDGE = '''
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


class Nudge:
    """Copies theta and moves its first weight by ``step`` per pair."""

    def __init__(self, step: float = 0.001, save: bool = True):
        self.step, self.save = step, save

    def train(self, policy_dir, prompts, chosen, rejected, output_dir, seed, progress=None):
        model = AutoModelForCausalLM.from_pretrained(policy_dir)
        with torch.no_grad():
            next(model.parameters()).view(-1)[0] += self.step * len(prompts)
        if self.save:
            model.save_pretrained(output_dir)
            AutoTokenizer.from_pretrained(policy_dir).save_pretrained(output_dir)
        if progress is not None:
            progress(1.0)
        return [{"step": 1.0, "loss": 0.25, "pairs": float(len(prompts)), "seed": float(seed)}]
'''


def _user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str = NUDGE) -> Path:
    """``text`` as an importable module of its own name (modules stay imported between tests)."""
    name = f"eva_user_solver_{uuid.uuid4().hex[:8]}"
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    return path


def _ctx(tmp_path: Path, policy_dir: str, **more: Any) -> SimpleNamespace:
    """What the train stage reads of its context, for a call outside a flow."""
    return SimpleNamespace(
        scratch=str(tmp_path / "scratch"),
        seed=7,
        progress=lambda _: None,
        log=SimpleNamespace(info=lambda *a: None, warning=lambda *a: None),
        model_dir=lambda name: policy_dir,
        **more,
    )


def _first_weight(path: str) -> float:
    model = AutoModelForCausalLM.from_pretrained(path)
    return float(next(model.parameters()).detach().view(-1)[0])


def test_a_python_solver_trains_through_the_stage(policy_dir: str, tmp_path: Path, monkeypatch):
    module = _user_module(tmp_path, monkeypatch).stem
    solver = {"kind": "python", "factory": f"{module}:Nudge", "options": {"step": 0.01}}
    # A solver of its own lays out its own batches: no effective-batch check on it.
    assert TrainConfig(solver=solver, launcher="accelerate", num_processes=3).processes == 3
    config = TrainConfig(solver=solver)
    out = train.fn(_ctx(tmp_path, policy_dir), config, pairs=PAIRS)
    assert _first_weight(out.model_dir) == pytest.approx(_first_weight(policy_dir) + 0.12)
    assert out.table.to_pylist() == [{"step": 1.0, "loss": 0.25, "pairs": 12.0, "seed": 7.0}]
    assert out.stats["pairs"] == 12 and out.stats["steps"] == 1 and out.stats["loss"] == 0.25
    assert "effective_batch" not in out.stats  # a TRL solver's layout, not this one's


def test_a_python_solver_that_saves_nothing_fails_the_stage(
    policy_dir: str, tmp_path: Path, monkeypatch
):
    module = _user_module(tmp_path, monkeypatch).stem
    config = TrainConfig(
        solver={"kind": "python", "factory": f"{module}:Nudge", "options": {"save": False}}
    )
    with pytest.raises(StageError, match=rf"the solver {module}:Nudge saved no checkpoint"):
        train.fn(_ctx(tmp_path, policy_dir), config, pairs=PAIRS)


def test_editing_the_solvers_file_changes_the_train_key(tmp_path: Path, monkeypatch):
    path = _user_module(tmp_path, monkeypatch)
    config = TrainConfig(solver={"kind": "python", "factory": f"{path.stem}:Nudge"})
    assert f"{path.stem}:Nudge" in dict(components(config))
    run = RunContext(root=str(tmp_path / "runs"), run="r", seed=0)
    key = train.cache_key(run, 1, config, "train", {})
    assert train.cache_key(run, 1, config, "train", {}) == key
    path.write_text(path.read_text().replace("self.step * len(prompts)", "self.step"))
    assert train.cache_key(run, 1, config, "train", {}) != key


def test_a_bad_solver_path_is_refused_in_one_line(tmp_path: Path, capsys) -> None:
    bad = {"kind": "python", "factory": "eva_no_such_module:Solver"}
    with pytest.raises(ConfigError) as info:
        validate_config(tiny_run_config(str(tmp_path), train={"solver": bad}))
    err = info.value
    assert err.field == "train.solver.factory" and "PYTHONPATH" in (err.hint or "")
    assert str(err).startswith("train.solver.factory: cannot import module 'eva_no_such_module'")
    assert main(["config", "--set", f"train.solver={json.dumps(bad)}"]) == 2
    printed = capsys.readouterr().err.strip()
    assert printed.startswith("eva: error: train.solver.factory: cannot import module")
    assert len(printed.splitlines()) == 1


def test_options_the_solver_refuses_are_refused_at_the_edge(tmp_path: Path, monkeypatch):
    from flows.inputs import check_inputs

    module = _user_module(tmp_path, monkeypatch).stem
    solver = {"kind": "python", "factory": f"{module}:Nudge", "options": {"stride": 2}}
    config = validate_config(tiny_run_config(str(tmp_path), train={"solver": solver}))
    with pytest.raises(ConfigError, match=r"^train\.solver\.options: .*'stride'"):
        check_inputs(config)


BROKEN = """
class Fails:
    def __init__(self):
        raise RuntimeError("solver init failed: no GPU here")


def nothing():
    return None


def not_a_solver():
    return {"train": "a dict, not a solver"}
"""


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("Fails", "{f} raised RuntimeError: solver init failed: no GPU here (eva builds each "),
        ("nothing", "{f} returned None (it must build a solver: an object with train())"),
        ("not_a_solver", "{f} built a dict, which has no train() (it must build a solver: an "),
    ],
)
def test_a_solver_that_fails_to_build_or_builds_no_solver_is_refused_at_the_edge(
    tmp_path: Path, monkeypatch, name, says
):
    # The first used to end in a traceback from check_inputs, the second in an AttributeError
    # at the train stage, after the run had generated and scored.
    from flows.inputs import check_inputs

    factory = f"{_user_module(tmp_path, monkeypatch, BROKEN).stem}:{name}"
    solver = {"kind": "python", "factory": factory}
    config = validate_config(tiny_run_config(str(tmp_path), train={"solver": solver}))
    with pytest.raises(ConfigError) as refused:
        check_inputs(config)
    assert refused.value.field == "train.solver.factory"
    line = refused.value.line()
    assert line.startswith("train.solver.factory: " + says.format(f=factory)), line
    assert "\n" not in line


def test_every_field_that_takes_a_component_of_yours_says_what_it_builds() -> None:
    # The edge checks what a factory built against the field's Builds; a field without one
    # would let a factory that returns None through.
    import typing

    from pydantic import BaseModel

    from flows.config import OnlineRunConfig, RunConfig
    from tasks.backends.python import Builds, PythonComponent

    def models_in(annotation: Any) -> list[type[BaseModel]]:
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return [annotation]
        return [m for arg in typing.get_args(annotation) for m in models_in(arg)]

    seen: dict[str, Any] = {}

    def visit(model: type[BaseModel], prefix: str) -> None:  # the classes, optional sections too
        for name, field in model.model_fields.items():
            inner = models_in(field.annotation)
            if PythonComponent in inner:
                roles = [m for m in field.metadata if isinstance(m, Builds)]
                seen[prefix + name] = roles[0].methods if roles else None
            for sub in inner:
                if sub is not PythonComponent:
                    visit(sub, f"{prefix}{name}.")

    visit(RunConfig, "")
    visit(OnlineRunConfig, "")
    assert seen == {
        "prompts.source": ("draw",),
        "heldout.source": ("draw",),
        "bootstrap.builder": ("build",),
        "annotate.reward": ("score",),
        "evolve.evolver": ("evolve",),
        "complexity.judge": ("score",),
        "train.solver": ("train",),
        "evaluate.reward": ("score",),
        "evaluate.judge.reference.heldout.source": ("draw",),
        "online.reward": ("score",),
        "online.evolver": ("evolve",),
    }


# --- report_to ----------------------------------------------------------------------------------


def test_report_to_is_validated_and_left_out_of_the_key_while_empty() -> None:
    from tasks.keys import keyed_config

    assert DPOSolverConfig().model_dump()["report_to"] == []  # the dump records it
    assert "report_to" not in keyed_config(TrainConfig())["solver"]  # the key leaves it out
    on = DPOSolverConfig(report_to=["tensorboard"])
    assert keyed_config(on)["report_to"] == ["tensorboard"]  # set: it reruns training
    run = RunContext(root="/tmp/runs", run="r", seed=0)
    off_key = train.cache_key(run, 1, TrainConfig(), "train", {})
    assert train.cache_key(run, 1, TrainConfig(solver=on), "train", {}) != off_key
    with pytest.raises(ValidationError, match="name each tracker"):
        DPOSolverConfig(report_to=["all"])
    with pytest.raises(ValidationError, match=r"unknown tracker 'tensorbored'; one of .*wandb"):
        DPOSolverConfig(report_to=["tensorbored"])


def test_a_tracker_that_is_not_installed_is_refused_in_one_line(monkeypatch) -> None:
    monkeypatch.setitem(REPORTERS, "tensorboard", ("tensorboard", ("eva_no_such_module",)))
    with pytest.raises(ConfigError) as info:
        check_reporters(["tensorboard"])
    assert str(info.value) == (
        "train.solver.report_to: tensorboard needs the tensorboard package, which is not "
        "installed (pip install tensorboard on every machine that trains, or drop tensorboard)"
    )
    check_reporters([])  # the default reports to none: nothing to check
    check_reporters(["kubeflow"])  # configured by its environment: no package


def test_the_edge_refuses_a_run_whose_tracker_is_missing(tmp_path: Path, monkeypatch) -> None:
    from flows.inputs import check_inputs

    monkeypatch.setitem(REPORTERS, "wandb", ("wandb", ("eva_no_such_module",)))
    cfg = tiny_run_config(str(tmp_path))
    cfg["train"]["solver"]["report_to"] = ["wandb"]
    with pytest.raises(ConfigError, match=r"^train\.solver\.report_to: wandb needs the wandb "):
        check_inputs(validate_config(cfg))


class _Recorder(TensorBoardCallback):
    """TensorBoard's callback without tensorboard: writes each log row as JSON to the folder
    eva points it at, so the test sees what reached the tracker and where."""

    def __init__(self) -> None:  # no SummaryWriter: the package may not be installed
        self.logging_dir: str | None = None

    def on_train_begin(self, args: TrainingArguments, state: TrainerState,
                       control: TrainerControl, **kw: Any) -> None:  # fmt: skip
        assert self.logging_dir is not None, "eva did not say where to log"
        os.makedirs(self.logging_dir, exist_ok=True)

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, Any] | None = None, **kw: Any) -> None:  # fmt: skip
        assert self.logging_dir is not None
        with open(os.path.join(self.logging_dir, "rows.jsonl"), "a") as f:
            f.write(json.dumps({"step": state.global_step, **(logs or {})}) + "\n")

    def on_train_end(self, *a: Any, **kw: Any) -> None:
        pass


def test_report_to_reaches_the_trainer_and_tensorboard_logs_in_the_run(
    policy_dir: str, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setitem(integration_utils.INTEGRATION_TO_CALLBACK, "tensorboard", _Recorder)
    solver = DPOSolverConfig(**FAST, effective_batch_size=6, report_to=["tensorboard"])
    trainer = build_trainer(solver, policy_dir, PROMPTS, ["abc"] * 12, ["ghij"] * 12,
                            str(tmp_path / "t"), 0, logging_dir=str(tmp_path / "logs"))  # fmt: skip
    assert trainer.args.report_to == ["tensorboard"]
    (recorder,) = [c for c in trainer.callback_handler.callbacks if isinstance(c, _Recorder)]
    assert recorder.logging_dir == str(tmp_path / "logs")
    # The default reports to none: no tracker's callback at all.
    plain = build_trainer(solver.model_copy(update={"report_to": []}), policy_dir, PROMPTS,
                          ["abc"] * 12, ["ghij"] * 12, str(tmp_path / "p"), 0)  # fmt: skip
    assert plain.args.report_to == []
    assert not any(isinstance(c, TensorBoardCallback) for c in plain.callback_handler.callbacks)
    # Through the stage: the rows land in the run, beside the iteration's artifacts.
    ctx = _ctx(tmp_path, policy_dir, store=RunStore(str(tmp_path / "runs"), "r"), iteration=1,
               artifact="train")  # fmt: skip
    out = train.fn(ctx, TrainConfig(solver=solver), pairs=PAIRS)
    logged = tmp_path / "runs" / "r" / "iter_1" / "train_logs" / "rows.jsonl"
    rows = [json.loads(line) for line in logged.read_text().splitlines()]
    losses = [r for r in rows if "loss" in r]
    assert [r["step"] for r in losses] == out.table.column("step").to_pylist() == [1, 2]


def test_a_remote_run_gets_its_tensorboard_logs_after_training(
    policy_dir: str, tmp_path: Path, monkeypatch, local_s3
) -> None:
    monkeypatch.setitem(integration_utils.INTEGRATION_TO_CALLBACK, "tensorboard", _Recorder)
    solver = DPOSolverConfig(**FAST, effective_batch_size=6, report_to=["tensorboard"])
    store = RunStore("s3://eva-bucket/runs", "r", local_s3)
    ctx = _ctx(tmp_path, policy_dir, store=store, iteration=1, artifact="train")
    train.fn(ctx, TrainConfig(solver=solver), pairs=PAIRS)
    with store.fs.open("eva-bucket/runs/r/iter_1/train_logs/rows.jsonl") as f:
        rows = [json.loads(line) for line in f.read().decode().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2]


def test_tensorboard_writes_event_files_in_the_run(policy_dir: str, tmp_path: Path) -> None:
    """The real callback, where tensorboard (or tensorboardX) is installed."""
    if not integration_utils.is_tensorboard_available():
        pytest.skip("neither tensorboard nor tensorboardX is installed here")
    solver = DPOSolverConfig(**FAST, effective_batch_size=6, report_to=["tensorboard"])
    ctx = _ctx(tmp_path, policy_dir, store=RunStore(str(tmp_path / "runs"), "r"), iteration=0,
               artifact="train")  # fmt: skip
    train.fn(ctx, TrainConfig(solver=solver), pairs=PAIRS)
    logs = tmp_path / "runs" / "r" / "iter_0" / "train_logs"
    assert [p.name for p in logs.iterdir() if p.name.startswith("events.out.tfevents.")]


def test_load_solver_hands_the_logging_dir_to_trl_solvers_only(tmp_path: Path, monkeypatch):
    trl = load_solver(DPOSolverConfig(), str(tmp_path))
    assert getattr(trl, "logging_dir", None) == str(tmp_path)
    module = _user_module(tmp_path, monkeypatch).stem
    config = TrainConfig(solver={"kind": "python", "factory": f"{module}:Nudge"})
    own = load_solver(config.solver, str(tmp_path))
    assert type(own).__name__ == "Nudge" and not hasattr(own, "logging_dir")


def test_a_launched_process_builds_the_solver_from_the_spec(
    policy_dir: str, tmp_path: Path, monkeypatch
) -> None:
    """What every process of ``train.launcher: accelerate`` runs (``launch.main``), here in
    this process: a solver of yours and the logging folder cross the boundary as JSON."""
    from tasks.backends.train.launch import LaunchSpec
    from tasks.backends.train.launch import main as launched

    module = _user_module(tmp_path, monkeypatch).stem
    config = TrainConfig(solver={"kind": "python", "factory": f"{module}:Nudge"})
    pairs_path = tmp_path / "pairs.parquet"
    pq.write_table(PAIRS, pairs_path)
    spec = LaunchSpec(
        solver=config.solver, policy_dir=policy_dir, pairs_path=str(pairs_path),
        output_dir=str(tmp_path / "out"), seed=3, metrics_path=str(tmp_path / "metrics.json"),
        logging_dir=str(tmp_path / "logs"),
    )  # fmt: skip
    assert launched([spec.model_dump_json()]) == 0
    rows = json.loads((tmp_path / "metrics.json").read_text())
    assert rows == [{"step": 1.0, "loss": 0.25, "pairs": 12.0, "seed": 3.0}]
    assert (tmp_path / "out" / "config.json").is_file()

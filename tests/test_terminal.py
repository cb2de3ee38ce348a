"""What `eva run` shows in a terminal: no library bars, a stage's progress and its headline
stats, one line for a failed stage, what to do next; `eva train-node`'s refusals."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Sequence

import pytest

from eva_runtime.progress import TerminalProgress, quiet_library_bars, report
from flows.cli import main
from flows.commands import next_steps
from flows.config import RunConfig
from tasks.stage_log import headline
from tests.conftest import tiny_run_config

PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class RaisingReward:
    """A reward component whose scoring fails the way a user's code does (not an EvaError)."""

    def score(
        self, prompts: Sequence[str], responses: Sequence[Sequence[str]], progress: object = None
    ) -> list[list[float]]:
        raise ZeroDivisionError("the reward divided by zero")


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_prints_a_plain_line_at_most_every_ten_seconds_with_step_loss_and_eta() -> None:
    clock, out, forwarded = _Clock(), io.StringIO(), list[float]()
    progress = TerminalProgress("train iter_1", forwarded.append, stream=out, clock=clock)
    clock.now = 102.0  # the first report, 2 s in: the pace (ETA) is measured from here
    progress(0.1, step=4, total=40)
    clock.now = 105.0
    progress(0.2, step=8, total=40)
    assert out.getvalue() == ""  # under 10 s: nothing yet
    clock.now = 112.0
    progress(0.6, step=24, total=40, loss=2.5)
    clock.now = 113.0
    progress(0.7, step=28, total=40)  # 1 s after the last line: nothing
    clock.now = 130.0
    progress(1.0, step=40, total=40)  # the end prints nothing: the stage's own line follows
    # 0.5 of the work in the 10 s since the first report: the remaining 0.4 takes 8 s.
    assert out.getvalue() == "train iter_1  60% | step 24/40 | loss 2.5 | 12 s, ETA 8 s\n"
    assert forwarded == [0.1, 0.2, 0.6, 0.7, 1.0]  # every call still reaches the UI's bar


def test_on_a_terminal_progress_redraws_one_line_and_erases_it_at_the_end() -> None:
    clock, out = _Clock(), _Terminal()
    progress = TerminalProgress("generate iter_0", stream=out, clock=clock)
    progress(0.0)
    clock.now = 101.0
    progress(0.25)
    clock.now = 101.2  # within half a second of the last line: not redrawn
    progress(0.3)
    clock.now = 102.0
    progress(0.5)
    progress(1.0)
    assert out.getvalue() == (
        "\rgenerate iter_0  25% | 1 s, ETA 3 s\033[K"
        "\rgenerate iter_0  50% | 2 s, ETA 2 s\033[K"
        "\r\033[K"
    )


def test_report_gives_detail_only_to_a_sink_that_shows_it() -> None:
    seen: list[float] = []
    report(seen.append, 0.5, step=2, total=4, loss=1.0)  # a plain callable: the fraction only
    assert seen == [0.5]


def test_library_bars_are_hidden_unless_the_user_asked_for_them() -> None:
    env: dict[str, str] = {"HF_DATASETS_DISABLE_PROGRESS_BARS": "0"}
    quiet_library_bars(env)
    assert env == {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_DATASETS_DISABLE_PROGRESS_BARS": "0"}


def test_a_stage_line_shows_its_headline_stats_else_its_first_scalars() -> None:
    stats = {"score": 0.09512, "solved": 0, "per_category": {"add": 0.1}, "backend_seconds": 0.1}
    assert headline("evaluate", stats) == "score 0.09512, solved 0"
    stats = {"a": 1, "b": {"x": 2}, "c": "x", "d": 0.5, "e": True, "f": 3}
    assert headline("someone_elses", stats) == "a 1, c x, d 0.5, e true"


def test_next_steps_name_the_run_and_the_ui_of_a_lasting_server() -> None:
    config = RunConfig.model_validate(tiny_run_config("/data/my runs", "base"))
    assert next_steps(config, None) == (
        "next: eva show --run base --root '/data/my runs'    "
        "(a stage's rows: add --iteration N --stage NAME)"
    )
    assert next_steps(config, "http://127.0.0.1:4200/").endswith(
        "\n      the run in the Prefect UI: http://127.0.0.1:4200/runs"
    )


def _eva(tmp_path, config: dict) -> subprocess.CompletedProcess[str]:
    """`eva run` in a process of its own (the libraries' bars are decided at its start),
    reporting to the suite's Prefect server, a lasting one for it."""
    from prefect.settings import PREFECT_API_URL

    path = tmp_path / "run.json"
    path.write_text(json.dumps(config))
    env = {**os.environ, "PYTHONPATH": PROJECT, "PREFECT_API_URL": str(PREFECT_API_URL.value())}
    for name in ("HF_HUB_DISABLE_PROGRESS_BARS", "HF_DATASETS_DISABLE_PROGRESS_BARS"):
        env.pop(name, None)
    code = "import flows.cli, sys; sys.exit(flows.cli.main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, "run", "--config", str(path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_a_run_shows_no_library_bars_and_ends_with_what_to_do_next(
    prefect_api, policy_dir, tmp_path
) -> None:
    root = str(tmp_path / "runs")
    theta_0 = {"init_checkpoint": policy_dir}
    done = _eva(tmp_path, tiny_run_config(root, "quiet", iterations=0, bootstrap=theta_0))
    assert done.returncode == 0, done.stderr[-3000:]
    # Before: a "Loading weights" bar for every checkpoint loaded, "Writing model shards" for
    # every one saved (evaluate, generate, train x2, ...).
    assert "Loading weights" not in done.stderr and "Writing model shards" not in done.stderr
    assert "Map" not in done.stderr  # datasets' map bars (TRL's DPO tokenizes with map)
    assert "evaluate setup: score " in done.stderr  # the headline, not ~40 fields
    assert "per_category" not in done.stderr
    assert done.stdout.rstrip().endswith(
        f"next: eva show --run quiet --root {root}    (a stage's rows: add --iteration N "
        "--stage NAME)\n      the run in the Prefect UI: http://127.0.0.1"
        + done.stdout.rstrip().rsplit("http://127.0.0.1", 1)[1]
    )
    assert done.stdout.rstrip().endswith("/runs")


def test_a_failing_stage_ends_the_command_with_one_line_and_its_traceback_in_the_run(
    prefect_api, policy_dir, tmp_path
) -> None:
    root = str(tmp_path / "runs")
    reward = {"kind": "python", "factory": "tests.test_terminal:RaisingReward"}
    theta_0 = {"init_checkpoint": policy_dir}
    config = tiny_run_config(root, "broken", bootstrap=theta_0, annotate={"reward": reward})
    done = _eva(tmp_path, config)
    assert done.returncode == 1  # a crash in the user's code (an EvaError would exit 2)
    log = os.path.join(root, "broken", "logs", "setup-evaluate.log")
    last = done.stderr.rstrip().splitlines()[-1]
    assert last == (
        "eva: error: evaluate of setup failed: ZeroDivisionError: the reward divided by zero "
        f"(full traceback in {log})"
    )
    # Before: four tracebacks through Prefect's engine, 326 lines.
    assert "Traceback" not in done.stderr
    assert len(done.stderr.splitlines()) < 16, done.stderr
    with open(log) as f:
        kept = f.read()
    assert kept.startswith("Traceback") and 'raise ZeroDivisionError("the reward' in kept


def test_ctrl_c_ends_the_command_with_one_line_and_keeps_the_finished_stages(
    prefect_api, tmp_path
) -> None:
    """SIGINT to the command's process group, as a terminal's Ctrl-C, once X_0 is written:
    exit 130 and one line (it was the stage's traceback through Prefect, 65 lines), the run's
    lock released, the finished stage kept for the same command to go on from."""
    import signal
    import time

    from prefect.settings import PREFECT_API_URL

    from tasks.store import RunStore

    root = str(tmp_path / "runs")
    path = tmp_path / "run.json"
    path.write_text(json.dumps(tiny_run_config(root, "stopped")))
    env = {**os.environ, "PYTHONPATH": PROJECT, "PREFECT_API_URL": str(PREFECT_API_URL.value())}
    code = "import flows.cli, sys; sys.exit(flows.cli.main(sys.argv[1:]))"
    eva = subprocess.Popen(
        [sys.executable, "-c", code, "run", "--config", str(path)], cwd=tmp_path, env=env,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    store = RunStore(root, "stopped")
    deadline = time.monotonic() + 120
    while store.read_manifest(None, "prompts") is None:
        assert eva.poll() is None and time.monotonic() < deadline, "no X_0 in 2 minutes"
        time.sleep(0.1)
    os.killpg(eva.pid, signal.SIGINT)
    _, err = eva.communicate(timeout=60)
    assert eva.returncode == 130, err[-3000:]
    assert err.rstrip().splitlines()[-1] == (
        "eva: interrupted (every finished stage is kept: the same command goes on from there)"
    )
    assert "Traceback" not in err
    assert not os.path.exists(os.path.join(root, "stopped", ".lock.json"))
    assert store.read_manifest(None, "prompts") is not None


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--machine-rank", "0"], "argument --machine-rank: machine 0 is the train stage itself"),
        (["--wait", "-1"], "argument --wait: must be > 0 seconds (got -1;"),
    ],
)
def test_train_node_refuses_rank_0_and_a_negative_wait_in_one_line(argv, says, capsys) -> None:
    assert main(["train-node", "--run", "r", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"eva: error: {says}") and err.count("\n") == 1


def test_the_train_stage_shows_its_step_and_loss_on_the_terminal(policy_dir, tmp_path) -> None:
    # Regression: the stage scaled the bar with a plain function, which dropped the solver's
    # step and loss on the way; only percentages reached the terminal.
    import io
    from types import SimpleNamespace

    import pyarrow as pa

    from eva_runtime.progress import TerminalProgress
    from tasks.backends.train.dpo import DPOSolverConfig
    from tasks.train import TrainConfig, train

    out = io.StringIO()
    bar = TerminalProgress("train iter_1", stream=out, interval_s=0.0)
    ctx = SimpleNamespace(
        scratch=str(tmp_path), seed=0, progress=bar, model_dir=lambda name: policy_dir,
        log=SimpleNamespace(info=lambda *a: None),
    )  # fmt: skip
    solver = DPOSolverConfig(learning_rate=1e-3, num_train_epochs=1, effective_batch_size=4)
    pairs = pa.table({"prompt": ["1+2=", "3+4="] * 4, "chosen": ["3", "7"] * 4,
                      "rejected": ["4", "8"] * 4})  # fmt: skip
    train.fn(ctx, TrainConfig(solver=solver), pairs=pairs)
    lines = out.getvalue().splitlines()
    # Step 2 is 100%, which erases the line; the loss shows once the trainer has logged one.
    assert lines == ["train iter_1  50% | step 1/2 | " + lines[0].rsplit(" | ", 1)[1]], lines


def test_a_ctrl_c_prefect_turned_into_its_own_error_still_ends_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Prefect's task engine, interrupted while it creates a task run, reports the crash of a
    run it has not set and raises ValueError('Task run is not set') in the KeyboardInterrupt's
    place (once in CI, in the Ctrl-C test above): the command still ends with its one line and
    130. An error of a run's own, raised without a Ctrl-C, is not taken for one."""
    from flows import commands

    def interrupted_while_creating_a_task_run(args: object) -> int:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise ValueError("Task run is not set") from None  # __context__ is kept

    monkeypatch.setattr(commands, "run", interrupted_while_creating_a_task_run)
    assert main(["run", "--config", "run.yaml"]) == 130
    kept = "every finished stage is kept: the same command goes on from there"
    assert capsys.readouterr().err == f"eva: interrupted ({kept})\n"

    # Prefect logs the flow run's failure with that error: its traceback is left out (the line
    # stays), as a failed stage's is; a run's own error keeps its traceback.
    import logging

    def logged(error: BaseException) -> logging.LogRecord:
        record = logging.LogRecord("prefect.flow_runs", logging.ERROR, __file__, 1,
                                   "Encountered exception during execution", None,
                                   (type(error), error, error.__traceback__))  # fmt: skip
        for quiet in logging.getLogger("prefect.flow_runs").filters:
            quiet.filter(record)
        return record

    try:
        interrupted_while_creating_a_task_run(None)
    except ValueError as error:
        assert logged(error).exc_info is None
    assert logged(ValueError("a run's own error")).exc_info is not None

    def failing(args: object) -> int:
        raise ValueError("a run's own error")

    monkeypatch.setattr(commands, "run", failing)
    with pytest.raises(ValueError, match="a run's own error"):
        main(["run", "--config", "run.yaml"])

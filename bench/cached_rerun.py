"""A cached rerun against whatever Prefect API is configured, with heartbeats on and off.

    PREFECT_API_URL=http://127.0.0.1:4299/api python -m bench.cached_rerun [--root DIR]

Runs ``bench.costs``' demo (1,000 prompts, 300-step theta_0) once from an empty root, then
relaunches it three times with flow-run heartbeats on (what eva does against a lasting server)
and three times with them off (what eva does on Prefect's temporary server), and prints each
time. Made to compare API databases: on SQLite a rerun pays the client's 2 s back-off whenever
two writes collide; on PostgreSQL they do not collide (docs/benchmarks.md, section 2).
"""

from __future__ import annotations

import argparse
import shutil
import time

import flows  # noqa: F401  (eva's Prefect defaults, before prefect is imported)
from bench.costs import DEMO, cached_rerun
from flows.api import temporary_server
from flows.config import validate_config


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--root", default="runs-bench/cached-rerun")
    args = ap.parse_args(argv)
    from flows.run import eva_run

    shutil.rmtree(args.root, ignore_errors=True)
    cfg = validate_config({**DEMO.model_dump(mode="json"), "root": args.root, "run": "demo"})
    started = time.perf_counter()
    eva_run(cfg)
    first = time.perf_counter() - started

    on = cached_rerun(cfg, first)
    with temporary_server():  # heartbeats off
        off = cached_rerun(cfg, first)
    print(f"original run {first:.2f} s")
    for label, rerun in (("heartbeats on", on), ("heartbeats off", off)):
        print(
            f"cached rerun, {label}: {rerun['runs']} s, median {100 * rerun['share']:.1f}% of "
            f"it; {rerun['retries_503']} request(s) retried after a 503"
        )


if __name__ == "__main__":
    main()

"""A cached rerun of the demo against one Prefect API, with flow-run heartbeats on and off.

    python -m bench.cached_rerun [--server eva|prefect|configured] [--root DIR]

Runs ``bench.costs``' demo (1,000 prompts, 300-step theta_0) once from an empty root, then
relaunches it three times with flow-run heartbeats on (what eva does against a lasting server)
and three times with them off (what eva does on its temporary server), and prints each time and
the requests the API answered 503 (each retried after 2 s, then 4 s). The API is one of:

* ``eva``: eva's temporary server (``eva_runtime.prefect_server``: SQLite writes begin IMMEDIATE);
* ``prefect``: Prefect's own temporary server (SQLite writes begin DEFERRED and fail on a race);
* ``configured``: ``PREFECT_API_URL``, e.g. a server on PostgreSQL (docs/benchmarks.md, 2).
"""

from __future__ import annotations

import argparse
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager

import flows  # noqa: F401  (eva's Prefect defaults, before prefect is imported)
from bench.costs import DEMO
from bench.costs_timing import cached_rerun
from eva_runtime.prefect_api import no_heartbeats
from flows.config import validate_config


@contextmanager
def _api(server: str) -> Iterator[None]:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    if server == "configured":
        if not PREFECT_API_URL.value():
            raise SystemExit("--server configured needs PREFECT_API_URL")
        yield
    elif server == "eva":
        from eva_runtime.prefect_server import temporary_server

        with temporary_server():
            yield
    else:
        from prefect.server.api.server import SubprocessASGIServer

        with (
            SubprocessASGIServer() as prefect_server,
            temporary_settings(updates={PREFECT_API_URL: prefect_server.api_url}),
        ):
            yield


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--server", choices=["eva", "prefect", "configured"], default="eva")
    ap.add_argument("--root", default="runs-bench/cached-rerun")
    args = ap.parse_args(argv)
    from flows.run import eva_run

    shutil.rmtree(args.root, ignore_errors=True)
    cfg = validate_config({**DEMO.model_dump(mode="json"), "root": args.root, "run": "demo"})
    with _api(args.server):
        started = time.perf_counter()
        eva_run(cfg)
        first = time.perf_counter() - started
        on = cached_rerun(cfg, first)
        with no_heartbeats():
            off = cached_rerun(cfg, first)
    print(f"API: {args.server}; original run {first:.2f} s")
    for label, rerun in (("heartbeats on", on), ("heartbeats off", off)):
        print(
            f"cached rerun, {label}: {rerun['runs']} s, median {100 * rerun['share']:.1f}% of "
            f"it; {rerun['retries_503']} request(s) retried after a 503"
        )


if __name__ == "__main__":
    main()

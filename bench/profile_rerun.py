"""Where a cached rerun's time goes: cProfile of relaunching a finished run.

    python -m bench.profile_rerun [--root runs-bench/costs/full] [--run demo]

Run ``python -m bench.costs`` first; it leaves the finished demo run this relaunches. The
Prefect server is started (and one relaunch made) before profiling, so neither is counted.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import flows  # noqa: F401  (eva's Prefect defaults, before prefect is imported)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--root", default="runs-bench/costs/full")
    ap.add_argument("--run", default="demo")
    ap.add_argument("--lines", type=int, default=40)
    args = ap.parse_args(argv)
    from flows.config import RunConfig
    from flows.run import eva_run
    from flows.runs import stored_config

    config = stored_config(args.root, args.run)
    if not isinstance(config, RunConfig):
        raise SystemExit(f"{args.run} is an online run; profile an offline one")
    eva_run(config)  # warm: server up, modules imported
    profile = cProfile.Profile()
    started = time.perf_counter()
    profile.runcall(eva_run, config)
    print(f"cached rerun: {time.perf_counter() - started:.2f} s")
    pstats.Stats(profile).sort_stats("cumulative").print_stats(args.lines)


if __name__ == "__main__":
    main()

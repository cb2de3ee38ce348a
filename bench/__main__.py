"""``python -m bench [--quick] [--root DIR] [--out DIR]``: the method, compute-matched and cost
benchmarks, one after the other (what ``eva bench`` starts); each module also runs alone
(``python -m bench.method``, ``python -m bench.matched``, ``python -m bench.costs``). The
compute-matched arms start from the method benchmark's base runs under the same root."""

from __future__ import annotations

import argparse
import os
import sys

from bench import costs, matched, method


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--quick", action="store_true", help="one seed, fewer arms, demo size")
    p.add_argument("--root", default="runs-bench", help="where the benchmark runs live")
    p.add_argument("--out", default=os.path.join("docs", "bench"), help="tables and plots")
    args = p.parse_args(argv)
    quick = ["--quick"] if args.quick else []
    method.main([*quick, "--root", args.root, "--out", args.out])
    matched.main([*quick, "--root", args.root, "--out", args.out])
    costs.main([*quick, "--root", os.path.join(args.root, "costs"), "--out", args.out])
    return 0


if __name__ == "__main__":
    sys.exit(main())

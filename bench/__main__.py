"""``python -m bench [--quick] [--root DIR] [--out DIR]``: the method and cost benchmarks, one
after the other (what ``eva bench`` starts); each module also runs alone (``python -m
bench.method``, ``python -m bench.costs``)."""

from __future__ import annotations

import argparse
import os
import sys

from bench import costs, method


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--quick", action="store_true", help="one seed, fewer arms, demo size")
    p.add_argument("--root", default="runs-bench", help="where the benchmark runs live")
    p.add_argument("--out", default=os.path.join("docs", "bench"), help="tables and plots")
    args = p.parse_args(argv)
    quick = ["--quick"] if args.quick else []
    method.main([*quick, "--root", args.root, "--out", args.out])
    costs.main([*quick, "--root", os.path.join(args.root, "costs"), "--out", args.out])
    return 0


if __name__ == "__main__":
    sys.exit(main())

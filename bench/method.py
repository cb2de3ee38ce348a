"""Benchmark: the paper's tables, in miniature, on the built-in world (issue 4, part 1).

    python -m bench.method [--quick] [--seeds 0 1 2] [--root runs-bench] [--out docs/bench]

Design (fixed before looking at any arm):

* Every arm of a seed starts from the same theta_1: theta_0 (SFT on the world) followed by DPO
  on seed split 1 (the paper's theta_0 -> theta_1), computed once per seed in a ``base`` run
  and handed to each arm as ``bootstrap.init_checkpoint``. X_0 and the held-out set depend only
  on the seed, so every arm sees the same ones.
* Same budget for every arm: at most ``PAIR_BUDGET`` pairs per iteration (a seeded subset),
  the same solver, epochs and batch, hence the same number of optimizer steps whenever an arm
  produces at least that many pairs (the tables report the pairs each arm actually had).
* Arms: ``fresh`` (DPO on a new seed split each iteration, "+new seed prompts") and ``eva``
  (Table 2 and, over three iterations, Table 13); ``eva`` under each informativeness metric
  (Table 4); no evolving vs evolving, greedy vs weighted subset (Table 5).
* Reported per arm and iteration: held-out score (mean dense reward of greedy answers), the
  share solved exactly, per-category scores, and the training set's mean difficulty and
  category mix (Table 7 / Figure 6).

Runs are ordinary eva runs under ``--root``: rerunning the benchmark reuses every finished
stage, and any arm can be inspected with ``eva show``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import flows  # noqa: F401  (eva's Prefect defaults, before prefect is imported)
from eva_core import world
from eva_core.informativeness import METRICS
from flows.config import deep_merge

PAIR_BUDGET = 48


@dataclass(frozen=True)
class Arm:
    name: str
    table: str
    iterations: int
    overrides: dict[str, Any] = field(default_factory=dict)


def arms(quick: bool) -> list[Arm]:
    long = 2 if quick else 3
    out = [
        Arm("fresh", "T2/T13", long, {"prompt_strategy": "fresh"}),
        Arm("eva", "T2/T13", long, {}),
    ]
    metrics = ("uniform",) if quick else tuple(m for m in METRICS if m != "a_min")
    out += [Arm(f"metric-{m}", "T4", 1, {"score": {"metric": m}}) for m in metrics]
    out.append(Arm("subset-weighted", "T5", 1, {"prompt_strategy": "subset"}))
    if not quick:
        greedy = {"sample": {"method": "greedy"}}
        out.append(Arm("subset-greedy", "T5", 1, {"prompt_strategy": "subset", **greedy}))
        out.append(Arm("eva-greedy", "T5", 1, greedy))
    return out


def base_config(root: str, seed: int, quick: bool) -> dict[str, Any]:
    size = 200 if quick else 400
    return {
        "root": root,
        "seed": seed,
        "prompts": {"world_size": size},
        "heldout": {"world_size": 300 if quick else 500, "world_distribution": "heldout"},
        "pairs": {"max_pairs": PAIR_BUDGET},
    }


def _iteration_row(store: Any, t: int | None) -> dict[str, Any]:
    ev = store.read_manifest(t, "evaluate")["stats"]
    row = {
        "score": ev["score"],
        "solved": ev["solved"],
        **{f"cat_{k}": v for k, v in ev["per_category"].items()},
    }
    if t is not None:
        gen = store.read_manifest(t, "generate")
        prompts = store.read_table(gen["uri"]).column("prompt").to_pylist()
        row["difficulty"] = round(sum(map(world.difficulty, prompts)) / len(prompts), 3)
        row["categories"] = dict(Counter(map(world.category_of, prompts)))
        row["pairs"] = store.read_manifest(t, "pairs")["stats"]["pairs"]
    return row


def run_seed(root: str, seed: int, quick: bool) -> dict[str, Any]:
    from flows.config import validate_config
    from flows.run import eva_run
    from tasks.store import RunStore

    base = base_config(root, seed, quick)
    cfg = validate_config(deep_merge(base, {"run": f"s{seed}-base", "iterations": 0}))
    eva_run(cfg)
    store = RunStore(cfg.root, cfg.run)
    result: dict[str, Any] = {"theta_0": _iteration_row(store, None)}
    theta1 = _iteration_row(store, 0)
    result["theta_1"] = theta1
    train = store.read_manifest(0, "train")
    assert train is not None, "the base run trains theta_1"
    checkpoint = train["model_uri"]
    for arm in arms(quick):
        started = time.perf_counter()
        arm_cfg = deep_merge(
            base,
            {
                "run": f"s{seed}-{arm.name}",
                "iterations": arm.iterations,
                "iteration0_dpo": False,
                "bootstrap": {"init_checkpoint": checkpoint},
            },
        )
        cfg = validate_config(deep_merge(arm_cfg, arm.overrides))
        eva_run(cfg)
        store = RunStore(cfg.root, cfg.run)
        result[arm.name] = {
            "table": arm.table,
            "seconds": round(time.perf_counter() - started, 1),
            "iterations": [_iteration_row(store, t) for t in range(1, arm.iterations + 1)],
        }
    return result


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="one seed, fewer arms (<= 10 min)")
    ap.add_argument("--seeds", type=int, nargs="+")
    ap.add_argument("--root", default="runs-bench")
    ap.add_argument("--out", default=os.path.join("docs", "bench"))
    args = ap.parse_args()
    seeds = args.seeds or ([0] if args.quick else [0, 1, 2])
    root = os.path.abspath(os.path.join(args.root, "quick" if args.quick else "full"))
    started = time.perf_counter()
    results = {str(s): run_seed(root, s, args.quick) for s in seeds}
    from bench.report import write_method_report

    os.makedirs(args.out, exist_ok=True)
    name = "method-quick" if args.quick else "method"
    with open(os.path.join(args.out, f"{name}.json"), "w") as f:
        json.dump(results, f, indent=1)
    md = write_method_report(
        results, args.out, name, seconds=time.perf_counter() - started, quick=args.quick
    )
    print(md)


if __name__ == "__main__":
    main()

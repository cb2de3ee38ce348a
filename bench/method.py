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
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import flows  # noqa: F401  (eva's Prefect defaults, before prefect is imported)
from eva_core import world
from eva_core.informativeness import METRICS, reward_matrix
from flows.config import ConfigError, apply_overrides, deep_merge, validate_config

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


def base_config(root: str, seed: int, quick: bool, overrides: list[str]) -> dict[str, Any]:
    """The settings every arm shares; ``overrides`` (``a.b=value``) apply to all arms alike."""
    size = 200 if quick else 400
    base = {
        "root": root,
        "seed": seed,
        "prompts": {"world_size": size},
        "heldout": {"world_size": 300 if quick else 500, "world_distribution": "heldout"},
        "pairs": {"max_pairs": PAIR_BUDGET},
    }
    # Overrides change single fields of the config that would run (see flows.config).
    return apply_overrides(validate_config(base).model_dump(mode="json"), overrides)


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
        row.update(_pair_quality(store, t))
    return row


def _pair_quality(store: Any, t: int) -> dict[str, Any]:
    """What the solver was taught: how good the chosen answers were and how far it moved.

    ``sample_reward`` is the mean reward of the N sampled responses on X_t; ``chosen_exact``
    the share of pairs whose chosen response is fully correct (a chosen answer that is still
    wrong teaches the wrong digits as well as the right ones); ``train_margin`` the solver's
    own last logged reward margin (beta-scaled log-ratio, chosen minus rejected),
    ``train_loss`` its last loss (DPO starts at ln 2 = 0.693), and ``chosen_logp`` the mean
    log-probability of the chosen answers in the first and last logged batch: when it falls,
    DPO is pushing probability off the chosen answers too, not only off the rejected ones.
    """
    pairs = store.read_table(store.read_manifest(t, "pairs")["uri"])
    chosen = pairs.column("chosen_reward").to_numpy()
    rewards = store.read_table(store.read_manifest(t, "annotate")["uri"]).column("rewards")
    manifest = store.read_manifest(t, "train")
    train = manifest["stats"]
    log = store.read_table(manifest["uri"])
    logp = log.column("logps/chosen").to_pylist() if "logps/chosen" in log.column_names else []
    return {
        "pairs": len(chosen),
        "sample_reward": round(float(np.nanmean(reward_matrix(rewards))), 3),
        "chosen_exact": round(float((chosen == 1.0).mean()), 3) if len(chosen) else None,
        "steps": train.get("steps"),
        "train_loss": train.get("loss"),
        "train_margin": train.get("rewards/margins"),
        "chosen_logp": [round(logp[0], 3), round(logp[-1], 3)] if logp else None,
    }


def run_seed(
    root: str, seed: int, quick: bool, overrides: list[str], only: list[str] | None
) -> dict[str, Any]:
    from flows.run import eva_run
    from tasks.store import RunStore

    base = base_config(root, seed, quick, overrides)
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
        if only and arm.name not in only:
            continue
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


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="one seed, fewer arms (<= 10 min)")
    ap.add_argument("--seeds", type=int, nargs="+")
    ap.add_argument("--root", default="runs-bench")
    ap.add_argument("--out", default=os.path.join("docs", "bench"))
    ap.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a run setting for every arm (and the base run), e.g. "
        "--set train.solver.learning_rate=5e-4; use with --tag",
    )
    ap.add_argument("--arms", nargs="+", help="run only these arms (default: all)")
    ap.add_argument(
        "--tag", default="", help="name for a variant: its runs and report get their own names"
    )
    args = ap.parse_args(argv)
    try:  # checked first: finding out after the last arm would waste the whole run
        import matplotlib  # noqa: F401
    except ImportError:
        raise SystemExit(
            "eva: error: the benchmark draws its plots with matplotlib: pip install -e '.[bench]'"
        ) from None
    seeds = args.seeds or ([0] if args.quick else [0, 1, 2])
    mode = "quick" if args.quick else "full"
    root = os.path.abspath(os.path.join(args.root, f"{mode}-{args.tag}" if args.tag else mode))
    try:  # a bad --set fails here, in one line, before any arm runs
        validate_config(base_config(root, seeds[0], args.quick, args.overrides))
    except ConfigError as exc:
        raise SystemExit(f"eva: error: {exc}") from None
    started = time.perf_counter()
    results = {str(s): run_seed(root, s, args.quick, args.overrides, args.arms) for s in seeds}
    from bench.report import write_method_report

    os.makedirs(args.out, exist_ok=True)
    name = ("method-quick" if args.quick else "method") + (f"-{args.tag}" if args.tag else "")
    with open(os.path.join(args.out, f"{name}.json"), "w") as f:
        json.dump(results, f, indent=1)
    md = write_method_report(
        results,
        args.out,
        name,
        seconds=time.perf_counter() - started,
        quick=args.quick,
        command="python -m bench.method " + " ".join(sys.argv[1:] if argv is None else argv),
    )
    print(md)


if __name__ == "__main__":
    main()

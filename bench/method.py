"""Benchmark: the paper's tables, in miniature, on the built-in world.

    python -m bench.method [--quick] [--seeds 0 1 2 3 4] [--root runs-bench] [--out docs/bench]

Design (written in docs/benchmarks.md before any arm ran):

* Per seed, a ``base`` run draws X_0 (seed prompts), the held-out set (target prompts, disjoint
  from X_0) and theta_0, and trains theta_1 with the world's solver (the baseline criterion:
  does one solver step on seed prompts help?). Every offline arm starts from that theta_1
  (``bootstrap.init_checkpoint``) and sees the same X_0 and held-out set.
* Equal training: exactly ``PAIR_BUDGET`` (K) pairs per iteration for every arm, hence the same
  optimizer steps: a seeded subset of K when an arm has more; when it has fewer, the arm reruns
  with its own source grown (``Arm.grown``, ``run_arm``) until every iteration reaches K. Every
  row reports the responses the arm generated (creator rollouts included) and the growth.
* Arms: ``fresh`` (+new seed prompts), ``eva`` and ``target`` (the upper bound: new prompts
  from the target distribution) over several iterations (Tables 2 and 13); ``eva`` under each
  informativeness metric (Table 4); no evolving vs evolving, greedy vs weighted (Table 5);
  the null controls (uniform selection, random evolution, no evolution);
  ``eva-previous`` (creator_rollouts=previous); per paper solver (DPO, SimPO, ORPO, SPPO), its
  own theta_1 from theta_0 and one iteration of fresh and eva (Table 2); online RLOO with and
  without the buffer from theta_0 on |D| = ``ONLINE_SEEDS`` prompts of X_0, evaluated after
  every 1x of the prompt budget (Table 1).
* Reported per arm and iteration: held-out score (mean dense reward of greedy answers), share
  solved, per-category scores, the paired Δ from the arm's starting model, and the training
  set's mean difficulty and category mix (Table 7 / Figure 6); every claim judged by the
  pre-registered rule (``bench.claims``).
* ``--quick``: seed 0 at the full run's sizes, fewer arms and iterations, so its numbers are the
  full run's for those arms.

Runs are ordinary eva runs under ``--root``: rerunning the benchmark reuses every finished
stage, and any arm can be inspected with ``eva show``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any

import flows  # noqa: F401  (eva's Prefect defaults, before prefect is imported)
from bench.arms import WINDOW, Baseline, baseline_run, start_from, world_sizes
from bench.method_arms import PAIR_BUDGET, Arm, arm_config, arms, base_config
from bench.method_results import available_pairs, iteration_row, model_path
from flows.config import ConfigError, OnlineRunConfig, load_config, validate_config
from flows.config_layers import deep_merge

TOPUP_FACTORS = (1.0, 1.5, 2.0, 3.0)  # how far an arm's own source grows to reach K
ONLINE_SEEDS = 1000


def _offline(
    base: dict[str, Any],
    name: str,
    overrides: dict[str, Any],
    baseline: Baseline | None = None,
    topup: float = 1.0,
) -> Any:
    """Run one offline arm (or base run) to completion; returns its store."""
    from flows.run import eva_run
    from tasks.store import RunStore

    cfg = arm_config(base, name, overrides)
    if baseline is None:
        eva_run(cfg)
    else:
        baseline_run(cfg, baseline, topup)
    return RunStore(cfg.root, cfg.run)


def run_arm(base: dict[str, Any], name: str, arm: Arm, overrides: dict[str, Any]) -> Any:
    """Run an arm so that every iteration trains exactly K pairs: when one yields fewer, rerun
    the arm with its own source grown (``Arm.grown``) until none does; returns the store and
    the factor it took (rerunning keeps every stage the growth did not change)."""
    size = int(base["prompts"]["source"]["options"]["size"])
    for factor in TOPUP_FACTORS:
        if arm.topup == "split" and factor > WINDOW:  # a split grows inside its window only
            break
        used = factor
        grown = deep_merge(overrides, arm.grown(factor, size))
        split = factor if arm.topup == "split" else 1.0
        store = _offline(base, name, grown, arm.baseline, split)
        its = range(1, int(overrides.get("iterations", arm.iterations)) + 1)
        if all(available_pairs(store, t) >= PAIR_BUDGET for t in its):
            break
    return store, used


def seed_base(
    root: str, seed: int, quick: bool, overrides: list[str], theta0: str | None
) -> tuple[dict[str, Any], Any, float]:
    """The seed's base run (X_0, held-out set, theta_0 -> theta_1 on K pairs), X_0 grown until
    it yields K: the settings every arm of the seed shares, the base run's store and the
    factor X_0 grew by (``bench.matched`` starts from the same base runs)."""
    base = base_config(root, seed, quick, overrides)
    if theta0 is not None:
        base = deep_merge(base, {"bootstrap": start_from(theta0)})
    size = int(base["prompts"]["source"]["options"]["size"])
    for factor in TOPUP_FACTORS:  # theta_1 trains K pairs too: X_0 grows when it yields fewer
        if factor != 1.0:
            base = deep_merge(base, world_sizes(round(size * factor)))
        store = _offline(base, f"s{seed}-base", {"iterations": 0})
        if available_pairs(store, 0) >= PAIR_BUDGET:
            break
    return base, store, factor


def run_seed(
    root: str,
    seed: int,
    quick: bool,
    overrides: list[str],
    only: list[str] | None,
    theta0: str | None = None,
    arm_list: list[Arm] | None = None,
) -> dict[str, Any]:
    """Every arm of one seed (``arm_list``, default the benchmark's); from ``theta0`` when given
    (the first seed's), else from the world's SFT with this seed."""
    base, store, factor = seed_base(root, seed, quick, overrides, theta0)
    result: dict[str, Any] = {
        "theta_0": {**iteration_row(store, None), "model": model_path(store, None)},
        "theta_1": {**iteration_row(store, 0), "base": "theta_0", "topup": factor},
    }
    theta0, starts = model_path(store, None), {"theta_1": model_path(store, 0)}
    for arm in arm_list or arms(quick):
        if only and arm.name not in only:
            continue
        if arm.start not in starts:  # a paper solver's own theta_0 -> theta_1 (Table 2)
            solver = arm.overrides["train"]
            s = _offline(base, f"s{seed}-base-{arm.start}", {
                "iterations": 0, "bootstrap": start_from(theta0), "train": solver,
            })  # fmt: skip
            starts[arm.start] = model_path(s, 0)
            result[arm.start] = {**iteration_row(s, 0), "base": "theta_0"}
        started = time.perf_counter()
        store, factor = run_arm(base, f"s{seed}-{arm.name}", arm, {
            "iterations": arm.iterations,
            "iteration0_dpo": False,
            "bootstrap": start_from(starts[arm.start]),
            **arm.overrides,
        })  # fmt: skip
        result[arm.name] = {
            "table": arm.table,
            "base": arm.start,
            "topup": factor,
            "seconds": round(time.perf_counter() - started, 1),
            "iterations": [iteration_row(store, t) for t in range(1, arm.iterations + 1)],
        }
    if not only or any(a.startswith("online") for a in only):
        result.update(run_online(root, seed, quick, theta0, base))
    return result


def online_config(root: str, seed: int, evolve: bool, budget: float, base: dict[str, Any]) -> Any:
    """Online RLOO from theta_0 on the first ``ONLINE_SEEDS`` prompts of X_0, evaluated on the
    offline arms' held-out set; one segment per 1x of the prompt budget."""
    from tasks.store import RunStore

    setup = RunStore(base["root"], f"s{seed}-base")
    world = load_config(None, None, OnlineRunConfig)
    solver = world.online.solver
    per_step = min(solver.prompts_per_step, ONLINE_SEEDS)  # a step never exceeds 1x the budget
    per_x = math.ceil(ONLINE_SEEDS / per_step)
    return validate_config(
        deep_merge(
            world.model_dump(mode="json"),
            {
                "run": f"s{seed}-online-{'eva' if evolve else 'rloo'}",
                "root": root,
                "seed": seed,
                "prompts": {"path": _uri(setup, "prompts"), "limit": ONLINE_SEEDS},
                "heldout": {"path": _uri(setup, "heldout")},
                "bootstrap": start_from(model_path(setup, None)),
                "online": {
                    "budget": budget,
                    "steps_per_segment": per_x,
                    "solver": {"prompts_per_step": per_step},
                    "buffer": {"evolve": evolve},
                },
            },
        ),
        OnlineRunConfig,
    )


def run_online(
    root: str, seed: int, quick: bool, theta0: str, base: dict[str, Any]
) -> dict[str, Any]:
    from flows.online import eva_online
    from tasks.store import RunStore

    out: dict[str, Any] = {}
    for evolve, budget in ((False, 1.0 if quick else 6.0), (True, 1.0 if quick else 3.0)):
        cfg = online_config(root, seed, evolve, budget, base)
        started = time.perf_counter()
        rows = eva_online(cfg)
        store = RunStore(cfg.root, cfg.run)
        out["online-eva" if evolve else "online-rloo"] = {
            "table": "T1",
            "base": "theta_0",
            "seconds": round(time.perf_counter() - started, 1),
            "iterations": [
                {**iteration_row(store, None, segment=s), **_online_cells(row)}
                for s, row in enumerate(rows[1:], start=1)
            ],
        }
    return out


def _uri(store: Any, artifact: str) -> str:
    manifest = store.read_manifest(None, artifact)
    assert manifest is not None, f"{store.base}: no {artifact}"
    return str(store.absolute(manifest["uri"]))


def _online_cells(row: dict[str, Any]) -> dict[str, Any]:
    return {k: row[k] for k in ("budget", "phase", "buffer", "mean_reward", "children")}


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
    seeds = args.seeds or ([0] if args.quick else [0, 1, 2, 3, 4])
    mode = "quick" if args.quick else "full"
    root = os.path.abspath(os.path.join(args.root, f"{mode}-{args.tag}" if args.tag else mode))
    try:  # a bad --set fails here, in one line, before any arm runs
        validate_config(base_config(root, seeds[0], args.quick, args.overrides))
    except ConfigError as exc:
        raise SystemExit(f"eva: error: {exc}") from None
    started = time.perf_counter()
    # One theta_0 for every seed (the first seed's SFT), as the paper post-trains one base
    # model: the seeds replicate the post-training (docs/benchmarks.md, candidate C4).
    results: dict[str, Any] = {}
    theta0: str | None = None
    for s in seeds:
        results[str(s)] = run_seed(root, s, args.quick, args.overrides, args.arms, theta0)
        model = results[str(s)]["theta_0"].pop("model")  # a path on this machine: not reported
        theta0 = theta0 or model
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

"""Benchmark (issue 32, part 3): do partial-credit pairs let eva teach a skill theta_1 cannot
yet sample?

    python -m bench.reach [--seeds 0 1 2 3 4] [--root runs-bench]

Design (pre-registered in docs/benchmarks.md, "Reach"): per seed, from ``bench.method``'s
theta_1 (same root, same base runs), ``eva`` with the world's exact-chosen pairs (the
retention runs' own, reused), ``eva-partial`` and ``fresh-partial`` with best-vs-worst pairs
whatever the best scores, two iterations each at K pairs. Every checkpoint is scored on the
held-out set and on R, three-operand sums no arm of the seed trained on.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any

import numpy as np

import flows  # noqa: F401  (eva's Prefect defaults, before prefect is imported)
from bench.arms import start_from
from bench.method import run_arm, seed_base
from bench.method_arms import Arm
from bench.method_results import iteration_row, model_path

ITERATIONS = 2
PARTIAL = {"pairs": {"min_chosen_reward": None}}
ARMS = (
    Arm("eva", "T2/T13", ITERATIONS, {}),
    Arm("eva-partial", "reach", ITERATIONS, PARTIAL),
    Arm("fresh-partial", "reach", ITERATIONS, PARTIAL, baseline="fresh"),
)
TARGET = {"categories": {"add": 1}, "operands": [3, 3], "digits": [1, 2]}
TARGET_SIZE, TARGET_DRAW = 500, 3000
T_CRITICAL = 2.776  # two-sided 95%, df 4 (five seeds)


def trained_prompts(store: Any) -> set[str]:
    """Every prompt a run trained on or started from: X_0 and each iteration's X_t."""
    out: set[str] = set()
    for t in range(ITERATIONS + 1):
        manifest = store.read_manifest(t, "generate")
        if manifest is not None:
            out |= set(store.read_table(manifest["uri"]).column("prompt").to_pylist())
    return out


def on_target(model_dir: str, prompts: list[str], n: int = 1) -> dict[str, float]:
    """The checkpoint on ``prompts``: greedy answers' mean world reward and exact share
    (``n`` = 1), or the share of prompts with an exact answer among ``n`` samples (pass@n)."""
    from eva_world import world
    from tasks.backends.generate.transformers import TransformersGeneration

    greedy = n == 1
    backend = TransformersGeneration(
        temperature=0.0 if greedy else 0.7, max_new_tokens=10, batch_size=512
    )
    answers = backend.load(model_dir).generate(prompts, n=n, seed=0)
    rewards = np.array(
        [[world.reward(p, a) for a in rs] for p, rs in zip(prompts, answers, strict=True)]
    )
    if not greedy:
        return {f"pass@{n}": round(float((rewards == 1.0).any(axis=1).mean()), 4)}
    return {
        "target": round(float(rewards.mean()), 4),
        "target_exact": round(float((rewards == 1.0).mean()), 4),
    }


def run_seed(root: str, seed: int, theta0: str | None) -> tuple[dict[str, Any], str]:
    from eva_world import world
    from eva_world.components import distribution_of

    base, base_store, _ = seed_base(root, seed, False, [], theta0)
    theta1 = model_path(base_store, 0)
    stores: dict[str, Any] = {}
    rows: dict[str, Any] = {}
    for arm in ARMS:
        started = time.perf_counter()
        store, factor = run_arm(base, f"s{seed}-{arm.name}", arm, {
            "iterations": arm.iterations, "iteration0_dpo": False,
            "bootstrap": start_from(theta1), **arm.overrides,
        })  # fmt: skip
        stores[arm.name] = store
        rows[arm.name] = {
            "topup": factor,
            "seconds": round(time.perf_counter() - started, 1),
            "iterations": [iteration_row(store, t) for t in range(1, arm.iterations + 1)],
        }
    seen = trained_prompts(base_store).union(*(trained_prompts(s) for s in stores.values()))
    dist = distribution_of(TARGET)
    held = world.sample_prompts(dist, TARGET_SIZE, TARGET_DRAW, exclude=seen)
    result: dict[str, Any] = {
        "target_set": {"size": len(held), "trained_on": sum(map(dist.contains, seen))},
        "theta_1": {**on_target(theta1, held), **on_target(theta1, held, n=6)},
    }
    for name, store in stores.items():
        for t, row in enumerate(rows[name]["iterations"], start=1):
            row.update(on_target(model_path(store, t), held))
        result[name] = rows[name]
    return result, model_path(base_store, None)


def summarize(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Per arm and iteration: held-out, R score and R exact share; for eva-partial its paired
    R difference from eva and from fresh-partial (mean, sd, t), and the pre-registered verdict
    at the last iteration."""
    seeds = sorted(results)
    out = []
    for arm in ARMS:
        for t in range(ITERATIONS):
            row: dict[str, Any] = {"arm": arm.name, "iteration": t + 1, "seeds": len(seeds)}
            for measure in ("score", "target", "target_exact"):
                mine = [results[s][arm.name]["iterations"][t][measure] for s in seeds]
                row[measure] = round(float(np.mean(mine)), 4)
                row[f"{measure}_sd"] = round(float(np.std(mine, ddof=1)), 4)
            if arm.name == "eva-partial":
                for other in ("eva", "fresh-partial"):
                    diff = [
                        results[s]["eva-partial"]["iterations"][t]["target"]
                        - results[s][other]["iterations"][t]["target"]
                        for s in seeds
                    ]
                    sd = float(np.std(diff, ddof=1)) if len(diff) > 1 else math.nan
                    row[f"target_vs_{other}"] = round(float(np.mean(diff)), 4)
                    row[f"target_vs_{other}_sd"] = round(sd, 4)
                    row[f"target_vs_{other}_t"] = (
                        round(float(np.mean(diff)) / (sd / math.sqrt(len(diff))), 2)
                        if sd > 0
                        else None
                    )
                if t == ITERATIONS - 1 and len(seeds) >= 5:
                    row["reaches"] = all(
                        (row[f"target_vs_{o}_t"] or 0) > T_CRITICAL
                        for o in ("eva", "fresh-partial")
                    )
            out.append(row)
    return out


def report(rows: list[dict[str, Any]], out_dir: str, command: str, seconds: float) -> str:
    from bench.report import md_table

    head = ["arm", "t", "held-out (sd)", "R score (sd)", "R exact (sd)",
            "R vs eva (sd, t)", "R vs fresh-partial (sd, t)", "reaches"]  # fmt: skip

    def vs(r: dict[str, Any], other: str) -> str:
        if f"target_vs_{other}" not in r:
            return "-"
        t = r[f"target_vs_{other}_t"]
        return f"{r[f'target_vs_{other}']:+.3f} ({r[f'target_vs_{other}_sd']:.3f}, {t})"

    body = [
        [r["arm"], str(r["iteration"]), f"{r['score']:.3f} ({r['score_sd']:.3f})",
         f"{r['target']:.3f} ({r['target_sd']:.3f})",
         f"{r['target_exact']:.3f} ({r['target_exact_sd']:.3f})",
         vs(r, "eva"), vs(r, "fresh-partial"), str(r.get("reaches", "-"))]
        for r in rows
    ]  # fmt: skip
    md = (
        f"# Reach (issue 32)\n\n`{command}`, {seconds / 60:.1f} min.\n\n"
        + "\n".join(md_table(head, body))
        + "\n"
    )
    with open(os.path.join(out_dir, "reach.md"), "w") as f:
        f.write(md)
    return md


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--root", default="runs-bench")
    ap.add_argument("--out", default=os.path.join("docs", "bench"))
    args = ap.parse_args(argv)
    root = os.path.abspath(os.path.join(args.root, "full"))
    started = time.perf_counter()
    results: dict[str, Any] = {}
    theta0: str | None = None
    for seed in args.seeds:
        results[str(seed)], model = run_seed(root, seed, theta0)
        theta0 = theta0 or model
        print(json.dumps({seed: {a: results[str(seed)][a]["iterations"][-1]["target"]
                                 for a in ("eva", "eva-partial", "fresh-partial")}}),
              flush=True)  # fmt: skip
        os.makedirs(args.out, exist_ok=True)
        rows = summarize(results) if len(results) > 1 else []
        with open(os.path.join(args.out, "reach.json"), "w") as f:
            json.dump({"summary": rows, "runs": results}, f, indent=1)
    command = "python -m bench.reach " + " ".join(sys.argv[1:] if argv is None else argv)
    print(report(summarize(results), args.out, command, time.perf_counter() - started))


if __name__ == "__main__":
    main()

"""Benchmark (issue 32, part 2): does a mix with more kept prompts keep the seed skill?

    python -m bench.retention [--seeds 0 1 2 3 4] [--root runs-bench]

Design (pre-registered in docs/benchmarks.md, "Retention"): per seed, from ``bench.method``'s
theta_1 (same root, same base runs), ``fresh`` and ``eva`` as ``bench.method``'s full-mode arms
(so they are reused from its root when it ran) and eva with 50% and 20% evolved prompts, three
iterations each at K pairs. Every checkpoint is scored on the run's held-out (target) set and
on S, a seed-distribution set that excludes every prompt any arm of the seed trained on.
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
from bench.arms import BENCH_SEED_DISTRIBUTION, start_from
from bench.method import run_arm, seed_base
from bench.method_arms import Arm
from bench.method_results import iteration_row, model_path

ITERATIONS = 3
ARMS = (
    Arm("fresh", "T2/T13", ITERATIONS, baseline="fresh"),
    Arm("eva", "T2/T13", ITERATIONS, {}),
    Arm("eva-mix50", "retention", ITERATIONS, {"mix": {"ratio_evolved": 0.5}}),
    Arm("eva-mix20", "retention", ITERATIONS, {"mix": {"ratio_evolved": 0.2}}),
)
SEED_SET_SIZE, SEED_SET_DRAW = 500, 2000
T_CRITICAL = 2.776  # two-sided 95%, df 4 (five seeds)


def trained_prompts(store: Any) -> set[str]:
    """Every prompt a run trained on or started from: X_0 and each iteration's X_t."""
    out: set[str] = set()
    for t in range(ITERATIONS + 1):
        manifest = store.read_manifest(t, "generate")
        if manifest is not None:
            out |= set(store.read_table(manifest["uri"]).column("prompt").to_pylist())
    return out


def seed_skill(model_dir: str, prompts: list[str]) -> float:
    """Mean world reward of the checkpoint's greedy answers on ``prompts``."""
    from eva_world import world
    from tasks.backends.generate.transformers import TransformersGeneration

    generator = TransformersGeneration(temperature=0.0, max_new_tokens=10, batch_size=512).load(
        model_dir
    )
    answers = generator.generate(prompts, n=1, seed=0)
    return float(np.mean([world.reward(p, a[0]) for p, a in zip(prompts, answers, strict=True)]))


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
    dist = distribution_of(BENCH_SEED_DISTRIBUTION)
    held = world.sample_prompts(dist, SEED_SET_SIZE, SEED_SET_DRAW, exclude=seen)
    result: dict[str, Any] = {
        "seed_set": {"size": len(held), "excluded": len(seen)},
        "theta_1": {"seed_skill": round(seed_skill(theta1, held), 4)},
    }
    for name, store in stores.items():
        for t, row in enumerate(rows[name]["iterations"], start=1):
            row["seed_skill"] = round(seed_skill(model_path(store, t), held), 4)
        result[name] = rows[name]
    return result, model_path(base_store, None)


def summarize(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Per arm and iteration: held-out and seed skill, and their paired differences from
    fresh (mean, sd, t), with the pre-registered verdicts at the last iteration."""
    seeds = sorted(results)
    fresh_sd = float(
        np.std([results[s]["fresh"]["iterations"][-1]["seed_skill"] for s in seeds], ddof=1)
    )
    out = []
    for arm in ARMS:
        for t in range(ITERATIONS):
            row: dict[str, Any] = {"arm": arm.name, "iteration": t + 1, "seeds": len(seeds)}
            for measure in ("score", "seed_skill"):
                mine = [results[s][arm.name]["iterations"][t][measure] for s in seeds]
                diff = [
                    m - results[s]["fresh"]["iterations"][t][measure]
                    for m, s in zip(mine, seeds, strict=True)
                ]
                sd = float(np.std(diff, ddof=1)) if len(diff) > 1 else math.nan
                row[measure] = round(float(np.mean(mine)), 4)
                row[f"{measure}_sd"] = round(float(np.std(mine, ddof=1)), 4)
                row[f"{measure}_vs_fresh"] = round(float(np.mean(diff)), 4)
                row[f"{measure}_vs_fresh_sd"] = round(sd, 4)
                row[f"{measure}_t"] = (
                    round(float(np.mean(diff)) / (sd / math.sqrt(len(diff))), 2) if sd > 0 else None
                )
            if arm.name != "fresh" and t == ITERATIONS - 1 and len(seeds) >= 5:
                row["keeps_seed_skill"] = row["seed_skill_vs_fresh"] >= -fresh_sd
                row["keeps_gain"] = (row["score_t"] or 0) > T_CRITICAL
            out.append(row)
    return out


def report(rows: list[dict[str, Any]], out_dir: str, command: str, seconds: float) -> str:
    from bench.report import md_table

    head = ["arm", "t", "held-out (sd)", "vs fresh (sd, t)", "seed skill (sd)",
            "vs fresh (sd, t)", "keeps seed skill", "keeps gain"]  # fmt: skip

    def pair(r: dict[str, Any], m: str) -> str:
        if r["arm"] == "fresh":
            return "-"
        return f"{r[f'{m}_vs_fresh']:+.3f} ({r[f'{m}_vs_fresh_sd']:.3f}, {r[f'{m}_t']})"

    body = [
        [r["arm"], str(r["iteration"]), f"{r['score']:.3f} ({r['score_sd']:.3f})",
         pair(r, "score"), f"{r['seed_skill']:.3f} ({r['seed_skill_sd']:.3f})",
         pair(r, "seed_skill"), str(r.get("keeps_seed_skill", "-")),
         str(r.get("keeps_gain", "-"))]
        for r in rows
    ]  # fmt: skip
    md = (
        f"# Retention (issue 32)\n\n`{command}`, {seconds / 60:.1f} min.\n\n"
        + "\n".join(md_table(head, body))
        + "\n"
    )
    with open(os.path.join(out_dir, "retention.md"), "w") as f:
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
        print(json.dumps({seed: {a: results[str(seed)][a]["iterations"][-1] for a in
                                 ("fresh", "eva")}}), flush=True)  # fmt: skip
        os.makedirs(args.out, exist_ok=True)
        rows = summarize(results) if len(results) > 1 else []
        with open(os.path.join(args.out, "retention.json"), "w") as f:
            json.dump({"summary": rows, "runs": results}, f, indent=1)
    command = "python -m bench.retention " + " ".join(sys.argv[1:] if argv is None else argv)
    print(report(summarize(results), args.out, command, time.perf_counter() - started))


if __name__ == "__main__":
    main()

"""Benchmark (issue 32, part 2): does a mix with more kept prompts keep the seed skill?

    python -m bench.retention [--seeds 0 1 2 3 4] [--root runs-bench]

Design (pre-registered in docs/benchmarks.md, "Retention"): per seed, from ``bench.method``'s
theta_1 (same root, same base runs), ``fresh`` and ``eva`` as ``bench.method``'s full-mode arms
(so they are reused from its root when it ran) and eva with 50% and 20% evolved prompts, three
iterations each at K pairs. Every checkpoint is scored on the run's held-out (target) set and
on S, a seed-distribution set that excludes every prompt any arm of the seed trained on.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import flows  # noqa: F401  (eva's Prefect defaults, before prefect is imported)
from bench.arms import BENCH_SEED_DISTRIBUTION
from bench.held_apart import (
    T_CRITICAL,
    paired,
    run_arms,
    run_seeds,
    trained_prompts,
    world_rewards,
    write_report,
)
from bench.method_arms import Arm
from bench.method_results import model_path

ITERATIONS = 3
ARMS = (
    Arm("fresh", "T2/T13", ITERATIONS, baseline="fresh"),
    Arm("eva", "T2/T13", ITERATIONS, {}),
    Arm("eva-mix50", "retention", ITERATIONS, {"mix": {"ratio_evolved": 0.5}}),
    Arm("eva-mix20", "retention", ITERATIONS, {"mix": {"ratio_evolved": 0.2}}),
)
SEED_SET_SIZE, SEED_SET_DRAW = 500, 2000


def seed_skill(model_dir: str, prompts: list[str]) -> float:
    """Mean world reward of the checkpoint's greedy answers on ``prompts``."""
    return round(float(world_rewards(model_dir, prompts).mean()), 4)


def run_seed(root: str, seed: int, theta0: str | None) -> tuple[dict[str, Any], str]:
    from eva_world import world
    from eva_world.components import distribution_of

    base_store, stores, rows = run_arms(root, seed, theta0, ARMS)
    theta1 = model_path(base_store, 0)
    seen = trained_prompts([base_store, *stores.values()], ITERATIONS)
    dist = distribution_of(BENCH_SEED_DISTRIBUTION)
    held = world.sample_prompts(dist, SEED_SET_SIZE, SEED_SET_DRAW, exclude=seen)
    result: dict[str, Any] = {
        "seed_set": {"size": len(held), "excluded": len(seen)},
        "theta_1": {"seed_skill": seed_skill(theta1, held)},
    }
    for name, store in stores.items():
        for t, row in enumerate(rows[name]["iterations"], start=1):
            row["seed_skill"] = seed_skill(model_path(store, t), held)
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
                mean, sd, t_stat = paired(diff)
                row[measure] = round(float(np.mean(mine)), 4)
                row[f"{measure}_sd"] = round(float(np.std(mine, ddof=1)), 4)
                row[f"{measure}_vs_fresh"] = round(mean, 4)
                row[f"{measure}_vs_fresh_sd"] = round(sd, 4)
                row[f"{measure}_t"] = t_stat
            if arm.name != "fresh" and t == ITERATIONS - 1 and len(seeds) >= 5:
                row["keeps_seed_skill"] = row["seed_skill_vs_fresh"] >= -fresh_sd
                row["keeps_gain"] = (row["score_t"] or 0) > T_CRITICAL
            out.append(row)
    return out


def report(results: dict[str, Any], out_dir: str, command: str, seconds: float) -> str:
    rows = summarize(results)
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
    return write_report(out_dir, "retention", "Retention (issue 32)", command, seconds, head, body)


def main(argv: list[str] | None = None) -> None:
    run_seeds("retention", __doc__, argv, run_seed, summarize, report, lambda result: {
        a: result[a]["iterations"][-1] for a in ("fresh", "eva")
    })  # fmt: skip


if __name__ == "__main__":
    main()

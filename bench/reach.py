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

from typing import Any

import numpy as np

import flows  # noqa: F401  (eva's Prefect defaults, before prefect is imported)
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

ITERATIONS = 2
PARTIAL = {"pairs": {"min_chosen_reward": None}}
ARMS = (
    Arm("eva", "T2/T13", ITERATIONS, {}),
    Arm("eva-partial", "reach", ITERATIONS, PARTIAL),
    Arm("fresh-partial", "reach", ITERATIONS, PARTIAL, baseline="fresh"),
)
TARGET = {"categories": {"add": 1}, "operands": [3, 3], "digits": [1, 2]}
TARGET_SIZE, TARGET_DRAW = 500, 3000


def on_target(model_dir: str, prompts: list[str], n: int = 1) -> dict[str, float]:
    """The checkpoint on ``prompts``: greedy answers' mean world reward and exact share
    (``n`` = 1), or the share of prompts with an exact answer among ``n`` samples (pass@n)."""
    rewards = world_rewards(model_dir, prompts, n)
    if n != 1:
        return {f"pass@{n}": round(float((rewards == 1.0).any(axis=1).mean()), 4)}
    return {
        "target": round(float(rewards.mean()), 4),
        "target_exact": round(float((rewards == 1.0).mean()), 4),
    }


def run_seed(root: str, seed: int, theta0: str | None) -> tuple[dict[str, Any], str]:
    from eva_world import world
    from eva_world.components import distribution_of

    base_store, stores, rows = run_arms(root, seed, theta0, ARMS)
    theta1 = model_path(base_store, 0)
    seen = trained_prompts([base_store, *stores.values()], ITERATIONS)
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
                    mean, sd, t_stat = paired(diff)
                    row[f"target_vs_{other}"] = round(mean, 4)
                    row[f"target_vs_{other}_sd"] = round(sd, 4)
                    row[f"target_vs_{other}_t"] = t_stat
                if t == ITERATIONS - 1 and len(seeds) >= 5:
                    row["reaches"] = all(
                        (row[f"target_vs_{o}_t"] or 0) > T_CRITICAL
                        for o in ("eva", "fresh-partial")
                    )
            out.append(row)
    return out


def report(results: dict[str, Any], out_dir: str, command: str, seconds: float) -> str:
    rows = summarize(results)
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
    return write_report(out_dir, "reach", "Reach (issue 32)", command, seconds, head, body)


def main(argv: list[str] | None = None) -> None:
    run_seeds("reach", __doc__, argv, run_seed, summarize, report, lambda result: {
        a: result[a]["iterations"][-1]["target"] for a in ("eva", "eva-partial", "fresh-partial")
    })  # fmt: skip


if __name__ == "__main__":
    main()

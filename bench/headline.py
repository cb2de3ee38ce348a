"""Benchmark (issue 32, part 4): the headline over three iterations and five seeds, each seed
its own theta_0.

    python -m bench.headline [--seeds 0 1 2 3 4] [--root runs-bench] [--out docs/bench]

Design (pre-registered in docs/benchmarks.md, "Full runs"): ``bench.method``'s full-mode world,
sizes and arms, except that every seed starts from its own theta_0 (the world's SFT drawn with
that seed), so the spread over seeds includes theta_0's, and the null controls run three
iterations as eva does. Every offline checkpoint is also scored on S, a seed-distribution set
apart from everything the seed's arms trained on (``bench.retention``'s seed skill).
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import numpy as np

import flows  # noqa: F401  (eva's Prefect defaults, before prefect is imported)
from bench import method
from bench.arms import BENCH_SEED_DISTRIBUTION
from bench.claims import judge
from bench.held_apart import paired, run_seeds, trained_prompts
from bench.method_arms import Arm, arms
from bench.method_results import model_path
from bench.report import md_table, mean_std
from bench.retention import SEED_SET_DRAW, SEED_SET_SIZE, seed_skill

ITERATIONS = 3
ARMS = ("fresh", "eva", "target", "metric-uniform", "random-evolution")
# (paired difference, a, b): each judged at every iteration by section 1's rule.
COMPARISONS = (
    ("eva - fresh", "eva", "fresh"),
    ("eva - metric-uniform (selection)", "eva", "metric-uniform"),
    ("eva - random-evolution (direction)", "eva", "random-evolution"),
    ("target - eva (room left)", "target", "eva"),
)


def headline_arms() -> list[Arm]:
    """``bench.method``'s arms of the headline, each run for ``ITERATIONS`` iterations."""
    return [replace(a, iterations=ITERATIONS) for a in arms(quick=False) if a.name in ARMS]


def run_seed(root: str, seed: int, theta0: str | None) -> tuple[dict[str, Any], str]:
    """One seed from ``theta0``, else its own (``main`` passes none): ``bench.method``'s rows,
    the seed skill of every offline checkpoint on a seed-distribution set none of the seed's
    arms trained on, and the seed's theta_0."""
    from eva_world import world
    from eva_world.components import distribution_of
    from tasks.store import RunStore

    result = method.run_seed(root, seed, False, [], None, theta0, arm_list=headline_arms())
    model = result["theta_0"].pop("model")  # a path on this machine: not reported
    base = RunStore(root, f"s{seed}-base")
    stores = {name: RunStore(root, f"s{seed}-{name}") for name in ARMS}
    seen = trained_prompts([base, *stores.values()], ITERATIONS)
    dist = distribution_of(BENCH_SEED_DISTRIBUTION)
    held = world.sample_prompts(dist, SEED_SET_SIZE, SEED_SET_DRAW, exclude=seen)
    result["seed_set"] = {"size": len(held), "excluded": len(seen)}
    result["theta_0"]["seed_skill"] = seed_skill(model_path(base, None), held)
    result["theta_1"]["seed_skill"] = seed_skill(model_path(base, 0), held)
    for name, store in stores.items():
        for t, row in enumerate(result[name]["iterations"], start=1):
            row["seed_skill"] = seed_skill(model_path(store, t), held)
    return result, model


def summarize(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Per comparison and iteration, on the held-out score and the seed skill: the paired
    difference's mean, sd and t, and the held-out verdict by section 1's rule."""
    seeds = sorted(results)
    out = []
    for label, a, b in COMPARISONS:
        for t in range(1, ITERATIONS + 1):
            row: dict[str, Any] = {"comparison": label, "iteration": t, "seeds": len(seeds)}
            for measure in ("score", "seed_skill"):
                diff = np.asarray([
                    results[s][a]["iterations"][t - 1][measure]
                    - results[s][b]["iterations"][t - 1][measure]
                    for s in seeds
                ])  # fmt: skip
                mean, sd, t_stat = paired(list(diff))
                row[measure] = round(mean, 4)
                row[f"{measure}_sd"] = round(sd, 4)
                row[f"{measure}_t"] = t_stat
                row[f"{measure}_positive"] = int((diff > 0).sum())
                if measure == "score":
                    verdict, row["margin"] = judge(diff)
                    row["verdict"] = verdict.strip("*")
            out.append(row)
    return out


def report(results: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """The section ``write_method_report`` does not write: every comparison at every
    iteration on both measures, each arm's seed skill, and theta_0's own spread."""
    seeds = sorted(results)
    theta0 = [results[s]["theta_0"]["score"] for s in seeds]
    lines = [
        "## Each seed its own theta_0: the controls and the seed skill at every iteration",
        "",
        f"theta_0 held-out, per seed: {', '.join(f'{x:.3f}' for x in theta0)} "
        f"({mean_std(theta0)}).",
        "",
    ]
    body = [
        [
            r["comparison"],
            str(r["iteration"]),
            f"{r['score']:+.3f} ± {r['score_sd']:.3f} (t {r['score_t']}, "
            f"{r['score_positive']} of {r['seeds']} > 0)",
            f"**{r['verdict']}**" if r["verdict"] == "held" else r["verdict"],
            f"{r['seed_skill']:+.3f} ± {r['seed_skill_sd']:.3f} (t {r['seed_skill_t']})",
        ]
        for r in rows
    ]
    head = [
        "paired difference",
        "iteration",
        "held-out",
        "held (> 0 beyond 2 sd)?",
        "seed skill on S",
    ]
    lines += [*md_table(head, body), ""]
    skill = [
        [base, mean_std([results[s][base]["seed_skill"] for s in seeds])]
        for base in ("theta_0", "theta_1")
    ]
    for arm in ARMS:
        for t in range(1, ITERATIONS + 1):
            values = [results[s][arm]["iterations"][t - 1]["seed_skill"] for s in seeds]
            skill.append([f"{arm}, iteration {t}", mean_std(values)])
    lines += ["### Seed skill on S (mean world reward of greedy answers)", ""]
    lines += [*md_table(["checkpoint", "seed skill"], skill), ""]
    return "\n".join(lines)


def write(results: dict[str, Any], out_dir: str, command: str, seconds: float) -> str:
    """``headline.md``: ``bench.method``'s tables and claims, then this benchmark's own."""
    from bench.report import write_method_report

    md = write_method_report(results, out_dir, "headline", seconds, False, command)
    md += "\n" + report(results, summarize(results))
    with open(os.path.join(out_dir, "headline.md"), "w") as f:
        f.write(md)
    return md


def main(argv: list[str] | None = None) -> None:
    run_seeds("headline", __doc__, argv, run_seed, summarize, write, lambda result: {
        a: result[a]["iterations"][-1]["score"] for a in ARMS
    }, folder="headline", shared_theta0=False)  # fmt: skip


if __name__ == "__main__":
    main()

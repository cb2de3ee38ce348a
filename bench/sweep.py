"""Diagnosis: does any solver setting let self-generated pairs teach the tiny policy?

    python -m bench.sweep [--out docs/bench/sweep]

The method benchmark found every arm within noise of theta_1. This runs the quick benchmark's
two main arms (fresh seed prompts and eva, two iterations each, one seed) under each solver
variant below, the same variant for every arm and for theta_0 -> theta_1, and tabulates how far
each step moved the held-out score. It varies only the solver and the pair rule, never the world
or the held-out set. Each variant is an ordinary ``bench.method`` call, so its runs are cached
under ``runs-bench/quick-<tag>`` and its full tables are written beside the summary.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from bench import method
from bench.report import md_table

# tag -> --set overrides (on top of the demo solver: DPO, beta 0.1, lr 2e-4, batch 16, 2 epochs)
VARIANTS: dict[str, list[str]] = {
    "demo": [],
    "epochs-8": ["train.solver.num_train_epochs=8"],
    "lr-5e-4-epochs-4": ["train.solver.learning_rate=5e-4", "train.solver.num_train_epochs=4"],
    "lr-1e-3": ["train.solver.learning_rate=1e-3"],
    "pairs-160": ["prompts.source.options.size=800", "pairs.max_pairs=160"],
    "dpo-nll": ["train.solver.loss_type=[sigmoid, sft]"],
    "dpo-nll-epochs-8": [
        "train.solver.loss_type=[sigmoid, sft]",
        "train.solver.num_train_epochs=8",
    ],
    "exact-chosen": ["pairs.min_chosen_reward=1.0"],
    "exact-chosen-epochs-8": ["pairs.min_chosen_reward=1.0", "train.solver.num_train_epochs=8"],
    "exact-chosen-nll-epochs-8": [
        "pairs.min_chosen_reward=1.0",
        "train.solver.loss_type=[sigmoid, sft]",
        "train.solver.num_train_epochs=8",
    ],
}


def _row(tag: str, overrides: list[str], result: dict) -> list[str]:
    seed = next(iter(result.values()))
    theta0, theta1 = seed["theta_0"]["score"], seed["theta_1"]["score"]
    cells = [f"`{tag}`", " ".join(f"`{o}`" for o in overrides) or "(demo solver)"]
    cells += [f"{theta0:.3f}", f"{theta1 - theta0:+.3f}"]
    for arm in ("fresh", "eva"):
        its = seed[arm]["iterations"]
        cells += [f"{its[-1]['score'] - theta1:+.3f}"]
        cells += [f"{sum(it['chosen_exact'] for it in its) / len(its):.2f}"]
    cells += [f"{seed['theta_1']['train_margin']:.3f}"]
    first, last = seed["theta_1"]["chosen_logp"]
    cells += [f"{first:.2f} -> {last:.2f}"]
    return cells


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", default=os.path.join("docs", "bench", "sweep"))
    ap.add_argument("--root", default="runs-bench")
    ap.add_argument("--only", nargs="+", choices=sorted(VARIANTS), help="run only these")
    args = ap.parse_args(argv)
    started = time.perf_counter()
    rows = []
    for tag, overrides in VARIANTS.items():
        if args.only and tag not in args.only:
            continue
        sets = [x for o in overrides for x in ("--set", o)]
        common = ["--quick", "--arms", "fresh", "eva", "--root", args.root, "--out", args.out]
        method.main([*common, "--tag", tag, *sets])
        with open(os.path.join(args.out, f"method-quick-{tag}.json")) as f:
            rows.append(_row(tag, overrides, json.load(f)))
    head = [
        "variant", "overrides", "theta_0", "theta_0 -> theta_1", "fresh: it 2 - theta_1",
        "fresh: chosen exact", "eva: it 2 - theta_1", "eva: chosen exact",
        "theta_1 final margin", "theta_1 chosen log-prob, first -> last batch",
    ]  # fmt: skip
    md = "\n".join(
        [
            "## Solver sweep (quick, seed 0)",
            "",
            f"`python -m bench.sweep`, {time.strftime('%Y-%m-%d')}, "
            f"{(time.perf_counter() - started) / 60:.1f} min (variants already run come back from "
            "the cache). Held-out score differences; "
            "one seed: read them against the seed-to-seed spread of the full method run.",
            "",
            *md_table(head, rows),
            "",
        ]
    )
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()

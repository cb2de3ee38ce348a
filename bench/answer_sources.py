"""Majority-vote answers for evolved prompts, measured answer-blind on the world (issue 22).

    python -m bench.answer_sources [--parents 500] [--evolutions 4] [--samples 6]
        [--thresholds 3/6 4/6 5/6] [--seeds 0 1 2] [--root runs-bench/world]
        [--out runs-bench/answer_sources]

An LLM rewriter does not know the answers of the prompts it writes; the world's rewriter does.
This script pretends it does not: it draws seed prompts, evolves them with the world's
operators (``WorldRewriter``), samples N answers per child from theta_0 (``bench.world``'s
for each seed, trained once and cached under ``--root``), labels each child by
``eva_core.answers``'s majority vote, and only then asks the world (``world.solve``) whether
the label is right.

Per threshold and per category of the child: the share of children kept, the accuracy of the
kept labels, and for reference ``any correct`` (the share of children with a correct answer
among the N samples: what a verifier would let the solver learn from) and the accuracy of the
unthresholded majority; ``wrong = careless`` is the share of kept wrong labels that are exactly
the careless demonstrator's answer (``world.careless_answer``), the slip theta_0 imitates.
Thresholds are fractions of N (``4/6``): a share is k/N, and a decimal such as 0.67 sits above
4/6 and so asks for 5 of 6. With ``--root`` holding cached theta_0s it runs in well under a
minute per seed on two cores; otherwise each theta_0's SFT comes first (several minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import numpy as np
import torch

from bench import world as bench_world
from bench.report import mean_std
from eva_core.answers import majority_answers
from eva_world import world
from eva_world.components import WorldRewriter
from flows.markdown import md_table
from tasks.backends.generate.transformers import TransformersGeneration

ALL = "all"


def children(parents: int, evolutions: int, seed: int) -> tuple[list[str], list[str]]:
    """Distinct evolved children of seed prompts and the operator that made each."""
    prompts = world.sample_prompts(world.SEED_DISTRIBUTION, parents, seed=seed)
    rewrites = WorldRewriter().evolve(
        prompts, [world.category_of(p) for p in prompts], evolutions, seed
    )
    found: dict[str, str] = {}
    for rs in rewrites:
        for child, method in rs:
            found.setdefault(child, method)
    return list(found), list(found.values())


def measure(
    kids: list[str], samples: list[list[str]], thresholds: list[tuple[str, float]]
) -> list[dict[str, Any]]:
    """One row per (threshold, category): kept share and label accuracy against world.solve."""
    truth = [world.solve(c) for c in kids]
    cats = np.array([world.category_of(c) for c in kids])
    any_correct = np.array(
        [any(r.strip() == t for r in rs) for rs, t in zip(samples, truth, strict=True)]
    )
    rows = []
    for label, threshold in thresholds:
        vote = majority_answers(samples, threshold)
        right = np.array([a == t for a, t in zip(vote.answers, truth, strict=True)])
        careless = np.array(
            [a == world.careless_answer(c) for a, c in zip(vote.answers, kids, strict=True)]
        )
        for cat in [ALL, *world.CATEGORIES]:
            sel = np.ones(len(kids), bool) if cat == ALL else cats == cat
            kept = sel & vote.keep
            rows.append({
                "label": label,
                "threshold": threshold,
                "category": cat,
                "children": int(sel.sum()),
                "kept": int(kept.sum()),
                "kept_share": float(kept.sum() / max(sel.sum(), 1)),
                "label_accuracy": float(right[kept].mean()) if kept.any() else float("nan"),
                "wrong_careless": float(careless[kept & ~right].mean())
                if (kept & ~right).any()
                else float("nan"),
                "majority_accuracy": float(right[sel].mean()) if sel.any() else float("nan"),
                "any_correct": float(any_correct[sel].mean()) if sel.any() else float("nan"),
                "dropped": vote.stats.as_dict() if cat == ALL else None,
            })  # fmt: skip
    return rows


def report(per_seed: dict[int, list[dict[str, Any]]], command: str, minutes: float) -> str:
    """Mean ± sd over seeds for every (threshold, category) row."""
    head = ["threshold", "category", "children", "kept", "label accuracy (kept)",
            "wrong = careless", "majority accuracy (all)", "any correct"]  # fmt: skip
    runs = list(per_seed.values())
    table = []
    for i, first in enumerate(runs[0]):
        col = [run[i] for run in runs]

        def ms(key: str, col: list[dict[str, Any]] = col) -> str:
            return mean_std([float(r[key]) for r in col])

        table.append([
            first["label"], first["category"], f"{np.mean([r['children'] for r in col]):.0f}",
            ms("kept_share"), ms("label_accuracy"), ms("wrong_careless"),
            ms("majority_accuracy"), ms("any_correct"),
        ])  # fmt: skip
    drops = [f"{r['label']}: {r['dropped']}" for r in runs[0] if r["category"] == ALL]
    intro = (
        f"`{command}`: {minutes:.1f} min, {os.cpu_count()} cores; seeds {sorted(per_seed)} "
        "(a theta_0 and a set of children per seed), ± is the sd over seeds."
    )
    return "\n".join([
        "## Majority-vote answers for evolved prompts (answer-blind)", "", intro, "",
        *md_table(head, table), "", f"Dropped (seed {min(per_seed)}): " + "; ".join(drops), "",
    ])  # fmt: skip


def fraction(text: str) -> float:
    """A threshold written as a decimal (0.5) or a fraction of N (4/6)."""
    num, _, den = text.partition("/")
    return float(num) / float(den) if den else float(num)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--parents", type=int, default=500)
    ap.add_argument("--evolutions", type=int, default=4)
    ap.add_argument("--samples", type=int, default=6)
    ap.add_argument("--thresholds", nargs="+", default=["3/6", "4/6", "5/6"])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--root", default=os.path.join("runs-bench", "world"))
    ap.add_argument("--out", default=os.path.join("runs-bench", "answer_sources"))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    started = time.perf_counter()
    thresholds = [(t, fraction(t)) for t in args.thresholds]
    per_seed: dict[int, list[dict[str, Any]]] = {}
    for seed in args.seeds:
        # bench.world's theta_0 for this seed (candidate C1's demonstrations and held-out set).
        heldout = world.sample_prompts(bench_world.SFT_2, bench_world.HELDOUT, seed=1000 + seed)
        policy = bench_world.theta0(args.root, bench_world.SFT_2, seed, heldout)
        kids, _ = children(args.parents, args.evolutions, seed)
        gen = TransformersGeneration(temperature=0.7, top_p=0.9, max_new_tokens=10, batch_size=512)
        samples = gen.load(policy).generate(kids, args.samples, seed=seed).texts
        rows = measure(kids, samples, thresholds)
        per_seed[seed] = rows
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "answer_sources.json"), "w") as f:
        json.dump(per_seed, f, indent=1)
    command = " ".join(
        ["python -m bench.answer_sources", *(sys.argv[1:] if argv is None else argv)]
    )
    print(report(per_seed, command, (time.perf_counter() - started) / 60))


if __name__ == "__main__":
    main()

"""What issue 32's retention and reach benchmarks share: each seed's arms from ``bench.method``'s
theta_1, a prompt set drawn apart from everything any arm of the seed trained on, the world's
reward of a checkpoint's answers there, the paired statistics, and the loop over seeds that
saves after every seed."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from bench.arms import start_from
from bench.method import run_arm, seed_base
from bench.method_arms import Arm
from bench.method_results import iteration_row, model_path

T_CRITICAL = 2.776  # two-sided 95%, df 4 (five seeds)


def run_arms(
    root: str, seed: int, theta0: str | None, arms: Sequence[Arm]
) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """The seed's base run, and each arm's store and rows (held-out figures per iteration),
    every arm from the base run's theta_1 at K pairs an iteration."""
    base, base_store, _ = seed_base(root, seed, False, [], theta0)
    theta1 = model_path(base_store, 0)
    stores: dict[str, Any] = {}
    rows: dict[str, Any] = {}
    for arm in arms:
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
    return base_store, stores, rows


def trained_prompts(stores: Sequence[Any], iterations: int) -> set[str]:
    """Every prompt the runs trained on or started from: X_0 and each iteration's X_t."""
    out: set[str] = set()
    for store in stores:
        for t in range(iterations + 1):
            manifest = store.read_manifest(t, "generate")
            if manifest is not None:
                out |= set(store.read_table(manifest["uri"]).column("prompt").to_pylist())
    return out


def world_rewards(model_dir: str, prompts: list[str], n: int = 1) -> np.ndarray:
    """The world's reward of the checkpoint's answers, one row per prompt: greedy for
    ``n`` = 1, else ``n`` samples at the world's temperature."""
    from eva_world import world
    from tasks.backends.generate.transformers import TransformersGeneration

    backend = TransformersGeneration(
        temperature=0.0 if n == 1 else 0.7, max_new_tokens=10, batch_size=512
    )
    answers = backend.load(model_dir).generate(prompts, n=n, seed=0).texts
    return np.array(
        [[world.reward(p, a) for a in rs] for p, rs in zip(prompts, answers, strict=True)]
    )


def paired(diff: Sequence[float]) -> tuple[float, float, float | None]:
    """Mean, sd and paired t of per-seed differences (t None when they do not vary)."""
    mean = float(np.mean(diff))
    sd = float(np.std(diff, ddof=1)) if len(diff) > 1 else math.nan
    return mean, sd, round(mean / (sd / math.sqrt(len(diff))), 2) if sd > 0 else None


def run_seeds(
    name: str,
    description: str | None,
    argv: list[str] | None,
    run_seed: Callable[[str, int, str | None], tuple[dict[str, Any], str]],
    summarize: Callable[[dict[str, Any]], list[dict[str, Any]]],
    report: Callable[[dict[str, Any], str, str, float], str],
    headline: Callable[[dict[str, Any]], dict[str, Any]],
    folder: str = "full",
    shared_theta0: bool = True,
) -> None:
    """The command line of ``bench.<name>``: every seed in turn under ``--root``/``folder``
    (from one theta_0, the first seed's, when ``shared_theta0``; else each seed's own),
    ``<name>.json`` rewritten after each, the report at the end."""
    ap = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--root", default="runs-bench")
    ap.add_argument("--out", default=os.path.join("docs", "bench"))
    args = ap.parse_args(argv)
    root = os.path.abspath(os.path.join(args.root, folder))
    started = time.perf_counter()
    results: dict[str, Any] = {}
    theta0: str | None = None
    for seed in args.seeds:  # saved after every seed: a crash keeps the seeds done
        results[str(seed)], model = run_seed(root, seed, theta0)
        if shared_theta0:
            theta0 = theta0 or model
        print(json.dumps({seed: headline(results[str(seed)])}), flush=True)
        os.makedirs(args.out, exist_ok=True)
        rows = summarize(results) if len(results) > 1 else []
        with open(os.path.join(args.out, f"{name}.json"), "w") as f:
            json.dump({"summary": rows, "runs": results}, f, indent=1)
    command = f"python -m bench.{name} " + " ".join(sys.argv[1:] if argv is None else argv)
    print(report(results, args.out, command, time.perf_counter() - started))


def write_report(
    out_dir: str,
    name: str,
    title: str,
    command: str,
    seconds: float,
    head: list[str],
    body: list[list[str]],
) -> str:
    """``<name>.md``: a title, the command and its time, and one table; returns the text."""
    from bench.report import md_table

    md = (
        f"# {title}\n\n`{command}`, {seconds / 60:.1f} min.\n\n"
        + "\n".join(md_table(head, body))
        + "\n"
    )
    with open(os.path.join(out_dir, f"{name}.md"), "w") as f:
        f.write(md)
    return md

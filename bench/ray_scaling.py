"""Benchmark: the generate stage on a local Ray cluster with 1 and 2 CPU workers.

    python -m bench.ray_scaling [--prompts 6000] [--n 6] [--cpus 2] [--rows-per-task 250]
                                [--verbose]

On the world's demo policy shape (untrained, so the figures do not depend on a training run;
10 new tokens, as configs/world.yaml) it times the stage in this process, then as a Ray job on a
``LocalRayCluster`` of ``--cpus`` CPUs with 1 and 2 workers. A job pays a fixed start-up
(submission, the job's driver, each worker importing torch and loading the policy) once per
stage; the stage's own stats split it off: ``ray_startup_s`` runs from submission to the first
rollouts done, ``ray_steady_per_s`` is the rollouts per second after that, which is what more
workers buy. Every Ray run's rollouts are checked against the in-process ones (the same table).
Prints a markdown table.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import tempfile
import time

import pyarrow as pa
import torch

from eva_core.schema import seed_records
from eva_runtime.ray_local import LocalRayCluster
from eva_world import world
from eva_world.tiny_lm import (
    TinyModelConfig,
    build_char_tokenizer,
    build_tiny_model,
    save_checkpoint,
)
from tasks.backends.generate.transformers import TransformersGeneration
from tasks.backends.ray_cluster import RayJob
from tasks.content_hashes import hash_directory
from tasks.context import RunContext, StageContext
from tasks.generate import GenerateConfig, generate
from tasks.store import Ref

BACKEND = TransformersGeneration(max_new_tokens=10, batch_size=512)  # configs/world.yaml's


def _stage(
    root: str, run: str, texts: list[str], policy: str, config: GenerateConfig
) -> tuple[float, pa.Table, dict]:
    """Run the generate stage function on ``texts``: (seconds, its table, its stats)."""
    ctx = RunContext(root=root, run=run, seed=0)
    store = ctx.store()
    table = seed_records(texts, [world.category_of(p) for p in texts])
    uri, digest, _ = store.write_table(1, "prompts", table)
    refs = {
        "prompts": Ref("prompts", 1, uri, digest, len(texts)),
        "policy": Ref("policy", 0, "", hash_directory(policy), 0, model_uri=policy),
    }
    stage = StageContext(ctx, 1, "generate", 11, refs, root, store, lambda _: None)
    started = time.perf_counter()
    out = generate.fn(stage, config, prompts=table)
    return time.perf_counter() - started, out.table, out.stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--prompts", type=int, default=6000)
    ap.add_argument("--n", type=int, default=6)
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--rows-per-task", type=int, default=250)
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)  # eva's default (RunConfig.torch_threads); each worker uses one
    # --verbose: the jobs' logs as the stage forwards them, timestamped (where the time goes).
    level = logging.INFO if args.verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(asctime)s %(message)s")
    with tempfile.TemporaryDirectory(prefix="eva-ray-bench-") as root:
        rows, rollouts = _measure(args, root)
    print(f"generate: {args.prompts} prompts x n={args.n}, {platform.machine()}, "
          f"{os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}; Ray rollouts identical to "
          "in-process: yes")  # fmt: skip
    print("\n| where | stage seconds | rollouts/s (whole stage) | start-up s | steady rollouts/s |")
    print("| --- | --- | --- | --- | --- |")
    for name, seconds, startup, steady in rows:
        print(f"| {name} | {seconds:.1f} | {rollouts / seconds:.0f} | {startup} | {steady:.0f} |")


def _measure(args: argparse.Namespace, root: str) -> tuple[list[tuple], int]:
    """In-process, then 1 and 2 Ray workers: (name, seconds, start-up, steady) rows."""
    policy = os.path.join(root, "policy")
    tok = build_char_tokenizer(world.ALPHABET)
    save_checkpoint(build_tiny_model(TinyModelConfig(), tok, seed=0), tok, policy)
    texts = world.sample_prompts(world.SEED_DISTRIBUTION, args.prompts, seed=0)
    rollouts = args.prompts * args.n

    seconds, reference, _ = _stage(
        root, "local", texts, policy, GenerateConfig(n=args.n, backend=BACKEND)
    )
    rows = [("in-process", seconds, "-", rollouts / seconds)]
    with LocalRayCluster(num_cpus=args.cpus) as cluster:
        for workers in (1, 2):
            ray = RayJob(
                address=cluster.address, workers=workers, rows_per_task=args.rows_per_task,
                poll_s=0.25,
            )  # fmt: skip
            config = GenerateConfig(n=args.n, backend=BACKEND, ray=ray)
            seconds, table, stats = _stage(root, f"ray{workers}", texts, policy, config)
            assert table.equals(reference), f"{workers} workers: other rollouts"
            name = f"Ray job, {workers} worker{'s' * (workers > 1)}"
            rows.append((name, seconds, f"{stats['ray_startup_s']:.1f}", stats["ray_steady_per_s"]))

    return rows, rollouts


if __name__ == "__main__":
    main()

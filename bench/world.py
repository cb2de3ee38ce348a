"""The world's preconditions, judged without any eva arm (docs/benchmarks.md, issue 20).

    python -m bench.world [--candidates C1 C2 C3] [--seeds 0 1 2 3 4] [--root runs-bench/world]

For each candidate world and seed: theta_0 (the world's SFT, cached under ``--root``: candidates
with the same demonstrations share it), theta_1 = one solver step on K pairs from the seed set,
then one more iteration from theta_1 on K pairs from new *seed* prompts (``fresh``) and on K
pairs from new *target* prompts (``target``, the upper bound). Every step trains exactly K
pairs: prompts are drawn from the arm's own stream until K pairs with a correct chosen answer
exist (a seeded subset of K then), so the arms differ in their prompts only.

1. The baseline learns: theta_1 - theta_0 >= +0.03 on the held-out set, > 3 sd over seeds.
2. The prompt distribution matters: target - fresh >= +0.05, > 3 sd (paired by seed).

Runs in this process (the stages' backends, no Prefect): a candidate is a few minutes per seed,
most of it theta_0's SFT.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from bench.report import mean_std
from eva_core.pairs import choose_pairs
from eva_world import world
from eva_world.configs import TinyModelConfig
from eva_world.tiny_lm import build_char_tokenizer, build_tiny_model, save_checkpoint, sft
from flows.markdown import md_table
from tasks.backends.generate.transformers import TransformersGeneration
from tasks.backends.train.objectives import DPONLLSolverConfig

K = 320  # pairs per solver step, every arm (20 optimizer steps at batch 32, 2 epochs)
HELDOUT = 500
CHUNK = 1000  # prompts generated at a time while collecting pairs
MAX_CHUNKS = 12
SOLVER = DPONLLSolverConfig(learning_rate=2e-4, effective_batch_size=32, beta=0.1, max_length=64)
CATS3 = (("add", 1.0), ("sub", 1.0), ("rev", 1.0))


@dataclass(frozen=True)
class Candidate:
    name: str
    sft: world.Distribution  # theta_0's demonstrations
    seed: world.Distribution  # X_0 and the fresh arm
    target: world.Distribution  # held-out set and the target arm
    # One theta_0 and one held-out set for every seed (seed 0's): the seeds then replicate the
    # post-training only, as the paper post-trains one base model on fixed benchmarks.
    shared_base: bool = False


SFT_2 = world.Distribution(CATS3, digits=(1, 3), rev_length=(2, 6))
SFT_3 = world.Distribution(CATS3, operands=(2, 3), digits=(1, 3), rev_length=(2, 6))
SKEWED = (("add", 0.45), ("sub", 0.45), ("rev", 0.10))
CANDIDATES = {
    "C1": Candidate("C1", SFT_2, world.Distribution(SKEWED), SFT_2),
    "C2": Candidate("C2", SFT_3, world.Distribution(SKEWED), SFT_3),
    "C3": Candidate("C3", SFT_2, world.Distribution((("add", 0.5), ("sub", 0.5))), SFT_2),
    "C4": Candidate(
        "C4", SFT_2, world.Distribution((("add", 0.5), ("sub", 0.5))), SFT_2, shared_base=True
    ),
    # The current world, for reference: the same categories, one digit fewer.
    "W0": Candidate("W0", SFT_2, world.SEED_DISTRIBUTION, SFT_2),
}


def stream(dist: world.Distribution, seed: int, exclude: set[str]) -> Iterator[list[str]]:
    """Chunks of new prompts of ``dist``: one seeded stream, never repeating, never ``exclude``."""
    seen = set(exclude)
    for i in range(MAX_CHUNKS):
        chunk = world.sample_prompts(dist, CHUNK, seed=seed * 1000 + i, exclude=seen)
        seen.update(chunk)
        yield chunk


def score(policy: str, prompts: list[str]) -> dict[str, float]:
    """Held-out score (mean dense reward of greedy answers), overall and per category."""
    gen = TransformersGeneration(temperature=0.0, max_new_tokens=10, batch_size=512)
    answers, _ = gen.load(policy).generate(prompts, 1, seed=0).firsts()
    rewards = np.array([world.reward(p, a) for p, a in zip(prompts, answers, strict=True)])
    cats = np.array([world.category_of(p) for p in prompts])
    out = {"score": float(rewards.mean()), "solved": float((rewards == 1).mean())}
    out.update({f"cat_{c}": float(rewards[cats == c].mean()) for c in sorted(set(cats))})
    return out


def step(policy: str, chunks: Iterator[list[str]], seed: int, out: str) -> dict[str, Any]:
    """One solver step on exactly K pairs from ``chunks``; what it drew and generated."""
    gen = TransformersGeneration(temperature=0.7, top_p=0.9, max_new_tokens=10, batch_size=512)
    sampler = gen.load(policy)
    prompts: list[str] = []
    chosen: list[str] = []
    rejected: list[str] = []
    drawn = 0
    for i, chunk in enumerate(chunks):
        samples = sampler.generate(chunk, 6, seed=seed * 100 + i).texts
        rewards = np.array(
            [[world.reward(p, r) for r in rs] for p, rs in zip(chunk, samples, strict=True)]
        )
        choice, _ = choose_pairs(rewards, 1.0)
        for r, c, j in zip(choice.rows, choice.chosen, choice.rejected, strict=True):
            prompts.append(chunk[r])
            chosen.append(samples[r][c])
            rejected.append(samples[r][j])
        drawn += len(chunk)
        if len(prompts) >= K:
            break
    if len(prompts) < K:
        raise RuntimeError(f"only {len(prompts)} pairs from {drawn} prompts; raise MAX_CHUNKS")
    keep = np.sort(np.random.default_rng(seed).choice(len(prompts), K, replace=False))
    pick = [int(k) for k in keep]
    rows = SOLVER.load().train(
        policy,
        [prompts[k] for k in pick],
        [chosen[k] for k in pick],
        [rejected[k] for k in pick],
        out,
        seed=seed,
    )
    return {"prompts_drawn": drawn, "responses": drawn * 6, "steps": int(rows[-1]["step"])}


def theta0(root: str, sft_dist: world.Distribution, seed: int, heldout: list[str]) -> str:
    """theta_0 for these demonstrations and seed, trained once and kept under ``root``."""
    digest = hashlib.sha256(repr((sft_dist, seed, sorted(heldout))).encode()).hexdigest()
    key = f"theta0-s{seed}-{digest[:12]}"
    out = os.path.join(root, key)
    if os.path.isfile(os.path.join(out, "config.json")):
        return out
    tok = build_char_tokenizer(world.ALPHABET)
    model = build_tiny_model(TinyModelConfig(), tok, seed=seed)
    examples = world.sft_examples(sft_dist, 3000 * 64, seed, careless=0.6, exclude=set(heldout))
    sft(model, tok, examples, 3000, 64, 3e-3, 50, seed)
    save_checkpoint(model, tok, out)
    return out


def run_candidate(c: Candidate, seed: int, root: str) -> dict[str, Any]:
    base_seed = 0 if c.shared_base else seed
    heldout = world.sample_prompts(c.target, HELDOUT, seed=1000 + base_seed)
    held = set(heldout)
    base = theta0(root, c.sft, base_seed, heldout)
    where = os.path.join(root, f"{c.name}-s{seed}")
    row: dict[str, Any] = {"theta_0": score(base, heldout)}
    seeds = stream(c.seed, 2000 + seed, held)
    theta1 = os.path.join(where, "theta1")
    row["theta_1_step"] = step(base, seeds, seed, theta1)
    row["theta_1"] = score(theta1, heldout)
    # fresh continues the seed stream past X_0; target draws its own stream of target prompts.
    for arm, chunks in (("fresh", seeds), ("target", stream(c.target, 3000 + seed, held))):
        row[f"{arm}_step"] = step(theta1, chunks, seed + 1, os.path.join(where, arm))
        row[arm] = score(os.path.join(where, arm), heldout)
    return row


def verdict(rows: list[dict[str, Any]]) -> dict[str, Any]:
    learn = np.array([r["theta_1"]["score"] - r["theta_0"]["score"] for r in rows])
    room = np.array([r["target"]["score"] - r["fresh"]["score"] for r in rows])

    def held(d: np.ndarray, floor: float) -> bool:
        return bool(d.mean() >= floor and (len(d) < 2 or d.mean() > 3 * d.std(ddof=1)))

    return {
        "learns": [float(x) for x in learn],
        "room": [float(x) for x in room],
        "baseline_learns": held(learn, 0.03),
        "distribution_matters": held(room, 0.05),
    }


def report(results: dict[str, Any], command: str, minutes: float) -> str:
    head = ["candidate", "theta_0", "theta_1 - theta_0", "fresh", "target", "target - fresh",
            "rev: fresh / target", "prompts drawn: fresh / target", "P1", "P2"]  # fmt: skip
    table = []
    for name, per_seed in results.items():
        rows = list(per_seed["seeds"].values())
        v = per_seed["verdict"]
        table.append([
            name,
            mean_std([r["theta_0"]["score"] for r in rows]),
            mean_std(v["learns"]),
            mean_std([r["fresh"]["score"] for r in rows]),
            mean_std([r["target"]["score"] for r in rows]),
            mean_std(v["room"]),
            f"{np.mean([r['fresh']['cat_rev'] for r in rows]):.3f} / "
            f"{np.mean([r['target']['cat_rev'] for r in rows]):.3f}",
            f"{np.mean([r['fresh_step']['prompts_drawn'] for r in rows]):.0f} / "
            f"{np.mean([r['target_step']['prompts_drawn'] for r in rows]):.0f}",
            "met" if v["baseline_learns"] else "missed",
            "met" if v["distribution_matters"] else "missed",
        ])  # fmt: skip
    intro = (
        f"`{command}`: {minutes:.1f} min, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores. "
        f"{HELDOUT} held-out target prompts per seed; every step trains exactly {K} pairs; "
        "± is the standard deviation over seeds; differences are paired by seed."
    )
    title = "## World search: the preconditions, without any eva arm"
    return "\n".join([title, "", intro, "", *md_table(head, table), ""])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--candidates", nargs="+", default=["C1", "C2", "C3", "C4"])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--root", default=os.path.join("runs-bench", "world"))
    ap.add_argument("--out", default=os.path.join("docs", "bench"))
    ap.add_argument("--all", action="store_true", help="try every candidate, not the first met")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    started = time.perf_counter()
    results: dict[str, Any] = {}
    for name in args.candidates:
        rows = {}
        for seed in args.seeds:
            rows[str(seed)] = run_candidate(CANDIDATES[name], seed, args.root)
            print(name, seed, json.dumps(rows[str(seed)]), flush=True)
        results[name] = {"seeds": rows, "verdict": verdict(list(rows.values()))}
        print(name, json.dumps(results[name]["verdict"]), flush=True)
        met = results[name]["verdict"]
        if met["baseline_learns"] and met["distribution_matters"] and not args.all:
            break
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "world.json"), "w") as f:
        json.dump(results, f, indent=1)
    command = "python -m bench.world " + " ".join(argv if argv is not None else [])
    md = report(results, command.strip(), (time.perf_counter() - started) / 60)
    with open(os.path.join(args.out, "world.md"), "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()

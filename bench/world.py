"""Why the built-in world looks the way it does: the decisive comparison of the world search.

    python -m bench.world [--seeds 0 1 2] [--out docs/bench]

Three recipes for theta_0, each trained from scratch per seed, then one solver step on 3,000
seed prompts (N = 6 samples at temperature 0.7, best vs worst), with two solvers:

* ``landed``: the world as it was (GPT-2, 2 layers, 64 dims, 1,500 SFT steps on easy problems).
* ``llama-careful``: a 3-layer Llama trained on the whole target range, correct demonstrations.
* ``world``: the same Llama, 3,000 steps, 60% careless demonstrations (the world as frozen).

Solvers: ``dpo`` (the landed demo's DPO: beta 0.1, lr 2e-4, batch 16, 2 epochs, every pair) and
``dpo_nll`` (the world's solver: DPO + NLL, beta 0.1, lr 2e-4, batch 32, 2 epochs, pairs whose
chosen answer is correct). Reported: theta_0's greedy and pass@6 exact share on the held-out
set, the pairs each solver got, and the held-out score before and after (mean dense reward of
the greedy answer), with the paired Δ over seeds.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from bench.report import md_table, mean_std
from eva_core.pairs import choose_pairs
from eva_world import world
from eva_world.tiny_lm import (
    TinyModelConfig,
    build_char_tokenizer,
    build_tiny_model,
    save_checkpoint,
    sft,
)
from tasks.backends.generate.transformers import TransformersGeneration
from tasks.backends.train.dpo import DPOSolverConfig, TRLSolverConfig
from tasks.backends.train.objectives import DPONLLSolverConfig

SEED_PROMPTS, HELDOUT = 3000, 500


@dataclass(frozen=True)
class Recipe:
    name: str
    model: TinyModelConfig
    steps: int
    dist: world.Distribution
    careless: float


RECIPES = (
    Recipe("landed", TinyModelConfig(arch="gpt2", n_layer=2, n_embd=64, n_head=2), 1500,
           world.SEED_DISTRIBUTION, 0.0),
    Recipe("llama-careful", TinyModelConfig(), 1500, world.SFT_DISTRIBUTION, 0.0),
    Recipe("world", TinyModelConfig(), 3000, world.SFT_DISTRIBUTION, 0.6),
)  # fmt: skip

SOLVERS: dict[str, tuple[TRLSolverConfig, float | None]] = {
    "dpo": (
        DPOSolverConfig(learning_rate=2e-4, effective_batch_size=16, beta=0.1, max_length=64),
        None,
    ),
    "dpo_nll": (
        DPONLLSolverConfig(learning_rate=2e-4, effective_batch_size=32, beta=0.1, max_length=64),
        1.0,
    ),
}


def _sample(
    model_dir: str, prompts: list[str], n: int, temperature: float, seed: int
) -> tuple[list[list[str]], np.ndarray]:
    """n responses per prompt (temperature 0: greedy) and their world rewards."""
    gen = TransformersGeneration(temperature=temperature, max_new_tokens=10, batch_size=512)
    out = gen.load(model_dir).generate(prompts, n, seed=seed)
    rewards = [[world.reward(p, r) for r in rs] for p, rs in zip(prompts, out, strict=True)]
    return out, np.array(rewards)


def _rewards(model_dir: str, prompts: list[str], n: int, temperature: float) -> np.ndarray:
    return _sample(model_dir, prompts, n, temperature, seed=1)[1]


def theta0(recipe: Recipe, seed: int, heldout: list[str], out_dir: str) -> str:
    tok = build_char_tokenizer(world.ALPHABET)
    model = build_tiny_model(recipe.model, tok, seed=seed)
    examples = world.sft_examples(
        recipe.dist, recipe.steps * 64, seed, careless=recipe.careless, exclude=set(heldout)
    )
    sft(model, tok, examples, recipe.steps, 64, 3e-3, 50, seed)
    save_checkpoint(model, tok, out_dir)
    return out_dir


def solver_step(
    policy: str, prompts: list[str], solver: TRLSolverConfig, min_chosen: float | None, out: str
) -> int:
    samples, rewards = _sample(policy, prompts, 6, 0.7, seed=2)
    choice, _ = choose_pairs(rewards, min_chosen)
    rows = [int(i) for i in choice.rows]
    if not rows:
        return 0
    solver.load().train(
        policy,
        [prompts[i] for i in rows],
        [samples[i][j] for i, j in zip(rows, choice.chosen, strict=True)],
        [samples[i][j] for i, j in zip(rows, choice.rejected, strict=True)],
        out,
        seed=0,
    )
    return len(rows)


def run(seeds: list[int]) -> dict[str, Any]:
    torch.set_num_threads(1)
    results: dict[str, Any] = {}
    for seed in seeds:
        heldout = world.sample_prompts(world.HELDOUT_DISTRIBUTION, HELDOUT, seed=1000 + seed)
        prompts = world.sample_prompts(
            world.SEED_DISTRIBUTION, SEED_PROMPTS, seed=2000 + seed, exclude=set(heldout)
        )
        for recipe in RECIPES:
            with tempfile.TemporaryDirectory(prefix="eva-world-") as tmp:
                started = time.perf_counter()
                policy = theta0(recipe, seed, heldout, os.path.join(tmp, "theta0"))
                greedy = _rewards(policy, heldout, 1, 0.0)[:, 0]
                sampled = _rewards(policy, heldout, 6, 0.7)
                row: dict[str, Any] = {
                    "score": float(greedy.mean()),
                    "greedy_exact": float((greedy == 1).mean()),
                    "pass6_exact": float((sampled == 1).any(axis=1).mean()),
                    "sft_seconds": round(time.perf_counter() - started, 1),
                }
                for name, (solver, min_chosen) in SOLVERS.items():
                    out = os.path.join(tmp, name)
                    pairs = solver_step(policy, prompts, solver, min_chosen, out)
                    after = _rewards(out, heldout, 1, 0.0)[:, 0] if pairs else greedy
                    row[name] = {"pairs": pairs, "score": float(after.mean())}
                results.setdefault(recipe.name, {})[str(seed)] = row
                print(recipe.name, seed, json.dumps(row), flush=True)
    return results


def report(results: dict[str, Any], command: str, seconds: float) -> str:
    head = ["theta_0 recipe", "held-out score", "greedy exact", "pass@6 exact", "solver",
            "pairs", "score after", "Δ"]  # fmt: skip
    table = []
    for recipe, per_seed in results.items():
        rows = list(per_seed.values())
        for name in SOLVERS:
            table.append([
                recipe,
                mean_std([r["score"] for r in rows]),
                mean_std([r["greedy_exact"] for r in rows]),
                mean_std([r["pass6_exact"] for r in rows]),
                name,
                mean_std([r[name]["pairs"] for r in rows]),
                mean_std([r[name]["score"] for r in rows]),
                mean_std([r[name]["score"] - r["score"] for r in rows]),
            ])  # fmt: skip
    intro = (
        f"`{command}`: {seconds / 60:.1f} min, {time.strftime('%Y-%m-%d')}, "
        f"{os.cpu_count()} cores. {HELDOUT} held-out target prompts and {SEED_PROMPTS} seed "
        "prompts per seed; ± is the standard deviation over seeds; Δ is paired."
    )
    title = "## World search: one solver step from three theta_0 recipes"
    return "\n".join([title, "", intro, "", *md_table(head, table), ""])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", default=os.path.join("docs", "bench"))
    args = ap.parse_args(argv)
    started = time.perf_counter()
    results = run(args.seeds)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "world.json"), "w") as f:
        json.dump(results, f, indent=1)
    command = "python -m bench.world " + " ".join(argv if argv is not None else [])
    md = report(results, command.strip(), time.perf_counter() - started)
    with open(os.path.join(args.out, "world.md"), "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()

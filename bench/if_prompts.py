"""Seed and held-out prompts for verifiable instruction following: real user questions with
instructions a checker can verify, written as IFEval's rows are.

The questions are MT-Bench's first turns and Arena-Hard's prompts (``../shared/data``, both
Apache-2.0), kept when they are at most ``--max-chars`` characters and hold no code block
(a small model's answer to a page of code says little about following an instruction). They
are shuffled once with ``--seed`` and split: the first ``--heldout`` are the held-out set, the
rest the training pool, so no question is in both.

Each question gets 1, 2 or 3 instructions (IFEval's own mix: ``COUNT_WEIGHTS``), drawn from the
instruction evolver's defaults by the checkers themselves (``tasks.backends.ifeval.draw``) and
never two that conflict; the prompt is the question followed by each instruction in its
checker's own words. A row is ``{key, prompt, instruction_id_list, kwargs, category}``:
IFEval's columns, so the files read as any IFEval-format file does (``prompts.path``).

    python -m bench.if_prompts --out configs/smollm2-if
"""

from __future__ import annotations

import argparse
import json
import os
import random
from typing import Any

from tasks.backends.evolve.instructions import DEFAULT_INSTRUCTIONS
from tasks.backends.ifeval import Instruction, consistent, describe, draw

# How many instructions a prompt gets, weighted as in IFEval (about 1.5 on average).
COUNT_WEIGHTS = {1: 0.6, 2: 0.3, 3: 0.1}


def questions(data: str, max_chars: int) -> list[dict[str, str]]:
    """MT-Bench's first turns, then Arena-Hard's prompts, that are short and hold no code."""
    rows: list[dict[str, str]] = []
    with open(os.path.join(data, "mt_bench_questions.jsonl")) as f:
        for line in f:
            q = json.loads(line)
            rows.append({"key": f"mt-bench/{q['question_id']}", "question": q["turns"][0],
                         "category": q["category"]})  # fmt: skip
    with open(os.path.join(data, "arena_hard_v0.1_questions.jsonl")) as f:
        for line in f:
            q = json.loads(line)
            rows.append({"key": f"arena-hard/{q['uid']}", "question": q["prompt"],
                         "category": "arena-hard"})  # fmt: skip
    return [r for r in rows if len(r["question"]) <= max_chars and "```" not in r["question"]]


def instructions_for(rng: random.Random) -> list[Instruction]:
    """1-3 instructions that do not conflict, drawn by their checkers."""
    count = rng.choices(list(COUNT_WEIGHTS), weights=list(COUNT_WEIGHTS.values()))[0]
    chosen: list[Instruction] = []
    while len(chosen) < count:
        new = draw(rng.choice(DEFAULT_INSTRUCTIONS), rng.randrange(2**31))
        if consistent([*chosen, new]):
            chosen.append(new)
    return chosen


def row(question: dict[str, str], rng: random.Random) -> dict[str, Any]:
    chosen = instructions_for(rng)
    text = " ".join([question["question"].strip(), *(describe(i) for i in chosen)])
    return {
        "key": question["key"],
        "prompt": text,
        "instruction_id_list": [iid for iid, _ in chosen],
        "kwargs": [args for _, args in chosen],
        "category": question["category"],
    }


def build(data: str, heldout: int, max_chars: int, seed: int) -> dict[str, list[dict[str, Any]]]:
    rng = random.Random(seed)
    pool = questions(data, max_chars)
    rng.shuffle(pool)
    rows = [row(q, rng) for q in pool]
    return {"heldout": rows[:heldout], "train": rows[heldout:]}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=os.path.join("..", "shared", "data"))
    p.add_argument("--out", required=True, help="folder for train.jsonl and heldout.jsonl")
    p.add_argument("--heldout", type=int, default=128, help="questions kept for held-out")
    p.add_argument("--max-chars", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    for name, rows in build(args.data, args.heldout, args.max_chars, args.seed).items():
        with open(os.path.join(args.out, f"{name}.jsonl"), "w") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        counts = [len(r["instruction_id_list"]) for r in rows]
        print(f"{name}: {len(rows)} prompts, {sum(counts) / len(rows):.2f} instructions each")


if __name__ == "__main__":
    main()

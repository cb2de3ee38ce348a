"""The arithmetic of the ``labels`` measure (``bench.measures.labels``, issue 22): an
answer-blind arm's majority-vote labels recomputed and checked against the world's solver, the
threshold's trade-off, the pairs' and the evolved children's correctness; and the world's
answers to a seed set, a human labeller's stand-in."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from eva_core.answers import answer_rewards, majority_answers, normalize_answer
from eva_core.schema import prompt_id
from eva_world import world
from eva_world.components import match


def share(k: int, n: int) -> float | None:
    return round(k / n, 4) if n else None


def label_check(
    prompts: Sequence[str],
    responses: Sequence[Sequence[str]],
    stored: Sequence[Sequence[float]],
    known: Mapping[str, str],
    agreement: float,
) -> dict[str, Any]:
    """One annotate stage's labels, recomputed, and how right they were (per category too)."""
    answers = [known.get(prompt_id(p)) for p in prompts]
    got = answer_rewards(responses, answers, match, agreement)
    flat_got = np.array([r for rs in got.rewards for r in rs], dtype=float)
    flat_stored = np.array([r for rs in stored for r in rs], dtype=float)
    reproduced = bool(np.array_equal(flat_got, flat_stored, equal_nan=True))  # shapes too
    unknown = [i for i, answer in enumerate(answers) if answer is None]
    truth = {i: normalize_answer(world.solve(prompts[i])) for i in unknown}
    right = {i: got.labels[i] == truth[i] for i in truth if got.sources[i] == "majority"}
    wrong = [i for i, ok in right.items() if not ok]
    careless = sum(
        got.labels[i] == normalize_answer(world.careless_answer(prompts[i])) for i in wrong
    )
    errors = [
        abs(match(r, str(got.labels[i])) - match(r, truth[i])) for i in right for r in responses[i]
    ]
    counts = got.counts()
    by_category: dict[str, dict[str, Any]] = {}
    for c in sorted({str(world.category_of(prompts[i])) for i in truth}):
        idx = [i for i in truth if world.category_of(prompts[i]) == c]
        ok = [right[i] for i in idx if i in right]
        by_category[c] = {
            "unknown": len(idx),
            "dropped_share": share(len(idx) - len(ok), len(idx)),
            "label_accuracy": share(sum(ok), len(ok)),
        }
    return {
        "prompts": len(prompts),
        **counts,
        "reproduced": reproduced,
        "label_accuracy": share(sum(right.values()), len(right)),
        "dropped_share": share(counts["dropped"], len(truth)),
        "wrong_careless": share(careless, len(wrong)),
        "reward_error": round(float(np.mean(errors)), 4) if errors else None,
        "by_category": by_category,
    }


def threshold_sweep(
    prompts: Sequence[str], responses: Sequence[Sequence[str]], known: Mapping[str, str], n: int
) -> list[dict[str, Any]]:
    """For every threshold k/n: the share of the unknown prompts the majority vote labels and
    the accuracy of those labels."""
    unknown = [i for i, p in enumerate(prompts) if prompt_id(p) not in known]
    out = []
    for k in range(1, n + 1):
        vote = majority_answers([responses[i] for i in unknown], k / n)
        kept = [j for j, keep in enumerate(vote.keep) if keep]
        right = sum(
            vote.answers[j] == normalize_answer(world.solve(prompts[unknown[j]])) for j in kept
        )
        out.append({"threshold": f"{k}/{n}", "labelled": share(len(kept), len(unknown)),
                    "label_accuracy": share(right, len(kept))})  # fmt: skip
    return out


def chosen_correct(prompts: Sequence[str], chosen: Sequence[str]) -> float | None:
    """The share of pairs whose chosen answer is exactly right by the world's solver."""
    right = sum(world.reward(p, c) == 1.0 for p, c in zip(prompts, chosen, strict=True))
    return share(right, len(chosen))


def inherited_accuracy(children: Sequence[str], parents: Sequence[str]) -> float | None:
    """The share of children whose answer is their parent's: an inherited answer's accuracy."""
    same = sum(world.solve(c) == world.solve(p) for c, p in zip(children, parents, strict=True))
    return share(same, len(children))


def world_answers(prompts: Sequence[str], path: str) -> None:
    """A file of the world's answers to ``prompts`` (JSONL: prompt, answer): what a human
    labeller of the seed set would give."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        for p in prompts:
            f.write(json.dumps({"prompt": p, "answer": world.solve(p)}) + "\n")

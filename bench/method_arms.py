"""The method benchmark's arms: what each arm changes, and the settings every arm shares.

``bench.method`` runs them (its docstring holds the design); ``bench.method_results`` reads
what they trained on and how they scored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bench.arms import Baseline, bench_world, world_sizes
from eva_core.informativeness import METRICS
from flows.config import load_config, validate_config
from flows.config_layers import apply_overrides, deep_merge

PAIR_BUDGET = 320  # K: every arm trains exactly this many pairs an iteration (topped up if short)
# The paper's solvers, each with its own objective settings (beta, gamma, lambda: the solver
# defaults) and the world's schedule (learning rate, batch, epochs, correct chosen answers).
SOLVERS = ("dpo", "simpo", "orpo", "sppo")


@dataclass(frozen=True)
class Arm:
    name: str
    table: str
    iterations: int
    overrides: dict[str, Any] = field(default_factory=dict)
    start: str = "theta_1"  # the model it starts from: theta_1 or theta_1-<solver>
    baseline: Baseline | None = None  # new prompts each iteration (bench.arms), not eva

    @property
    def topup(self) -> str:
        """How the arm's own source grows when it yields fewer than K pairs: a longer split of
        its stream (baselines), more of X_{t-1} (subset arms), or more parents evolved and a
        larger X_t (every evolving arm)."""
        if self.baseline is not None:
            return "split"
        return "subset" if self.overrides.get("prompt_strategy") == "subset" else "evolve"

    def grown(self, factor: float, size: int) -> dict[str, Any]:
        """The overrides of this arm with its source grown ``factor`` times (1: as is)."""
        if factor == 1.0 or self.topup == "split":
            return {}
        fraction = min(1.0, 0.25 * factor)
        grown: dict[str, Any] = {"sample": {"fraction": fraction}}
        if self.topup == "evolve":
            grown["mix"] = {"size": round(size * factor)}
        return grown


def arms(quick: bool) -> list[Arm]:
    long = 2 if quick else 3
    out = [
        Arm("fresh", "T2/T13", long, baseline="fresh"),
        Arm("eva", "T2/T13", long, {}),
        Arm("target", "T2/T13", 1 if quick else long, baseline="target"),
    ]
    metrics = ("uniform",) if quick else tuple(m for m in METRICS if m != "a_min")
    out += [Arm(f"metric-{m}", "T4", 1, {"score": {"metric": m}}) for m in metrics]
    out.append(Arm("subset-weighted", "T5", 1, {"prompt_strategy": "subset"}))
    # The null controls: evolution without reward-guided selection (metric-uniform, above),
    # random evolution (a random undirected edit of a random parent), no evolution (subset).
    perturb = {"evolver": {"options": {"methods": ["perturb"]}}}
    out.append(
        Arm("random-evolution", "null", 1, {"sample": {"method": "uniform"}, "evolve": perturb})
    )
    if not quick:
        greedy = {"sample": {"method": "greedy"}}
        out.append(Arm("subset-greedy", "T5", 1, {"prompt_strategy": "subset", **greedy}))
        out.append(Arm("eva-greedy", "T5", 1, greedy))
        out.append(Arm("eva-previous", "T13", long, {"creator_rollouts": "previous"}))
        for s in SOLVERS:
            solver = {"train": {"solver": solver_settings(s)}}
            start = f"theta_1-{s}"
            out.append(Arm(f"fresh-{s}", "T2", 1, solver, start, baseline="fresh"))
            out.append(Arm(f"eva-{s}", "T2", 1, solver, start))
    return out


def solver_settings(kind: str) -> dict[str, Any]:
    """A paper solver with the world's schedule (its objective's own knobs keep their
    defaults): the same learning rate, batch, epochs and length cap as the world's solver."""
    return {
        "kind": kind,
        "learning_rate": 2e-4,
        "effective_batch_size": 32,
        "num_train_epochs": 2,
        "max_length": 64,
    }


def base_config(root: str, seed: int, quick: bool, overrides: list[str]) -> dict[str, Any]:
    """The settings every arm shares; ``overrides`` (``a.b=value``) apply to all arms alike."""
    # Field by field onto the world's config: a partial section would otherwise start from
    # that section's paper defaults and drop the world's settings (pairs.min_chosen_reward).
    base = deep_merge(
        deep_merge(load_config(None).model_dump(mode="json"), bench_world()),
        {
            "root": root,
            "seed": seed,
            # The same sizes in quick mode: its runs are then the full run's seed-0 runs, cut
            # short (fewer arms and iterations), and reproduce their numbers.
            **world_sizes(2000, 500),
            "pairs": {"max_pairs": PAIR_BUDGET},
        },
    )
    # Overrides change single fields of the config that would run (see flows.config).
    return apply_overrides(validate_config(base).model_dump(mode="json"), overrides)


def arm_config(base: dict[str, Any], name: str, overrides: dict[str, Any]) -> Any:
    """The validated config of one arm (or base run): ``overrides`` merged field by field onto
    ``base``, except a solver, which replaces the base's (another objective's fields differ)."""
    merged = deep_merge(base, {"run": name})
    solver = overrides.get("train", {}).get("solver")
    if solver is not None:
        merged = deep_merge(merged, {"train": {"solver": None}})
    return validate_config(deep_merge(merged, overrides))

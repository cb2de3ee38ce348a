"""The built-in world as eva components: its verifier is the reward model, its operators the
evolver, its difficulty the complexity judge, its distributions the prompt sources.

These are what a real deployment replaces with a reward model (ArmoRM, Skywork), an LLM
rewriter (EvolInstruct), an LLM judge and a prompt file; the stages cannot tell the difference.
Each is a plain class that ``configs/world.yaml`` names by import path
(``{kind: python, factory: eva_world.components:WorldVerifier}``), so eva's method never
imports the world. Each declares a ``version`` (bumped when what it computes can change: it
keys the stages that use it) and ``check_prompts``, which refuses a prompt set that is not the
world's before a run starts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence

import numpy as np

from eva_world import world

# What a prompt the world cannot handle gets told, after the row that showed it.
NOT_A_WORLD_PROMPT = (
    "is not a prompt of the built-in world (arithmetic and string reversal), which this config "
    "scores, evolves and trains on; for your own prompts use your own policy, reward model and "
    "evolver (configs/own-model.yaml)"
)


def check_world_prompts(prompts: Sequence[str]) -> None:
    """Raise ``ValueError`` naming the first prompt outside the world."""
    for i, prompt in enumerate(prompts):
        if world.parse(prompt) is None:
            shown = prompt if len(prompt) <= 60 else prompt[:57] + "..."
            raise ValueError(f"row {i} ({shown!r}) {NOT_A_WORLD_PROMPT}")


class WorldVerifier:
    """Scores responses with the world's program: dense position-wise match in [0, 1] (NaN for
    a prompt outside the world)."""

    version = 1

    check_prompts = staticmethod(check_world_prompts)

    def score(
        self,
        prompts: Sequence[str],
        responses: Sequence[Sequence[str]],
        progress: Callable[[float], None] = lambda _: None,
    ) -> list[list[float]]:
        out = [[world.reward(p, r) for r in rs] for p, rs in zip(prompts, responses, strict=True)]
        progress(1.0)
        return out


class WorldRewriter:
    """Rewrites prompts with the world's in-depth and in-breadth operators (``methods``: a
    subset of ``world.EVOLVE_METHODS``, all by default)."""

    version = 1

    check_prompts = staticmethod(check_world_prompts)

    def __init__(self, methods: Sequence[str] | None = None):
        chosen = tuple(methods or world.EVOLVE_METHODS)
        unknown = sorted(set(chosen) - set(world.EVOLVE_METHODS))
        if unknown:
            raise ValueError(f"methods: unknown {unknown}; choose from {world.EVOLVE_METHODS}")
        self.methods = chosen

    @staticmethod
    def category_of(prompt: str) -> str | None:
        """An in-breadth rewrite changes category: children are labelled by what they are."""
        return world.category_of(prompt)

    def evolve(
        self,
        prompts: Sequence[str],
        categories: Sequence[str | None],
        num_evolutions: int,
        seed: int,
    ) -> list[list[tuple[str, str]]]:
        out = []
        for i, prompt in enumerate(prompts):
            # One generator per prompt: a prompt's rewrites do not depend on its neighbours.
            rng = np.random.default_rng([seed, i])
            out.append(world.evolve_many(prompt, num_evolutions, rng, methods=self.methods))
        return out


class WorldDifficulty:
    """The complexity judge: a world prompt's exact difficulty, and no quality (NaN)."""

    version = 1

    check_prompts = staticmethod(check_world_prompts)

    def score(self, prompts: Sequence[str]) -> list[tuple[float, float]]:
        out = []
        for p in prompts:
            try:
                out.append((float(world.difficulty(p)), math.nan))
            except ValueError:  # not a world prompt: unscored rather than a failed stage
                out.append((math.nan, math.nan))
        return out


DISTRIBUTIONS = {"seed": world.SEED_DISTRIBUTION, "heldout": world.HELDOUT_DISTRIBUTION}


class WorldPrompts:
    """A prompt source: ``size`` distinct prompts of a world distribution (``seed``: the narrow
    seed set, ``heldout``: the broader target), labelled with their category."""

    version = 1

    def __init__(self, distribution: str = "seed", size: int = 256):
        if distribution not in DISTRIBUTIONS:
            raise ValueError(f"distribution: {distribution!r} is not one of {list(DISTRIBUTIONS)}")
        if size < 1:
            raise ValueError(f"size: must be >= 1 (got {size})")
        self.distribution, self.size = DISTRIBUTIONS[distribution], size

    def draw(self, seed: int, exclude: Collection[str] = ()) -> list[tuple[str, str | None]]:
        prompts = world.sample_prompts(self.distribution, self.size, seed, exclude=exclude)
        return [(p, world.category_of(p)) for p in prompts]

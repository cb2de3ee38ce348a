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
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

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


def match(response: str, answer: str) -> float:
    """The world's verifier against a given answer rather than the world's own: position-wise
    match in [0, 1] (``world.reward`` is this with ``world.solve(prompt)``). It is what a
    ``verifiable`` reward (``tasks.backends.reward.verifiable``) names to score the world's
    responses against known or majority-voted answers without the world's solver."""
    return world.match(response, answer)


class WorldRewriter:
    """Rewrites prompts with the world's in-depth and in-breadth operators (``methods``: a
    subset of ``world.ALL_METHODS``; by default ``world.EVOLVE_METHODS``, every operator but
    the undirected ``perturb``)."""

    version = 1

    check_prompts = staticmethod(check_world_prompts)

    def __init__(self, methods: Sequence[str] | None = None):
        chosen = tuple(methods or world.EVOLVE_METHODS)
        unknown = sorted(set(chosen) - set(world.ALL_METHODS))
        if unknown:
            raise ValueError(f"methods: unknown {unknown}; choose from {world.ALL_METHODS}")
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


def distribution_of(spec: str | Mapping[str, Any]) -> world.Distribution:
    """A named distribution (``seed``, ``heldout``) or one given by its parameters:
    ``{categories: {add: 1, sub: 1, rev: 1}, operands: [2, 3], digits: [1, 3],
    rev_length: [2, 6]}`` (categories and their weights; each range inclusive)."""
    if isinstance(spec, str):
        if spec not in DISTRIBUTIONS:
            raise ValueError(f"distribution: {spec!r} is not one of {list(DISTRIBUTIONS)}")
        return DISTRIBUTIONS[spec]
    unknown = set(spec) - {"categories", "operands", "digits", "rev_length"}
    if unknown or "categories" not in spec:
        raise ValueError(
            "distribution: give categories (with weights) and optionally operands, digits, "
            f"rev_length (got {sorted(spec)})"
        )
    ranges = {k: tuple(spec[k]) for k in ("operands", "digits", "rev_length") if k in spec}
    return world.Distribution(tuple(spec["categories"].items()), **ranges)


class WorldPrompts:
    """A prompt source: ``size`` distinct prompts of a world distribution, named (``seed``: the
    narrow seed set, ``heldout``: the broader target) or given by its parameters
    (``distribution_of``), labelled with their category. ``seed`` fixes the draw whatever the
    run's seed, as a benchmark's fixed set: the runs of every seed then share it (less the
    prompts a run's own ``exclude`` takes out, which are replaced by the next ones drawn)."""

    version = 1

    def __init__(
        self,
        distribution: str | Mapping[str, Any] = "seed",
        size: int = 256,
        seed: int | None = None,
    ):
        if size < 1:
            raise ValueError(f"size: must be >= 1 (got {size})")
        self.distribution, self.size, self.seed = distribution_of(distribution), size, seed

    def draw(self, seed: int, exclude: Collection[str] = ()) -> list[tuple[str, str | None]]:
        seed = seed if self.seed is None else self.seed
        prompts = world.sample_prompts(self.distribution, self.size, seed, exclude=exclude)
        return [(p, world.category_of(p)) for p in prompts]

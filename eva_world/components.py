"""The built-in world as eva backends: its verifier is the reward model, its operators the evolver.

These are what a real deployment replaces with a reward model (ArmoRM, Skywork) and an LLM
rewriter (EvolInstruct); the stages cannot tell the difference.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from eva_world import world
from tasks.backends.protocols import Progress, no_progress


class WorldReward(BaseModel):
    """Score responses with the world's program: dense position-wise match in [0, 1]."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["world"] = "world"

    def load(self) -> WorldVerifier:
        return WorldVerifier()


class WorldVerifier:
    def score(
        self,
        prompts: Sequence[str],
        responses: Sequence[Sequence[str]],
        progress: Progress = no_progress,
    ) -> list[list[float]]:
        out = [[world.reward(p, r) for r in rs] for p, rs in zip(prompts, responses, strict=True)]
        progress(1.0)
        return out


class WorldEvolver(BaseModel):
    """Rewrite prompts with the world's in-depth and in-breadth operators."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["world"] = "world"
    methods: tuple[str, ...] | None = Field(
        default=None, description="Restrict to these operators (default: all of EVOLVE_METHODS)."
    )

    def load(self) -> WorldRewriter:
        methods = self.methods or world.EVOLVE_METHODS
        unknown = sorted(set(methods) - set(world.EVOLVE_METHODS))
        if unknown:
            raise ValueError(
                f"evolver.methods: unknown {unknown}; choose from {world.EVOLVE_METHODS}"
            )
        return WorldRewriter(tuple(methods))


class WorldRewriter:
    def __init__(self, methods: tuple[str, ...]):
        self.methods = methods

    @staticmethod
    def category_of(prompt: str) -> str | None:
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
            rewrites = world.evolve_many(prompt, num_evolutions, rng, methods=self.methods)
            out.append(rewrites)
        return out

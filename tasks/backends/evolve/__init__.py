"""The evolver a config may name: one pydantic union, told apart by ``kind``.

``world`` needs nothing (the built-in world's operators); ``distilabel`` and ``paper`` need an
OpenAI-compatible LLM endpoint. A YAML config picks one with ``evolver: {kind: ..., ...}``.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from eva_world.components import WorldEvolver
from tasks.backends.evolve.distilabel import DistilabelEvolver
from tasks.backends.evolve.paper import PaperTemplateEvolver

EvolverBackend = Annotated[
    WorldEvolver | DistilabelEvolver | PaperTemplateEvolver, Field(discriminator="kind")
]

__all__ = ["DistilabelEvolver", "EvolverBackend", "PaperTemplateEvolver", "WorldEvolver"]

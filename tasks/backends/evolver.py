"""The evolver a config may name: one pydantic union, told apart by ``kind``.

``world`` needs nothing (the built-in world's operators); ``distilabel`` and ``paper`` need an
OpenAI-compatible LLM endpoint. A YAML config picks one with ``evolver: {kind: ..., ...}``.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from tasks.backends.distilabel_evolve import DistilabelEvolver
from tasks.backends.paper_evolve import PaperTemplateEvolver
from tasks.backends.world import WorldEvolver

EvolverBackend = Annotated[
    WorldEvolver | DistilabelEvolver | PaperTemplateEvolver, Field(discriminator="kind")
]

__all__ = ["DistilabelEvolver", "EvolverBackend", "PaperTemplateEvolver", "WorldEvolver"]

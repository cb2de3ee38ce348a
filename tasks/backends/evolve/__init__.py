"""The evolver a config may name: one pydantic union, told apart by ``kind``.

``distilabel`` (EvolInstruct, the paper's) and ``paper`` (the paper's appendix-F templates) need
an OpenAI-compatible LLM endpoint; ``python`` builds an object of yours with ``factory(**options)``
(the built-in world's operators: ``eva_world.components:WorldRewriter``); ``instructions`` adds
or tightens one verifiable instruction (IFEval's checkers). A YAML config picks one with
``evolver: {kind: ..., ...}``.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from tasks.backends.evolve.distilabel import DistilabelEvolver
from tasks.backends.evolve.instructions import InstructionEvolver
from tasks.backends.evolve.paper import PaperTemplateEvolver
from tasks.backends.python import PythonComponent

EvolverBackend = Annotated[
    DistilabelEvolver | PaperTemplateEvolver | InstructionEvolver | PythonComponent,
    Field(discriminator="kind"),
]

__all__ = [
    "DistilabelEvolver",
    "EvolverBackend",
    "InstructionEvolver",
    "PaperTemplateEvolver",
    "PythonComponent",
]

"""``SolverBackend``: the solver config a stage accepts, by ``kind``: one of the TRL objectives,
or ``python``, a solver of yours named by import path.

``kind`` is required: a solver section without it would otherwise silently become another
objective than the one the run was using.

A ``python`` solver is ``{kind: python, factory: "package.module:Name", options: {...}}``:
``factory(**options)`` builds an object with the ``Solver`` protocol's ``train`` method
(``tasks.backends.protocols``), which the train stage calls with the policy's checkpoint folder,
the pairs' prompts, chosen and rejected responses, the folder to save the new checkpoint in and
the stage's seed. Its code keys the train stage as any component of yours does
(``tasks.backends.python``).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from tasks.backends.protocols import Solver
from tasks.backends.python import PythonComponent
from tasks.backends.train.dpo import DPOSolverConfig, TRLSolverConfig
from tasks.backends.train.objectives import (
    DPONLLSolverConfig,
    ORPOSolverConfig,
    SimPOSolverConfig,
    SPPOSolverConfig,
)

SolverBackend = Annotated[
    DPOSolverConfig
    | SimPOSolverConfig
    | ORPOSolverConfig
    | SPPOSolverConfig
    | DPONLLSolverConfig
    | PythonComponent,
    Field(discriminator="kind"),
]


def load_solver(solver: SolverBackend, logging_dir: str | None = None) -> Solver:
    """The solver a config names; a TRL solver's trackers that write files (TensorBoard) write
    them to ``logging_dir``. A solver of yours is built as ``factory(**options)``: what it logs,
    and where, is its own."""
    if isinstance(solver, TRLSolverConfig):
        return solver.load(logging_dir)
    loaded: Solver = solver.load()
    return loaded

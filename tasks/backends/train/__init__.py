"""``SolverBackend``: the solver config a stage accepts, one of the TRL objectives by ``kind``.

``kind`` is required: a solver section without it would otherwise silently become another
objective than the one the run was using.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from tasks.backends.train.dpo import DPOSolverConfig
from tasks.backends.train.objectives import (
    DPONLLSolverConfig,
    ORPOSolverConfig,
    SimPOSolverConfig,
    SPPOSolverConfig,
)

SolverBackend = Annotated[
    DPOSolverConfig | SimPOSolverConfig | ORPOSolverConfig | SPPOSolverConfig | DPONLLSolverConfig,
    Field(discriminator="kind"),
]

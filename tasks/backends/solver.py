"""``SolverBackend``: the solver config a stage accepts, one of the TRL objectives by ``kind``.

A config without ``kind`` is DPO, so run configs written before the other objectives existed
(``{"solver": {"learning_rate": ...}}``) still load. That needs a callable discriminator:
``Field(discriminator="kind")`` rejects a dict that lacks the tag.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Discriminator, Tag

from tasks.backends.trl_dpo import DPOSolverConfig
from tasks.backends.trl_solvers import (
    DPONLLSolverConfig,
    ORPOSolverConfig,
    SimPOSolverConfig,
    SPPOSolverConfig,
)


def _kind(value: Any) -> str:
    if isinstance(value, dict):
        return str(value.get("kind", "dpo"))
    return str(getattr(value, "kind", "dpo"))


SolverBackend = Annotated[
    Annotated[DPOSolverConfig, Tag("dpo")]
    | Annotated[SimPOSolverConfig, Tag("simpo")]
    | Annotated[ORPOSolverConfig, Tag("orpo")]
    | Annotated[SPPOSolverConfig, Tag("sppo")]
    | Annotated[DPONLLSolverConfig, Tag("dpo_nll")],
    Discriminator(_kind),
]

"""What a launch asks of each stage: run what is unfinished, or rerun one stage (``eva stage``).

The pipeline is declared once, by the flows that call the stages; nothing here knows a stage
name or an order. What depends on what is read from the refs a stage is called with: a stage
depends on the target of ``eva stage`` exactly when one of its inputs was made by the target or
by something that depends on it (``Ref.rerun``). So ``eva stage complexity --downstream`` reruns
complexity and nothing else (nothing reads it), and ``eva stage evolve --downstream`` reruns
evolve, mix, the solver step on X_t and every later iteration.

A stage that neither is the target nor depends on it is reused if it finished and is skipped
otherwise, never computed: a launch that targets one stage does no other work. When the target
itself gets an input that was skipped, it fails naming that input.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from tasks.store import Ref

Decision = Literal["auto", "force", "reuse", "skip"]


class Plan(BaseModel):
    """Which stage to rerun, and whether what depends on it reruns too. The default plan runs
    whatever is not cached.

    ``target`` (with ``target_iteration``; None is setup) runs again, forced when ``force``;
    the stages that depend on it are skipped unless ``downstream``, in which case they run
    too, forced when ``force``. Everything else is reused, never computed.
    """

    model_config = ConfigDict(frozen=True)
    target_iteration: int | None = None
    target: str | None = None
    force: bool = True
    downstream: bool = False
    # Names this plan in the process-wide record of what its launch met (``met``).
    id: str = Field(default_factory=lambda: uuid.uuid4().hex)

    def is_target(self, iteration: int | None, artifact: str) -> bool:
        return self.target is not None and (iteration, artifact) == (
            self.target_iteration,
            self.target,
        )

    def decide(self, iteration: int | None, artifact: str, refs: Mapping[str, Ref]) -> Decision:
        if self.target is None:
            return "auto"
        _record(self.id, iteration, artifact)
        if self.is_target(iteration, artifact):
            return "force" if self.force else "auto"
        if any(r.rerun for r in refs.values()):
            if not self.downstream:
                return "skip"
            return "force" if self.force else "auto"
        return "reuse"

    def met(self) -> bool:
        """Whether a flow run with this plan reached its target."""
        with _LOCK:
            return (self.target_iteration, self.target) in _SEEN.get(self.id, [])

    def called_at(self, iteration: int | None) -> list[str]:
        """The artifacts the flow run with this plan called at ``iteration``, in call order."""
        with _LOCK:
            return list(dict.fromkeys(a for i, a in _SEEN.get(self.id, []) if i == iteration))


_LOCK = threading.Lock()
_SEEN: dict[str, list[tuple[int | None, str]]] = {}  # plan id -> (iteration, artifact) met


def _record(plan_id: str, iteration: int | None, artifact: str) -> None:
    # Stages run as Prefect tasks in threads of this process: a plain locked dict suffices.
    with _LOCK:
        _SEEN.setdefault(plan_id, []).append((iteration, artifact))

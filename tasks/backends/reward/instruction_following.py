"""Verifiable instruction following as a reward: IFEval's checkers (``if-verifiable``) judge each
response against the instructions its prompt carries as data (``tasks.backends.ifeval``).

The reward of a response is the checkers' verdict on it:

* ``score: partial`` (default): the share of its prompt's instructions it follows, a dense
  signal (the per-prompt form of IFEval's instruction-level accuracy);
* ``score: all``: 1 when it follows every one, else 0 (IFEval's prompt-level accuracy).

``loose: false`` (default) is IFEval's strict check, the response as it is; ``loose: true``
also accepts it with its first or last line, or its markdown asterisks, removed. A prompt that
carries no instructions has no verdict: its responses are NaN, unscored and counted
(``no_instructions``), never guessed from its text. A checker that raises on a response gives
that response NaN, counted as ``checker_failures``.

``stats()`` counts, since load, the instructions checked and followed: over a held-out set,
``followed / instructions`` is IFEval's instruction-level accuracy and ``all_followed /
responses`` its prompt-level one, in the configured check; ``*_strict`` and ``*_loose`` count
both checks whatever the configuration, and ``instructions_given`` every instruction, a
response a checker failed on included (``flows.evaluate_run.ifeval_figures``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from eva_core.schema import INSTRUCTION_COLUMNS
from eva_runtime.errors import ConfigError
from tasks.backends.ifeval import Instruction, parse, registry, seeded
from tasks.backends.protocols import Progress, no_progress


class InstructionFollowingReward(BaseModel):
    """IFEval's checkers, on the instructions each prompt carries."""

    version: ClassVar[int] = 1  # bump when a change can change what it computes
    # langdetect decides the language and case checkers' "is it English".
    libraries: ClassVar[tuple[str, ...]] = ("if-verifiable", "langdetect")
    prompt_columns: ClassVar[tuple[str, ...]] = INSTRUCTION_COLUMNS

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["instruction_following"] = "instruction_following"
    score: Literal["partial", "all"] = Field(
        default="partial",
        description="partial = the share of the prompt's instructions a response follows; "
        "all = 1 only when it follows every one (IFEval's prompt-level accuracy).",
    )
    loose: bool = Field(
        default=False,
        description="false = IFEval's strict check (the response as it is); true = its loose "
        "one (also with the first or last line, or markdown asterisks, removed).",
    )

    def load(self) -> InstructionScorer:
        try:
            registry()
        except ImportError as exc:
            raise ConfigError(str(exc), field="annotate.reward") from None
        # langdetect samples; its documented switch makes a verdict the same on every call.
        from langdetect import DetectorFactory

        DetectorFactory.seed = 0
        return InstructionScorer(self)


class InstructionScorer:
    """A loaded instruction-following reward (``RewardModel``); reads ``prompt_columns``."""

    prompt_columns = INSTRUCTION_COLUMNS

    def __init__(self, config: InstructionFollowingReward):
        self.config = config
        self._counts: Counter[str] = Counter()

    def stats(self) -> dict[str, int]:
        """Responses checked, instructions checked and followed, responses that followed all,
        prompts without instructions, checker failures: since load, over every call."""
        return dict(self._counts)

    def score(
        self,
        prompts: Sequence[str],
        responses: Sequence[Sequence[str]],
        progress: Progress = no_progress,
        *,
        instruction_id_list: Sequence[Any] | None = None,
        kwargs: Sequence[Any] | None = None,
    ) -> list[list[float]]:
        if instruction_id_list is None:
            raise ValueError(
                "the instruction-following reward reads the prompts' instruction_id_list and "
                "kwargs columns, and was given none"
            )
        kwargs = kwargs if kwargs is not None else [None] * len(prompts)
        if not len(prompts) == len(responses) == len(instruction_id_list) == len(kwargs):
            raise ValueError(f"{len(prompts)} prompts but {len(responses)} response lists")
        out: list[list[float]] = []
        for i, (prompt, group) in enumerate(zip(prompts, responses, strict=True)):
            ids = instruction_id_list[i]
            if ids is None or len(ids) == 0:
                self._counts["no_instructions"] += 1
                out.append([math.nan] * len(group))
                continue
            instructions = parse(ids, kwargs[i])
            out.append([self._one(prompt, r, instructions) for r in group])
            progress((i + 1) / len(prompts))
        return out

    def _one(self, prompt: str, response: str, instructions: list[Instruction]) -> float:
        from if_verifiable.common import evaluate_instructions

        ids = [iid for iid, _ in instructions]
        self._counts["instructions_given"] += len(ids)
        try:
            # Seeded: a checker given an argument it does not take draws one (the edge refuses
            # such rows, tasks.backends.ifeval.check); the same response then scores the same.
            with seeded(0):
                results, _ = evaluate_instructions(
                    response, ids, [args for _, args in instructions], prompt, registry()
                )
        except Exception:  # one checker's bad day is this response's NaN, not the stage's end
            self._counts["checker_failures"] += 1
            return math.nan
        # An empty response follows nothing (the package returns no results for it).
        whole = len(results) == len(ids)
        strict = sum(r.strict_pass for r in results) if whole else 0
        loose = sum(r.loose_pass for r in results) if whole else 0
        followed = loose if self.config.loose else strict
        self._counts.update(
            responses=1,
            instructions=len(ids),
            followed=followed,
            all_followed=int(followed == len(ids)),
            followed_strict=strict,
            all_followed_strict=int(strict == len(ids)),
            followed_loose=loose,
            all_followed_loose=int(loose == len(ids)),
        )
        if self.config.score == "all":
            return float(followed == len(ids))
        return followed / len(ids)

"""An evolver for verifiable instruction following: EvolInstruct's "add constraints", in depth,
with constraints a checker can verify (``tasks.backends.ifeval``).

Each child of a prompt is the prompt made harder by one step; a prompt's children are steps
drawn at random, without repeats, from those open to it:

* ``add:<id>``: one more instruction of ``instructions``, with the arguments its checker draws,
  that conflicts with none the prompt has (at most ``max_instructions`` in all); its
  description, in the checker's words, is appended to the text;
* ``tighten:<id>``: an instruction the prompt has, made stricter (one more keyword to include
  or to avoid, a count raised or a bound lowered: ``ifeval.TIGHTEN``); its old description in
  the text is replaced by the new one. A prompt whose text does not hold that description
  word for word (one written by hand) is only ever added to.

A child carries its instructions as data beside its text (``evolve`` returns ``(text, method,
columns)``), so the reward checks exactly what the text asks. Children are drawn from a seed of
the stage's and the parent's text, so a parent's children do not depend on its batch-mates.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from eva_core.schema import INSTRUCTION_COLUMNS
from eva_runtime.seeds import content_seed
from tasks.backends.ifeval import (
    TIGHTEN,
    Instruction,
    as_columns,
    consistent,
    describe,
    draw,
    parse,
    unusable,
)

# Instructions a short answer can follow: what a small model on a CPU can learn from. Left
# out by default: length and sentence counts it cannot reach in a few hundred tokens, another
# language, two responses, repeating the prompt, a fixed yes/no/maybe answer.
DEFAULT_INSTRUCTIONS = (
    "change_case:english_lowercase",
    "change_case:english_capital",
    "punctuation:no_comma",
    "startend:end_checker",
    "startend:quotation",
    "detectable_content:postscript",
    "detectable_format:title",
    "detectable_format:number_highlighted_sections",
    "detectable_content:number_placeholders",
    "keywords:existence",
    "keywords:forbidden_words",
    "keywords:frequency",
)


class InstructionEvolver(BaseModel):
    """Evolve a prompt by adding or tightening one verifiable instruction."""

    version: ClassVar[int] = 1  # bump when a change can change what it computes
    libraries: ClassVar[tuple[str, ...]] = ("if-verifiable",)
    prompt_columns: ClassVar[tuple[str, ...]] = INSTRUCTION_COLUMNS

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["instructions"] = "instructions"
    instructions: tuple[str, ...] = Field(
        default=DEFAULT_INSTRUCTIONS,
        min_length=1,
        description="The instruction ids (if-verifiable's IFEval registry) a child may add.",
    )
    max_instructions: int = Field(
        default=4, ge=1, description="A child never carries more instructions than this."
    )
    tighten: bool = Field(
        default=True,
        description="Also make an instruction the prompt has stricter; false: only add.",
    )

    @field_validator("instructions")
    @classmethod
    def _usable(cls, ids: tuple[str, ...]) -> tuple[str, ...]:
        for iid in ids:
            if (why := unusable(iid)) is not None:
                raise ValueError(why)
        return ids

    def load(self) -> InstructionRewriter:
        return InstructionRewriter(self)


class InstructionRewriter:
    """A loaded instruction evolver (``Evolver``); reads ``prompt_columns``."""

    prompt_columns = INSTRUCTION_COLUMNS

    def __init__(self, config: InstructionEvolver):
        self.config = config

    @staticmethod
    def keeps_topic(method: str) -> bool:
        """Every child is its parent's task with one more (or a stricter) instruction."""
        return True

    def evolve(
        self,
        prompts: Sequence[str],
        categories: Sequence[str | None],
        num_evolutions: int,
        seed: int,
        *,
        instruction_id_list: Sequence[Any] | None = None,
        kwargs: Sequence[Any] | None = None,
    ) -> list[list[tuple[str, str, dict[str, Any]]]]:
        ids = instruction_id_list if instruction_id_list is not None else [None] * len(prompts)
        args = kwargs if kwargs is not None else [None] * len(prompts)
        out = []
        for text, own_ids, own_args in zip(prompts, ids, args, strict=True):
            have = parse(own_ids, own_args) if own_ids else []
            rng = random.Random(content_seed(seed, text))
            out.append(self._children(text, have, num_evolutions, rng))
        return out

    def _children(
        self, text: str, have: list[Instruction], n: int, rng: random.Random
    ) -> list[tuple[str, str, dict[str, Any]]]:
        """Up to ``n`` of the steps open to the prompt, drawn without repeats."""
        open_steps = self._steps(text, have, rng)
        rng.shuffle(open_steps)
        return open_steps[:n]

    def _steps(
        self, text: str, have: list[Instruction], rng: random.Random
    ) -> list[tuple[str, str, dict[str, Any]]]:
        """Every child one step away: each instruction that may be added (its arguments drawn
        once), each one the prompt has made stricter."""
        cfg = self.config
        steps = []
        if len(have) < cfg.max_instructions:
            for iid in cfg.instructions:
                new = draw(iid, rng.randrange(2**31))
                if consistent([*have, new]):
                    child = [*have, new]
                    steps.append(self._as_child(f"{text.rstrip()} {describe(new)}", iid, child))
        for j, (iid, old_args) in enumerate(have if cfg.tighten else []):
            stricter = TIGHTEN[iid](old_args, rng) if iid in TIGHTEN else None
            old = describe(have[j])
            if stricter is None or old not in text:
                continue  # a text written by hand: no words of the checker's to replace
            child = [*have[:j], (iid, stricter), *have[j + 1 :]]
            if consistent(child):
                new_text = text.replace(old, describe((iid, stricter)), 1)
                steps.append(self._as_child(new_text, iid, child, "tighten"))
        return steps

    @staticmethod
    def _as_child(
        text: str, iid: str, instructions: list[Instruction], step: str = "add"
    ) -> tuple[str, str, dict[str, Any]]:
        ids, args = as_columns(instructions)
        return text, f"{step}:{iid}", {"instruction_id_list": ids, "kwargs": args}

"""Complexity/quality judges of prompts: the paper's LLM judge (Table 7), or an object of yours
(``python``; the built-in world's exact difficulty is ``eva_world.components:WorldDifficulty``).
The ``complexity`` stage charts a prompt set with them; the paper evolver's best-of-N tree ranks
its rewrites with the LLM one.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from eva_runtime.llm_client import LLMClient
from eva_runtime.llm_config import NamedLLMConfig
from tasks.backends.python import PythonComponent

JUDGE_TEMPLATE = """You are an expert judge of the user prompts used to train AI assistants.
Rate the user prompt below on two scales from 1 to 10. Do not answer the prompt.

Complexity: how much knowledge, reasoning, specificity and how many constraints a good answer
needs. 1 = a trivial one-step request; 5 = a typical task needing some expertise or several
steps; 10 = a demanding expert task with several interacting requirements.
Quality: how clear, coherent, self-contained and answerable the prompt is. 1 = unintelligible,
contradictory or impossible to answer; 5 = understandable but vague or partly ill-posed;
10 = precise, well-posed and realistic.

Reply with exactly two lines and nothing else:
Complexity: <integer from 1 to 10>
Quality: <integer from 1 to 10>

#Prompt#:
{prompt}
"""
_SCORE = {
    # "Complexity: 7", "**Complexity**: 7/10", "complexity score = 7.5"
    name: re.compile(rf"{name}(?:\s+(?:score|rating))?[^\w\n]{{0,8}}(\d+(?:\.\d+)?)", re.I)
    for name in ("complexity", "quality")
}


def parse_judgement(text: str) -> tuple[float, float]:
    """(complexity, quality) from a judge's answer; NaN for a missing or out-of-range score."""

    def one(name: str) -> float:
        m = _SCORE[name].search(text or "")
        value = float(m.group(1)) if m else math.nan
        return value if 1.0 <= value <= 10.0 else math.nan

    return one("complexity"), one("quality")


class LLMComplexityJudge(BaseModel):
    """Ask an LLM to rate complexity and quality 1-10 (the paper's Table 7 judge)."""

    version: ClassVar[int] = 1  # bump when a change can change what it computes
    libraries: ClassVar[tuple[str, ...]] = ()

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["llm"] = "llm"
    llm: NamedLLMConfig = Field(
        description="Endpoint, model (required), key, concurrency, timeout and retries."
    )
    temperature: float = Field(default=0.0, ge=0.0, description="0: a judge should not sample.")
    max_tokens: int = Field(default=1024, ge=1, description="Answer length cap in tokens.")

    def load(self) -> LLMComplexityScorer:
        return LLMComplexityScorer(self)


class LLMComplexityScorer:
    """Failed requests are unscored (NaN), not fatal; a 401/403/404 stops the stage."""

    def __init__(self, config: LLMComplexityJudge):
        self.config = config
        self.client = LLMClient(config.llm)  # a missing API key raises here

    def stats(self) -> dict[str, int]:
        """The client's request counts since load, over every ``score`` call."""
        return self.client.stats()

    def score(self, prompts: Sequence[str]) -> list[tuple[float, float]]:
        cfg = self.config
        requests = [JUDGE_TEMPLATE.format(prompt=p) for p in prompts]
        answers = self.client.answers(
            requests, temperature=cfg.temperature, max_tokens=cfg.max_tokens
        )
        return [parse_judgement(a) for a in answers]

    def rank_scores(self, prompts: Sequence[str]) -> list[float]:
        """One number to rank rewrites by: complexity + quality, so that a harder prompt wins
        only while it stays well-posed; NaN when the judge gave no usable answer."""
        return [c + q for c, q in self.score(prompts)]


ComplexityJudgeBackend = Annotated[
    LLMComplexityJudge | PythonComponent, Field(discriminator="kind")
]

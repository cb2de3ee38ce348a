"""Stage ``complexity``: how hard and how well-posed each prompt of a prompt set is.

The paper (Table 7) shows that evolved prompts grow in complexity and keep their quality by
asking an LLM judge to rate both from 1 to 10; ``LLMComplexityJudge`` is such a judge over any
OpenAI-compatible endpoint (through ``tasks.backends.llm_client``). The built-in world needs no
LLM: ``WorldJudge`` reports its exact difficulty (digits + 2 per extra operand, or string
length) and no quality. The same judge ranks rewrites in the paper evolver's best-of-N tree.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Annotated, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, Field

from eva_core import world
from tasks.backends.llm_client import LLMClient, NamedLLMConfig
from tasks.stage import StageContext, StageOutput, stage

COMPLEXITY_COLUMNS = ("prompt_id", "prompt", "complexity", "quality")

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


class WorldJudge(BaseModel):
    """The built-in world's exact difficulty; no quality (NaN)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["world"] = "world"

    def load(self) -> WorldDifficulty:
        return WorldDifficulty()


class WorldDifficulty:
    @property
    def counts(self) -> dict[str, int]:
        return {}  # no requests: the world computes difficulty

    def score(self, prompts: Sequence[str]) -> list[tuple[float, float]]:
        out = []
        for p in prompts:
            try:
                out.append((float(world.difficulty(p)), math.nan))
            except ValueError:  # not a world prompt: unscored rather than a failed stage
                out.append((math.nan, math.nan))
        return out


class LLMComplexityJudge(BaseModel):
    """Ask an LLM to rate complexity and quality 1-10 (the paper's Table 7 judge)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["llm"] = "llm"
    llm: NamedLLMConfig = Field(
        description="Endpoint, model (required), key, concurrency, timeout and retries."
    )
    temperature: float = Field(default=0.0, ge=0.0, description="0: a judge should not sample.")
    max_tokens: int = Field(default=1024, ge=1, description="Answer length cap in tokens.")

    def load(self) -> ComplexityJudge:
        return ComplexityJudge(self)


class ComplexityJudge:
    """Failed requests are unscored (NaN), not fatal; a 401/403/404 stops the stage."""

    def __init__(self, config: LLMComplexityJudge):
        self.config = config
        self.client = LLMClient(config.llm)  # a missing API key raises here

    @property
    def counts(self) -> dict[str, int]:
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


Judge = Annotated[WorldJudge | LLMComplexityJudge, Field(discriminator="kind")]


class ComplexityConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    judge: Judge = Field(default_factory=WorldJudge)
    chunk: int = Field(default=256, ge=1, description="Prompts per judge call (progress step).")


@stage("complexity", inputs={"prompts": ("prompt_id", "prompt")}, outputs=COMPLEXITY_COLUMNS)
def complexity(ctx: StageContext, config: ComplexityConfig, prompts: pa.Table) -> StageOutput:
    judge = config.judge.load()
    texts = prompts.column("prompt").to_pylist()
    scores: list[tuple[float, float]] = []
    for start in range(0, len(texts), config.chunk):
        scores += judge.score(texts[start : start + config.chunk])
        ctx.progress(min(1.0, (start + config.chunk) / max(len(texts), 1)))
    values = np.array(scores, dtype=float).reshape(-1, 2)
    out = prompts.select(["prompt_id", "prompt"])
    out = out.append_column("complexity", pa.array(values[:, 0], pa.float64()))
    out = out.append_column("quality", pa.array(values[:, 1], pa.float64()))

    def mean(col: np.ndarray) -> float | None:
        ok = col[np.isfinite(col)]
        return round(float(ok.mean()), 4) if ok.size else None

    stats = {
        "judge": config.judge.kind, "prompts": len(texts),
        "mean_complexity": mean(values[:, 0]), "mean_quality": mean(values[:, 1]),
        "unscored": int((~np.isfinite(values[:, 0])).sum()), "requests": judge.counts,
    }  # fmt: skip
    top = pc.sort_indices(out, [("complexity", "descending")])[:20]
    rows = [
        {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
        for r in out.take(top).select(["prompt", "complexity", "quality"]).to_pylist()
    ]
    return StageOutput(out, stats=stats, ui_tables={"most-complex": rows})

"""The LLM judge of evaluation: a strong model compares a checkpoint's answer with a reference
model's, as Arena-Hard does (its verdict scale, both orders, ties allowed).

Every judging request goes through the one LLM client (``eva_runtime.llm_client``): its retries,
concurrency, key and counts. A verdict is parsed strictly (``eva_core.verdicts``): a judgment
without exactly one label of the scale is unparseable, kept as text and counted, never guessed.

Failure policy, per comparison: a request that still fails after its retries, or that the
endpoint refuses for that request alone (a 400 for a prompt over its context), is counted as
failed and left out, as an unparseable verdict is. A configuration error every request would
hit (401, 403, 404: the key, the model) stops the call; so does an endpoint that is down (the
client's breaker, ``LLMEndpointDown``), in one line naming it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, field_validator

from eva_core.verdicts import parse_verdict
from eva_runtime.llm_client import LLMClient, LLMRequestError
from eva_runtime.llm_config import NamedLLMConfig
from tasks.backends.judge.reference import ReferenceSource
from tasks.backends.protocols import Progress, no_progress

# Our own wording of Arena-Hard's judging instructions, asking for its five labels.
DEFAULT_SYSTEM_PROMPT = """You are an impartial judge. Two AI assistants, A and B, answered \
the same user prompt; decide whose answer is better.

First write your own answer to the prompt. Then compare each assistant's answer with yours: \
point out and correct any mistake or inaccurate information. Judge whether each answer is \
helpful (it does what the prompt asks; where the prompt is ambiguous, asking for clarification \
beats assuming), relevant (every part of it serves the prompt) and concise (clear, not verbose). \
Consider creativity and novelty where the prompt calls for them, and note important \
information that an answer leaves out.

After your explanation, end with exactly one of these labels as your final verdict:

1. Assistant A is significantly better: [[A>>B]]
2. Assistant A is slightly better: [[A>B]]
3. Tie, relatively the same: [[A=B]]
4. Assistant B is slightly better: [[B>A]]
5. Assistant B is significantly better: [[B>>A]]

For example: "My final verdict is tie: [[A=B]]"."""

DEFAULT_TEMPLATE = """<|User Prompt|>
{prompt}

<|The Start of Assistant A's Answer|>
{answer_a}
<|The End of Assistant A's Answer|>

<|The Start of Assistant B's Answer|>
{answer_b}
<|The End of Assistant B's Answer|>"""

PLACEHOLDERS = ("{prompt}", "{answer_a}", "{answer_b}")


class Judgment(NamedTuple):
    """One comparison: the verdict's label (None: unparseable or failed), the judge's text
    (None when the request failed), and whether it failed."""

    label: str | None
    text: str | None
    failed: bool


class JudgeConfig(BaseModel):
    """An LLM judge of each checkpoint's held-out answers against reference answers."""

    version: ClassVar[int] = 1  # bump when a change can change what it computes
    libraries: ClassVar[tuple[str, ...]] = ("numpy",)
    model_config = ConfigDict(frozen=True, extra="forbid")

    llm: NamedLLMConfig = Field(
        description="The judge's endpoint, model (required: Arena-Hard's is "
        "gpt-4-1106-preview), key, concurrency, timeout and retries."
    )
    reference: ReferenceSource = Field(
        # Left out of the judge stage's own config (it reads the reference artifact, keyed by
        # its content): how the answers were made is the reference stage's.
        exclude_if=lambda value: value is None,
        description="The reference answers: {kind: column, column: ...} of the held-out file "
        "or dataset, {kind: file, path: ...}, or {kind: generate, model: ..., generation: "
        "...} (generated once per run; Arena-Hard's reference model is gpt-4-0314).",
    )
    system_prompt: str = Field(
        default=DEFAULT_SYSTEM_PROMPT,
        description="The judge's instructions; they must ask for one of [[A>>B]], [[A>B]], "
        "[[A=B]], [[B>A]], [[B>>A]] (Arena-Hard's scale, the only verdicts read).",
    )
    template: str = Field(
        default=DEFAULT_TEMPLATE,
        description="The user message, with {prompt}, {answer_a} and {answer_b}.",
    )
    temperature: float = Field(default=0.0, ge=0.0, description="Arena-Hard's 0.")
    max_tokens: int = Field(
        default=4096, ge=1, description="Judgment length cap in tokens (Arena-Hard's 4096)."
    )
    bootstrap_rounds: int = Field(
        default=1000, ge=1, description="Resamples of the prompts for the win rate's interval."
    )
    confidence: float = Field(
        default=0.95, gt=0.0, lt=1.0, description="The interval's confidence level."
    )
    max_unjudged_share: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="Fail the judge stage when more than this share of the prompts got no "
        "usable verdict in either order (a broken judge or template); fewer are counted.",
    )

    @field_validator("template")
    @classmethod
    def _placeholders(cls, value: str) -> str:
        try:
            value.format(prompt="", answer_a="", answer_b="")
        except (KeyError, IndexError, ValueError) as e:
            raise ValueError(
                f"placeholders are {PLACEHOLDERS}; double other braces ({e!r})"
            ) from None
        if missing := [k for k in PLACEHOLDERS if k not in value]:
            raise ValueError(f"the template lacks {missing}")
        return value

    def without_reference(self) -> JudgeConfig:
        """The judge stage's config: this one without how the reference was made."""
        return self.model_copy(update={"reference": None})

    def load(self) -> LLMJudge:
        return LLMJudge(self)


class LLMJudge:
    """Asks the judge about pairs of answers, concurrently, through the shared client."""

    def __init__(self, config: JudgeConfig):
        self.config = config
        self.client = LLMClient(config.llm)  # a missing API key raises here

    def __repr__(self) -> str:
        return f"LLMJudge(model={self.client.model!r}, base_url={self.config.llm.base_url!r})"

    def close(self) -> None:
        self.client.close()

    def stats(self) -> dict[str, int]:
        """Requests, retries, failures and tokens since the judge was loaded."""
        return self.client.stats()

    def compare(
        self, games: Sequence[tuple[str, str, str]], progress: Progress = no_progress
    ) -> list[Judgment]:
        """A judgment of each ``(prompt, answer A, answer B)``, in order."""
        cfg = self.config

        def one(game: tuple[str, str, str]) -> Judgment:
            prompt, a, b = game
            messages = [
                {"role": "system", "content": cfg.system_prompt},
                {"role": "user", "content": cfg.template.format(
                    prompt=prompt, answer_a=a, answer_b=b)},
            ]  # fmt: skip
            try:
                texts = self.client.chat(
                    messages, temperature=cfg.temperature, max_tokens=cfg.max_tokens
                )
            except LLMRequestError as exc:
                if exc.config_error:
                    raise  # every request would hit it: the batch stops, naming it
                return Judgment(None, None, True)
            text = texts[0] if texts else ""
            return Judgment(parse_verdict(text), text, False)

        return self.client.map(one, list(games), progress)

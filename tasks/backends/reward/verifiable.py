"""A verifiable reward for prompts whose reference answer is known for some and not for others.

A math or puzzle set usually comes with answers for its seed prompts; the children an LLM
rewriter evolves from them come with none. ``verifiable`` scores a response with a verifier
``function(response, answer) -> float`` against

* the prompt's **known answer**, from a file (``answers``: JSONL, JSON, CSV or parquet with a
  prompt and an answer column), matched by ``eva_core.schema.prompt_id``, so spacing and case
  of the prompt do not matter;
* for a prompt without one, with ``unknown: majority``, the **majority answer** of its own N
  responses, when that answer's share of the N reaches ``agreement`` (test-time RL's and
  self-questioning LMs' labelling: TTRL, Zuo et al. 2025; SQLM, Chen et al. 2025; R-Zero);
  below it, or with ``unknown: drop``, every response of the prompt is NaN: unscored, counted
  by the stage (``annotate.max_unscored_share``) and left out of pairs and informativeness.

It needs a prompt's N responses together, so it is not a pointwise reward: evaluation (one
greedy answer per prompt) needs a reward of its own (``evaluate.reward``).

Verifier failures: one that raises on a response gives that response NaN and is counted
(``verifier_failures``); one that raises on every response fails the call, one line naming it.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from eva_core.answers import answer_rewards, normalize_answer
from eva_core.schema import prompt_id
from eva_runtime.errors import EvaError, first_line
from tasks.backends.protocols import Progress, no_progress
from tasks.backends.reward.function import GuardedCalls, resolve_function
from tasks.content_hashes import hash_file
from tasks.prompt_files import read_columns

FIELD = "annotate.reward"
FORMATS = (".jsonl", ".json", ".csv", ".parquet")


class AnswersError(EvaError, ValueError):
    """An answers file that cannot be read as asked (file, format, columns, conflicts)."""


def read_answers(
    path: str, prompt_column: str = "prompt", answer_column: str = "answer"
) -> dict[str, str]:
    """Known answers by ``prompt_id``. Rows with an empty answer are skipped (those prompts
    count as unknown); two different answers for one prompt are refused."""
    ext = os.path.splitext(path)[1].lower()
    if ext not in FORMATS:
        raise AnswersError(
            f"answers: {path!r} is not one of {', '.join(FORMATS)}",
            field=f"{FIELD}.answers",
            hint="a file with a prompt and an answer column",
        )
    try:
        columns = read_columns(path, ext, {})
    except Exception as exc:  # missing, unreadable, malformed: one line, whichever
        raise AnswersError(
            f"answers: cannot read {path!r}: {first_line(exc)}",
            field=f"{FIELD}.answers",
            hint="a local JSONL, JSON, CSV or parquet file",
        ) from None
    for name, column in (("prompt_column", prompt_column), ("answer_column", answer_column)):
        if column not in columns:
            raise AnswersError(
                f"answers: {path!r} has no column {column!r} (it has {list(columns)})",
                field=f"{FIELD}.{name}",
                hint=f"set {name} to the column that holds it",
            )
    out: dict[str, str] = {}
    prompts, answers = columns[prompt_column], columns[answer_column]
    for row, (prompt, answer) in enumerate(zip(prompts, answers, strict=True)):
        text = "" if answer is None else str(answer).strip()
        if not text or not isinstance(prompt, str):
            continue
        key = prompt_id(prompt)
        if out.get(key, text) != text:
            raise AnswersError(
                f"answers: row {row} gives {text!r} for a prompt already answered "
                f"{out[key]!r}: {prompt[:60]!r}",
                field=f"{FIELD}.answers",
                hint="one answer per prompt (prompts match ignoring spacing and case)",
            )
        out[key] = text
    return out


class VerifiableReward(BaseModel):
    """Score responses against known answers, and unknown ones against a majority vote."""

    version: ClassVar[int] = 1  # bump when a change can change what it computes
    libraries: ClassVar[tuple[str, ...]] = ("pyarrow",)

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["verifiable"] = "verifiable"
    function: str = Field(
        description='The verifier, import path "package.module:function", called as '
        "f(response, answer) -> float (1 correct, 0 wrong, or anything between; None: NaN)."
    )
    extract: str | None = Field(
        default=None,
        description='The final answer of a response, import path "package.module:function", '
        "called as f(response) -> str; the majority vote counts these (normalized for spacing "
        "and case) instead of whole responses, so long solutions that end in the same answer "
        "agree. None: whole responses (short-answer tasks).",
    )
    answers: str | None = Field(
        default=None,
        description="Known reference answers: a local JSONL/JSON/CSV/parquet file with a "
        "prompt and an answer column (matched ignoring spacing and case). None: every prompt "
        "is unknown.",
    )
    prompt_column: str = Field(default="prompt", description="The answers file's prompt column.")
    answer_column: str = Field(default="answer", description="The answers file's answer column.")
    unknown: Literal["majority", "drop"] = Field(
        default="majority",
        description="A prompt with no known answer: majority = scored against the most "
        "frequent answer of its own N responses when that reaches `agreement` (TTRL, SQLM, "
        "R-Zero), else unscored; drop = unscored (NaN).",
    )
    agreement: float = Field(
        default=0.5,
        gt=0.0,
        le=1.0,
        description="The share of a prompt's N responses the majority answer needs to become "
        "its label (empty responses count in N). TTRL labels by plain majority; higher is "
        "fewer, surer labels.",
    )

    @field_validator("function", "extract")
    @classmethod
    def _importable(cls, value: str | None) -> str | None:
        if value is not None:
            resolve_function(value)
        return value

    @model_validator(mode="before")
    @classmethod
    def _recorded_hash(cls, data: Any) -> Any:
        # Configs written before the hash moved into the key (a run folder's config.json) carry
        # it: it was always recomputed from the file, so a value given is dropped.
        if isinstance(data, dict) and "answers_sha256" in data:
            data = {k: v for k, v in data.items() if k != "answers_sha256"}
        return data

    @model_validator(mode="after")
    def _read(self) -> VerifiableReward:
        if self.answers is not None:
            try:
                read_answers(self.answers, self.prompt_column, self.answer_column)
            except AnswersError as exc:  # pydantic names the field; the hint stays in the line
                raise ValueError(f"{exc.message} ({exc.hint})") from None
        return self

    def extra_key(self) -> dict[str, str | None]:
        """What the config points at, in its part of the key (``tasks.keys``): the answers
        file's hash, so editing the file reruns the stages that use this reward."""
        return {"answers_sha256": hash_file(self.answers) if self.answers is not None else None}

    def load(self) -> VerifiableScorer:
        known: dict[str, str] = {}
        if self.answers is not None:
            known = read_answers(self.answers, self.prompt_column, self.answer_column)
        extract = resolve_function(self.extract) if self.extract is not None else None
        return VerifiableScorer(resolve_function(self.function), known, self, extract)


class VerifiableScorer:
    """A loaded verifiable reward (``RewardModel``); ``stats()`` counts since load."""

    def __init__(
        self,
        verify: Callable[[str, str], Any],
        known: dict[str, str],
        config: VerifiableReward,
        extract: Callable[[str], Any] | None = None,
    ):
        self.verify, self.known, self.config, self.extract = verify, known, config, extract
        self._counts: Counter[str] = Counter()

    def stats(self) -> dict[str, int]:
        """Prompts scored by a known answer, by a majority label, dropped (and why), and
        verifier failures, since load over every ``score`` call (``ReportsStats``)."""
        return dict(self._counts)

    def _normalize(self, response: str) -> str:
        """What the majority vote counts: the extracted final answer (empty when extraction
        fails: it then counts against the agreement), spacing and case normalized."""
        if self.extract is None:
            return normalize_answer(response)
        try:
            answer = self.extract(response)
        except Exception:  # an unreadable response gives no answer, as an empty one
            return ""
        return normalize_answer(str(answer)) if answer is not None else ""

    def score(
        self,
        prompts: Sequence[str],
        responses: Sequence[Sequence[str]],
        progress: Progress = no_progress,
    ) -> list[list[float]]:
        if len(prompts) != len(responses):
            raise ValueError(f"{len(prompts)} prompts but {len(responses)} response lists")
        answers = [self.known.get(prompt_id(p)) for p in prompts]
        verify = GuardedCalls(self.verify, self.config.function, what="verifier")
        if self.config.unknown == "majority":
            result = answer_rewards(
                responses, answers, verify, self.config.agreement, self._normalize
            )
            rewards, counts, vote = result.rewards, result.counts(), result.stats.as_dict()
        else:
            rewards = [
                [verify(r, a) for r in rs] if a is not None else [math.nan] * len(rs)
                for rs, a in zip(responses, answers, strict=True)
            ]
            known = sum(a is not None for a in answers)
            counts, vote = {"known": known, "majority": 0, "dropped": len(answers) - known}, {}
        self._counts.update(counts)
        self._counts.update({k: v for k, v in vote.items() if k.startswith("dropped_")})
        self._counts.update(verifier_failures=verify.failures)
        verify.check()
        progress(1.0)
        return rewards

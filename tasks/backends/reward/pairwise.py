"""Pairwise preferences turned into per-response rewards, with an LLM judge as the comparator.

SPPO-style methods need a preference ``P(a beats b)`` rather than a pointwise reward. eva's
stages consume one number per response, so ``PairwiseReward`` scores response ``i`` of a prompt
by its mean win probability against the other ``N - 1`` responses. That costs ``N(N-1)/2``
judge calls per prompt, ``N(N-1)`` with ``both_orders`` (30 for the default N = 6): quadratic
in N, so keep N small or budget the endpoint accordingly. Identical responses are not sent to
the judge: they tie (0.5) by definition.

``both_orders`` asks for each pair as (a, b) and as (b, a) and averages ``p(a>b)`` with
``1 - p(b>a)``, which cancels a judge's preference for the first (or second) position.

Failure policy: an unparseable verdict is NaN for that comparison and left out of the means; a
request that still fails after its retries is too (counted in ``stats()``, since the reward was
loaded, with the judge's request counts as ``judge_*``). Any other failed request (a 401, an
unknown model) stops the call: every request would hit it. A response with no usable comparison
is NaN. If no comparison at all is usable the call raises: the judge or its template is broken,
and a stage of NaN rewards would only fail later and less clearly.
"""

from __future__ import annotations

import math
import re
import threading
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import ClassVar, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, field_validator

from eva_runtime.errors import ConfigError, EvaError
from eva_runtime.llm_client import LLMClient, LLMRequestError
from eva_runtime.llm_config import NamedLLMConfig
from tasks.backends.protocols import Progress, no_progress, stats_of

# Where a pairwise reward sits in a config: annotate is the one stage that takes one (evaluation
# and the online loop score one response alone, and need a pointwise reward).
FIELD = "annotate.reward"

DEFAULT_TEMPLATE = """You are judging two responses to the same user prompt.

[Prompt]
{prompt}

[Response A]
{response_a}

[Response B]
{response_b}

Which response is better: more correct, more helpful, and better written? Reply with exactly \
one of: A, B, or tie."""

_BRACKETED = re.compile(r"\[\[\s*(A|B|tie)\s*\]\]", re.IGNORECASE)
_LEADING = re.compile(
    r"^\W*(?:(?:response|answer|output|option)\s+)?(A|B|tie|equal|draw)\b", re.IGNORECASE
)


class JudgeRequestError(EvaError, RuntimeError):
    """A comparison the judge could not be asked: the endpoint kept failing past the retries."""


def parse_verdict(text: str | None) -> float:
    """``P(A beats B)`` from a judge's answer: A -> 1, B -> 0, tie -> 0.5, anything else NaN.

    Accepts a bare verdict ("A", "b.", "Tie"), a leading one ("Response A is better") and the
    MT-Bench ``[[A]]`` form anywhere in the text; refuses to guess beyond that.
    """
    if not text:
        return math.nan
    match = _BRACKETED.search(text) or _LEADING.match(text.strip())
    if match is None:
        return math.nan
    verdict = match.group(1).lower()
    return {"a": 1.0, "b": 0.0}.get(verdict, 0.5)


class LLMPairwiseJudgeConfig(BaseModel):
    """An LLM judge behind an OpenAI-compatible ``/chat/completions`` endpoint."""

    version: ClassVar[int] = 1  # bump when a change can change what it computes
    libraries: ClassVar[tuple[str, ...]] = ()

    model_config = ConfigDict(frozen=True, extra="forbid")

    llm: NamedLLMConfig = Field(
        description="Endpoint, model (required), key, concurrency, timeout and retries."
    )
    template: str = Field(
        default=DEFAULT_TEMPLATE,
        description="Judging prompt with {prompt}, {response_a} and {response_b}; it must ask "
        'for "A", "B" or "tie".',
    )
    max_tokens: int = Field(default=8, ge=1, description="Answer length cap in tokens.")
    temperature: float = Field(default=0.0, ge=0.0, description="0: the same verdict each time.")

    @field_validator("template")
    @classmethod
    def _placeholders(cls, value: str) -> str:
        names = ("{prompt}", "{response_a}", "{response_b}")
        try:
            value.format(prompt="", response_a="", response_b="")
        except (KeyError, IndexError, ValueError) as e:
            raise ValueError(f"placeholders are {names}; double other braces ({e!r})") from None
        if missing := [k for k in names if k not in value]:
            raise ValueError(f"the template lacks {missing}")
        return value

    def load(self) -> LLMPairwiseJudge:
        return LLMPairwiseJudge(self)


class LLMPairwiseJudge:
    """``PairwiseJudge`` over HTTP: the shared client's retries, concurrency and counts."""

    def __init__(self, config: LLMPairwiseJudgeConfig):
        self.config = config
        self.client = LLMClient(config.llm)  # a missing API key raises here

    def __repr__(self) -> str:
        return (
            f"LLMPairwiseJudge(model={self.client.model!r}, base_url={self.config.llm.base_url!r})"
        )

    def close(self) -> None:
        self.client.close()

    def stats(self) -> dict[str, int]:
        """The client's request counts since load (requests, retries, failures, tokens)."""
        return self.client.stats()

    def compare(self, prompt: str, a: str, b: str) -> float:
        """P(``a`` beats ``b``) from one verdict: 1, 0, 0.5 for a tie, NaN if unparseable."""
        cfg = self.config
        text = cfg.template.format(prompt=prompt, response_a=a, response_b=b)
        messages = [{"role": "user", "content": text}]
        try:
            answer = self.client.chat(
                messages, max_tokens=cfg.max_tokens, temperature=cfg.temperature
            )
        except LLMRequestError as exc:
            if exc.transient:  # retries spent: this comparison is lost, the others may not be
                raise JudgeRequestError(f"judge request failed: {exc}") from exc
            raise
        return parse_verdict(answer[0] if answer else None)


@runtime_checkable
class PairwiseJudge(Protocol):
    """Compares two responses to one prompt."""

    def compare(self, prompt: str, a: str, b: str) -> float:
        """P(``a`` better than ``b``) in [0, 1], NaN if undecidable; ``JudgeRequestError`` if
        the comparison could not be made at all (the scorer then counts it as failed)."""
        ...


class PairwiseReward(BaseModel):
    """Per-response reward = mean win probability against the prompt's other responses."""

    version: ClassVar[int] = 1  # bump when a change can change what it computes
    libraries: ClassVar[tuple[str, ...]] = ()

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["pairwise"] = "pairwise"
    judge: LLMPairwiseJudgeConfig
    both_orders: bool = Field(
        default=True,
        description="Judge every pair in both orders and average, cancelling position bias "
        "(doubles the calls).",
    )

    def load(self) -> PairwiseScorer:
        return PairwiseScorer(self.judge.load(), self.both_orders, self.judge.llm.concurrency)


class PairwiseScorer:
    """A judge wrapped as a ``RewardModel``: O(N^2) comparisons per prompt, run concurrently."""

    def __init__(self, judge: PairwiseJudge, both_orders: bool = True, workers: int = 8):
        self.judge = judge
        self.both_orders = both_orders
        self.workers = workers
        self._counts: Counter[str] = Counter()

    def stats(self) -> dict[str, int]:
        """Comparisons, failed requests, unparseable verdicts and the judge's request counts
        (``judge_*``) since load, over every ``score`` call (``ReportsStats``)."""
        return dict(self._counts)

    def score(
        self,
        prompts: Sequence[str],
        responses: Sequence[Sequence[str]],
        progress: Progress = no_progress,
    ) -> list[list[float]]:
        if len(prompts) != len(responses):
            raise ValueError(f"{len(prompts)} prompts but {len(responses)} response lists")
        if responses and all(len(rs) < 2 for rs in responses):
            raise ConfigError(
                "a pairwise reward needs at least 2 responses per prompt to compare",
                field=FIELD,
                hint="sample 2 or more per prompt (generate.n), or use a pointwise reward",
            )
        # Every (prompt, first, second) judge call, in the position it will be asked.
        calls: list[tuple[int, int, int]] = []
        for p, rs in enumerate(responses):
            for i in range(len(rs)):
                for j in range(i + 1, len(rs)):
                    if rs[i] == rs[j]:
                        continue  # a tie by definition; not worth a call
                    calls.append((p, i, j))
                    if self.both_orders:
                        calls.append((p, j, i))
        before = stats_of(self.judge)  # an HTTP judge counts its requests
        verdicts, failed = self._run(calls, prompts, responses, progress)
        unparseable = sum(math.isnan(v) for v in verdicts.values()) - failed
        judged = {f"judge_{k}": v - before.get(k, 0) for k, v in stats_of(self.judge).items()}
        self._counts.update(comparisons=len(calls), failed=failed, unparseable=unparseable)
        self._counts.update(judged)
        if calls and failed + unparseable == len(calls):
            raise RuntimeError(
                f"the judge gave no usable verdict in {len(calls)} comparisons "
                f"({failed} failed requests, {unparseable} unparseable answers)"
            )
        progress(1.0)
        return [self._row(p, rs, verdicts) for p, rs in enumerate(responses)]

    def _run(
        self,
        calls: list[tuple[int, int, int]],
        prompts: Sequence[str],
        responses: Sequence[Sequence[str]],
        progress: Progress,
    ) -> tuple[dict[tuple[int, int, int], float], int]:
        """Run the judge calls concurrently; a transient failure is NaN, a fatal one stops all."""
        verdicts: dict[tuple[int, int, int], float] = {}
        failed = 0
        fatal = threading.Event()

        def call(p: int, i: int, j: int) -> float:
            # After a fatal error (a 401, an unknown model) the queued calls end here instead of
            # each sending a request to an endpoint that will refuse them all.
            if fatal.is_set():
                return math.nan
            try:
                return self.judge.compare(prompts[p], responses[p][i], responses[p][j])
            except Exception as e:
                if not isinstance(e, JudgeRequestError):
                    fatal.set()
                raise

        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            futures = {pool.submit(call, *c): c for c in calls}
            for done, future in enumerate(as_completed(futures), start=1):
                try:
                    verdicts[futures[future]] = future.result()
                except JudgeRequestError:  # anything else propagates, once the queue drains
                    failed += 1
                    verdicts[futures[future]] = math.nan
                progress(done / len(futures))
        return verdicts, failed

    @staticmethod
    def _row(p: int, rs: Sequence[str], verdicts: dict[tuple[int, int, int], float]) -> list[float]:
        def win(i: int, j: int) -> float:
            """P(response i beats response j), from whichever orders were asked."""
            if rs[i] == rs[j]:
                return 0.5
            asked = [verdicts.get((p, i, j), math.nan), 1.0 - verdicts.get((p, j, i), math.nan)]
            usable = [e for e in asked if not math.isnan(e)]
            return sum(usable) / len(usable) if usable else math.nan

        row = []
        for i in range(len(rs)):
            wins = [w for j in range(len(rs)) if j != i if not math.isnan(w := win(i, j))]
            row.append(sum(wins) / len(wins) if wins else math.nan)
        return row

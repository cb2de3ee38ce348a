"""The eva paper's rewriting strategies (appendix F) as an evolver, with a best-of-N tree.

Appendix F gives ten strategies and two instruction frames; the text here restates them in this
project's words, keeping the same strategies, the same instructions and the same constraints:
- in-depth (constraints, deepening, concretizing, reasoning, expansion), framed as a *Prompt
  Rewriter* making the prompt a bit harder for strong models while it stays reasonable and
  answerable by humans, keeps any table or code, sounds like a real user, and stays about as
  long as the original or a little longer;
- in-breadth (persona, shift-in, shift-out, mix, abstract), framed as a *Prompt Creator* making a
  brand-new prompt for diversity, of similar length and complexity, reasonable and solvable by
  humans, sounding like a real user. ``mix`` combines the prompt's idea with elements of another
  domain (one prompt in, as in the paper; no second prompt).
Both frames end in "#Given Prompt#:" and "#Rewritten Prompt#:" / "#Created Prompt#:", which
eva's post-processing strips if a model echoes them. The strategy behind every child is recorded
in its ``evolve_method`` (``paper:<strategy>``, ``paper:<s1>><s2>`` for a two-level path).

Each rewrite applies one strategy to the parent (a tree, not EvolInstruct's chain). With
``strategies_per_seed`` > ``keep_best`` it becomes a beam search: every kept node gets that many
rewrites, a scorer ranks them (the LLM complexity judge of ``tasks.complexity`` by default, or
prompt length), the best ``keep_best`` survive, and this repeats ``depth`` times. Strategy
draws come from one generator per prompt seeded with ``(seed, prompt index)``, so they repeat
exactly for a seed whatever the batch or the server answered.

Requests go through ``eva_runtime.llm_client``: a failed request is an empty rewrite (which
post-processing counts), a 401/403/404 stops the stage.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from eva_core.evolution import clean_rewrite, is_refusal
from eva_runtime.llm_client import LLMClient
from eva_runtime.llm_config import NamedLLMConfig

Scorer = Callable[[Sequence[str]], list[float]]

IN_DEPTH_FRAME = (
    "Act as an expert Prompt Rewriter.\n"
    "Your goal is to rewrite the given prompt into a more complex version that large language "
    "models find a bit harder to handle.\n"
    "The rewritten prompt must stay reasonable and must be understood and answerable by humans. "
    "Keep every non-text part of #Given Prompt#, such as a table or code, if it has one. Do not "
    "make the rewritten prompt verbose: it should be about as long as #Given Prompt#, or a little "
    "longer.\n"
    "It must read like a real person's prompt, not like machine-generated text.\n"
    "Make the prompt more complex with this method:\n{method}\n"
    "Change it meaningfully across its whole structure, so that it reads clearly differently "
    "from the original, and make sure it poses a more CHALLENGING task. "
    "Answer with the rewritten prompt only.\n"
    "#Given Prompt#:\n{prompt}\n#Rewritten Prompt#:"
)
IN_BREADTH_FRAME = (
    "Act as an expert Prompt Creator.\n"
    "Your goal is to create a brand-new prompt from the given one, to make the prompts language "
    "models train on more diverse and general, so they practise varied challenges and "
    "perspectives.\n"
    "The created prompt should have about the same LENGTH and complexity as #Given Prompt#. "
    "It must be reasonable, interpretable and solvable by humans, and read like a real person's "
    "prompt, not like machine-generated text.\n"
    "Create it with this method:\n{method}\n"
    "Change it meaningfully across its whole structure, so that it reads clearly differently "
    "from the original. Answer with the created prompt only.\n"
    "#Given Prompt#:\n{prompt}\n#Created Prompt#:"
)

IN_DEPTH = {
    "constraints": "Add one or more significant constraints or requirements to #Given Prompt#, "
    "ones that really change how a model must answer (extra rules, context or limits that call "
    "for creative adjustments).",
    "deepening": "If #Given Prompt# asks about certain issues, widen and deepen the inquiry so "
    "that it needs a more detailed, multi-layered or comprehensive answer, for instance by "
    "splitting it into sub-problems or asking to connect unrelated concepts.",
    "concretizing": "Replace general concepts in #Given Prompt# with more specific, detailed "
    "ones, so the problem is better defined and less ambiguous (say, 'a wearable fitness "
    "tracker with GPS' instead of 'a device').",
    "reasoning": "Add one or more reasoning steps to #Given Prompt#: rewrite it to demand "
    "explicit multi-step reasoning or justified intermediate steps; a simple query, for "
    "instance, should come to need a step-by-step breakdown of the logic or calculation.",
    "expansion": "Expand #Given Prompt# with further perspectives, domains or layers of "
    "complexity; a prompt about one scenario, for instance, can add related scenarios or ask "
    "to compare different situations.",
}
IN_BREADTH = {
    "persona": "Reframe #Given Prompt# as if a user with an entirely different persona, "
    "background or expertise wrote it, adjusting tone, style and phrasing to match, so that it "
    "reads as authored by someone new.",
    "shift-in": "Move the high-level idea of #Given Prompt# to a different subdomain or context "
    "within the same domain, one that still challenges a model to reason or bring knowledge of "
    "that domain.",
    "shift-out": "Move the high-level idea of #Given Prompt# to an entirely different topic in a "
    "different setting, one that calls for similar reasoning or understanding of context in a "
    "new way.",
    "mix": "Combine the high-level concept of #Given Prompt# with elements of a different "
    "domain, bringing in new scenarios or contexts for diversity while staying relevant to the "
    "original idea.",
    "abstract": "Turn #Given Prompt# into a more abstract, general version that drops specific "
    "details but keeps its intent, so that it calls for broader reasoning from principles.",
}
STRATEGIES: tuple[str, ...] = (*IN_DEPTH, *IN_BREADTH)


def render(strategy: str, prompt: str) -> str:
    """The paper's request for ``strategy`` applied to ``prompt``: the in-depth frame for an
    in-depth strategy, the in-breadth frame for an in-breadth one."""
    if strategy in IN_DEPTH:
        return IN_DEPTH_FRAME.format(method=IN_DEPTH[strategy], prompt=prompt)
    return IN_BREADTH_FRAME.format(method=IN_BREADTH[strategy], prompt=prompt)


def length_scorer(prompts: Sequence[str]) -> list[float]:
    """Longer = more complex: the cheap proxy, no LLM call."""
    return [float(len(p)) for p in prompts]


class PaperTemplateEvolver(BaseModel):
    """Rewrite with the paper's strategies over an OpenAI-compatible LLM; optional best-of-N."""

    version: ClassVar[int] = 1  # bump when a change can change what it computes
    libraries: ClassVar[tuple[str, ...]] = ()

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["paper"] = "paper"
    llm: NamedLLMConfig = Field(
        description="Endpoint, model (required), key, concurrency, timeout and retries; the "
        "LLM judge scorer uses it too."
    )
    temperature: float = Field(default=0.88, ge=0.0, description="Official eva evolve: 0.88.")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    max_tokens: int = Field(default=1024, ge=1, description="Rewrite length cap in tokens.")
    seed_requests: bool = Field(
        default=False,
        description="Send a `seed` per request, from the run seed and the message, so sampling "
        "repeats exactly on servers that honour it (vLLM, OpenAI).",
    )
    strategies: tuple[str, ...] = Field(default=STRATEGIES, description="Strategies to draw.")
    strategies_per_seed: int | None = Field(
        default=None, ge=1, description="Rewrites per kept node (N); None = num_evolutions."
    )
    keep_best: int | None = Field(
        default=None, ge=1, description="Nodes kept per level (beam); None = num_evolutions."
    )
    depth: int = Field(default=1, ge=1, description="Levels of rewriting (1 = one rewrite).")
    scorer: Literal["judge", "length"] = Field(
        default="judge", description="Ranks rewrites when N > keep_best: LLM judge or length."
    )

    @field_validator("strategies")
    @classmethod
    def _known_strategies(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        # Refused when the config is read, not when the evolve stage of iteration 1 loads it.
        unknown = sorted(set(value) - set(STRATEGIES))
        if unknown or not value:
            what = f"unknown {unknown}" if unknown else "none given"
            raise ValueError(f"{what}; choose from {', '.join(STRATEGIES)}")
        return value

    def load(self, scorer: Scorer | None = None) -> PaperRewriter:
        return PaperRewriter(self, scorer)


class PaperRewriter:
    def __init__(self, config: PaperTemplateEvolver, scorer: Scorer | None = None):
        self.config, self.scorer = config, scorer
        self.counts: Counter[str] = Counter()
        self.client = LLMClient(config.llm)  # a missing API key raises here
        self._judge: Any = None  # the LLM complexity judge, made when first needed

    def stats(self) -> dict[str, int]:
        """The client's request counts, rewrites generated and scored, and the LLM judge's
        requests (``judge_*``), since load over every evolve call."""
        return dict(self.counts)

    @staticmethod
    def keeps_topic(method: str) -> bool:
        """In-depth strategies all the way down a path: the parent's task, made harder."""
        path = method.removeprefix("paper:").split(">")
        return all(s in IN_DEPTH for s in path)

    def evolve(
        self,
        prompts: Sequence[str],
        categories: Sequence[str | None],
        num_evolutions: int,
        seed: int,
    ) -> list[list[tuple[str, str]]]:
        cfg = self.config
        per_node = cfg.strategies_per_seed or num_evolutions
        keep = min(cfg.keep_best or num_evolutions, num_evolutions)
        before = self.client.stats()
        judged = self._judge.stats() if self._judge is not None else {}
        sampling = {
            "temperature": cfg.temperature,
            "top_p": cfg.top_p,
            "max_tokens": cfg.max_tokens,
        }
        request_seed = seed if cfg.seed_requests else None
        rngs = [np.random.default_rng([seed, i]) for i in range(len(prompts))]
        # Beam per prompt: (raw answer, cleaned text, strategy path); the root has no path.
        beams: list[list[tuple[str, str, str]]] = [[(p, p, "")] for p in prompts]
        generated = scored = 0
        for _ in range(cfg.depth):
            jobs: list[tuple[int, str, str]] = []  # (prompt index, request, path)
            for i, beam in enumerate(beams):
                # Draw for every beam slot, even a failed one, so draws do not depend on answers.
                for slot in range(keep if beam[0][2] else 1):
                    picks = self._draw(rngs[i], per_node)
                    if slot >= len(beam) or not _usable(beam[slot][1]):
                        continue
                    _, text, path = beam[slot]
                    for s in picks:
                        jobs.append((i, render(s, text), f"{path}>{s}" if path else s))
            answers = self.client.answers([r for _, r, _ in jobs], request_seed, **sampling)
            generated += len(jobs)
            children: list[list[tuple[str, str, str]]] = [[] for _ in prompts]
            for (i, _, path), raw in zip(jobs, answers, strict=True):
                children[i].append((raw, clean_rewrite(raw), path))
            # One scorer call per level for every prompt that has more children than slots.
            ranked = [(i, j) for i, kids in enumerate(children) if len(kids) > keep
                      for j, kid in enumerate(kids) if _usable(kid[1])]  # fmt: skip
            values = self._score([children[i][j][1] for i, j in ranked])
            scores = dict(zip(ranked, values, strict=True))
            scored += len(ranked)
            for i, kids in enumerate(children):
                # Usable rewrites best first (stable: ties keep draw order); failures only fill
                # slots nothing better is left for, so that post-processing counts them.
                order = sorted(range(len(kids)), key=lambda j: -scores.get((i, j), -np.inf))
                kids = [kids[j] for j in order if _usable(kids[j][1])] + [
                    k for k in kids if not _usable(k[1])
                ]
                if kids:  # a prompt whose whole beam failed keeps its failures to be counted
                    beams[i] = kids[:keep]
        self.counts.update(self.client.stats_since(before))
        self.counts.update(generated=generated, scored=scored)
        if self._judge is not None:
            after = self._judge.stats().items()
            self.counts.update({f"judge_{k}": v - judged.get(k, 0) for k, v in after})
        return [[(raw, f"paper:{path}") for raw, _, path in beam if path] for beam in beams]

    def _draw(self, rng: np.random.Generator, n: int) -> list[str]:
        """``n`` strategies drawn uniformly, distinct until every allowed one has been used once
        (so four children of one parent never repeat a strategy while others are unused)."""
        pool = self.config.strategies
        names: list[str] = []
        while len(names) < n:
            names += [pool[j] for j in rng.permutation(len(pool))]
        return names[:n]

    def _score(self, texts: list[str]) -> list[float]:
        if not texts:
            return []
        scorer = self.scorer
        if scorer is None and self.config.scorer == "length":
            scorer = length_scorer
        elif scorer is None:
            if self._judge is None:
                from tasks.backends.evolve.judge import LLMComplexityJudge

                self._judge = LLMComplexityJudge(llm=self.config.llm).load()
            scorer = self._judge.rank_scores
        values = np.asarray(scorer(texts), dtype=float)
        return [float(v) if np.isfinite(v) else -np.inf for v in values]


def _usable(text: str) -> bool:
    return bool(text.strip()) and not is_refusal(text)

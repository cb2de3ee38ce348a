"""The eva paper's rewriting strategies (appendix F) as an evolver, with a best-of-N tree.

The paper lists its strategies by name: in-depth ones that make a prompt harder while keeping
its task (constraints, deepening, concretizing, reasoning, expansion) and in-breadth ones that
move to a new, rarer prompt (persona, shift-in, shift-out, mix, abstract). The paper could not
be downloaded where this was written, so the templates below are reconstructed from those names
in the style of WizardLM's EvolInstruct templates (same "#The Given Prompt#" / "#Rewritten
Prompt#" scaffolding, which eva's post-processing strips); they are not a verbatim copy.

Each rewrite applies one strategy to the parent (a tree, not EvolInstruct's chain). With
``strategies_per_seed`` > ``keep_best`` it becomes a beam search: every kept node gets that many
rewrites, a scorer ranks them (the LLM complexity judge of ``tasks.complexity`` by default, or
prompt length), the best ``keep_best`` survive, and this repeats ``depth`` times. Strategy
draws come from one generator per prompt seeded with ``(seed, prompt index)``, so they repeat
exactly for a seed whatever the batch or the server answered.

Requests go through ``tasks.backends.llm_client``: a failed request is an empty rewrite (which
post-processing counts), a 401/403/404 stops the stage.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from eva_core.evolution import clean_rewrite, is_refusal
from tasks.backends.llm_client import LLMClient, NamedLLMConfig

Scorer = Callable[[Sequence[str]], list[float]]

_HEAD = (
    "I want you to act as a Prompt Rewriter.\n"
    "Your objective is to rewrite #The Given Prompt# into a new prompt with the method below, "
    "so that even strong AI assistants (e.g. ChatGPT, GPT-4) find it harder to answer well.\n"
    "The new prompt must be reasonable, self-contained, and understood and answerable by "
    "humans. Keep any code, table or input data of #The Given Prompt# that it still needs. "
    "Do not answer the prompt. Add at most 10 to 30 words unless the method says otherwise.\n"
    "Method ({kind}): {method}\n"
    "'#The Given Prompt#' and '#Rewritten Prompt#' must not appear in your answer.\n"
)
_TAIL = "#The Given Prompt#:\n{prompt}\n#Rewritten Prompt#:\n"
_MIX_TAIL = "#The Given Prompt#:\n{prompt}\n#The Second Prompt#:\n{other}\n#Rewritten Prompt#:\n"

IN_DEPTH = {
    "constraints": "Add one more constraint or requirement the answer must satisfy.",
    "deepening": "If the prompt asks about an issue, increase the depth and breadth of the "
    "inquiry: ask about causes, consequences, trade-offs or edge cases.",
    "concretizing": "Replace general concepts with more specific ones: a concrete setting, "
    "named entities, numbers or an example input.",
    "reasoning": "If the prompt can be solved with a few simple thinking steps, rewrite it to "
    "explicitly require multi-step reasoning that builds on intermediate results.",
    "expansion": "Expand the prompt with a closely related sub-task or follow-up question, so "
    "that a complete answer must cover both (this method may add up to 50 words).",
}
IN_BREADTH = {
    "persona": "Rewrite the prompt as asked by a specific, realistic persona (a profession, "
    "a situation, a goal) whose needs change what a good answer must contain.",
    "shift-in": "Shift in: narrow the prompt to a rarer, more specialised sub-topic within the "
    "same domain, keeping its form.",
    "shift-out": "Shift out: carry the prompt's task and form over to a different but related "
    "domain, where it is less commonly asked.",
    "mix": "Combine #The Given Prompt# with #The Second Prompt# into one coherent new prompt "
    "that needs the skills of both.",
    "abstract": "Raise the prompt to a more abstract, conceptual level: ask for the general "
    "principle, pattern or method behind it, with the original as one instance.",
}
STRATEGIES: tuple[str, ...] = (*IN_DEPTH, *IN_BREADTH)


def render(strategy: str, prompt: str, other: str | None = None) -> str:
    """The rewriting request for ``strategy`` applied to ``prompt`` (``other``: mix partner)."""
    kind, method = (
        ("in-depth", IN_DEPTH[strategy])
        if strategy in IN_DEPTH
        else ("in-breadth", IN_BREADTH[strategy])
    )
    head = _HEAD.format(kind=kind, method=method)
    if strategy == "mix":
        return head + _MIX_TAIL.format(prompt=prompt, other=other)
    return head + _TAIL.format(prompt=prompt)


def length_scorer(prompts: Sequence[str]) -> list[float]:
    """Longer = more complex: the cheap proxy, no LLM call."""
    return [float(len(p)) for p in prompts]


class PaperTemplateEvolver(BaseModel):
    """Rewrite with the paper's strategies over an OpenAI-compatible LLM; optional best-of-N."""

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

    def load(self, scorer: Scorer | None = None) -> PaperRewriter:
        unknown = sorted(set(self.strategies) - set(STRATEGIES))
        if unknown or not self.strategies:
            raise ValueError(f"evolver.strategies: unknown {unknown}; choose from {STRATEGIES}")
        return PaperRewriter(self, scorer)


class PaperRewriter:
    def __init__(self, config: PaperTemplateEvolver, scorer: Scorer | None = None):
        self.config, self.scorer = config, scorer
        self.counts: dict[str, int] = {}
        self.client = LLMClient(config.llm)  # a missing API key raises here
        self._judge: Any = None  # the LLM complexity judge, made when first needed

    def stats(self) -> dict[str, int]:
        return dict(self.counts)

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
        judged = self._judge.counts if self._judge is not None else {}
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
                    picks = self._draw(rngs[i], per_node, len(prompts))
                    if slot >= len(beam) or not _usable(beam[slot][1]):
                        continue
                    _, text, path = beam[slot]
                    for s, offset in picks:
                        other = None if offset is None else prompts[(i + offset) % len(prompts)]
                        request = render(s, text, other)
                        jobs.append((i, request, f"{path}>{s}" if path else s))
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
        self.counts = {**self.client.stats_since(before), "generated": generated}
        self.counts["scored"] = scored
        if self._judge is not None:
            after = self._judge.counts.items()
            self.counts |= {f"judge_{k}": v - judged.get(k, 0) for k, v in after}
        return [[(raw, f"paper:{path}") for raw, _, path in beam if path] for beam in beams]

    def _draw(self, rng: np.random.Generator, n: int, batch: int) -> list[tuple[str, int | None]]:
        """``n`` strategies, distinct until every allowed one has been used once, each with its
        mix partner (another prompt of the batch; mix needs a batch of two or more)."""
        pool = [s for s in self.config.strategies if batch > 1 or s != "mix"] or ["constraints"]
        names: list[str] = []
        while len(names) < n:
            names += [pool[j] for j in rng.permutation(len(pool))]
        # The partner is an offset from the prompt, drawn before any answer is known.
        return [(s, int(rng.integers(1, batch)) if s == "mix" else None) for s in names[:n]]

    def _score(self, texts: list[str]) -> list[float]:
        if not texts:
            return []
        scorer = self.scorer
        if scorer is None and self.config.scorer == "length":
            scorer = length_scorer
        elif scorer is None:
            if self._judge is None:
                # lazy: the stage module imports Prefect
                from tasks.complexity import LLMComplexityJudge

                self._judge = LLMComplexityJudge(llm=self.config.llm).load()
            scorer = self._judge.rank_scores
        values = np.asarray(scorer(texts), dtype=float)
        return [float(v) if np.isfinite(v) else -np.inf for v in values]


def _usable(text: str) -> bool:
    return bool(text.strip()) and not is_refusal(text)

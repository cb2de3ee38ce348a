"""distilabel's EvolInstruct / EvolComplexity / SelfInstruct as eva's evolver, over any
OpenAI-compatible endpoint (``vllm serve``, a hosted API): the official eva code evolves with
EvolInstruct over an API model at temperature 0.88.

distilabel 1.5.3 is run standalone (``task.load(); next(task.process(rows))``), not as a
Pipeline (pinned <1.6, last release), and its tasks talk to the endpoint through eva's own
client: the LLM they are given is ``eva_runtime.distilabel_llm.ClientLLM`` over the
``LLMClient`` this rewriter builds from its ``llm:`` block. So the endpoint is configured as for
every LLM backend (``eva_runtime.llm_config``): the key is read when the evolver loads (a named
variable that is unset fails then, before any request; no key, no Authorization header), and
requests get eva's concurrency cap, retry policy (``max_retries``, ``backoff_s``,
``max_backoff_s``, Retry-After), fractional ``timeout_s`` and the client's request and token
counts. Three of distilabel's behaviours are corrected:

- Outside a Pipeline one failed request would lose the whole batch, and a ``None`` generation
  crashes EvolInstruct's ``str.split``. Over ``ClientLLM`` every per-request failure (a timeout,
  a 503 after retries) is ``""``, which eva's post-processing counts as ``empty``; only
  configuration errors (401/403/404) stop the stage (``LLMBatchError``, naming the status).
- A chain link whose input failed (empty, a refusal) is not sent, as rewriting it only yields
  junk: it is marked ``SKIP`` and comes back ``""`` too.
- EvolInstruct's ``seed`` is never applied (``np.random.choice`` on the global generator), so
  mutations are drawn here from one generator per prompt seeded with ``(seed, prompt index)``:
  the same choices whatever the batch size or the neighbours, and global numpy state untouched
  (seeding the global generator per prompt would serialize requests, one prompt at a time).

``stats()`` are the request outcomes since the evolver was loaded, over every evolve call, as
``ClientLLM`` counts them: ``requests`` (each request once, retries not included), ``timeout``,
``error_<status>``, ``error_connection``, ``error_malformed``, ``skipped_after_failure`` and
``no_content``, a key present once nonzero. The HTTP-level counts (requests with retries,
retries, failures, tokens) are the client's: ``self.client.stats()``.

distilabel is imported lazily (seconds, and warnings): the CLI pays only when it is used.
"""

from __future__ import annotations

import logging
import warnings
from collections import Counter
from collections.abc import Sequence
from functools import cache
from types import SimpleNamespace
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from eva_core.evolution import is_refusal
from eva_runtime.llm_client import LLMClient
from eva_runtime.llm_config import NamedLLMConfig


class DistilabelEvolver(BaseModel):
    """Evolve prompts with a distilabel task over an OpenAI-compatible LLM."""

    version: ClassVar[int] = 1  # bump when a change can change what it computes
    libraries: ClassVar[tuple[str, ...]] = ("distilabel",)

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["distilabel"] = "distilabel"
    task: Literal["evol_instruct", "evol_complexity", "self_instruct"] = Field(
        default="evol_instruct",
        description="evol_instruct: a chain of num_evolutions rewrites, each of the previous "
        "one, all kept; evol_complexity: the same without the in-breadth mutation; "
        "self_instruct: num_evolutions new queries inspired by the prompt.",
    )
    llm: NamedLLMConfig = Field(
        description="Endpoint, model (required), key, concurrency, timeout and retries: "
        "distilabel's requests go through eva's client."
    )
    temperature: float = Field(default=0.88, ge=0.0, description="Official eva evolve: 0.88.")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    max_tokens: int = Field(
        default=1024, ge=1, description="Rewrite length cap in tokens (distilabel's is 128)."
    )
    seed_requests: bool = Field(
        default=False,
        description="Send a `seed` per request, from the run seed and the message, so sampling "
        "repeats exactly on servers that honour it (vLLM, OpenAI).",
    )
    batch_size: int = Field(default=64, ge=1, description="Prompts per distilabel call.")
    application_description: str = Field(
        default="AI assistant", description="self_instruct only: the application queried."
    )

    def load(self) -> DistilabelRewriter:
        return DistilabelRewriter(self)


class DistilabelRewriter:
    def __init__(self, config: DistilabelEvolver):
        self.config = config
        self.counts: Counter[str] = Counter()
        # Built now, so a named key variable that is unset fails at load; the key lives only in
        # the client's headers.
        self.client = LLMClient(config.llm)

    def __repr__(self) -> str:
        return f"DistilabelRewriter(task={self.config.task!r}, model={self.config.llm.model!r})"

    def close(self) -> None:
        self.client.close()

    def _llm(self, seed: int) -> Any:
        """A loaded distilabel LLM over this rewriter's client that never raises for one failed
        request; built per evolve call, so that its counts are that call's (``evolve`` adds
        them up)."""
        cfg = self.config
        out = _runtime().ClientLLM.over(
            self.client,
            seed=seed if cfg.seed_requests else None,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            max_new_tokens=cfg.max_tokens,
        )
        out.load()
        return out

    def stats(self) -> dict[str, int]:
        """Request outcomes since load (see the module docstring)."""
        return dict(self.counts)

    @staticmethod
    def keeps_topic(method: str) -> bool:
        """The first link of an evol chain by an in-depth mutation rewrites the parent itself;
        later links rewrite the link before (which may have left the topic), breadth and
        self-instruct make new prompts."""
        parts = method.split(":")
        return len(parts) == 3 and parts[1] != "breadth" and parts[2] == "chain-1"

    def evolve(
        self,
        prompts: Sequence[str],
        categories: Sequence[str | None],
        num_evolutions: int,
        seed: int,
    ) -> list[list[tuple[str, str]]]:
        cfg, step = self.config, self.config.batch_size
        llm = self._llm(seed)
        out: list[list[tuple[str, str]]] = []
        for start in range(0, len(prompts), step):
            batch = list(prompts[start : start + step])
            if cfg.task == "self_instruct":
                out += _self_instruct(llm, batch, num_evolutions, cfg.application_description)
            else:
                rngs = [np.random.default_rng([seed, start + i]) for i in range(len(batch))]
                out += _evol_chain(llm, cfg.task, batch, num_evolutions, rngs)
        self.counts.update(llm.counts)
        return out


def _evol_chain(
    llm: Any, task: str, batch: list[str], num_evolutions: int, rngs: list[np.random.Generator]
) -> list[list[tuple[str, str]]]:
    """Run EvolInstruct's chain, the k-th link recorded as ``{task}:{mutation}:chain-{k}``: all
    links get lineage depth parent + 1 (the protocol returns no depth); the method says where."""
    t = _runtime().SeededEvolInstruct(
        llm=llm,
        num_evolutions=num_evolutions,
        store_evolutions=True,
        mutation_templates=mutation_templates(task),
    )
    t.load()
    t.plan(rngs)
    rows = next(t.process([{"instruction": p} for p in batch]))
    if t.calls != len(batch) * num_evolutions:  # the draw order assumption no longer holds
        raise RuntimeError(f"EvolInstruct drew {t.calls} mutations, expected a chain per prompt")
    return [
        [(text, f"{task}:{name.lower()}:chain-{k + 1}") for k, (text, name) in enumerate(pairs)]
        for pairs in (
            zip(row["evolved_instructions"], drawn, strict=True)
            for row, drawn in zip(rows, t.drawn, strict=True)
        )
    ]


def _self_instruct(
    llm: Any, batch: list[str], num: int, application: str
) -> list[list[tuple[str, str]]]:
    """SelfInstruct writes ``num`` queries a call, one per line; a failed call yields none, so
    lists are padded with "" to ``num`` (counted as ``empty``) and cut to ``num``."""
    t = _runtime().SelfInstruct(llm=llm, num_instructions=num, application_description=application)
    t.load()
    rows = next(t.process([{"input": p} for p in batch]))
    out = []
    for row in rows:
        found = [s for s in (row.get("instructions") or []) if isinstance(s, str)][:num]
        out.append([(s, f"self_instruct:{j + 1}") for j, s in enumerate(found)])
        out[-1] += [("", "self_instruct:failed")] * (num - len(found))
    return out


def mutation_templates(task: str) -> dict[str, str]:
    """distilabel's mutation templates (placeholder ``<PROMPT>``) for an evol task."""
    rt = _runtime()
    return dict(rt.complexity_templates if task == "evol_complexity" else rt.instruct_templates)


@cache
def _runtime() -> SimpleNamespace:
    """distilabel, eva's LLM adapter and the seeded EvolInstruct, built once. Its import and
    subclassing warn about its own pydantic fields, and every standalone task logs that it has no
    Pipeline: all muted."""
    from eva_runtime.distilabel_llm import SKIP, ClientLLM

    with warnings.catch_warnings(action="ignore"):
        import distilabel.pipeline  # noqa: F401  (a task imports it when created)
        from distilabel.steps.tasks import EvolInstruct, SelfInstruct
        from distilabel.steps.tasks.evol_instruct import utils
        from distilabel.steps.tasks.evol_instruct.evol_complexity import utils as complexity

        class SeededEvolInstruct(EvolInstruct):
            _rngs: list[np.random.Generator] = PrivateAttr(default_factory=list)
            _drawn: list[list[str]] = PrivateAttr(default_factory=list)

            def plan(self, rngs: list[np.random.Generator]) -> None:
                self._rngs, self._drawn = rngs, [[] for _ in rngs]

            @property
            def drawn(self) -> list[list[str]]:
                """The mutation names drawn for each prompt, in chain order."""
                return self._drawn

            @property
            def calls(self) -> int:
                return sum(len(d) for d in self._drawn)

            def _apply_random_mutation(self, instruction: str) -> str:
                # distilabel calls this once per prompt, in batch order, for every chain link:
                # the n-th call is prompt n % batch (checked against the total after the run).
                i = self.calls % len(self._rngs)
                names = self.mutation_templates_names
                name = names[int(self._rngs[i].integers(len(names)))]
                self._drawn[i].append(name)  # drawn for a skipped link too: later draws stay put
                if not instruction.strip() or is_refusal(instruction):
                    return SKIP  # answered "" without a request
                return self.mutation_templates[name].replace("<PROMPT>", instruction)

    logging.getLogger("distilabel.step.None").addFilter(  # an unnamed step's logger
        lambda record: "hasn't received a pipeline" not in record.getMessage()
    )
    return SimpleNamespace(
        ClientLLM=ClientLLM,
        SeededEvolInstruct=SeededEvolInstruct,
        SelfInstruct=SelfInstruct,
        instruct_templates=utils.MUTATION_TEMPLATES,
        complexity_templates=complexity.MUTATION_TEMPLATES,
    )

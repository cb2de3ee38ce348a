"""Rollouts with vLLM's offline engine, in this process: the GPU ``Generator`` backend.

vLLM is imported only in ``load``: it is not a dependency of eva (it pins torch, transformers
and fastapi versions that conflict with eva's CPU pins and with prefect 3.8), so this module must
import, validate and hash configs on machines without it. Where vLLM cannot live in eva's
environment, serve the policy with ``vllm serve`` from its own and use the ``openai`` backend.

Reproducibility: each prompt's ``SamplingParams`` carries a seed derived from ``(seed, prompt
index)`` (vLLM seeds the ``j``-th of its ``n`` samples with ``seed + j``), so a prompt's samples
do not depend on which other prompts share the call. vLLM does not promise bit-identical logits
across batch compositions, so a different ``chunk_size`` can in rare cases change a sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from tasks.backends.chat_template import GENERATION, template_use
from tasks.backends.devices import spawn_vllm_engines
from tasks.backends.generate.openai import derive_seed
from tasks.backends.protocols import Generations, Progress, no_progress

MISSING_VLLM = (
    "the 'vllm' generation backend needs vLLM, which is not installed in this environment. "
    "vLLM pins its own torch/transformers/fastapi versions, which conflict with eva's (so eva has "
    "no vllm extra): on a GPU machine, install it in a separate environment and set the stage's "
    "backend to kind 'served', which starts `vllm serve` from there on the stage's checkpoint; "
    "or run `vllm serve <checkpoint dir>` yourself and use kind 'openai' (base_url "
    "http://HOST:8000/v1)."
)


class VLLMGeneration(BaseModel):
    """Sample responses with vLLM's offline ``LLM`` engine (needs a GPU and vLLM installed)."""

    # 2: each response says whether it finished before the length cap (``Generations``).
    version: ClassVar[int] = 2  # bump when a change can change what it computes
    libraries: ClassVar[tuple[str, ...]] = ("vllm",)

    model_config = ConfigDict(extra="forbid")

    kind: Literal["vllm"] = "vllm"
    temperature: float = Field(
        default=0.7,
        ge=0.0,
        description="Softmax temperature (eva's default 0.7). 0 = greedy: each prompt is "
        "decoded once and that response is repeated n times.",
    )
    top_p: float = Field(default=0.9, gt=0.0, le=1.0, description="eva's default 0.9.")
    max_tokens: int = Field(default=1024, ge=1, description="Response length cap in tokens.")
    tensor_parallel_size: int = Field(default=1, ge=1, description="GPUs to shard the model on.")
    gpu_memory_utilization: float = Field(
        default=0.9, gt=0.0, le=1.0, description="Fraction of GPU memory vLLM may claim."
    )
    dtype: Literal["auto", "float16", "bfloat16", "float32"] = Field(
        default="auto", description='"auto" = the checkpoint\'s (float32 ones run in 16 bits).'
    )
    max_model_len: int | None = Field(
        default=None, ge=1, description="Context length cap (prompt + response); None = model's."
    )
    enforce_eager: bool = Field(
        default=False,
        description="Skip CUDA graph capture: slower decoding, much faster start (tests, tiny "
        "runs).",
    )
    chat_template: Literal["auto", "always", "never"] = Field(
        default="auto",
        description='"auto" uses llm.chat when the tokenizer has a chat template and '
        'llm.generate on raw text otherwise; "always" fails without one; "never" = raw text.',
    )
    chunk_size: int = Field(
        default=2048,
        ge=1,
        description="Prompts per engine call; progress is reported after each. Larger keeps "
        "the GPU busier at the end of each call.",
    )

    def load(self, model_dir: str) -> VLLMGenerator:
        """Start a vLLM engine on the checkpoint in ``model_dir``."""
        try:
            import vllm
        except ImportError as exc:
            raise ImportError(MISSING_VLLM) from exc
        spawn_vllm_engines()
        llm = vllm.LLM(
            model=model_dir,
            tensor_parallel_size=self.tensor_parallel_size,
            gpu_memory_utilization=self.gpu_memory_utilization,
            dtype=self.dtype,
            max_model_len=self.max_model_len,
            enforce_eager=self.enforce_eager,
            seed=0,  # sampling is seeded per request; this only fixes engine-level randomness
        )
        has_template = bool(getattr(llm.get_tokenizer(), "chat_template", None))
        use_chat = template_use(has_template, self.chat_template, model_dir, GENERATION)
        return VLLMGenerator(llm, vllm.SamplingParams, self, use_chat)


class VLLMGenerator:
    """A loaded vLLM engine that satisfies the ``Generator`` protocol."""

    def __init__(self, llm: Any, sampling_params: Any, config: VLLMGeneration, use_chat: bool):
        self.llm = llm
        self._sampling_params = sampling_params  # vllm.SamplingParams, passed in: lazy import
        self.config = config
        self.use_chat = use_chat

    def generate(
        self, prompts: Sequence[str], n: int, seed: int, progress: Progress = no_progress
    ) -> Generations:
        """``n`` responses per prompt (text, in vLLM's sample index order), each finished
        unless vLLM stopped it at ``max_tokens`` (``finish_reason == "length"``)."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        cfg = self.config
        greedy = cfg.temperature == 0.0
        per_request = 1 if greedy else n  # n greedy samples would all be the same
        results: list[list[str]] = []
        finished: list[list[bool]] = []
        for start in range(0, len(prompts), cfg.chunk_size):
            chunk = list(prompts[start : start + cfg.chunk_size])
            params = [
                self._sampling_params(
                    n=per_request,
                    temperature=cfg.temperature,
                    top_p=cfg.top_p,
                    max_tokens=cfg.max_tokens,
                    seed=derive_seed(seed, start + k),
                )
                for k in range(len(chunk))
            ]
            if self.use_chat:
                conversations = [[{"role": "user", "content": p}] for p in chunk]
                outputs = self.llm.chat(conversations, params, use_tqdm=False)
            else:
                outputs = self.llm.generate(chunk, params, use_tqdm=False)
            for out in outputs:  # RequestOutputs come back in input order
                samples = sorted(out.outputs, key=lambda c: c.index)
                texts = [c.text for c in samples]
                done = [c.finish_reason != "length" for c in samples]
                results.append(texts * n if greedy else texts)
                finished.append(done * n if greedy else done)
            progress(min(1.0, (start + len(chunk)) / len(prompts)))
        return Generations(results, finished)

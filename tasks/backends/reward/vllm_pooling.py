"""Reward models served by vLLM's pooling runner: the fast path for plain classifier RMs on GPU.

``LLM(model, runner="pooling")`` + ``llm.classify(...)`` runs a ``*ForSequenceClassification``
checkpoint (Skywork-Reward and similar, ``num_labels=1``) with vLLM's batching. With one label,
vLLM applies a sigmoid unless told otherwise, which squashes the gaps between high rewards that
eva's informativeness (max - min reward) depends on; ``PoolingParams(use_activation=False)``
returns the raw logit, the same number ``SequenceClassifierReward`` gives.

ArmoRM's custom architecture does not run on vLLM: score it with ``sequence_classifier``.
vLLM is not a dependency of eva (its pins clash with the transformers eva uses): it is imported
only in ``load()``, so configs validate and tests run without it.

Conversations are tokenised here, with the same rules as the transformers backend (chat
template when the tokenizer has one), and handed to vLLM as token ids, so vLLM does not add a
second bos to a template that already has one.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from eva_runtime.errors import ConfigError
from tasks.backends.devices import spawn_vllm_engines
from tasks.backends.protocols import Progress, no_progress
from tasks.backends.reward.sequence_classifier import FIELD, encode_all, use_chat_template


class VLLMPoolingReward(BaseModel):
    """Score responses with a classifier reward model on vLLM's pooling runner."""

    version: ClassVar[int] = 1  # bump when a change can change what it computes
    libraries: ClassVar[tuple[str, ...]] = ("vllm",)

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["vllm_pooling"] = "vllm_pooling"
    model: str = Field(description="Checkpoint directory or hub id of the reward model.")
    trust_remote_code: bool = Field(
        default=False, description="Run the checkpoint's own code. Off unless set."
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto", description="vLLM's dtype ('auto' = the checkpoint's)."
    )
    max_length: int = Field(
        default=4096, ge=1, description="Longest conversation in tokens; longer ones get NaN."
    )
    chat_template: bool | Literal["auto"] = Field(
        default="auto", description="As in sequence_classifier."
    )
    tensor_parallel_size: int = Field(default=1, ge=1, description="GPUs to shard the model on.")
    gpu_memory_utilization: float = Field(
        default=0.9,
        gt=0.0,
        le=1.0,
        description="Share of GPU memory vLLM may take. With dtype float32 vLLM attends with "
        "FlexAttention, whose block map grows with the KV cache: a small model at 0.9 of a "
        "141 GB card asked for 63 GiB more and died; scoring needs little cache, so lower it.",
    )
    chunk_size: int = Field(
        default=4096,
        ge=1,
        description="Conversations per classify() call; vLLM batches within a call, chunks "
        "only exist to report progress.",
    )

    def load(self) -> VLLMPoolingScorer:
        try:
            from vllm import LLM, PoolingParams
        except ImportError as e:
            raise ImportError(
                "reward.kind=vllm_pooling needs vLLM, which is not installed here; install it "
                "in a GPU environment (its transformers/torch pins differ from eva's) or use "
                "kind=sequence_classifier"
            ) from e
        spawn_vllm_engines()
        llm = LLM(
            model=self.model,
            runner="pooling",
            trust_remote_code=self.trust_remote_code,
            dtype=self.dtype,
            max_model_len=self.max_length,
            tensor_parallel_size=self.tensor_parallel_size,
            gpu_memory_utilization=self.gpu_memory_utilization,
        )
        return VLLMPoolingScorer(llm, PoolingParams(use_activation=False), self)


class VLLMPoolingScorer:
    """A vLLM pooling model that satisfies the ``RewardModel`` protocol."""

    def __init__(self, llm: Any, params: Any, config: VLLMPoolingReward):
        self.llm = llm
        self.params = params
        self.config = config
        self.tokenizer = llm.get_tokenizer()
        self.use_template = use_chat_template(self.tokenizer, config.chat_template, config.model)
        self._counts: Counter[str] = Counter(too_long=0)

    def stats(self) -> dict[str, int]:
        """Conversations left unscored as too long, since load (``ReportsStats``)."""
        return dict(self._counts)

    def score(
        self,
        prompts: Sequence[str],
        responses: Sequence[Sequence[str]],
        progress: Progress = no_progress,
    ) -> list[list[float]]:
        out = [[math.nan] * len(rs) for rs in responses]
        valid, too_long = encode_all(
            self.tokenizer, prompts, responses, self.use_template, self.config.max_length
        )
        self._counts.update(too_long=too_long)
        step = self.config.chunk_size
        for start in range(0, len(valid), step):
            chunk = valid[start : start + step]
            results = self.llm.classify(
                [{"prompt_token_ids": ids} for _, _, ids in chunk],
                pooling_params=self.params,
                use_tqdm=False,
            )
            for (i, j, _), result in zip(chunk, results, strict=True):
                values = list(result.outputs.probs)
                if len(values) != 1:
                    raise ConfigError(
                        f"{self.config.model} returns {len(values)} classes; a reward model "
                        "has one label",
                        field=f"{FIELD}.model",
                        hint="a checkpoint with num_labels=1 (a head like ArmoRM's: kind "
                        "sequence_classifier)",
                    )
                out[i][j] = float(values[0])
            progress(min(1.0, (start + len(chunk)) / len(valid)))
        progress(1.0)
        return out

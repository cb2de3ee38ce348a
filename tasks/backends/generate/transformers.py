"""Rollouts with plain transformers ``generate``: the CPU / small-GPU ``Generator`` backend.

Sampling is done by Gumbel-max on counter-based noise rather than by ``torch.multinomial``:
each token's noise is a hash of ``(seed, prompt index, sample index, step, token id)``. A
response therefore depends only on its prompt and those indices, never on ``batch_size``, on
which prompts share a batch, on how much left padding they got, or on the device's RNG: the same
seed gives the same rollouts whether the stage runs in one batch or fifty. ``argmax(logits / T +
Gumbel)`` is an exact sample from ``softmax(logits / T)`` (over the top-p nucleus once the rest
is masked), so this is ordinary temperature + nucleus sampling, just with addressable noise.

The sampler itself (torch, transformers) lives in ``tasks.backends.generate.sampler`` and is
imported when the backend loads, so reading a config never pays for those imports.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from tasks.backends.chat_template import GENERATION, template_use
from tasks.backends.devices import Device

if TYPE_CHECKING:
    from tasks.backends.generate.sampler import TransformersGenerator


class TransformersGeneration(BaseModel):
    """Sample responses with ``transformers`` ``generate`` (no vLLM needed)."""

    # 2: each response says whether it finished before the length cap (``Generations``), and
    # an answer ends at any end id of the checkpoint's generation config too.
    version: ClassVar[int] = 2  # bump when a change can change what it computes
    libraries: ClassVar[tuple[str, ...]] = ("torch", "transformers")

    model_config = ConfigDict(extra="forbid")

    kind: Literal["transformers"] = "transformers"
    temperature: float = Field(
        default=0.7,
        ge=0.0,
        description="Softmax temperature (eva's default 0.7). 0 = greedy: each prompt is "
        "decoded once and that response is repeated n times.",
    )
    top_p: float = Field(
        default=0.9, gt=0.0, le=1.0, description="Nucleus sampling mass (eva's default 0.9)."
    )
    max_new_tokens: int = Field(default=256, ge=1, description="Response length cap in tokens.")
    batch_size: int = Field(
        default=64, ge=1, description="Prompts per forward batch (each expands to n rows)."
    )
    device: Device = Field(
        default="auto", description='"auto" = cuda when available, else cpu; or a torch device.'
    )
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        default="auto",
        description='"auto" = bfloat16 on a CUDA device that supports it, float32 otherwise.',
    )
    chat_template: Literal["auto", "always", "never"] = Field(
        default="auto",
        description='"auto" applies the tokenizer\'s chat template when it has one and feeds raw '
        'text otherwise; "always" fails without a template; "never" feeds raw text.',
    )

    def load(self, model_dir: str) -> TransformersGenerator:
        """Load the checkpoint in ``model_dir`` for generation."""
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from tasks.backends.generate.sampler import TransformersGenerator

        device = self.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(self.dtype)
        if dtype is None:
            bf16_ok = device.startswith("cuda") and torch.cuda.is_bf16_supported()
            dtype = torch.bfloat16 if bf16_ok else torch.float32
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
        model.to(torch.device(device)).eval()  # type: ignore[arg-type]  # wrapped .to stub
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        template_use(bool(tokenizer.chat_template), self.chat_template, model_dir, GENERATION)
        return TransformersGenerator(model, tokenizer, self)


def check_fits(
    model_config: Any,
    prompt_tokens: Sequence[int],
    max_new_tokens: int,
    rows: Sequence[int] | None = None,
) -> None:
    """Raise, naming the first prompt (by row: its position in ``rows`` if given, as a Ray
    worker's shard gives them), when a prompt plus ``max_new_tokens`` exceeds the model's
    position table, instead of truncating answers or crashing mid-batch."""
    limit = getattr(model_config, "max_position_embeddings", None)
    if limit is None:
        return
    over = [i for i, n in enumerate(prompt_tokens) if n + max_new_tokens > limit]
    if over:
        i = over[0]
        row = i if rows is None else rows[i]
        raise ValueError(
            f"prompt row {row} has {prompt_tokens[i]} tokens; with max_new_tokens "
            f"{max_new_tokens} it exceeds the model's {limit} positions ({len(over)} prompts "
            "do): shorten the prompts or lower max_new_tokens"
        )

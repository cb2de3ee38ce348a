"""The transformers generation backend's sampler: batched ``generate`` with addressable noise.

See ``tasks.backends.generate.transformers`` for the backend's config and why sampling is done by
Gumbel-max on counter-based noise.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import torch
from transformers import (
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from eva_runtime.errors import ConfigError
from tasks.backends.chat_template import GENERATION
from tasks.backends.generate.chat_codec import ChatCodec, end_ids
from tasks.backends.generate.transformers import TransformersGeneration, check_fits
from tasks.backends.protocols import Generations, Progress, no_progress

_M32 = 0xFFFFFFFF


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 integer hash on int64 tensors holding 32-bit values.

    Products may wrap past 2**63; the low 32 bits (all we keep) are still exact, so CPU and CUDA
    give identical bits.
    """
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def _row_keys(seed: int, prompt_idx: torch.Tensor, sample_idx: torch.Tensor) -> torch.Tensor:
    base = _hash32(torch.tensor([(seed >> 32) & _M32])) ^ (seed & _M32)
    return _hash32(_hash32(_hash32(base) ^ prompt_idx) ^ sample_idx)


class _GumbelSampling(LogitsProcessor):
    """Temperature, top-p, then addressable Gumbel noise; ``generate`` then takes the argmax."""

    def __init__(self, keys: torch.Tensor, prompt_width: int, temperature: float, top_p: float):
        self.keys = keys  # one 32-bit key per row of the batch
        self.prompt_width = prompt_width
        self.temperature = temperature
        self.top_p = top_p

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        logits = scores.float() / self.temperature
        if self.top_p < 1.0:
            sorted_scores, order = logits.sort(dim=-1, descending=True)
            probs = sorted_scores.softmax(dim=-1)
            # Drop a token when the mass ranked strictly above it already reaches top_p; the
            # most likely token always survives.
            drop = (probs.cumsum(dim=-1) - probs) >= self.top_p
            drop[..., 0] = False
            logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
        step = input_ids.shape[1] - self.prompt_width
        keys = _hash32(self.keys.to(scores.device) ^ _hash32(torch.tensor(step)))
        vocab = torch.arange(scores.shape[-1], device=scores.device)
        bits = _hash32(keys[:, None] ^ vocab[None, :]) >> 8  # 24 bits: exact in float32
        uniform = (bits.float() + 0.5) / float(1 << 24)
        return cast(torch.FloatTensor, logits - torch.log(-torch.log(uniform)))


class TransformersGenerator:
    """A loaded policy that satisfies the ``Generator`` protocol."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        config: TransformersGeneration,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        use_template = config.chat_template == "always" or (
            config.chat_template == "auto" and bool(tokenizer.chat_template)
        )
        self.end_ids: list[int] = end_ids(tokenizer, model.generation_config, model.config)
        self.codec = ChatCodec(tokenizer, self.end_ids, use_template)
        pad = tokenizer.pad_token_id
        if pad is None and self.end_ids:
            pad = self.end_ids[0]
        if pad is None:
            named = getattr(tokenizer, "name_or_path", None) or "the policy"
            raise ConfigError(
                f"the tokenizer of {named} has neither a pad nor an eos token to pad batches with",
                field="bootstrap.init_checkpoint",
                hint="set its eos_token (or pad_token) in the checkpoint's tokenizer_config.json",
            )
        self.pad_id: int = pad

    def generate(
        self,
        prompts: Sequence[str],
        n: int,
        seed: int,
        progress: Progress = no_progress,
        *,
        indices: Sequence[int] | None = None,
    ) -> Generations:
        """``n`` responses per prompt (new tokens only, cut at the first end-of-turn token,
        special tokens removed), each with whether it finished before ``max_new_tokens``.

        ``indices`` are the prompts' positions in the whole stage input (default 0, 1, ...):
        they address the sampling noise, so a shard of the prompts, generated on its own with
        its positions, gives exactly the responses the whole set would (a Ray worker's shard).
        """
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if indices is None:
            indices = range(len(prompts))
        elif len(indices) != len(prompts):
            raise ValueError(f"{len(indices)} indices for {len(prompts)} prompts")
        cfg = self.config
        greedy = cfg.temperature == 0.0
        rows_per_prompt = 1 if greedy else n
        encoded = [self.codec.encode(p) for p in prompts]
        if empty := [i for i, ids in enumerate(encoded) if not ids]:
            raise ValueError(f"prompts at {empty[:5]} encode to no tokens; nothing to condition on")
        # Longest first, so batches hold similar lengths (little padding) and a batch that does
        # not fit in memory fails at the start rather than at the end of a long run.
        order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i]))
        lengths = [len(ids) for ids in encoded]
        try:
            check_fits(self.model.config, lengths, cfg.max_new_tokens, rows=indices)
        except ValueError as exc:  # check_fits leaves the field to its callers (flows.inputs)
            raise ConfigError(
                str(exc),
                field=f"{GENERATION}.max_new_tokens",
                hint="an evolved prompt is capped by evolve.max_chars, a file's by "
                "prompts.max_chars",
            ) from None
        results: list[list[str]] = [[] for _ in prompts]
        finished: list[list[bool]] = [[] for _ in prompts]
        device = self.model.device
        for start in range(0, len(order), cfg.batch_size):
            # Every prompt gets the full max_new_tokens: positions come from the attention mask,
            # so a long batch-mate does not shorten anyone's answer.
            chunk = order[start : start + cfg.batch_size]
            width = max(len(encoded[i]) for i in chunk)
            max_new = cfg.max_new_tokens
            input_ids = torch.full((len(chunk), width), self.pad_id, dtype=torch.long)
            attention = torch.zeros((len(chunk), width), dtype=torch.long)
            for row, i in enumerate(chunk):  # left padding: generation appends on the right
                input_ids[row, width - len(encoded[i]) :] = torch.tensor(encoded[i])
                attention[row, width - len(encoded[i]) :] = 1
            input_ids = input_ids.repeat_interleave(rows_per_prompt, dim=0).to(device)
            attention = attention.repeat_interleave(rows_per_prompt, dim=0).to(device)
            processors = LogitsProcessorList()
            if not greedy:
                prompt_idx = torch.tensor([indices[i] for i in chunk])
                prompt_idx = prompt_idx.repeat_interleave(rows_per_prompt)
                sample_idx = torch.arange(rows_per_prompt).repeat(len(chunk))
                keys = _row_keys(seed, prompt_idx, sample_idx)
                processors.append(_GumbelSampling(keys, width, cfg.temperature, cfg.top_p))
            # The sampling lives in our processor, so generate itself runs greedy. Neutral
            # temperature/top_p: otherwise a checkpoint's own sampling defaults are merged in
            # (unused under greedy) and transformers warns about them on every batch.
            gen_config = GenerationConfig(
                do_sample=False,
                num_beams=1,
                temperature=1.0,
                top_p=1.0,
                max_new_tokens=max_new,
                pad_token_id=self.pad_id,
                eos_token_id=self.end_ids or None,
            )
            # Any: transformers' stubs type `generate` through nn.Module.__getattr__.
            model: Any = self.model
            with torch.inference_mode():
                out = model.generate(
                    input_ids=input_ids,
                    attention_mask=attention,
                    generation_config=gen_config,
                    logits_processor=processors,
                )
            new_tokens = out[:, width:].tolist()
            for row, ids in enumerate(new_tokens):
                text, done = self.codec.decode(ids)
                results[chunk[row // rows_per_prompt]].append(text)
                finished[chunk[row // rows_per_prompt]].append(done)
            progress(min(1.0, (start + len(chunk)) / len(order)))
        if greedy:
            results, finished = [r * n for r in results], [f * n for f in finished]
        return Generations(results, finished)

"""How a generation backend that tokenizes in this process (transformers, CTranslate2) turns a
prompt into the token ids the policy reads, and the ids it wrote back into a response: one rule,
so that every engine answers exactly the prompt the solver trains on and cuts and flags an
answer the same way (``tasks.backends.protocols.Generations``)."""

from __future__ import annotations

from typing import Any


class ChatCodec:
    """A prompt through the tokenizer's chat template (or as raw text), and a response's ids
    cut at the first id that ends a turn."""

    def __init__(self, tokenizer: Any, end_ids: list[int], use_template: bool):
        self.tokenizer = tokenizer
        self.end_ids = end_ids
        self.use_template = use_template

    def encode(self, prompt: str) -> list[int]:
        if self.use_template:
            text = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
            )
            # The template already carries bos and friends: don't add them twice.
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        return list(self.tokenizer(prompt)["input_ids"])

    def decode(self, ids: list[int]) -> tuple[str, bool]:
        """The response's text, cut at its first end-of-turn token, and whether it had one (it
        finished) or ran into the length cap (truncated)."""
        end = next((k for k, t in enumerate(ids) if t in self.end_ids), None)
        if end is not None:
            ids = ids[:end]
        return str(self.tokenizer.decode(ids, skip_special_tokens=True)), end is not None


def end_ids(tokenizer: Any, generation_config: Any, model_config: Any) -> list[int]:
    """Every id that ends a turn: the tokenizer's eos and the checkpoint's generation config's
    (a chat model often lists its end-of-turn token there: Llama 3's <|eot_id|>, Qwen's
    <|im_end|> beside <|endoftext|>); the model config's where neither names one."""
    configured = getattr(generation_config, "eos_token_id", None)
    ends = _ids(tokenizer.eos_token_id) + _ids(configured)
    ends += _ids(getattr(model_config, "eos_token_id", None)) if not ends else []
    return list(dict.fromkeys(ends))


def _ids(value: int | list[int] | None) -> list[int]:
    """A config's token id field (one id, a list of them, or none) as a list."""
    if value is None:
        return []
    return [value] if isinstance(value, int) else list(value)

"""Tiny models of real architectures, built here and published into an offline Hugging Face Hub
cache, for the tests of a run on a user's own model.

A user names Hub ids (``Qwen/Qwen2.5-0.5B-Instruct``) that ``from_pretrained`` resolves through
the Hub's cache. Nothing can be downloaded here, so the tests build what such an id would hold:
a byte-level BPE tokenizer trained on real prompts, with a ChatML chat template (Qwen2's), a
2-layer Qwen2 policy and a Qwen2 sequence-classification reward model; they save them with
``save_pretrained`` into the cache's own layout (``models--org--name/snapshots/<commit>/`` and
``refs/main``), so that with ``HF_HUB_CACHE`` pointing there and ``HF_HUB_OFFLINE=1`` the real
loading path finds them by id.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2ForSequenceClassification,
)

POLICY = "eva-tests/tiny-qwen2-instruct"
REWARD = "eva-tests/tiny-qwen2-reward"
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tokenizer(texts: Sequence[str], vocab_size: int = 600) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on ``texts`` (any text encodes: no unknown token),
    with Qwen2's special tokens and ChatML template."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    fast.chat_template = CHATML
    return fast


def _config(tokenizer: PreTrainedTokenizerFast, **extra: object) -> Qwen2Config:
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
        **extra,
    )


def publish(cache: str, repo_id: str, model: object, tokenizer: PreTrainedTokenizerFast) -> str:
    """Save a model and its tokenizer as revision ``main`` of ``repo_id`` in the Hub cache at
    ``cache``; returns the snapshot folder."""
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    base = os.path.join(cache, "models--" + repo_id.replace("/", "--"))
    snapshot = os.path.join(base, "snapshots", commit)
    model.save_pretrained(snapshot)  # type: ignore[attr-defined]
    tokenizer.save_pretrained(snapshot)
    os.makedirs(os.path.join(base, "refs"), exist_ok=True)
    with open(os.path.join(base, "refs", "main"), "w") as f:
        f.write(commit)
    return snapshot


def build_hub_cache(cache: str, texts: Sequence[str]) -> tuple[str, str]:
    """A tiny Qwen2 policy and reward model, by id, in the Hub cache at ``cache``."""
    tokenizer = build_tokenizer(texts)
    torch.manual_seed(0)
    publish(cache, POLICY, Qwen2ForCausalLM(_config(tokenizer)), tokenizer)
    reward = Qwen2ForSequenceClassification(_config(tokenizer, num_labels=1))
    publish(cache, REWARD, reward, tokenizer)
    return POLICY, REWARD

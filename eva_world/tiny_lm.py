"""A character-level language model small enough to train on two CPU cores: the world's policy.

The demo world needs a policy that starts weak, learns from preference pairs within minutes, and
round-trips through ``save_pretrained`` / ``from_pretrained`` exactly like a hub checkpoint, so
that the generator and solver backends run their real loading code on it. A character tokenizer
keeps the vocabulary tiny (tens of tokens) and makes every answer a handful of tokens long.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GPT2Config,
    LlamaConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    get_cosine_schedule_with_warmup,
)

from eva_runtime.progress import report
from eva_world.configs import SFTConfig as SFTConfig  # re-exported: the SFT's settings
from eva_world.configs import TinyModelConfig
from tasks.backends.protocols import Progress, no_progress

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"


def build_char_tokenizer(alphabet: str) -> PreTrainedTokenizerFast:
    """One token per character of ``alphabet`` plus ``<pad>``, ``<eos>`` (also bos) and ``<unk>``.

    ``<unk>`` exists so that a character outside the alphabet (an evolved prompt can contain
    anything) degrades to one unknown token instead of an exception deep inside a batch.
    """
    chars = list(dict.fromkeys(alphabet))  # dedupe, keep order: ids must not depend on repeats
    if not chars:
        raise ValueError("alphabet must contain at least one character")
    vocab = {PAD: 0, EOS: 1, UNK: 2}
    for ch in chars:
        vocab[ch] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    # Split("", "isolated") cuts between every character, spaces included, so " " is a token of
    # its own; Fuse() joins decoded tokens without the spaces WordLevel would put between them.
    backend.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        eos_token=EOS,
        bos_token=EOS,
        unk_token=UNK,
        padding_side="left",  # generation pads on the left; sft() builds its own batches
    )


def build_tiny_model(
    config: TinyModelConfig, tokenizer: PreTrainedTokenizerBase, seed: int
) -> PreTrainedModel:
    """A freshly initialised model sized by ``config``, with ``tokenizer``'s special ids."""
    if config.n_embd % config.n_head:
        raise ValueError(f"n_embd={config.n_embd} is not divisible by n_head={config.n_head}")
    special = dict(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model_config: PretrainedConfig
    if config.arch == "llama":
        model_config = LlamaConfig(
            hidden_size=config.n_embd,
            intermediate_size=4 * config.n_embd,
            num_hidden_layers=config.n_layer,
            num_attention_heads=config.n_head,
            num_key_value_heads=config.n_head,
            max_position_embeddings=config.n_positions,
            tie_word_embeddings=True,
            **special,
        )
    else:
        model_config = GPT2Config(
            n_positions=config.n_positions,
            n_embd=config.n_embd,
            n_layer=config.n_layer,
            n_head=config.n_head,
            resid_pdrop=config.dropout,
            embd_pdrop=config.dropout,
            attn_pdrop=config.dropout,
            **special,
        )
    # fork_rng: seeding the initialisation must not reseed the caller's global generator.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(model_config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return model


def _encode_examples(
    tokenizer: PreTrainedTokenizerBase, examples: Sequence[tuple[str, str]], max_len: int
) -> list[tuple[list[int], int]]:
    """Token ids of ``prompt + answer + eos`` and the prompt's length, for every example."""
    eos = tokenizer.eos_token_id
    encoded = []
    for prompt, answer in examples:
        # Encoded separately so the prompt/answer boundary is exact even for merging tokenizers.
        p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        a = tokenizer(answer, add_special_tokens=False)["input_ids"]
        ids = [*p, *a, eos]
        if len(ids) > max_len:
            raise ValueError(f"example {prompt!r} -> {answer!r} has {len(ids)} tokens > {max_len}")
        encoded.append((ids, len(p)))
    return encoded


def sft(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[tuple[str, str]],
    steps: int,
    batch_size: int,
    learning_rate: float,
    warmup_steps: int,
    seed: int,
    progress: Progress = no_progress,
    *,
    weight_decay: float = 0.0,
    max_grad_norm: float = 1.0,
    log_every: int = 50,
) -> list[dict[str, float]]:
    """Teacher-forced training on ``(prompt, answer)`` pairs; loss on answer + eos tokens only.

    A plain loop instead of ``Trainer``: on two cores Trainer's per-step overhead is comparable to
    a step of this model, and owning the loop makes bit-for-bit reproducibility easy to reason
    about (one seeded generator for batch order, one ``manual_seed`` for dropout).
    Returns ``{"step", "loss", "seconds"}`` every ``log_every`` steps (loss averaged over them).
    """
    if not examples:
        raise ValueError("no examples to train on")
    device = model.device
    max_len = int(getattr(model.config, "max_position_embeddings", 0) or 1 << 30)
    encoded = _encode_examples(tokenizer, examples, max_len)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # dropout masks, when the model has dropout
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=learning_rate, weight_decay=weight_decay, foreach=False
    )
    scheduler = get_cosine_schedule_with_warmup(optimizer, warmup_steps, steps)

    # Epoch-style sampling (a fresh permutation whenever the last one is used up) so every
    # example is seen equally often, unlike sampling with replacement.
    order: list[int] = []
    metrics: list[dict[str, float]] = []
    window: list[float] = []
    start = time.perf_counter()
    model.train()
    for step in range(1, steps + 1):
        batch: list[tuple[list[int], int]] = []
        while len(batch) < batch_size:
            if not order:
                order = torch.randperm(len(encoded), generator=gen).tolist()
            batch.append(encoded[order.pop()])
        # Right padding: positions count from 0 at the first real token, as at inference.
        width = max(len(ids) for ids, _ in batch)
        input_ids = torch.full((len(batch), width), pad, dtype=torch.long)
        labels = torch.full((len(batch), width), -100, dtype=torch.long)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        for row, (ids, prompt_len) in enumerate(batch):
            input_ids[row, : len(ids)] = torch.tensor(ids)
            labels[row, prompt_len : len(ids)] = torch.tensor(ids[prompt_len:])
            attention[row, : len(ids)] = 1
        input_ids, labels, attention = (t.to(device) for t in (input_ids, labels, attention))

        logits = model(input_ids=input_ids, attention_mask=attention).logits
        # Token t predicts token t+1, so compare logits[:, :-1] with labels[:, 1:].
        loss = F.cross_entropy(
            logits[:, :-1].reshape(-1, logits.size(-1)).float(),
            labels[:, 1:].reshape(-1),
            ignore_index=-100,
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
        scheduler.step()

        window.append(loss.item())
        if step % log_every == 0 or step == steps:
            metrics.append(
                {
                    "step": float(step),
                    "loss": math.fsum(window) / len(window),
                    "seconds": time.perf_counter() - start,
                }
            )
            window = []
        loss_now = metrics[-1]["loss"] if metrics else loss.item()
        report(progress, step / steps, step=step, total=steps, loss=loss_now)
    model.eval()
    return metrics


def save_checkpoint(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: str) -> None:
    """Write model (safetensors: transformers 5 has no other format) and tokenizer to ``path``."""
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)


def load_checkpoint(
    path: str, device: str = "cpu"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a checkpoint through the Auto classes, the same path the backends use."""
    # float32 explicitly: transformers 5 loads in the checkpoint's dtype, and this model is
    # trained with plain fp32 AdamW on CPU, where bf16 weights would swallow small updates.
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.to(torch.device(device)).eval()  # type: ignore[arg-type]  # wrapped .to stub
    tokenizer = AutoTokenizer.from_pretrained(path)
    return model, tokenizer

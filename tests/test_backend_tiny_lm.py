"""The demo policy: character tokenizer, tiny Llama/GPT-2, plain SFT loop, checkpoint round trip."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from eva_world.tiny_lm import (
    SFTConfig,
    TinyModelConfig,
    build_char_tokenizer,
    build_tiny_model,
    load_checkpoint,
    save_checkpoint,
    sft,
)

ALPHABET = "0123456789+-=:abcdefghij "
# One-digit sums with the answer's digits reversed, the demo world's task in miniature.
ADDITION = [(f"{a}+{b}=", str(a + b)[::-1]) for a in range(10) for b in range(10)]


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer(ALPHABET)


def _params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _next_token_probs(model, tok, text: str) -> torch.Tensor:
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        return model(input_ids=ids).logits[0, -1].softmax(-1)


def test_tokenizer_round_trips_every_character_including_spaces(tok):
    text = "12+3= a b  c:j-0"
    ids = tok(text)["input_ids"]
    assert len(ids) == len(text)  # one token per character, no bos/eos added
    assert tok.decode(ids) == text
    assert tok.pad_token == "<pad>" and tok.eos_token == "<eos>"
    assert tok.padding_side == "left"
    assert len(tok) == len(ALPHABET) + 3  # + pad, eos, unk


def test_tokenizer_maps_unknown_characters_to_unk_and_survives_save(tok, tmp_path: Path):
    ids = tok("1?2")["input_ids"]
    assert ids[1] == tok.unk_token_id
    assert tok.decode(ids, skip_special_tokens=True) == "12"
    tok.save_pretrained(tmp_path)
    from transformers import AutoTokenizer

    again = AutoTokenizer.from_pretrained(tmp_path)
    assert again("9+9= ab")["input_ids"] == tok("9+9= ab")["input_ids"]
    assert again.decode(again("9+9= ab")["input_ids"]) == "9+9= ab"
    assert again.padding_side == "left"


@pytest.mark.parametrize(
    ("arch", "cls", "max_params"),
    [("llama", "LlamaForCausalLM", 500_000), ("gpt2", "GPT2LMHeadModel", 400_000)],
)
def test_build_tiny_model_is_seeded_and_leaves_global_rng_alone(tok, arch, cls, max_params):
    cfg = TinyModelConfig(arch=arch)
    state = torch.get_rng_state()
    a, b, c = (build_tiny_model(cfg, tok, seed=s) for s in (1, 1, 2))
    assert type(a).__name__ == cls
    assert torch.equal(torch.get_rng_state(), state)
    pa, pb = _params(a), _params(b)
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    emb_a, emb_c = a.get_input_embeddings().weight, c.get_input_embeddings().weight
    assert not torch.equal(emb_a, emb_c)
    assert a.config.vocab_size == len(tok)
    assert a.config.pad_token_id == tok.pad_token_id == a.generation_config.pad_token_id
    assert a.generation_config.eos_token_id == tok.eos_token_id
    assert sum(p.numel() for p in a.parameters()) < max_params  # stays CPU-demo sized


def test_tiny_model_config_rejects_bad_shapes(tok):
    with pytest.raises(ValidationError):
        TinyModelConfig(n_layer=0)
    with pytest.raises(ValueError, match="divisible"):
        build_tiny_model(TinyModelConfig(n_embd=64, n_head=3), tok, seed=0)


def test_sft_loss_falls_and_is_bit_for_bit_reproducible(tok):
    cfg = SFTConfig(steps=120, learning_rate=3e-3, warmup_steps=10, log_every=20)
    runs = []
    for _ in range(2):
        model = build_tiny_model(TinyModelConfig(), tok, seed=0)
        seen: list[float] = []
        metrics = sft(model, tok, ADDITION, **cfg.model_dump(), seed=7, progress=seen.append)
        runs.append((_params(model), metrics))
    (w1, m1), (w2, m2) = runs
    assert [m["step"] for m in m1] == [20, 40, 60, 80, 100, 120]
    assert m1[-1]["loss"] < 0.5 * m1[0]["loss"]
    assert [m["loss"] for m in m1] == [m["loss"] for m in m2]
    assert all(torch.equal(w1[k], w2[k]) for k in w1)
    assert seen[-1] == 1.0 and len(seen) == cfg.steps
    # A different seed orders the batches differently, so the weights differ.
    other = build_tiny_model(TinyModelConfig(), tok, seed=0)
    sft(other, tok, ADDITION, **cfg.model_copy(update={"steps": 5}).model_dump(), seed=8)
    short = build_tiny_model(TinyModelConfig(), tok, seed=0)
    sft(short, tok, ADDITION, **cfg.model_copy(update={"steps": 5}).model_dump(), seed=7)
    assert not torch.equal(other.get_input_embeddings().weight, short.get_input_embeddings().weight)


def test_sft_trains_on_the_answer_and_eos_but_not_the_prompt(tok):
    model = build_tiny_model(TinyModelConfig(), tok, seed=0)
    sft(
        model,
        tok,
        [("abc", "d")],
        steps=60,
        batch_size=8,
        learning_rate=3e-3,
        warmup_steps=0,
        seed=0,
    )
    uniform = 1 / len(tok)
    assert _next_token_probs(model, tok, "abc")[tok.convert_tokens_to_ids("d")] > 0.9
    assert _next_token_probs(model, tok, "abcd")[tok.eos_token_id] > 0.9
    # The prompt's own continuation ("a" -> "b") carried no loss, so it was never learned.
    assert _next_token_probs(model, tok, "a")[tok.convert_tokens_to_ids("b")] < 5 * uniform


def test_sft_rejects_sequences_longer_than_the_position_table(tok):
    model = build_tiny_model(TinyModelConfig(n_positions=8), tok, seed=0)
    with pytest.raises(ValueError, match="tokens > 8"):
        sft(
            model,
            tok,
            [("0123", "45678")],
            steps=1,
            batch_size=1,
            learning_rate=1e-3,
            warmup_steps=0,
            seed=0,
        )
    with pytest.raises(ValueError, match="no examples"):
        sft(model, tok, [], steps=1, batch_size=1, learning_rate=1e-3, warmup_steps=0, seed=0)


def test_checkpoint_round_trip_through_auto_classes(tok, tmp_path: Path):
    model = build_tiny_model(TinyModelConfig(), tok, seed=3)
    save_checkpoint(model, tok, str(tmp_path))
    assert (tmp_path / "model.safetensors").exists()
    assert (tmp_path / "tokenizer.json").exists()
    loaded, loaded_tok = load_checkpoint(str(tmp_path))
    assert type(loaded).__name__ == "LlamaForCausalLM"
    assert not loaded.training
    ids = torch.tensor([tok("3+4=")["input_ids"]])
    with torch.no_grad():
        assert torch.equal(model.eval()(input_ids=ids).logits, loaded(input_ids=ids).logits)
    assert loaded_tok("3+4= ab")["input_ids"] == tok("3+4= ab")["input_ids"]
    assert loaded.generation_config.eos_token_id == tok.eos_token_id

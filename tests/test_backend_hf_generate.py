"""The transformers rollout backend, on a tiny GPT-2 that has learnt one-digit addition."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from eva_runtime.errors import ConfigError
from eva_world.tiny_lm import (
    TinyModelConfig,
    build_char_tokenizer,
    build_tiny_model,
    save_checkpoint,
    sft,
)
from tasks.backends.generate.sampler import TransformersGenerator
from tasks.backends.generate.transformers import TransformersGeneration
from tasks.backends.protocols import Generator

ALPHABET = "0123456789+-=:abcdefghij "
ADDITION = [(f"{a}+{b}=", str(a + b)[::-1]) for a in range(10) for b in range(10)]
# Different token lengths, so a batch of them is left-padded.
MIXED = ["1+2=", "4+4=", "12+3=", "7+9=", " 5+5=", "  3+3=", "9+0=", "a 2+2=", "6+7="]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("policy")
    tok = build_char_tokenizer(ALPHABET)
    model = build_tiny_model(TinyModelConfig(), tok, seed=0)
    sft(model, tok, ADDITION, steps=400, batch_size=64, learning_rate=3e-3, warmup_steps=20, seed=0)
    save_checkpoint(model, tok, str(path))
    return str(path)


def _load(model_dir: str, **overrides: object) -> TransformersGenerator:
    return TransformersGeneration(**{"max_new_tokens": 6, **overrides}).load(model_dir)


def test_loads_as_a_generator_on_cpu_in_float32(model_dir: str):
    gen = _load(model_dir)
    assert isinstance(gen, Generator)
    assert gen.model.device.type == "cpu" and gen.model.dtype == torch.float32
    assert not gen.codec.use_template  # the char tokenizer has no chat template: raw text


def test_greedy_returns_only_the_new_tokens(model_dir: str):
    gen = _load(model_dir, temperature=0.0)
    got = gen.generate([p for p, _ in ADDITION], n=2, seed=0)
    out = got.texts
    assert all(len(r) == 2 and r[0] == r[1] for r in out)
    # A learnt sum ends with eos well inside 6 new tokens: every answer finished.
    assert got.truncated() == 0 and all(f == [True, True] for f in got.finished)
    correct = sum(r[0] == answer for r, (_, answer) in zip(out, ADDITION, strict=True))
    # Exact answers mean: no prompt echoed, cut at eos, no "<eos>"/"<pad>" text.
    assert correct >= 90, [r[0] for r in out]


def test_greedy_output_does_not_depend_on_left_padding(model_dir: str):
    gen = _load(model_dir, temperature=0.0, max_new_tokens=12)
    widths = {len(gen.tokenizer(p)["input_ids"]) for p in MIXED}
    assert len(widths) >= 3  # the batch really is padded
    alone = [gen.generate([p], n=1, seed=0).texts[0][0] for p in MIXED]
    together = gen.generate(MIXED, n=1, seed=0).firsts()[0]
    assert together == alone
    # And the responses are not trivially equal (a broken model would print "" everywhere).
    assert len(set(alone)) >= 4


def test_sampling_is_seeded_and_independent_of_batching(model_dir: str):
    prompts = [p for p, _ in ADDITION[:40]] + MIXED
    # Temperature 2 so that even the learnt sums are uncertain enough for seeds to matter.
    gen = _load(model_dir, temperature=2.0, top_p=1.0, max_new_tokens=8)
    seen: list[float] = []
    got = gen.generate(prompts, n=6, seed=11, progress=seen.append)
    first = got.texts
    assert len(first) == len(prompts) and all(len(r) == 6 for r in first)
    assert gen.generate(prompts, n=6, seed=11) == got  # the finished flags too
    assert seen == sorted(seen) and seen[-1] == 1.0 and len(seen) == 1  # one batch of 49
    small = _load(model_dir, temperature=2.0, top_p=1.0, max_new_tokens=8, batch_size=5)
    assert small.generate(prompts, n=6, seed=11) == got
    other = gen.generate(prompts, n=6, seed=12).texts
    differ = sum(a != b for a, b in zip(first, other, strict=True))
    assert differ > len(prompts) // 2
    assert sum(len(set(r)) > 1 for r in first) > len(prompts) // 2  # samples vary per prompt
    for prompt, responses in zip(prompts, first, strict=True):
        for r in responses:
            assert "<" not in r and not r.startswith(prompt)  # no special tokens, no echo


def test_a_shard_with_its_indices_reproduces_the_whole_set(model_dir: str):
    # What a Ray worker does: generate an interleaved shard on its own, given each prompt's
    # position in the stage input; the shards together are the in-process result.
    prompts = [p for p, _ in ADDITION[:30]] + MIXED
    gen = _load(model_dir, temperature=2.0, top_p=1.0, max_new_tokens=8)
    whole = gen.generate(prompts, n=3, seed=5)
    odd = list(range(1, len(prompts), 2))
    shard = gen.generate([prompts[i] for i in odd], n=3, seed=5, indices=odd)
    assert shard.texts == [whole.texts[i] for i in odd]
    assert shard.finished == [whole.finished[i] for i in odd]
    # Without its indices the shard samples as if it were the whole input: other responses.
    assert gen.generate([prompts[i] for i in odd], n=3, seed=5) != shard
    # A prompt that cannot fit is named by its position in the whole input.
    with pytest.raises(ConfigError, match="prompt row 7 has"):
        gen.generate(["1+2=", "1" * 59 + "="], n=1, seed=0, indices=[3, 7])
    with pytest.raises(ValueError, match="2 indices for 3 prompts"):
        gen.generate(prompts[:3], n=1, seed=0, indices=[0, 1])


def test_first_token_frequencies_match_the_tempered_nucleus(model_dir: str):
    gen = _load(model_dir, temperature=2.0, top_p=0.8, max_new_tokens=1)
    prompt = "  3+4="  # off-distribution, so the next-token distribution is spread out
    ids = torch.tensor([gen.tokenizer(prompt)["input_ids"]])
    with torch.no_grad():
        probs = (gen.model(input_ids=ids).logits[0, -1] / 2.0).softmax(-1)
    sorted_p, order = probs.sort(descending=True)
    keep = order[(sorted_p.cumsum(0) - sorted_p) < 0.8]  # the nucleus
    assert 2 <= len(keep) < len(probs)
    target = torch.zeros_like(probs)
    target[keep] = probs[keep] / probs[keep].sum()

    n = 4000
    samples = gen.generate([prompt], n=n, seed=3).texts[0]
    # Special tokens (eos, pad, unk) all decode to "": compare them as one bucket.
    special = torch.tensor(gen.tokenizer.all_special_ids)
    counts = torch.zeros_like(probs)
    for s in samples:
        counts[special[0] if s == "" else gen.tokenizer.convert_tokens_to_ids(s)] += 1
    target[special[0]] = target[special].sum()
    target[special[1:]] = 0.0
    assert counts[target == 0].sum() == 0  # nothing from outside the nucleus
    # Every kept token within 4 standard errors of its probability.
    freq = counts / n
    stderr = (target * (1 - target) / n).sqrt()
    assert torch.all((freq - target).abs() <= 4 * stderr + 1e-3), (freq, target)


def test_config_validation_messages():
    with pytest.raises(ValidationError, match="temperature"):
        TransformersGeneration(temperature=-0.1)
    with pytest.raises(ValidationError, match="top_p"):
        TransformersGeneration(top_p=0.0)
    with pytest.raises(ValidationError, match="top_p"):
        TransformersGeneration(top_p=1.5)
    with pytest.raises(ValidationError, match="max_new_tokens"):
        TransformersGeneration(max_new_tokens=0)
    with pytest.raises(ValidationError):
        TransformersGeneration(kind="vllm")


def test_chat_template_always_requires_a_template(model_dir: str):
    with pytest.raises(ConfigError, match="no chat template") as e:
        TransformersGeneration(chat_template="always").load(model_dir)
    assert e.value.field == "generate.backend.chat_template" and "auto" in (e.value.hint or "")


def test_a_tokenizer_without_pad_or_eos_names_the_checkpoint(model_dir: str):
    gen = _load(model_dir)
    gen.tokenizer.pad_token, gen.tokenizer.eos_token = None, None
    gen.model.config.eos_token_id = gen.model.generation_config.eos_token_id = None
    with pytest.raises(ConfigError, match="neither a pad nor an eos token") as e:
        TransformersGenerator(gen.model, gen.tokenizer, gen.config)
    assert e.value.field == "bootstrap.init_checkpoint" and "eos_token" in (e.value.hint or "")


def test_a_prompt_that_cannot_fit_is_named_instead_of_shortening_its_batch(model_dir: str):
    # Every prompt gets the configured max_new_tokens or the call fails up front, naming the
    # row: a long prompt used to shorten every answer in its batch (issue 10).
    gen = _load(model_dir, temperature=0.0, max_new_tokens=10)
    with pytest.raises(ConfigError, match=r"row 1 has 60 tokens; with max_new_tokens 10") as e:
        gen.generate(["1+2=", "1" * 59 + "=", "3+4="], n=1, seed=0)
    assert e.value.field == "generate.backend.max_new_tokens"
    long_and_short = gen.generate(["1" * 50 + "=", "1+2="], n=1, seed=0)
    assert long_and_short.texts[1] == gen.generate(["1+2="], n=1, seed=0).texts[0]
    with pytest.raises(ValueError, match="no tokens"):
        gen.generate([""], n=1, seed=0)


def test_an_answer_cut_at_max_new_tokens_is_marked_truncated(model_dir: str):
    # With room for the sum and its eos every answer finishes; with one new token, the first
    # digit of a two-digit sum is all there is: cut before eos, so not finished.
    prompts = ["7+8=", "9+9=", "1+2="]
    roomy = _load(model_dir, temperature=0.0, max_new_tokens=6).generate(prompts, n=2, seed=0)
    assert roomy.finished == [[True, True]] * 3 and roomy.texts[0] == ["51", "51"]
    cut = _load(model_dir, temperature=0.0, max_new_tokens=1).generate(prompts, n=2, seed=0)
    assert cut.texts[0] == ["5", "5"] and cut.finished[0] == [False, False]
    # "3" is the whole answer to 1+2, but its eos did not fit either: cut is cut.
    assert cut.texts[2] == ["3", "3"] and cut.finished[2] == [False, False]
    assert cut.truncated() == 6


def test_an_end_id_of_the_generation_config_finishes_an_answer(model_dir: str):
    # A chat model ends its turn with a token its generation config lists beside the
    # tokenizer's eos (Llama 3's <|eot_id|>): an answer cut there finished.
    gen = _load(model_dir, temperature=0.0, max_new_tokens=6)
    one = gen.tokenizer.convert_tokens_to_ids("1")
    gen.model.generation_config.eos_token_id = [gen.tokenizer.eos_token_id, one]
    again = TransformersGenerator(gen.model, gen.tokenizer, gen.config)
    assert one in again.end_ids
    got = again.generate(["7+8=", "2+2="], n=1, seed=0)
    assert got.texts == [["5"], ["4"]] and got.finished == [[True], [True]]  # "51" stops at "1"

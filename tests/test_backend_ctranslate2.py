"""The CTranslate2 rollout backend, against the transformers backend on a tiny GPT-2 that has
learnt one-digit addition (the real model's run is tests/test_real_model.py's)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import TypeAdapter, ValidationError

from eva_runtime.errors import ConfigError
from eva_world.tiny_lm import (
    TinyModelConfig,
    build_char_tokenizer,
    build_tiny_model,
    save_checkpoint,
    sft,
)
from tasks.backends.generate import GenerationBackend, length_cap
from tasks.backends.generate.ctranslate2 import CTranslate2Generation, CTranslate2Generator
from tasks.backends.generate.transformers import TransformersGeneration
from tasks.backends.protocols import Generator

pytest.importorskip("ctranslate2")

ALPHABET = "0123456789+-=:abcdefghij "
ADDITION = [(f"{a}+{b}=", str(a + b)[::-1]) for a in range(10) for b in range(10)]
PROMPTS = [p for p, _ in ADDITION]


@pytest.fixture(scope="module", autouse=True)
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = str(tmp_path_factory.mktemp("eva-cache"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("EVA_CACHE_DIR", folder)
        yield folder


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("policy")
    tok = build_char_tokenizer(ALPHABET)
    model = build_tiny_model(TinyModelConfig(), tok, seed=0)
    sft(model, tok, ADDITION, steps=400, batch_size=64, learning_rate=3e-3, warmup_steps=20, seed=0)
    save_checkpoint(model, tok, str(path))
    return str(path)


def _load(model_dir: str, **overrides: object) -> CTranslate2Generator:
    return CTranslate2Generation(**{"max_new_tokens": 6, **overrides}).load(model_dir)


def test_greedy_float32_answers_as_the_transformers_backend_does(model_dir: str) -> None:
    ours = _load(model_dir, temperature=0.0, compute_type="float32", batch_sequences=7)
    assert isinstance(ours, Generator) and ours.device == "cpu"
    got = ours.generate(PROMPTS, 2, seed=0)
    theirs = TransformersGeneration(max_new_tokens=6, temperature=0.0).load(model_dir)
    expected = theirs.generate(PROMPTS, 2, seed=0)
    assert got == expected
    correct = sum(r[0] == answer for r, (_, answer) in zip(got.texts, ADDITION, strict=True))
    assert correct >= 90 and got.truncated() == 0


def test_int8_is_the_cpu_default_and_still_adds(model_dir: str) -> None:
    ours = _load(model_dir, temperature=0.0)
    assert ours.compute_type == "int8"
    texts = ours.generate(PROMPTS, 1, seed=0).firsts()[0]
    assert sum(t == answer for t, (_, answer) in zip(texts, ADDITION, strict=True)) >= 80


def test_an_answer_cut_at_the_cap_is_flagged_as_the_transformers_backend_flags_it(
    model_dir: str,
) -> None:
    # Two new tokens hold a one-digit answer and its end token; a two-digit one is cut.
    got = _load(model_dir, temperature=0.0, compute_type="float32", max_new_tokens=2)
    theirs = TransformersGeneration(max_new_tokens=2, temperature=0.0).load(model_dir)
    flags = [f[0] for f in got.generate(PROMPTS, 1, seed=0).finished]
    assert flags == [f[0] for f in theirs.generate(PROMPTS, 1, seed=0).finished]
    whole = _load(model_dir, temperature=0.0, compute_type="float32").generate(PROMPTS, 1, 0)
    assert flags == [len(t) < 2 for t in whole.firsts()[0]] and 40 <= flags.count(False) <= 50
    assert length_cap(CTranslate2Generation(max_new_tokens=9)) == ("max_new_tokens", 9)


def test_sampling_leaves_torchs_thread_count_as_it_found_it(model_dir: str) -> None:
    # CTranslate2 sets OpenMP's thread count where it builds its engines: torch's training after
    # sampling in the same process ran on one thread of two.
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        _load(model_dir, temperature=1.0, workers=2, threads=1).generate(PROMPTS[:4], 2, seed=0)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_sampling_is_seeded_and_n_per_prompt(model_dir: str) -> None:
    gen = _load(model_dir, temperature=1.5, top_p=1.0)
    first = gen.generate(PROMPTS, 4, seed=3)
    assert [len(r) for r in first.texts] == [4] * len(PROMPTS)
    assert gen.generate(PROMPTS, 4, seed=3) == first
    # Two engines side by side, each on its own batches: the same again, whatever the timing.
    pair = _load(model_dir, temperature=1.5, top_p=1.0, workers=2, batch_sequences=8)
    twice = [pair.generate(PROMPTS, 4, seed=3) for _ in range(2)]
    assert twice[0] == twice[1] and twice[0] != first  # other batches, other draws
    assert gen.generate(PROMPTS, 4, seed=4) != first
    assert sum(len(set(r)) > 1 for r in first.texts) > 10  # hot enough to disagree with itself
    # A nucleus of the single likeliest token is greedy decoding, whatever the temperature.
    narrow = _load(model_dir, temperature=1.5, top_p=0.001, compute_type="float32")
    greedy = _load(model_dir, temperature=0.0, compute_type="float32")
    assert narrow.generate(PROMPTS, 2, seed=5) == greedy.generate(PROMPTS, 2, seed=0)


def test_a_checkpoint_is_converted_once_by_its_content(
    model_dir: str, cache: str, tmp_path: Path
) -> None:
    _load(model_dir)  # converted by this call or an earlier test's
    assert _load(model_dir).stats() == {"conversions": 0}
    copy = tmp_path / "copy"
    shutil.copytree(model_dir, copy)
    assert _load(str(copy)).stats() == {"conversions": 0}  # the same weights elsewhere
    (copy / "config.json").write_text((copy / "config.json").read_text().replace("}", " }", 1))
    assert _load(str(copy)).stats() == {"conversions": 1}  # other bytes: converted again
    # int8 weights are stored in int8, in a folder of their own beside a float32 conversion.
    folders = [f for f in os.listdir(os.path.join(cache, "ctranslate2")) if f.endswith("-int8")]
    assert len(folders) == 2


def test_a_model_ctranslate2_cannot_convert_is_one_line_naming_the_kind(tmp_path: Path) -> None:
    from transformers import GPTNeoConfig, GPTNeoForCausalLM

    tok = build_char_tokenizer(ALPHABET)
    config = GPTNeoConfig(
        vocab_size=len(tok), hidden_size=16, num_layers=1, num_heads=2,
        attention_types=[[["global"], 1]], max_position_embeddings=32,
        eos_token_id=tok.eos_token_id,
    )  # fmt: skip
    GPTNeoForCausalLM(config).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    with pytest.raises(ConfigError) as refused:
        _load(str(tmp_path))
    line = refused.value.line()
    assert line.startswith("generate.backend.kind: CTranslate2 cannot convert")
    assert "GPTNeoConfig" in line and "use kind: transformers" in line and "\n" not in line
    assert not [f for f in os.listdir(os.environ["EVA_CACHE_DIR"] + "/ctranslate2") if ".tmp-" in f]


def test_without_ctranslate2_the_backend_is_refused_in_one_line(
    model_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import builtins

    real = builtins.__import__

    def no_ct2(name: str, *args: object, **kwargs: object) -> object:
        if name == "ctranslate2":
            raise ImportError("No module named 'ctranslate2'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ct2)
    with pytest.raises(ConfigError, match=r"needs the ctranslate2 package \(pip install"):
        _load(model_dir)


def test_the_config_is_a_generation_backend_and_refuses_unknown_values() -> None:
    adapter = TypeAdapter(GenerationBackend)
    backend = adapter.validate_python({"kind": "ctranslate2", "compute_type": "float32"})
    assert isinstance(backend, CTranslate2Generation) and backend.max_new_tokens == 256
    with pytest.raises(ValidationError, match="compute_type"):
        adapter.validate_python({"kind": "ctranslate2", "compute_type": "int4"})
    with pytest.raises(ValidationError, match="device"):
        adapter.validate_python({"kind": "ctranslate2", "device": "mps"})


def test_by_default_as_many_engines_as_cores_and_memory_hold(
    model_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import types

    import psutil

    gen = _load(model_dir)
    cores = len(os.sched_getaffinity(0))
    assert gen._layout() == (cores, 1)  # a tiny model: one one-thread engine a core
    weights = sum(f.stat().st_size for f in os.scandir(gen.path) if f.is_file())
    # Free memory for one copy of the weights in its quarter: one engine with every core.
    free = types.SimpleNamespace(available=4 * weights + 1)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: free)
    assert gen._layout() == (1, cores)
    assert _load(model_dir, workers=3, threads=2)._layout() == (3, 2)  # as configured

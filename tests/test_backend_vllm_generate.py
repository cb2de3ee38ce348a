"""The vLLM backend: config and missing-vLLM error everywhere; real sampling on a GPU with vLLM."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest
import torch
from pydantic import ValidationError

from eva_world.tiny_lm import build_char_tokenizer
from tasks.backends.generate.vllm import VLLMGeneration, VLLMGenerator
from tasks.backends.protocols import Generator

HAS_GPU_VLLM = torch.cuda.is_available() and importlib.util.find_spec("vllm") is not None
PROMPTS = ["1+2=", "34+5=", "r:abc=", "7-3="]


def test_config_defaults_and_validation():
    cfg = VLLMGeneration()
    assert (cfg.kind, cfg.temperature, cfg.top_p, cfg.tensor_parallel_size) == ("vllm", 0.7, 0.9, 1)
    assert cfg.max_model_len is None and cfg.chat_template == "auto"
    assert VLLMGeneration.model_validate(cfg.model_dump()) == cfg
    for bad in ({"gpu_memory_utilization": 1.5}, {"top_p": 0.0}, {"chat_template": "maybe"}):
        with pytest.raises(ValidationError):
            VLLMGeneration.model_validate(bad)
    with pytest.raises(ValidationError, match="Extra inputs"):
        VLLMGeneration.model_validate({"max_new_tokens": 8})  # the transformers field name


def test_load_without_vllm_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` now raises ImportError
    with pytest.raises(ImportError) as info:
        VLLMGeneration().load("/nowhere")
    message = str(info.value)
    assert "vllm serve" in message and "'served'" in message and "'openai'" in message
    assert "eva[vllm]" not in message  # no such extra: vLLM cannot share eva's environment


def test_in_process_engines_start_their_core_by_spawn(monkeypatch: pytest.MonkeyPatch):
    # On an H100, vLLM 0.22.1's default fork of its engine core died with "Cannot re-initialize
    # CUDA in forked subprocess" once the stage process had used CUDA; both in-process vLLM
    # backends now ask for spawn (vLLM's remedy), and leave a user's own choice alone.
    import types

    from tasks.backends.reward.vllm_pooling import VLLMPoolingReward

    seen: list[str | None] = []

    class FakeLLM:
        def __init__(self, **kwargs: object):
            seen.append(os.environ.get("VLLM_WORKER_MULTIPROC_METHOD"))

        def get_tokenizer(self) -> object:
            return build_char_tokenizer("0123456789")

    fake = types.SimpleNamespace(LLM=FakeLLM, SamplingParams=dict, PoolingParams=dict)
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.delenv("VLLM_WORKER_MULTIPROC_METHOD", raising=False)
    VLLMGeneration().load("/nowhere")
    monkeypatch.delenv("VLLM_WORKER_MULTIPROC_METHOD", raising=False)
    VLLMPoolingReward(model="m").load()
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "fork")
    VLLMGeneration().load("/nowhere")
    assert seen == ["spawn", "spawn", "fork"]


def test_chat_template_always_requires_a_template(monkeypatch: pytest.MonkeyPatch):
    import types

    from eva_runtime.errors import ConfigError

    class FakeLLM:
        def __init__(self, **kwargs: object):
            pass

        def get_tokenizer(self) -> object:
            return build_char_tokenizer("0123456789")  # no chat template

    fake = types.SimpleNamespace(LLM=FakeLLM, SamplingParams=dict)
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "spawn")  # load sets it: undone after
    with pytest.raises(ConfigError, match="/nowhere has no chat template") as e:
        VLLMGeneration(chat_template="always").load("/nowhere")
    assert e.value.field == "generate.backend.chat_template"
    assert not VLLMGeneration().load("/nowhere").use_chat  # auto: raw text without one


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU_VLLM, reason="needs a CUDA device and vLLM installed")
def test_samples_are_distinct_and_seed_reproducible(llama_dir: str):
    cfg = VLLMGeneration(
        temperature=1.0,
        top_p=1.0,
        max_tokens=8,
        gpu_memory_utilization=0.3,
        max_model_len=128,
        dtype="float32",
        enforce_eager=True,
    )
    gen = cfg.load(llama_dir)
    assert isinstance(gen, VLLMGenerator) and isinstance(gen, Generator)
    assert not gen.use_chat  # the character tokenizer has no chat template
    seen: list[float] = []
    first = gen.generate(PROMPTS, n=4, seed=7, progress=seen.append)
    assert len(first) == len(PROMPTS) and all(len(rs) == 4 for rs in first)
    # A random model over a 28-token vocabulary: 8-token samples essentially never collide.
    assert all(len(set(rs)) == 4 for rs in first), first
    assert seen == [1.0]
    assert gen.generate(PROMPTS, n=4, seed=7) == first
    other = gen.generate(PROMPTS, n=4, seed=8)
    assert all(a != b for a, b in zip(first, other, strict=True))
    # Per-prompt seeds: prompts sent one per engine call get the same samples (float32 keeps
    # batch-composition noise far below what could flip a draw).
    gen.config = cfg.model_copy(update={"chunk_size": 1})
    assert gen.generate(PROMPTS, n=4, seed=7) == first
    greedy = cfg.model_copy(update={"temperature": 0.0})
    gen.config = greedy
    assert all(len(set(rs)) == 1 and len(rs) == 3 for rs in gen.generate(PROMPTS, n=3, seed=0))

"""The one type stage configs use for "a policy sampler": any of the generation backends.

A config picks its backend with ``kind``. A mapping without ``kind`` is a transformers config,
so configs written before the other backends existed (``backend: {max_new_tokens: 10}``) keep
validating, and keep their meaning. Anything else names an unknown backend and fails with the
list of valid kinds instead of pydantic's errors for every union member.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Discriminator, Tag

from tasks.backends.generate.ctranslate2 import CTranslate2Generation
from tasks.backends.generate.openai import GenerationError, OpenAIGeneration, OpenAIGenerator
from tasks.backends.generate.served import ServedGeneration, ServedGenerator
from tasks.backends.generate.transformers import TransformersGeneration
from tasks.backends.generate.vllm import VLLMGeneration, VLLMGenerator

KINDS = ("transformers", "ctranslate2", "vllm", "openai", "served")


def _kind(value: Any) -> str | None:
    if isinstance(value, dict):
        kind = value.get("kind", "transformers")
        return kind if kind in KINDS else None
    return getattr(value, "kind", None)


GenerationBackend = Annotated[
    Annotated[TransformersGeneration, Tag("transformers")]
    | Annotated[CTranslate2Generation, Tag("ctranslate2")]
    | Annotated[VLLMGeneration, Tag("vllm")]
    | Annotated[OpenAIGeneration, Tag("openai")]
    | Annotated[ServedGeneration, Tag("served")],
    Discriminator(
        _kind,
        custom_error_type="unknown_generation_backend",
        custom_error_message="unknown generation backend 'kind': expected one of "
        + ", ".join(repr(k) for k in KINDS),
    ),
]
"""``backend: GenerationBackend = Field(default_factory=TransformersGeneration)`` in a stage."""


def length_cap(backend: Any) -> tuple[str, int]:
    """The backend's response length cap: its field, relative to the backend, and value."""
    if isinstance(backend, ServedGeneration):
        return "client.max_tokens", backend.client.max_tokens
    if isinstance(backend, TransformersGeneration | CTranslate2Generation):
        return "max_new_tokens", backend.max_new_tokens
    return "max_tokens", backend.max_tokens


__all__ = [
    "KINDS",
    "CTranslate2Generation",
    "GenerationBackend",
    "GenerationError",
    "OpenAIGeneration",
    "OpenAIGenerator",
    "ServedGeneration",
    "ServedGenerator",
    "TransformersGeneration",
    "VLLMGeneration",
    "VLLMGenerator",
    "length_cap",
]

"""Field types shared by backend configs, validated when the config is built (not when a
stage reaches for the device or the checkpoint, after artifacts have been written)."""

from __future__ import annotations

import os
import re
from typing import Annotated

from pydantic import AfterValidator

_DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


def _device(value: str) -> str:
    if not _DEVICE.fullmatch(value):
        raise ValueError(f"unknown device {value!r}: auto, cpu, cuda, cuda:N or mps")
    return value


def _model_ref(value: str) -> str:
    """A local checkpoint that must exist, or a hub id ("org/name"); a path-like value that is
    missing here fails now rather than as a hub lookup mid-run."""
    if value.startswith(("/", "./", "../", "~")) and not os.path.exists(os.path.expanduser(value)):
        raise ValueError(f"no checkpoint at {value!r}")
    return value


Device = Annotated[str, AfterValidator(_device)]
ModelRef = Annotated[str, AfterValidator(_model_ref)]


def spawn_vllm_engines() -> None:
    """Have an in-process vLLM engine start its engine core by spawn, unless the user chose.

    vLLM forks its engine-core process by default. In an eva stage process CUDA may already be
    in use (theta_t's evaluation or a transformers reward model in the same process), and a
    forked child then dies with "Cannot re-initialize CUDA in forked subprocess": seen on an
    H100 with vLLM 0.22.1, for ``vllm`` generation and ``vllm_pooling`` rewards alike. vLLM's
    own remedy is ``VLLM_WORKER_MULTIPROC_METHOD=spawn``; it costs a second of start-up.
    """
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")

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

"""Checks at the edge of what this machine must have for a run, made before it writes anything:
the accelerate config and the package it trains with, the trackers training reports to, the
environment variables that hold the run's API keys, and the devices its config asks for. Part of
``flows.inputs.check_inputs``, the one entry point.
"""

from __future__ import annotations

import os
from typing import Any

from pydantic import BaseModel

from eva_runtime.errors import ConfigError
from flows.config import RunConfig
from tasks.config_tree import walk

# What an accelerate config's distributed_type trains with, beyond eva's own install: the
# package it imports and the extra that installs it (pyproject.toml).
ACCELERATE_BACKENDS = {"DEEPSPEED": ("deepspeed", "DeepSpeed", "gpu")}


def check_accelerate(config: RunConfig) -> None:
    """The accelerate config is there, a run on several machines has a root they all mount, and
    the package the config trains with is installed."""
    from eva_runtime.accelerate import resolve_config

    path = resolve_config(config.train.accelerate_config)
    if not os.path.isfile(path):
        raise ConfigError(f"no file at {config.train.accelerate_config!r}",
                          field="train.accelerate_config")  # fmt: skip
    if config.train.nodes.machines > 1 and "://" in config.root:
        # The other machines read the pairs and the policy, and machine 0's launch request, by
        # path (eva_runtime/follow.py).
        raise ConfigError(
            f"train.nodes.machines={config.train.nodes.machines} needs a run root on a "
            f"filesystem every machine mounts at the same path, not {config.root}",
            field="train.nodes.machines",
        )
    _check_accelerate_backend(config.train.accelerate_config, path)


def _check_accelerate_backend(named: str, path: str) -> None:
    """The package the accelerate config trains with is installed (DeepSpeed for the default,
    infra/accelerate/zero3.yaml, which eva's own install does not carry): refused here, in one
    line naming the extra, instead of when the first training starts, hours into a run."""
    import importlib.util

    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return  # accelerate's own loader says what is wrong with it, at launch
    kind = str(data.get("distributed_type", "")).upper() if isinstance(data, dict) else ""
    if kind not in ACCELERATE_BACKENDS:
        return
    module, name, extra = ACCELERATE_BACKENDS[kind]
    if importlib.util.find_spec(module) is None:
        raise ConfigError(
            f"{named} trains with {name} (distributed_type: {kind}), which is not installed",
            field="train.accelerate_config",
            hint=f"pip install 'eva[{extra}]' on every machine that trains, or name an "
            f"accelerate config without {name}",
        )


def check_reporters(report_to: list[str], field: str = "train.solver.report_to") -> None:
    """Every tracker a solver's ``report_to`` (``field``) names is installed: refused now, in
    one line naming its package, not by the first training's trainer, hours into a run."""
    import importlib.util

    from tasks.backends.train.dpo import REPORTERS

    for name in report_to:
        package, modules = REPORTERS.get(name, ("", ()))
        if modules and not any(importlib.util.find_spec(m) for m in modules):
            raise ConfigError(
                f"{name} needs the {package} package, which is not installed",
                field=field,
                hint=f"pip install {package} on every machine that trains, or drop {name}",
            )


def check_api_keys(config: Any) -> None:
    """Every LLM endpoint in the config whose key variable is named has it set, checked before
    the run writes anything rather than when its stage is reached."""
    from eva_runtime.llm_config import LLMClientConfig, LLMConfigError, api_key

    for node in walk(config):
        if isinstance(node.value, LLMClientConfig):
            try:
                api_key(node.value)
            except LLMConfigError as exc:
                raise ConfigError(f"{node.path}.{str(exc).removeprefix('llm.')}") from None


def check_devices(config: BaseModel) -> None:
    """A device no machine here has (``device: cuda``, ``use_vllm: true``) is refused now,
    not trained on CPU in silence or failed after setup. torch is imported only when a config
    asks for an accelerator."""
    asked: list[tuple[str, str, str]] = []  # (field, its setting, what it needs)
    for node in walk(config):
        name = node.keys[-1] if node.owner is not None else None  # a field, not a dict's key
        value = node.value
        if name == "device" and isinstance(value, str) and value.startswith(("cuda", "mps")):
            asked.append((node.path, value, value.split(":")[0]))
        elif name == "use_vllm" and value is True:
            asked.append((node.path, "true", "cuda"))
    if not asked:
        return
    import torch

    have = {"cuda": torch.cuda.is_available(), "mps": torch.backends.mps.is_available()}
    for where, setting, needs in asked:
        if not have[needs]:
            raise ConfigError(
                f"{where}={setting} needs {needs.upper()}, which this machine does not have",
                field=where,
                hint='set it to "auto" or "cpu", or run on a machine with one'
                if not where.endswith("use_vllm")
                else "set it to false, or run on a machine with a GPU",
            )

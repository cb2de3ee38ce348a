"""Checks on user inputs that must pass before a run writes anything.

Config fields are validated by pydantic when the config is built; what remains are the
contents of files the config points at (a prompt file's columns and rows).
"""

from __future__ import annotations

from flows.config import ConfigError, OnlineRunConfig, RunConfig
from tasks.prompts import read_prompt_file


def check_inputs(config: RunConfig | OnlineRunConfig) -> None:
    for field, prompts in (("prompts", config.prompts), ("heldout", config.heldout)):
        if prompts.path is None:
            continue
        try:
            read_prompt_file(prompts)
        except FileNotFoundError:
            raise ConfigError(f"{field}.path: no file at {prompts.path!r}") from None
        except ValueError as exc:
            raise ConfigError(f"{field}.path: {exc}") from None

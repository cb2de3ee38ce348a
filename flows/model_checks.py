"""Checks at the edge of the models a run starts from, made before it writes anything: the solver
sees prompts laid out as generation fed them, every Hub model the run names is cached or the Hub
answers, and a local starting checkpoint has a readable config and weights. Part of
``flows.inputs.check_inputs``, the one entry point.
"""

from __future__ import annotations

import json
import os
from typing import Any

from eva_runtime.errors import ConfigError
from eva_runtime.hub import unreachable
from flows.config import OnlineRunConfig, RunConfig
from tasks.checkpoints import CheckpointError, check_gguf_reader, is_gguf
from tasks.content_hashes import is_hub_id


def _template_use(backend: Any) -> str | None:
    """How a generation backend lays out prompts: its ``chat_template`` setting, or for an HTTP
    backend its endpoint (chat: the server's template; completions: raw text)."""
    if (setting := getattr(backend, "chat_template", None)) is not None:
        return str(setting)
    endpoint = getattr(getattr(backend, "client", backend), "endpoint", None)
    return {"chat": "always", "completions": "never"}.get(str(endpoint))


def check_chat_templates(config: RunConfig) -> None:
    """The solver trains on prompts laid out as generation fed them: one side on raw text and
    the other templated would teach answers after a prompt the policy never sees that way."""
    solver = getattr(config.train.solver, "chat_template", None)
    for field, backend in (("generate.backend", config.generate.backend),
                           ("evaluate.generation", config.evaluate.generation)):  # fmt: skip
        used = _template_use(backend)
        if solver is None or used is None or (solver == "never") == (used == "never"):
            continue
        how = "raw text" if used == "never" else "the chat template"
        raise ConfigError(
            f"train.solver.chat_template is {solver!r} but {field} samples prompts as {how}",
            field="train.solver.chat_template",
            hint="the solver must see each prompt as generation fed it: set both to never, or "
            "neither",
        )


def check_hub_models(config: RunConfig | OnlineRunConfig) -> None:
    """Every Hub model the run names (the policy, the reward models) is cached or the Hub
    answers: checked in seconds, before anything is written, not by a stage's retries."""
    if isinstance(config, RunConfig):
        reward = ("annotate.reward", config.annotate.reward)
    else:
        reward = ("online.reward", config.online.reward)
    named = [("bootstrap.init_checkpoint", config.bootstrap.init_checkpoint)]
    for field, backend in (reward, ("evaluate.reward", config.evaluation.reward)):
        named.append((f"{field}.model", getattr(backend, "model", None)))
    checked: set[str] = set()
    for field, ref in named:
        if not isinstance(ref, str) or not is_hub_id(ref) or ref in checked:
            continue
        checked.add(ref)
        if (why := unreachable(ref)) is not None:
            raise ConfigError(
                f"{ref}: {why}",
                field=field,
                hint="download it where the Hub is reachable (hf download), or name a local "
                "checkpoint",
            )


_WEIGHTS = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json",
            "pytorch_model.bin.index.json")  # fmt: skip


def check_checkpoint(checkpoint: str | None) -> None:
    """A local starting checkpoint has a readable config and weights, a GGUF one a reader (a
    Hub id is checked by loading its config when ``flows.inputs`` checks that prompts fit it,
    else by its first stage)."""
    if checkpoint is not None and is_gguf(checkpoint):
        try:
            check_gguf_reader("bootstrap.init_checkpoint")
        except CheckpointError as exc:
            raise ConfigError(exc.message, field=exc.field, hint=exc.hint) from None
        return
    if checkpoint is None or is_hub_id(checkpoint) or not os.path.isdir(checkpoint):
        return
    try:
        with open(os.path.join(checkpoint, "config.json")) as f:
            json.load(f)
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"{checkpoint}: no readable config.json ({type(exc).__name__})",
            field="bootstrap.init_checkpoint",
        ) from None
    if not any(os.path.exists(os.path.join(checkpoint, w)) for w in _WEIGHTS):
        raise ConfigError(
            f"{checkpoint}: no weights ({', '.join(_WEIGHTS[:2])})",
            field="bootstrap.init_checkpoint",
        )

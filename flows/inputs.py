"""Checks on user inputs that must pass before a run writes anything.

Config fields are validated by pydantic when the config is built; what remains are the
contents of files the config points at (a prompt file's columns and rows) and whether the run
root can be written at all. Each failure is one line naming the field or file.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from typing import Any

import fsspec

from eva_runtime.errors import first_line
from flows.config import ConfigError, OnlineRunConfig, RunConfig
from tasks.prompts import read_prompt_file

ROOT_TIMEOUT_S = 20.0


def check_inputs(config: RunConfig | OnlineRunConfig) -> None:
    _check_checkpoint(config.bootstrap.init_checkpoint)
    _check_api_keys(config)
    if isinstance(config, RunConfig) and config.train.launcher == "accelerate":
        from eva_runtime.accelerate import resolve_config

        if not os.path.isfile(resolve_config(config.train.accelerate_config)):
            raise ConfigError(
                f"train.accelerate_config: no file at {config.train.accelerate_config!r}"
            )
        if config.train.nodes.machines > 1 and "://" in config.root:
            # The other machines read the pairs and the policy, and machine 0's launch
            # request, by path (tasks/backends/follow.py).
            raise ConfigError(
                f"train.nodes.machines={config.train.nodes.machines} needs a run root on a "
                f"filesystem every machine mounts at the same path, not {config.root}"
            )
    for field, prompts in (("prompts", config.prompts), ("heldout", config.heldout)):
        if prompts.path is None:
            continue
        try:
            table = read_prompt_file(prompts)
        except FileNotFoundError:
            raise ConfigError(f"{field}.path: no file at {prompts.path!r}") from None
        except ValueError as exc:
            raise ConfigError(f"{field}.path: {exc}") from None
        _check_context(config, field, table.column("prompt").to_pylist())
    check_root(config.root, config.storage_options)


def _check_context(config: RunConfig | OnlineRunConfig, field: str, prompts: list[str]) -> None:
    """Every prompt of a file fits the starting checkpoint's context with the configured
    answer length, when both are known here (a local checkpoint, transformers generation)."""
    checkpoint = config.bootstrap.init_checkpoint
    if isinstance(config, RunConfig):
        backend: Any = config.generate.backend
    else:
        backend = config.evaluate.generation
    if checkpoint is None or not os.path.isdir(checkpoint) or backend.kind != "transformers":
        return
    from transformers import AutoConfig, AutoTokenizer

    from tasks.backends.generate.transformers import check_fits

    try:
        tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    except Exception as exc:
        raise ConfigError(f"bootstrap.init_checkpoint: {checkpoint}: no usable tokenizer "
                          f"({type(exc).__name__})") from None  # fmt: skip
    lengths = [len(tokenizer(p)["input_ids"]) for p in prompts]
    try:
        check_fits(AutoConfig.from_pretrained(checkpoint), lengths, backend.max_new_tokens)
    except ValueError as exc:
        path = getattr(config, field).path
        raise ConfigError(f"{field}.path: {path}: {exc}") from None


_WEIGHTS = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json",
            "pytorch_model.bin.index.json")  # fmt: skip


def _check_checkpoint(checkpoint: str | None) -> None:
    """A local starting checkpoint has a readable config and weights (a hub id is left to the
    download, which names itself)."""
    if checkpoint is None or not os.path.isdir(checkpoint):
        return
    import json

    try:
        with open(os.path.join(checkpoint, "config.json")) as f:
            json.load(f)
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"bootstrap.init_checkpoint: {checkpoint}: no readable config.json "
            f"({type(exc).__name__})"
        ) from None
    if not any(os.path.exists(os.path.join(checkpoint, w)) for w in _WEIGHTS):
        raise ConfigError(
            f"bootstrap.init_checkpoint: {checkpoint}: no weights ({', '.join(_WEIGHTS[:2])})"
        )


def _check_api_keys(config: Any) -> None:
    """Every LLM endpoint in the config whose key variable is named has it set, checked before
    the run writes anything rather than when its stage is reached."""
    from pydantic import BaseModel

    from eva_runtime.llm_config import LLMClientConfig, LLMConfigError, api_key

    def visit(node: Any, path: str) -> None:
        if isinstance(node, LLMClientConfig):
            try:
                api_key(node)
            except LLMConfigError as exc:
                raise ConfigError(f"{path}.{str(exc).removeprefix('llm.')}") from None
        elif isinstance(node, BaseModel):
            for name in type(node).model_fields:
                visit(getattr(node, name), f"{path}.{name}" if path else name)

    visit(config, "")


def check_root(root: str, storage_options: dict[str, Any]) -> None:
    """The run root can be written (a local folder) or reached (a remote URL), checked without
    leaving anything behind and without waiting on an endpoint that does not answer."""
    if "://" not in root:
        _check_local_root(root)
        return
    outcome: list[BaseException | None] = []

    options = dict(storage_options)
    if root.startswith(("s3://", "s3a://")):
        # One quick attempt for the probe only: botocore's default retries and back-off made a
        # dead endpoint take 40 s to report (the run itself keeps the user's settings).
        quick = {"connect_timeout": 5, "read_timeout": 10, "retries": {"max_attempts": 1}}
        options["config_kwargs"] = {**quick, **options.get("config_kwargs", {})}
        options["skip_instance_cache"] = True

    def probe() -> None:
        try:
            fs, path = fsspec.core.url_to_fs(root, **options)
            fs.exists(path)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=probe, daemon=True)  # a hung endpoint must not hang us
    thread.start()
    thread.join(ROOT_TIMEOUT_S)
    endpoint = storage_options.get("endpoint_url") or (
        storage_options.get("client_kwargs") or {}
    ).get("endpoint_url")
    where = f"{root}" + (f" (endpoint {endpoint})" if endpoint else "")
    if not outcome:
        raise ConfigError(f"root: no answer from {where} within {ROOT_TIMEOUT_S:g} s")
    if (exc := outcome[0]) is not None:
        raise ConfigError(f"root: cannot reach {where}: {first_line(exc, with_type=False)}")


def _check_local_root(root: str) -> None:
    if os.path.exists(root) and not os.path.isdir(root):
        raise ConfigError(f"root: {root} is a file, not a folder")
    # Absolute first: the parent of a relative "runs" is "", which never exists.
    existing = os.path.abspath(root)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    try:  # a real write, removed at once: os.access cannot see read-only mounts or /proc
        shutil.rmtree(tempfile.mkdtemp(prefix=".eva-write-check-", dir=existing))
    except OSError as exc:
        raise ConfigError(f"root: cannot write under {root} ({exc.strerror})") from None

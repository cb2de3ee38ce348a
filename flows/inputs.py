"""Checks that a run can work, made before it writes anything: in seconds, each failure one line
naming the field to set.

Config fields are validated by pydantic when the config is built; what remains is what no field
can check alone: that the run names what only its user can (a policy, prompts, a reward model, a
rewriter), that its components accept its prompts (the built-in world's only know world
prompts), that every prompt fits the policy's context whenever the policy is known before
training, that API keys are set, that an evaluation judge answers and its reference answers
can be read, and that the run root can be written.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel

from eva_runtime.errors import ConfigError, EvaError, first_line
from eva_runtime.hub import unreachable
from flows.config import OnlineRunConfig, RunConfig
from flows.roots import check_root, check_storage_options
from tasks.backends.python import PythonComponent
from tasks.prompts import PromptsConfig, read_prompts
from tasks.store import is_hub_id

OWN_MODEL = "start from configs/own-model.yaml"


def check_inputs(config: RunConfig | OnlineRunConfig) -> None:
    _check_required(config)
    if isinstance(config, RunConfig):
        _check_chat_templates(config)
    _check_hub_models(config)
    _check_checkpoint(config.bootstrap.init_checkpoint)
    _check_api_keys(config)
    _check_judge(config)
    _check_devices(config)
    if isinstance(config, RunConfig) and config.train.launcher == "accelerate":
        _check_accelerate(config)
    if isinstance(config, RunConfig):
        _check_reporters(getattr(config.train.solver, "report_to", []))
    components = dict(_loaded_components(config))
    read: dict[str, list[str]] = {}  # the prompt files' texts, by field
    for field in ("prompts", "heldout"):
        prompts: PromptsConfig = getattr(config, field)
        if prompts.origin is None:
            continue
        named, shown = prompts.origin  # path or dataset
        if prompts.path is not None:
            check_storage_options(prompts.path, prompts.storage_options, f"{field}.storage_options")
        try:
            texts = read_prompts(prompts).column("prompt").to_pylist()
        except FileNotFoundError:
            raise ConfigError(f"{field}.path: no file at {prompts.path!r}") from None
        except ValueError as exc:
            raise ConfigError(f"{field}.{named}: {exc}") from None
        for where, component in components.items():
            check = getattr(component, "check_prompts", None)
            try:
                if check is not None:
                    check(texts)
            except ValueError as exc:
                raise ConfigError(
                    f"{field}.{named}: {shown}: {exc}",
                    hint=f"{where} is {_named(config, where)}",
                ) from None
        _check_context(config, field, texts)
        read[field] = texts
    if isinstance(config, OnlineRunConfig) and "prompts" in read:
        config.online.check_budget(len(read["prompts"]))
    if "prompts" in read and "heldout" in read:
        _check_heldout_overlap(read["prompts"], read["heldout"])
    check_root(config.root, config.storage_options)


def _check_required(config: RunConfig | OnlineRunConfig) -> None:
    """What only the user can name: refused in one line rather than hours into a run."""
    boot = config.bootstrap
    if boot.init_checkpoint is None and boot.builder is None:
        raise ConfigError(
            "no policy to start from",
            field="bootstrap.init_checkpoint",
            hint="set a Hub id or a local checkpoint, e.g. --set "
            "bootstrap.init_checkpoint=Qwen/Qwen2.5-0.5B-Instruct; or run the built-in demo "
            "with --config configs/world.yaml",
        )
    for field in ("prompts", "heldout"):
        if not getattr(config, field).given:
            raise ConfigError(
                "no prompts", field=f"{field}.path", hint=f"set a prompt file; {OWN_MODEL}"
            )
    if isinstance(config, RunConfig):
        reward, reward_field = config.annotate.reward, "annotate.reward"
        needs_evolver = config.prompt_strategy == "eva"
        evolver, evolver_field = config.evolve.evolver, "evolve.evolver"
    else:
        reward, reward_field = config.online.reward, "online.reward"
        needs_evolver = config.online.buffer.evolve
        evolver, evolver_field = config.online.evolver, "online.evolver"
    if reward is None:
        raise ConfigError(
            "no reward model",
            field=reward_field,
            hint="e.g. {kind: sequence_classifier, model: Skywork/Skywork-Reward-Llama-3.1-8B"
            f"-v0.2}}; {OWN_MODEL}",
        )
    if needs_evolver and evolver is None:
        raise ConfigError(
            "no rewriter to evolve prompts with",
            field=evolver_field,
            hint=f"e.g. {{kind: distilabel, llm: {{base_url: ..., model: ...}}}}; {OWN_MODEL}",
        )
    if config.evaluation.reward is None:
        raise ConfigError(
            f"{reward_field} is {reward.kind} and cannot score one answer alone",
            field="evaluate.reward",
            hint="set a pointwise reward for evaluation",
        )


def _loaded_components(config: BaseModel, path: str = "") -> Iterator[tuple[str, Any]]:
    """Every Python component the config names, built now: options it refuses fail here."""
    if isinstance(config, PythonComponent):
        try:
            yield path, config.load()
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{path}.options: {first_line(exc, with_type=False)}") from None
        return
    for name in type(config).model_fields:
        value = getattr(config, name)
        if isinstance(value, BaseModel):
            yield from _loaded_components(value, f"{path}.{name}" if path else name)


def _named(config: BaseModel, where: str) -> str:
    node: Any = config
    for part in where.split("."):
        node = getattr(node, part)
    return str(node.factory)


def _check_context(config: RunConfig | OnlineRunConfig, field: str, prompts: list[str]) -> None:
    """Every prompt of a file fits the starting policy's context with the configured answer
    length, when the policy is known before training (a local checkpoint or a Hub id) and the
    generation backend runs it here (transformers)."""
    checkpoint = config.bootstrap.init_checkpoint
    backend: Any = config.generate.backend if isinstance(config, RunConfig) else None
    backend = backend or config.evaluate.generation
    if checkpoint is None or backend.kind != "transformers":
        return
    from transformers import AutoConfig, AutoTokenizer

    from tasks.backends.generate.transformers import check_fits

    try:
        tokenizer = AutoTokenizer.from_pretrained(checkpoint)
        model_config = AutoConfig.from_pretrained(checkpoint)
    except Exception as exc:  # a Hub id that does not exist, or is not cached offline
        raise ConfigError(
            f"bootstrap.init_checkpoint: {checkpoint}: cannot be loaded "
            f"({first_line(exc, with_type=False)})"
        ) from None
    lengths = [len(tokenizer(p)["input_ids"]) for p in prompts]
    try:
        check_fits(model_config, lengths, backend.max_new_tokens)
    except ValueError as exc:
        named, shown = getattr(config, field).origin
        raise ConfigError(
            f"{field}.{named}: {shown}: {exc}",
            hint=f"or drop the long ones: {field}.max_chars (characters) with "
            f"{field}.drop_invalid: true",
        ) from None


def _template_use(backend: Any) -> str | None:
    """How a generation backend lays out prompts: its ``chat_template`` setting, or for an HTTP
    backend its endpoint (chat: the server's template; completions: raw text)."""
    if (setting := getattr(backend, "chat_template", None)) is not None:
        return str(setting)
    endpoint = getattr(getattr(backend, "client", backend), "endpoint", None)
    return {"chat": "always", "completions": "never"}.get(str(endpoint))


def _check_chat_templates(config: RunConfig) -> None:
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
            hint="the solver must see each prompt as generation fed it: set both to never, or "
            "neither",
        )


def _check_hub_models(config: RunConfig | OnlineRunConfig) -> None:
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
                f"{field}: {ref}: {why}",
                hint="download it where the Hub is reachable (hf download), or name a local "
                "checkpoint",
            )


_WEIGHTS = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json",
            "pytorch_model.bin.index.json")  # fmt: skip


def _check_checkpoint(checkpoint: str | None) -> None:
    """A local starting checkpoint has a readable config and weights (a Hub id is checked by
    loading its config, in ``_check_context`` when prompts are read, else by its first stage)."""
    if checkpoint is None or is_hub_id(checkpoint) or not os.path.isdir(checkpoint):
        return
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


# What an accelerate config's distributed_type trains with, beyond eva's own install: the
# package it imports and the extra that installs it (pyproject.toml).
ACCELERATE_BACKENDS = {"DEEPSPEED": ("deepspeed", "DeepSpeed", "gpu")}


def _check_accelerate(config: RunConfig) -> None:
    from eva_runtime.accelerate import resolve_config

    path = resolve_config(config.train.accelerate_config)
    if not os.path.isfile(path):
        raise ConfigError(f"train.accelerate_config: no file at {config.train.accelerate_config!r}")
    if config.train.nodes.machines > 1 and "://" in config.root:
        # The other machines read the pairs and the policy, and machine 0's launch request, by
        # path (eva_runtime/follow.py).
        raise ConfigError(
            f"train.nodes.machines={config.train.nodes.machines} needs a run root on a "
            f"filesystem every machine mounts at the same path, not {config.root}"
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


def _check_reporters(report_to: list[str]) -> None:
    """Every tracker ``train.solver.report_to`` names is installed: refused now, in one line
    naming its package, not by the first training's trainer, hours into a run."""
    import importlib.util

    from tasks.backends.train.dpo import REPORTERS

    for name in report_to:
        package, modules = REPORTERS.get(name, ("", ()))
        if modules and not any(importlib.util.find_spec(m) for m in modules):
            raise ConfigError(
                f"{name} needs the {package} package, which is not installed",
                field="train.solver.report_to",
                hint=f"pip install {package} on every machine that trains, or drop {name}",
            )


def _check_api_keys(config: Any) -> None:
    """Every LLM endpoint in the config whose key variable is named has it set, checked before
    the run writes anything rather than when its stage is reached."""
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


def _check_judge(config: RunConfig | OnlineRunConfig) -> None:
    """The evaluation judge answers (one GET of its model list) and its reference answers can be
    read, before the run writes anything: a judge that is down would otherwise fail the first
    judge stage, after theta_0 was trained and evaluated."""
    judged = config.evaluate.judge
    if judged is None:
        return
    from eva_runtime.llm_client import LLMClient
    from tasks.backends.judge.reference import for_heldout

    client = LLMClient(judged.llm)  # its key's variable is checked before (_check_api_keys)
    try:
        problem, models = client.probe()
    finally:
        client.close()
    if problem is not None:
        if not problem.startswith("refuses the key"):
            hint = "start the judge's server, or set it to an OpenAI-compatible endpoint that "
            hint += "answers"
        elif judged.llm.api_key_env is None:
            hint = "it asks for a key: set evaluate.judge.llm.api_key_env to its variable"
        else:
            hint = f"check the key in {judged.llm.api_key_env}"
        raise ConfigError(f"{judged.llm.base_url} {problem}", field="evaluate.judge.llm.base_url",
                          hint=hint)  # fmt: skip
    if models and judged.llm.model not in models:
        shown = ", ".join(models[:5]) + (", ..." if len(models) > 5 else "")
        _warn(
            f"evaluate.judge.llm.model: {judged.llm.base_url} lists no model "
            f"{judged.llm.model!r} (it lists {shown}); a request for it may be refused"
        )
    try:
        for_heldout(judged.reference, config.heldout).check()
    except EvaError as exc:
        raise ConfigError(exc.message, field=exc.field, hint=exc.hint) from None


def _warn(message: str) -> None:
    """A warning on stderr, once per process (the flow checks inputs again)."""
    line = f"eva: warning: {message}"
    if line not in _WARNED:
        _WARNED.add(line)
        print(line, file=sys.stderr)


def _check_heldout_overlap(prompts: list[str], heldout: list[str]) -> None:
    """The held-out set measures what training did not see (the paper's is disjoint from its
    prompts): one made of training prompts only is refused, one mostly of them is warned of."""
    train = set(prompts)
    shared = sum(p in train for p in heldout)
    if not heldout or not shared:
        return
    share = shared / len(heldout)
    message = f"{shared} of {len(heldout)} held-out prompts are training prompts too"
    if shared == len(heldout):
        raise ConfigError(
            f"{message}: it measures nothing training did not see",
            field="heldout.path",
            hint="use prompts disjoint from prompts.path",
        )
    line = f"eva: warning: heldout.path: {message} ({share:.0%}): scores on it flatter training"
    if share > 0.5 and line not in _WARNED:  # the flow checks inputs again: say it once
        _WARNED.add(line)
        print(line, file=sys.stderr)


_WARNED: set[str] = set()


def _check_devices(config: BaseModel) -> None:
    """A device no machine here has (``device: cuda``, ``use_vllm: true``) is refused now,
    not trained on CPU in silence or failed after setup. torch is imported only when a config
    asks for an accelerator."""
    asked: list[tuple[str, str]] = []  # (field, what it needs)

    def visit(node: Any, path: str) -> None:
        if not isinstance(node, BaseModel):
            return
        for name in type(node).model_fields:
            value, where = getattr(node, name), f"{path}.{name}" if path else name
            if name == "device" and isinstance(value, str) and value.startswith(("cuda", "mps")):
                asked.append((where, value.split(":")[0]))
            elif name == "use_vllm" and value is True:
                asked.append((where, "cuda"))
            visit(value, where)

    visit(config, "")
    if not asked:
        return
    import torch

    have = {"cuda": torch.cuda.is_available(), "mps": torch.backends.mps.is_available()}
    for where, needs in asked:
        if not have[needs]:
            setting = "true" if where.endswith("use_vllm") else str(_value_at(config, where))
            raise ConfigError(
                f"{where}={setting} needs {needs.upper()}, which this machine does not have",
                field=where,
                hint='set it to "auto" or "cpu", or run on a machine with one'
                if not where.endswith("use_vllm")
                else "set it to false, or run on a machine with a GPU",
            )


def _value_at(config: Any, where: str) -> Any:
    """The value a dotted field names."""
    node = config
    for part in where.split("."):
        node = getattr(node, part)
    return node

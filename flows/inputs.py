"""Checks that a run can work, made before it writes anything: in seconds, each failure one line
naming the field to set.

Config fields are validated by pydantic when the config is built; what remains is what no field
can check alone: that the run names what only its user can (a policy, prompts, a reward model, a
rewriter), that its components accept its prompts (the built-in world's only know world
prompts), that every prompt fits the policy's context whenever the policy is known before
training, that API keys are set, that an evaluation judge answers and its reference answers
can be read, and that the run root can be written.

``check_inputs`` is the one entry point. The checks of the prompts, of what only the user can
name and of the judge are here; those of the models the run starts from are in
``flows.model_checks``, those of what this machine must have (devices, the accelerate launcher,
trackers, API keys) in ``flows.machine_checks``, and those of the run root in ``flows.roots``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel

from eva_runtime.errors import ConfigError, EvaError, first_line
from flows.config import OnlineRunConfig, RunConfig, check_finite
from flows.machine_checks import check_accelerate, check_api_keys, check_devices, check_reporters
from flows.model_checks import check_chat_templates, check_checkpoint, check_hub_models
from flows.roots import check_root, check_storage_options
from tasks.backends.python import Builds, PythonComponent
from tasks.config_tree import Node, walk
from tasks.prompts import PromptsConfig, read_prompts

OWN_MODEL = "start from configs/own-model.yaml"


def _relative_hint(path: str | None) -> str | None:
    """A relative path is read from the folder eva runs in, also for a run launched elsewhere
    (its config keeps the path as it was given): say which folder that was."""
    if path is None or "://" in path or os.path.isabs(path):
        return None
    return (f"a relative path is read from the current folder, {os.getcwd()}: run eva from the "
            "folder the config (or the run) was written in, or give an absolute path")  # fmt: skip


def check_inputs(
    config: RunConfig | OnlineRunConfig, reads: tuple[str, ...] = ("prompts", "heldout")
) -> None:
    """Everything a launch can check before it writes anything; of the prompt sets, those it
    ``reads`` (an evaluation of a finished run reads neither of the run's own)."""
    check_finite(config)  # a config built without validate_config (a flow's parameter)
    _check_required(config)
    if isinstance(config, RunConfig):
        check_chat_templates(config)
    check_hub_models(config)
    check_checkpoint(config.bootstrap.init_checkpoint)
    check_api_keys(config)
    _check_judge(config)
    check_devices(config)
    if isinstance(config, RunConfig) and config.train.launcher == "accelerate":
        check_accelerate(config)
    if isinstance(config, RunConfig):
        check_reporters(getattr(config.train.solver, "report_to", []))
    else:
        check_reporters(getattr(config.online.solver, "report_to", []), "online.solver.report_to")
    components = dict(_loaded_components(config))
    read: dict[str, list[str]] = {}  # the prompt files' texts, by field
    for field in reads:
        prompts: PromptsConfig = getattr(config, field)
        if prompts.origin is None:
            continue
        named, shown = prompts.origin  # path or dataset
        if prompts.path is not None:
            check_storage_options(prompts.path, prompts.storage_options, f"{field}.storage_options")
        try:
            table = read_prompts(prompts)
        except FileNotFoundError:
            raise ConfigError(f"no file at {prompts.path!r}", field=f"{field}.path",
                              hint=_relative_hint(prompts.path)) from None  # fmt: skip
        except ValueError as exc:
            raise ConfigError(str(exc), field=f"{field}.{named}") from None
        texts = table.column("prompt").to_pylist()
        _check_instructions(config, field, f"{field}.{named}", shown, table)
        for where, (factory, component) in components.items():
            check = getattr(component, "check_prompts", None)
            try:
                if check is not None:
                    check(texts)
            except ValueError as exc:
                raise ConfigError(
                    f"{shown}: {exc}", field=f"{field}.{named}", hint=f"{where} is {factory}"
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


def _loaded_components(config: BaseModel) -> Iterator[tuple[str, tuple[str, Any]]]:
    """Every Python component the config names, built now: options it refuses, a factory that
    fails, and an object that cannot serve the field's role (``Builds``: None, or without the
    methods the stages call) fail here. ``(field, (its factory, the component))``."""
    for node in walk(config, descend=lambda node: not isinstance(node.value, PythonComponent)):
        if not isinstance(node.value, PythonComponent):
            continue
        factory = node.value.factory
        try:
            built = node.value.load()
        except (TypeError, ValueError) as exc:
            raise ConfigError(
                first_line(exc, with_type=False), field=f"{node.path}.options"
            ) from None
        except Exception as exc:  # its own code failed: the user's to fix, named here
            raise ConfigError(
                f"{factory} raised {first_line(exc)}",
                field=f"{node.path}.factory",
                hint="eva builds each component of yours once before the run starts",
            ) from None
        role = _role(node)
        if role is not None and (why := role.lacks(built)) is not None:
            raise ConfigError(
                f"{factory} {why}",
                field=f"{node.path}.factory",
                hint=f"it must build {role.wants()}",
            )
        yield node.path, (factory, built)


def _role(node: Node) -> Builds | None:
    """What the field holding a component declares the component must build."""
    metadata = node.field.metadata if node.field is not None else []
    return next((m for m in metadata if isinstance(m, Builds)), None)


def _check_instructions(
    config: RunConfig | OnlineRunConfig, field: str, key: str, shown: str, table: Any
) -> None:
    """Where a component reads each prompt's instructions (the instruction-following reward or
    evolver), the prompts carry them, and the checkers here can run every one. A training
    prompt no answer can follow as written (``Unfollowable``) is refused; a held-out one is
    scored as it is, and counted in one warning line."""
    readers = [
        node.path
        for node in walk(config)
        if isinstance(node.value, BaseModel) and getattr(node.value, "prompt_columns", None)
    ]
    if not readers:
        return
    from tasks.backends.ifeval import Unfollowable, check, parse

    ids = table.column("instruction_id_list").to_pylist()
    if all(i is None for i in ids):
        raise ConfigError(
            f"{shown}: no prompt carries instructions (instruction_id_list), and {readers[0]} "
            "checks a response against its prompt's",
            field=key,
            hint="give each row IFEval's instruction_id_list and kwargs, as python -m "
            "bench.if_prompts writes them",
        )
    kwargs_cells = table.column("kwargs").to_pylist()
    scored_as_is: list[str] = []
    for row, (given, kwargs) in enumerate(zip(ids, kwargs_cells, strict=True)):
        try:
            if given is not None:
                check(parse(given, kwargs))
        except Unfollowable as exc:
            if field == "prompts":
                raise ConfigError(f"{shown}: prompt {row}: {exc}", field=key,
                                  hint=f"{readers[0]} checks every one") from None  # fmt: skip
            scored_as_is.append(f"prompt {row}: {exc}")
        except (ValueError, ImportError) as exc:
            raise ConfigError(f"{shown}: prompt {row}: {exc}", field=key,
                              hint=f"{readers[0]} checks every one") from None  # fmt: skip
    if scored_as_is:
        _warn(
            f"{key}: {shown}: {len(scored_as_is)} held-out prompts cannot be followed as "
            f"written, and are scored as they are (the first, {scored_as_is[0]})"
        )


def _check_context(config: RunConfig | OnlineRunConfig, field: str, prompts: list[str]) -> None:
    """Every prompt of a file fits the starting policy's context with the configured answer
    length, when the policy is known before training (a local checkpoint or a Hub id) and the
    generation backend runs it here (transformers, CTranslate2)."""
    checkpoint = config.bootstrap.init_checkpoint
    backend: Any = config.generate.backend if isinstance(config, RunConfig) else None
    backend = backend or config.evaluate.generation
    if checkpoint is None or backend.kind not in ("transformers", "ctranslate2"):
        return
    from transformers import AutoConfig, AutoTokenizer

    from tasks.backends.generate.transformers import check_fits
    from tasks.checkpoints import local_checkpoint

    try:
        checkpoint = local_checkpoint(checkpoint, say=print)  # a GGUF file: its folder
        tokenizer = AutoTokenizer.from_pretrained(checkpoint)
        model_config = AutoConfig.from_pretrained(checkpoint)
    except Exception as exc:  # a Hub id that does not exist, or is not cached offline
        raise ConfigError(
            f"{checkpoint}: cannot be loaded ({first_line(exc, with_type=False)})",
            field="bootstrap.init_checkpoint",
        ) from None
    lengths = [len(tokenizer(p)["input_ids"]) for p in prompts]
    try:
        check_fits(model_config, lengths, backend.max_new_tokens)
    except ValueError as exc:
        named, shown = getattr(config, field).origin
        raise ConfigError(
            f"{shown}: {exc}",
            field=f"{field}.{named}",
            hint=f"or drop the long ones: {field}.max_chars (characters) with "
            f"{field}.drop_invalid: true",
        ) from None


def _check_judge(config: RunConfig | OnlineRunConfig) -> None:
    """The evaluation judge answers (one GET of its model list) and its reference answers can be
    read, before the run writes anything: a judge that is down would otherwise fail the first
    judge stage, after theta_0 was trained and evaluated."""
    judged = config.evaluate.judge
    if judged is None:
        return
    from eva_runtime.llm_client import LLMClient
    from tasks.backends.judge.reference import for_heldout

    client = LLMClient(judged.llm)  # its key's variable is checked before (check_api_keys)
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

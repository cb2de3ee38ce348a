"""Online solvers on TRL: RLOO (default) or GRPO, fed by eva's buffer, for S steps at a time.

The trainer is TRL's own (``RLOOTrainer`` / ``GRPOTrainer``); eva supplies two things:

* the prompt stream, a ``datasets.IterableDataset`` over ``OnlinePromptSource.records()``: one
  mini-batch of ``prompts_per_step`` prompts per optimizer step, each sampled
  ``num_generations`` times (``per_device_train_batch_size = prompts x generations``,
  ``steps_per_generation = 1``, no shuffle buffer, so the trainer sees prompts in draw order);
* the reward function, which scores completions with any pointwise reward backend (the world's
  verifier, a ``package.module:function``, a sequence-classifier reward model) and hands the
  (prompt x sample) rewards back to the source, which updates the buffer and evolves.

A segment starts from a checkpoint, trains ``steps`` optimizer steps at a constant learning rate
and saves the checkpoint; the optimizer starts afresh each segment (Adam's moments are
re-estimated within a few steps; carrying them would tie a checkpoint to one trainer).

Checked with TRL 1.16 on CPU (tests/test_online.py): all three trainers (RLOO, GRPO and the
experimental online DPO) accept a callable reward and an ``IterableDataset`` with
``max_steps``; reward functions get the dataset's extra columns (``prompt_id``) as keyword
arguments and ``trainer_state``.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from collections.abc import Sequence
from typing import Any, Literal

import datasets
import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator
from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback

from tasks.backends.devices import Device
from tasks.backends.online_source import OnlinePromptSource
from tasks.backends.protocols import Progress, RewardModel, no_progress
from tasks.backends.train.trl_common import ProgressCallback, numeric_row, quiet


class OnlineSolverConfig(BaseModel):
    """An online policy-gradient solver. Where the eva paper gives no online value, TRL's
    defaults apply (KL beta 0.05, clipping 0.2); the world's recipe sets its own."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["rloo", "grpo", "online_dpo"] = Field(
        default="rloo",
        description="rloo (the paper's online solver), grpo, or online_dpo (OAIF: the better of "
        "two samples is chosen; TRL's experimental OnlineDPOTrainer, num_generations is 2).",
    )
    learning_rate: float = Field(default=1e-6, gt=0, description="Constant learning rate.")
    beta: float = Field(default=0.05, ge=0, description="KL penalty towards the start policy.")
    num_generations: int = Field(
        default=4, ge=2, description="Samples per prompt (RLOO's k): the leave-one-out group."
    )
    prompts_per_step: int = Field(default=16, ge=1, description="Prompts per optimizer step.")
    temperature: float = Field(default=0.7, gt=0, description="Sampling temperature.")
    top_p: float = Field(default=0.9, gt=0, le=1, description="Nucleus sampling mass.")
    max_completion_length: int = Field(default=512, ge=1, description="Response token cap.")
    optim: str = Field(default="adamw_torch", description="transformers optimizer name.")
    bf16: bool = Field(default=False, description="bf16 autocast (GPU).")
    gradient_checkpointing: bool = Field(default=False, description="Recompute activations.")
    use_vllm: bool = Field(
        default=False,
        description="Generate with TRL's vLLM integration (GPU; vllm_mode server needs `trl "
        "vllm-serve` running, see the recipe).",
    )
    vllm_mode: Literal["server", "colocate"] = Field(default="server")
    device: Device = Field(default="auto", description='"auto" = cuda when available, else "cpu".')

    @model_validator(mode="after")
    def _dpo_needs_beta(self) -> OnlineSolverConfig:
        if self.kind == "online_dpo" and self.beta == 0:
            raise ValueError("online_dpo needs beta > 0 (its loss is constant at beta 0)")
        return self


def _trainer_args(config: OnlineSolverConfig, common: dict[str, Any]) -> Any:
    """The TRL config object for ``config.kind`` (online DPO names some knobs differently)."""
    sampling: dict[str, Any] = dict(
        temperature=config.temperature, top_p=config.top_p, beta=config.beta
    )
    vllm: dict[str, Any] = dict(use_vllm=config.use_vllm, vllm_mode=config.vllm_mode)
    if config.kind == "online_dpo":
        from trl.experimental.online_dpo import OnlineDPOConfig

        return OnlineDPOConfig(
            **common,
            **sampling,
            **vllm,
            per_device_train_batch_size=config.prompts_per_step,
            max_new_tokens=config.max_completion_length,
            # accelerate dispatches an IterableDataset's batches as tensors by default; the
            # prompts are text, so each process reads its own (RLOO/GRPO do this themselves).
            accelerator_config={"dispatch_batches": False},
        )
    from trl import GRPOConfig, RLOOConfig

    return (GRPOConfig if config.kind == "grpo" else RLOOConfig)(
        **common,
        **sampling,
        **vllm,
        per_device_train_batch_size=config.prompts_per_step * config.num_generations,
        steps_per_generation=1,
        num_generations=config.num_generations,
        max_completion_length=config.max_completion_length,
        shuffle_dataset=False,
    )


def _trainer_class(kind: str) -> type:
    if kind == "online_dpo":
        from trl.experimental.online_dpo import OnlineDPOTrainer

        return OnlineDPOTrainer
    from trl import GRPOTrainer, RLOOTrainer

    return GRPOTrainer if kind == "grpo" else RLOOTrainer


class _RewardHook:
    """TRL reward function: scores with the backend, hands rewards back to the source.

    RLOO and GRPO pass each prompt's k completions together (p0 p0 p0 p1 p1 p1 ...); online
    DPO passes the batch twice (p0 p1 ... p0 p1 ...), its two completions half a batch apart.
    """

    def __init__(self, reward: RewardModel, source: OnlinePromptSource, k: int, halves: bool):
        self.reward, self.source, self.k, self.halves = reward, source, k, halves
        self.__name__ = "eva_reward"  # TRL names logged metrics after the function

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], **_: Any) -> list[float]:
        n = len(prompts)
        if n % self.k:
            raise RuntimeError(f"{n} completions is not a multiple of k={self.k}")
        if self.halves:
            order = [j * (n // 2) + i for i in range(n // 2) for j in range(2)]
        else:
            order = list(range(n))
        grouped = [order[i : i + self.k] for i in range(0, n, self.k)]
        group_prompts = [prompts[g[0]] for g in grouped]
        responses = [[completions[j] for j in g] for g in grouped]
        scores = np.array(self.reward.score(group_prompts, responses), dtype=np.float64)
        self.source.feedback(group_prompts, scores)
        flat = np.empty(n)
        for g, row in zip(grouped, scores, strict=True):
            flat[g] = row
        return [float(x) for x in flat]


def train_segment(
    config: OnlineSolverConfig,
    policy_dir: str,
    source: OnlinePromptSource,
    reward: RewardModel,
    steps: int,
    output_dir: str,
    seed: int,
    progress: Progress = no_progress,
) -> list[dict[str, float]]:
    """Train ``steps`` optimizer steps from ``policy_dir`` on prompts from ``source``; save the
    model and tokenizer to ``output_dir``; return the trainer's logged rows."""
    use_cpu = config.device == "cpu" or (config.device == "auto" and not torch.cuda.is_available())
    k = 2 if config.kind == "online_dpo" else config.num_generations
    dataset = datasets.IterableDataset.from_generator(
        _stream, gen_kwargs={"source": _Handle(source)}
    )
    parent = os.path.dirname(os.path.abspath(output_dir))  # the stage's own scratch
    os.makedirs(parent, exist_ok=True)
    scratch = tempfile.TemporaryDirectory(prefix=f"eva-{config.kind}-", dir=parent)
    with scratch as trainer_dir, quiet():
        common: dict[str, Any] = dict(
            output_dir=trainer_dir,
            gradient_accumulation_steps=1,
            max_steps=steps,
            learning_rate=config.learning_rate,
            lr_scheduler_type="constant",
            warmup_steps=0,
            optim=config.optim,
            bf16=config.bf16,
            gradient_checkpointing=config.gradient_checkpointing,
            use_cpu=use_cpu,
            seed=seed,
            data_seed=seed,
            logging_steps=1,
            report_to=[],
            save_strategy="no",
            disable_tqdm=True,
        )
        args = _trainer_args(config, common)
        model = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(policy_dir)
        callbacks: list[TrainerCallback] = [ProgressCallback(progress)]
        trainer = _trainer_class(config.kind)(
            model=model,
            reward_funcs=_RewardHook(reward, source, k, halves=config.kind == "online_dpo"),
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=callbacks,
        )
        trainer.remove_callback(PrinterCallback)
        trainer.train()
        rows = [numeric_row(e) for e in trainer.state.log_history if "loss" in e]
        if any(math.isnan(r["loss"]) for r in rows):
            raise FloatingPointError(f"{config.kind} loss became NaN (policy {policy_dir})")
        trainer.save_model(output_dir)
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(output_dir, "training_args.bin"))
    progress(1.0)
    return rows


class _Handle:
    """Wraps the source so ``datasets`` fingerprints a stable object, never pickles the buffer."""

    def __init__(self, source: OnlinePromptSource):
        self.source = source

    def __reduce__(self) -> tuple[Any, ...]:
        return (str, ("eva-online-source",))


def _stream(source: _Handle) -> Any:
    yield from source.source.records()

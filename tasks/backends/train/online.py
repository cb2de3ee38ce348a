"""Online solvers on TRL: RLOO (default), GRPO or the experimental online DPO, driven by eva's
online loop (``tasks.online_loop``) for S optimizer steps at a time.

The trainer is TRL's own; the loop plugs in at three points, none of which depends on the order
in which TRL calls things or on how it lays out a batch:

* the prompt stream, a ``datasets.IterableDataset`` over ``feed.prompts()``: one mini-batch of
  ``prompts_per_step`` prompts per optimizer step, each sampled ``num_generations`` times
  (``per_device_train_batch_size = prompts x generations``, ``steps_per_generation = 1``, no
  shuffle buffer, so the trainer sees prompts in draw order);
* the reward function, which only scores: it hands each completion, with the ``row`` column of
  the prompt it answers, to ``feed.score`` (any pointwise reward backend behind it);
* a ``TrainerCallback`` whose ``on_step_end`` calls ``feed.step_end()``: the step has trained,
  so the loop updates the buffer with the rewards recorded for the batch and evolves.

Checked in TRL 1.16's source and on CPU (tests/test_online.py): RLOO and GRPO pass every dataset
column but ``prompt`` to a reward function as a keyword argument, one value per completion
(``_calculate_rewards``); online DPO passes them from its collated batch, doubled like its
``2 * prompts`` (``training_step``). All three accept an ``IterableDataset`` with ``max_steps``
(RLOO/GRPO repeat each prompt in the stream, ``repeat_iterable_dataset``). transformers calls
``on_step_end`` after the step's optimizer update and before the next step's batch is fetched;
accelerate's data loader has fetched one batch ahead by then.

A segment starts from a checkpoint, trains ``steps`` optimizer steps at a constant learning rate
and saves the checkpoint; the optimizer starts afresh each segment (Adam's moments are
re-estimated within a few steps; carrying them would tie a checkpoint to one trainer).
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar, Literal, Protocol

import datasets
import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PrinterCallback,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)

from tasks.backends.devices import Device
from tasks.backends.protocols import Progress, no_progress
from tasks.backends.train.trl_common import ProgressCallback, numeric_row, quiet


class OnlineFeed(Protocol):
    """What drives the trainer (``tasks.online_loop.OnlineLoop``)."""

    def prompts(self) -> Iterator[dict[str, Any]]:
        """The prompt stream: records with ``prompt`` and ``row`` (and ``prompt_id``)."""
        ...

    def score(
        self, rows: Sequence[str], prompts: Sequence[str], completions: Sequence[str]
    ) -> list[float]:
        """One reward per completion; ``rows[j]`` names the streamed prompt it answers."""
        ...

    def step_end(self) -> None:
        """An optimizer step has finished."""
        ...


class OnlineSolverConfig(BaseModel):
    """An online policy-gradient solver. Where the eva paper gives no online value, TRL's
    defaults apply (KL beta 0.05, clipping 0.2); the world's recipe sets its own."""

    version: ClassVar[int] = 1  # bump when a change can change what it computes
    libraries: ClassVar[tuple[str, ...]] = (
        "torch",
        "transformers",
        "trl",
        "accelerate",
        "datasets",
    )

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


class _Reward:
    """TRL reward function: scores each completion through the feed, by its prompt's row."""

    def __init__(self, feed: OnlineFeed):
        self.feed = feed
        self.__name__ = "eva_reward"  # TRL names logged metrics after the function

    def __call__(
        self, prompts: Sequence[str], completions: Sequence[str], row: Sequence[str], **_: Any
    ) -> list[float]:
        return self.feed.score(row, prompts, completions)


class _StepEnd(TrainerCallback):
    """Tells the feed that an optimizer step has finished."""

    def __init__(self, feed: OnlineFeed):
        self.feed = feed

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self.feed.step_end()


def train_segment(
    config: OnlineSolverConfig,
    policy_dir: str,
    feed: OnlineFeed,
    steps: int,
    output_dir: str,
    seed: int,
    progress: Progress = no_progress,
) -> list[dict[str, float]]:
    """Train ``steps`` optimizer steps from ``policy_dir`` on prompts from ``feed``; save the
    model and tokenizer to ``output_dir``; return the trainer's logged rows."""
    use_cpu = config.device == "cpu" or (config.device == "auto" and not torch.cuda.is_available())
    dataset = datasets.IterableDataset.from_generator(_stream, gen_kwargs={"feed": _Handle(feed)})
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
        callbacks: list[TrainerCallback] = [_StepEnd(feed), ProgressCallback(progress)]
        trainer = _trainer_class(config.kind)(
            model=model,
            reward_funcs=_Reward(feed),
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
    """Wraps the feed so ``datasets`` fingerprints a stable object, never pickles the buffer."""

    def __init__(self, feed: OnlineFeed):
        self.feed = feed

    def __reduce__(self) -> tuple[Any, ...]:
        return (str, ("eva-online-source",))


def _stream(feed: _Handle) -> Any:
    yield from feed.feed.prompts()

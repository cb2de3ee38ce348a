"""The solver: TRL preference trainers on the pairs a round produced, DPO by default.

Here: what every TRL objective shares (``TRLSolverConfig``, ``build_trainer``, ``TRLSolver``) and
DPO. ``trl_solvers`` adds SimPO, ORPO, SPPO and DPO + NLL as configs naming a trainer and loss.
Defaults are the eva paper's appendix A. For the DPO family the starting checkpoint doubles as
the frozen reference (TRL reloads it from ``policy_dir`` when ``ref_model`` is None), as in eva.

Pitfalls met with TRL 1.16 / transformers 5.23:
- TRL defaults ``bf16=True`` and gradient checkpointing on: both are always passed explicitly.
- transformers 5 dropped ``warmup_ratio``: a float in [0, 1) given as ``warmup_steps`` is a ratio.
- transformers 5 loads a checkpoint's saved dtype; weights load in float32 because AdamW updates
  at lr 5e-7 vanish in bf16 weights (``bf16=True`` still autocasts the matmuls).
- TRL 1.16 has no prompt-length cap; ``max_prompt_length`` is applied here, keeping the end.
- The training arguments are built *before* the model: under ``accelerate launch`` with ZeRO-3
  that order lets ``from_pretrained`` load the weights already partitioned.
- ``Trainer.save_model`` gathers ZeRO-3 shards; the pickled ``training_args.bin`` it adds (full
  of temporary paths) is removed so checkpoints stay byte-reproducible.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import tempfile
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import datasets
import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedTokenizerBase,
    PrinterCallback,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)
from trl import DPOConfig, DPOTrainer

from tasks.backends.devices import Device
from tasks.backends.protocols import Progress, no_progress
from tasks.backends.train.trl_common import ProgressCallback, numeric_row, quiet

_log = logging.getLogger(__name__)


EFFECTIVE_BATCH_HELP = (
    "Pairs per optimizer step over all processes, as the paper counts its batch size; "
    "per-device batch x gradient accumulation x processes must equal it."
)
MAX_LENGTH_HELP = (
    "Cap on prompt + response tokens (the response is cut). Lowered to the model's position "
    "table when that is smaller."
)
MAX_PROMPT_HELP = (
    "Cap on prompt tokens, applied before TRL sees the text by keeping the end of the prompt; "
    "also held below max_length so a response token always remains."
)


class TRLSolverConfig(BaseModel):
    """Fields every TRL preference solver shares; subclasses name the objective and its knobs."""

    version: ClassVar[int] = 1  # bump when a change can change what it computes
    libraries: ClassVar[tuple[str, ...]] = ("torch", "transformers", "trl", "accelerate")

    model_config = ConfigDict(extra="forbid")

    kind: str  # a Literal in every concrete subclass: the SolverBackend discriminator
    learning_rate: float = Field(default=5e-7, gt=0, description="Peak learning rate.")
    lr_scheduler_type: str = Field(default="cosine", description="transformers scheduler name.")
    num_train_epochs: float = Field(default=2, gt=0, description="Passes over the pairs.")
    warmup_ratio: float = Field(
        default=0.1, ge=0, lt=1, description="Fraction of the steps spent warming up linearly."
    )
    effective_batch_size: int = Field(default=8, ge=1, description=EFFECTIVE_BATCH_HELP)
    per_device_train_batch_size: int | None = Field(
        default=None,
        ge=1,
        description="Pairs per micro-batch on one device; None = effective batch / processes "
        "(no accumulation). Lower it to fit memory: accumulation makes up the rest.",
    )
    max_length: int | None = Field(default=2048, ge=2, description=MAX_LENGTH_HELP)
    max_prompt_length: int | None = Field(default=1024, ge=1, description=MAX_PROMPT_HELP)
    optim: str = Field(default="adamw_torch", description="transformers optimizer name.")
    logging_steps: int = Field(default=1, ge=1, description="Optimizer steps between log rows.")
    bf16: bool = Field(default=False, description="bf16 autocast (needs a GPU or recent CPU).")
    gradient_checkpointing: bool = Field(
        default=False,
        description="Recompute activations to save memory; TRL turns it on by default, which "
        "only costs time on small models.",
    )
    device: Device = Field(default="auto", description='"auto" = cuda when available, else "cpu".')

    @field_validator("optim")
    @classmethod
    def _known_optimizer(cls, value: str) -> str:
        from transformers.training_args import OptimizerNames

        names = [o.value for o in OptimizerNames]
        if value not in names:
            raise ValueError(f"unknown optimizer {value!r}; e.g. adamw_torch, rmsprop, sgd")
        return value

    @field_validator("lr_scheduler_type")
    @classmethod
    def _known_scheduler(cls, value: str) -> str:
        from transformers.trainer_utils import SchedulerType

        names = [t.value for t in SchedulerType]
        if value not in names:
            raise ValueError(f"unknown scheduler {value!r}; one of {', '.join(names)}")
        return value

    def trainer_args(self, common: dict[str, Any]) -> TrainingArguments:
        """TRL's config object for this objective, from the shared ``common`` arguments."""
        raise NotImplementedError

    def trainer_class(self) -> type[Trainer]:
        raise NotImplementedError  # a class per objective, so tests can call it directly

    def load(self) -> TRLSolver:
        """A solver with this configuration (models are loaded per ``train`` call)."""
        return TRLSolver(self)


def batch_layout(effective: int, per_device: int | None, processes: int) -> tuple[int, int]:
    """(per-device batch, gradient accumulation steps) that make ``effective`` pairs per
    optimizer step on ``processes`` devices; a ValueError naming the numbers when none does."""
    if processes < 1:
        raise ValueError(f"processes must be >= 1 (got {processes})")
    if per_device is None:
        if effective % processes:
            raise ValueError(
                f"effective_batch_size {effective} cannot be split evenly over {processes} "
                "processes"
            )
        per_device = effective // processes
    if effective % (per_device * processes):
        raise ValueError(
            f"effective_batch_size {effective} is not a multiple of per-device batch "
            f"{per_device} x {processes} processes"
        )
    return per_device, effective // (per_device * processes)


def dpo_args(
    common: dict[str, Any], beta: float, loss_type: list[str], loss_weights: list[float] | None
) -> DPOConfig:
    """DPOConfig for any DPO-family loss (DPO, SPPO hard, DPO + NLL)."""
    return DPOConfig(**common, beta=beta, loss_type=loss_type, loss_weights=loss_weights)


class DPOSolverConfig(TRLSolverConfig):
    """Direct Preference Optimization with TRL; defaults follow eva's appendix A."""

    kind: Literal["dpo"] = "dpo"
    beta: float = Field(default=0.05, gt=0, description="KL strength towards the reference.")
    loss_type: list[str] = Field(
        default=["sigmoid"],
        min_length=1,
        description='TRL loss names: "sigmoid" is DPO, "ipo", "sppo_hard", ["sigmoid", "sft"] '
        "is DPO + NLL (RPO).",
    )
    loss_weights: list[float] | None = Field(
        default=None, description="One weight per loss_type entry; None = all 1.0."
    )

    @model_validator(mode="after")
    def _weights_match_losses(self) -> DPOSolverConfig:
        n_weights, n_losses = len(self.loss_weights or self.loss_type), len(self.loss_type)
        if n_weights != n_losses:
            raise ValueError(
                f"loss_weights has {n_weights} entries for {n_losses} loss_type entries"
            )
        return self

    def trainer_args(self, common: dict[str, Any]) -> TrainingArguments:
        weights = None if self.loss_weights is None else list(self.loss_weights)
        return dpo_args(common, self.beta, list(self.loss_type), weights)

    def trainer_class(self) -> type[Trainer]:
        return DPOTrainer


def truncate_prompts(
    tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str], max_tokens: int
) -> tuple[list[str], int]:
    """Keep the last ``max_tokens`` tokens of every prompt (the instruction usually ends a
    long prompt) as text, so every TRL trainer tokenizes it the same way; returns the prompts
    and how many were cut. Cutting at a token's character offset keeps the text exact."""
    out, cut = list(prompts), 0
    for i, prompt in enumerate(prompts):
        enc = tokenizer(prompt, add_special_tokens=False, return_offsets_mapping=True)
        offsets = enc["offset_mapping"]
        if len(offsets) > max_tokens:
            out[i] = prompt[offsets[len(offsets) - max_tokens][0] :]
            cut += 1
    return out, cut


def build_trainer(
    config: TRLSolverConfig,
    policy_dir: str,
    prompts: Sequence[str],
    chosen: Sequence[str],
    rejected: Sequence[str],
    trainer_dir: str,
    seed: int,
    callbacks: Sequence[TrainerCallback] = (),
) -> Trainer:
    """A ready-to-``train()`` TRL trainer; split out of ``TRLSolver.train`` so tests can inspect
    the exact trainer (its batches, its ``compute_loss``) that training uses."""
    if not (len(prompts) == len(chosen) == len(rejected)):
        raise ValueError(
            f"prompts/chosen/rejected lengths differ: {len(prompts)}/{len(chosen)}/{len(rejected)}"
        )
    if not prompts:
        raise ValueError("no preference pairs to train on")
    # accelerate launch sets WORLD_SIZE in every process it starts; in-process training is one.
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    per_device, accumulation = batch_layout(
        config.effective_batch_size, config.per_device_train_batch_size, processes
    )
    use_cpu = config.device == "cpu" or (config.device == "auto" and not torch.cuda.is_available())
    max_length = config.max_length
    positions = getattr(AutoConfig.from_pretrained(policy_dir), "max_position_embeddings", None)
    if positions is not None and (max_length is None or max_length > positions):
        max_length = positions  # absolute-position models index out of range past their table
    tokenizer = AutoTokenizer.from_pretrained(policy_dir)
    prompt_cap = config.max_prompt_length
    if max_length is not None:
        prompt_cap = min(prompt_cap or max_length, max_length - 1)
    if prompt_cap is not None:
        prompts, cut = truncate_prompts(tokenizer, prompts, prompt_cap)
        if cut:
            _log.warning("kept the last %d tokens of %d long prompts", prompt_cap, cut)
    common: dict[str, Any] = dict(
        output_dir=trainer_dir,
        learning_rate=config.learning_rate,
        lr_scheduler_type=config.lr_scheduler_type,
        num_train_epochs=config.num_train_epochs,
        warmup_steps=config.warmup_ratio,  # a float in [0, 1) is a ratio in transformers 5
        per_device_train_batch_size=per_device,
        gradient_accumulation_steps=accumulation,
        max_length=max_length,
        optim=config.optim,
        logging_steps=config.logging_steps,
        bf16=config.bf16,  # TRL defaults this to True: always pass it
        activation_checkpointing=config.gradient_checkpointing,  # the v5 name of the flag
        use_cpu=use_cpu,
        seed=seed,
        data_seed=seed,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
    )
    dataset = datasets.Dataset.from_dict(
        {"prompt": list(prompts), "chosen": list(chosen), "rejected": list(rejected)}
    )
    with quiet():
        args = config.trainer_args(common)  # before the model: ZeRO-3 partitioned loading
        model = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32)
        trainer = config.trainer_class()(
            model=model,
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=list(callbacks),
        )
    # disable_tqdm swaps the progress bar for PrinterCallback, which prints every log dict.
    trainer.remove_callback(PrinterCallback)
    return trainer


class TRLSolver:
    """Satisfies the ``Solver`` protocol for any ``TRLSolverConfig``."""

    def __init__(self, config: TRLSolverConfig):
        self.config = config

    def train(
        self,
        policy_dir: str,
        prompts: Sequence[str],
        chosen: Sequence[str],
        rejected: Sequence[str],
        output_dir: str,
        seed: int,
        progress: Progress = no_progress,
    ) -> list[dict[str, float]]:
        """Train from ``policy_dir``, save model + tokenizer to ``output_dir``, and return the
        trainer's log rows that carry a loss (``step``, ``loss``, ``rewards/*``, ...)."""
        # The trainer's own output_dir only receives what save_strategy="no" still writes (nothing
        # today); a temporary directory keeps the caller's working directory clean regardless.
        parent = os.path.dirname(os.path.abspath(output_dir))  # the stage's own scratch
        os.makedirs(parent, exist_ok=True)
        with tempfile.TemporaryDirectory(
            prefix=f"eva-{self.config.kind}-", dir=parent
        ) as trainer_dir:
            callbacks = [ProgressCallback(progress)]
            trainer = build_trainer(
                self.config, policy_dir, prompts, chosen, rejected, trainer_dir, seed, callbacks
            )
            with quiet():
                trainer.train()
            rows = [numeric_row(e) for e in trainer.state.log_history if "loss" in e]
            if any(math.isnan(r["loss"]) for r in rows):
                # Checked before saving so a diverged policy never becomes the next round's start.
                raise FloatingPointError(
                    f"{self.config.kind} loss became NaN (policy {policy_dir})"
                )
            trainer.save_model(output_dir)  # gathers ZeRO-3 shards; only rank 0 writes
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(output_dir, "training_args.bin"))
        progress(1.0)
        return rows

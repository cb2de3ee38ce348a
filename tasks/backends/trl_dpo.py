"""The solver: TRL's ``DPOTrainer`` on the preference pairs a round produced.

Defaults are the DPO settings of the eva paper's appendix A. The starting checkpoint doubles as
the frozen reference (TRL reloads it from ``policy_dir`` when ``ref_model`` is None), which is
what eva does: every round's reference is the policy the round started from.
"""

from __future__ import annotations

import contextlib
import math
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from typing import Any, Literal

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
from trl import DPOConfig, DPOTrainer

from tasks.backends.protocols import Progress, no_progress


class DPOSolverConfig(BaseModel):
    """Direct Preference Optimization with TRL; defaults follow eva's appendix A."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["dpo"] = "dpo"
    beta: float = Field(default=0.05, gt=0, description="KL strength towards the reference.")
    learning_rate: float = Field(default=5e-7, gt=0, description="Peak AdamW learning rate.")
    lr_scheduler_type: str = Field(
        default="cosine", description="transformers scheduler name (cosine, linear, constant...)."
    )
    num_train_epochs: float = Field(default=2, gt=0, description="Passes over the pairs.")
    warmup_ratio: float = Field(
        default=0.1, ge=0, lt=1, description="Fraction of the steps spent warming up linearly."
    )
    per_device_train_batch_size: int = Field(
        default=8, ge=1, description="Pairs per device per micro-batch."
    )
    gradient_accumulation_steps: int = Field(
        default=1,
        ge=1,
        description="Micro-batches per optimizer step; effective batch = this x "
        "per_device_train_batch_size x devices (8 in the paper).",
    )
    max_length: int | None = Field(
        default=2048,
        ge=2,
        description="Cap on prompt + response tokens (truncated from the end; TRL 1.16 has no "
        "separate prompt cap). Lowered to the model's position table when that is smaller.",
    )
    loss_type: list[str] = Field(
        default=["sigmoid"],
        min_length=1,
        description='TRL loss names: "sigmoid" is DPO, "ipo", "sppo_hard", ["sigmoid", "sft"] '
        "is DPO + NLL (RPO).",
    )
    loss_weights: list[float] | None = Field(
        default=None, description="One weight per loss_type entry; None = all 1.0."
    )
    logging_steps: int = Field(default=1, ge=1, description="Optimizer steps between log rows.")
    bf16: bool = Field(default=False, description="bf16 autocast (needs a GPU or recent CPU).")
    gradient_checkpointing: bool = Field(
        default=False,
        description="Recompute activations to save memory; TRL turns it on by default, which "
        "only costs time on small models.",
    )
    device: str = Field(default="auto", description='"auto" = cuda when available, else "cpu".')

    @model_validator(mode="after")
    def _weights_match_losses(self) -> DPOSolverConfig:
        if self.loss_weights is not None and len(self.loss_weights) != len(self.loss_type):
            raise ValueError(
                f"loss_weights has {len(self.loss_weights)} entries for "
                f"{len(self.loss_type)} loss_type entries"
            )
        return self

    def load(self) -> DPOSolver:
        """A solver with this configuration (models are loaded per ``train`` call)."""
        return DPOSolver(self)


class _ProgressCallback(TrainerCallback):
    def __init__(self, progress: Progress):
        self.progress = progress

    def on_step_end(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        if state.max_steps:
            self.progress(min(1.0, state.global_step / state.max_steps))


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Hide datasets' per-map progress bars and transformers' v6 deprecation notices (raised
    from inside TRL, nothing we can change) for the duration, then restore the caller's state."""
    was_enabled = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", ".*will be removed in v6", FutureWarning)
            yield
    finally:
        if was_enabled:
            datasets.enable_progress_bars()


def build_dpo_trainer(
    config: DPOSolverConfig,
    policy_dir: str,
    prompts: Sequence[str],
    chosen: Sequence[str],
    rejected: Sequence[str],
    trainer_dir: str,
    seed: int,
    callbacks: Sequence[TrainerCallback] = (),
) -> DPOTrainer:
    """A ready-to-``train()`` DPOTrainer; split out of ``DPOSolver.train`` so tests can inspect
    the exact trainer (its batches, its ``compute_loss``) that training uses."""
    if not (len(prompts) == len(chosen) == len(rejected)):
        raise ValueError(
            f"prompts/chosen/rejected lengths differ: {len(prompts)}/{len(chosen)}/{len(rejected)}"
        )
    if not prompts:
        raise ValueError("no preference pairs to train on")
    use_cpu = config.device == "cpu" or (config.device == "auto" and not torch.cuda.is_available())
    # float32 master weights: transformers 5 loads the checkpoint's dtype, and AdamW updates at
    # lr 5e-7 vanish in bf16 weights. bf16=True still gives bf16 autocast for the matmuls.
    model = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(policy_dir)
    max_length = config.max_length
    positions = getattr(model.config, "max_position_embeddings", None)
    if positions is not None and (max_length is None or max_length > positions):
        max_length = positions  # absolute-position models index out of range past their table
    args = DPOConfig(
        output_dir=trainer_dir,
        beta=config.beta,
        learning_rate=config.learning_rate,
        lr_scheduler_type=config.lr_scheduler_type,
        num_train_epochs=config.num_train_epochs,
        # transformers 5 dropped `warmup_ratio`: a float in [0, 1) for warmup_steps is a ratio.
        warmup_steps=config.warmup_ratio,
        per_device_train_batch_size=config.per_device_train_batch_size,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        max_length=max_length,
        loss_type=list(config.loss_type),
        loss_weights=None if config.loss_weights is None else list(config.loss_weights),
        logging_steps=config.logging_steps,
        bf16=config.bf16,  # TRL defaults this to True: always pass it
        # transformers 5.23 renamed it; the old name still works but warns.
        activation_checkpointing=config.gradient_checkpointing,
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
    with _quiet():
        trainer = DPOTrainer(
            model=model,
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=list(callbacks),
        )
    # disable_tqdm swaps the progress bar for PrinterCallback, which prints every log dict.
    trainer.remove_callback(PrinterCallback)
    return trainer


def _numeric_row(entry: dict[str, Any]) -> dict[str, float]:
    row = {"step": float(entry["step"])}
    for key, value in entry.items():
        if isinstance(value, int | float) and not isinstance(value, bool) and key != "step":
            row[key] = float(value)
    return row


class DPOSolver:
    """Satisfies the ``Solver`` protocol."""

    def __init__(self, config: DPOSolverConfig):
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
        """Run DPO from ``policy_dir``, save model + tokenizer to ``output_dir``, and return
        the trainer's log rows that carry a loss (``step``, ``loss``, ``rewards/*``, ...)."""
        # The trainer's own output_dir only receives what save_strategy="no" still writes (nothing
        # today); a temporary directory keeps the caller's working directory clean regardless.
        with tempfile.TemporaryDirectory(prefix="eva-dpo-") as trainer_dir:
            trainer = build_dpo_trainer(
                self.config,
                policy_dir,
                prompts,
                chosen,
                rejected,
                trainer_dir,
                seed,
                callbacks=[_ProgressCallback(progress)],
            )
            with _quiet():
                trainer.train()
            rows = [_numeric_row(e) for e in trainer.state.log_history if "loss" in e]
            if any(math.isnan(r["loss"]) for r in rows):
                # Checked before saving so a diverged policy never becomes the next round's start.
                raise FloatingPointError(f"DPO loss became NaN (policy {policy_dir})")
            # Any: Trainer types these as Optional unions; both are set by build_dpo_trainer.
            model: Any = trainer.accelerator.unwrap_model(trainer.model)
            tokenizer: Any = trainer.processing_class
            model.save_pretrained(output_dir)
            tokenizer.save_pretrained(output_dir)
        progress(1.0)
        return rows

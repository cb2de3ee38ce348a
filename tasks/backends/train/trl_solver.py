"""The TRL trainer every preference solver runs: built from a ``TRLSolverConfig``, trained on the
pairs of a round, saved as the next checkpoint (``tasks.backends.train.dpo`` explains the
pitfalls each argument here avoids)."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import tempfile
from collections.abc import Sequence
from typing import Any

import datasets
import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedTokenizerBase,
    PrinterCallback,
    Trainer,
    TrainerCallback,
)
from transformers.integrations import TensorBoardCallback

from eva_runtime.errors import ConfigError
from tasks.backends.chat_template import SOLVER
from tasks.backends.protocols import Progress, no_progress
from tasks.backends.train.chat import assistant_turn, template_overhead, use_template, user_turn
from tasks.backends.train.dpo import TRLSolverConfig, batch_layout
from tasks.backends.train.trl_common import ProgressCallback, numeric_row, quiet

_log = logging.getLogger(__name__)


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
    logging_dir: str | None = None,
) -> Trainer:
    """A ready-to-``train()`` TRL trainer; split out of ``TRLSolver.train`` so tests can inspect
    the exact trainer (its batches, its ``compute_loss``) that training uses. With a chat
    template its rows are conversational, so TRL templates them as generation did
    (``tasks.backends.train.chat``). Its ``report_to`` trackers get the logged metrics;
    TensorBoard's event files go to ``logging_dir``."""
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
    chat = use_template(tokenizer, config.chat_template, policy_dir)
    prompt_cap = config.max_prompt_length
    if max_length is not None:
        prompt_cap = min(prompt_cap or max_length, max_length - 1)
    if prompt_cap is not None:
        # The template's own tokens come out of the cap, so the templated prompt fits it.
        overhead = template_overhead(tokenizer) if chat else 0
        text_cap = prompt_cap - overhead
        if text_cap < 1:
            raise ConfigError(
                f"a prompt cap of {prompt_cap} tokens (max_prompt_length, held below max_length) "
                f"leaves no room for a prompt in the {overhead} tokens of {policy_dir}'s chat "
                "template",
                field=f"{SOLVER}.max_prompt_length",
                hint=f"raise it above {overhead} tokens (and max_length, if that holds it lower)",
            )
        prompts, cut = truncate_prompts(tokenizer, prompts, text_cap)
        if cut:
            _log.warning("kept the last %d tokens of %d long prompts", text_cap, cut)
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
        report_to=list(config.report_to),  # transformers' "none" is []: never its "all"
        save_strategy="no",
        disable_tqdm=True,
    )
    dataset = datasets.Dataset.from_dict(
        {
            "prompt": [user_turn(p) for p in prompts] if chat else list(prompts),
            "chosen": [assistant_turn(c) for c in chosen] if chat else list(chosen),
            "rejected": [assistant_turn(r) for r in rejected] if chat else list(rejected),
        }
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
    if logging_dir is not None:
        log_tensorboard_to(trainer, logging_dir)
    return trainer


def log_tensorboard_to(trainer: Trainer, logging_dir: str) -> None:
    """Point the trainer's TensorBoard callback at ``logging_dir``. transformers 5 dropped the
    ``logging_dir`` argument: the callback's default is a folder under the trainer's
    ``output_dir``, a temporary one here, removed with the event files in it."""
    for callback in trainer.callback_handler.callbacks:
        if isinstance(callback, TensorBoardCallback):
            # Its own setting (read from TENSORBOARD_LOGGING_DIR when built), set per trainer
            # rather than through the process's environment, which other stages share.
            callback.logging_dir = logging_dir


class TRLSolver:
    """Satisfies the ``Solver`` protocol for any ``TRLSolverConfig``."""

    def __init__(self, config: TRLSolverConfig, logging_dir: str | None = None):
        self.config, self.logging_dir = config, logging_dir

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
                self.config, policy_dir, prompts, chosen, rejected, trainer_dir, seed, callbacks,
                self.logging_dir,
            )  # fmt: skip
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

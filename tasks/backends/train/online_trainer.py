"""The TRL side of an online segment: trainer arguments and class by ``kind``, and the reward
function that only scores; the dataset and the callback are the TRL bridge's
(``eva_adapters.trl``; ``tasks.backends.train.online`` explains the seams)."""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback

from tasks.backends.generate.chat_codec import end_ids
from tasks.backends.protocols import Progress, no_progress
from tasks.backends.train.chat import message_text, use_template, user_turn
from tasks.backends.train.online import OnlineFeed, OnlineSolverConfig
from tasks.backends.train.trl_common import ProgressCallback, numeric_row, quiet
from tasks.backends.train.trl_solver import log_tensorboard_to


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
            # auto is eva's own (cut_ranks_last); TRL's option is its one constant.
            missing_eos_penalty=None
            if config.missing_eos_penalty == "auto"
            else config.missing_eos_penalty,
            # The prompts are text, never dispatched as tensors: each process reads its own
            # batch (RLOO/GRPO set this themselves). The bridge runs in one process anyway.
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
        mask_truncated_completions=config.mask_truncated_completions,
        shuffle_dataset=False,
    )


def _trainer_class(config: OnlineSolverConfig) -> type:
    if config.kind == "online_dpo":
        from trl.experimental.online_dpo import OnlineDPOTrainer

        return OnlineDPOTrainer
    from trl import GRPOTrainer, RLOOTrainer

    return GRPOTrainer if config.kind == "grpo" else RLOOTrainer


def ended(ids: Sequence[int], stop_ids: frozenset[int]) -> bool:
    """Whether a completion's ids (as TRL hands them to a reward function, padded) end its
    turn: its last id is an end of turn or the pad id."""
    return bool(ids) and ids[-1] in stop_ids


class _Reward:
    """TRL reward function: scores each completion through the feed, by its prompt's row. With
    a chat template TRL passes prompts and completions as messages: the feed gets their text,
    and whether each completion finished, read off its token ids as TRL's own truncation test
    reads them (``mask_truncated_completions``, ``completions/clipped_ratio``): its last id is
    an end-of-turn or the pad id (``stop_ids``)."""

    def __init__(self, feed: OnlineFeed, stop_ids: Sequence[int]):
        self.feed = feed
        self.stop_ids = frozenset(stop_ids)
        self.__name__ = "eva_reward"  # TRL names logged metrics after the function

    def __call__(
        self,
        prompts: Sequence[Any],
        completions: Sequence[Any],
        eva_row: Sequence[str],
        completion_ids: Sequence[Sequence[int]],
        **columns: Any,
    ) -> list[float]:
        texts = [message_text(p) for p in prompts]
        finished = [ended(ids, self.stop_ids) for ids in completion_ids]
        # The record columns the bridge streams beside the prompt (those the reward reads).
        read = {c: columns[c] for c in self.feed.feed.columns if c in columns}
        completed = [message_text(c) for c in completions]
        return self.feed.score(eva_row, texts, completed, finished, **read)


def cut_ranks_last(reward: Callable[..., list[Any]], stop_ids: Sequence[int]) -> Callable[..., Any]:
    """``reward`` as online DPO compares it under ``missing_eos_penalty: auto``: each cut
    completion's value lowered by the batch's reward span plus one, so that every finished
    completion ranks above every cut one, and of a pair with one of each the finished one is
    chosen, whatever the reward's range (TRL's ``missing_eos_penalty`` is one constant, which
    decides only above the range). ``reward`` (the recording) sees and keeps the true values:
    the creator's informativeness is never shifted. Unscored values (None) stay unscored."""
    stops = frozenset(stop_ids)

    def compared(completion_ids: Sequence[Sequence[int]], **kw: Any) -> list[Any]:
        values = reward(completion_ids=completion_ids, **kw)
        scored = [v for v in values if v is not None and math.isfinite(v)]
        drop = (max(scored) - min(scored) + 1.0) if scored else 0.0
        cut = [not ended(ids, stops) for ids in completion_ids]
        return [v - drop if c and v is not None else v for v, c in zip(values, cut, strict=True)]

    compared.__name__ = getattr(reward, "__name__", "reward")
    return compared


def stop_ids(tokenizer: Any, model: Any) -> list[int]:
    """The ids a finished completion ends with, as TRL's trainers tell them: the ids that end
    a turn (those generation stops at: ``end_ids``), and the pad id (what a batch of
    completions is padded with after its end)."""
    pad = tokenizer.pad_token_id
    return [
        *end_ids(tokenizer, model.generation_config, model.config),
        *([pad] if pad is not None else []),
    ]


def build_online_trainer(
    config: OnlineSolverConfig,
    policy_dir: str,
    feed: OnlineFeed,
    steps: int,
    trainer_dir: str,
    seed: int,
    callbacks: Sequence[TrainerCallback] = (),
    logging_dir: str | None = None,
) -> Any:
    """A ready-to-``train()`` TRL trainer for ``steps`` optimizer steps on prompts from
    ``feed``; split out of ``train_segment`` so tests can inspect the exact trainer (what it
    feeds its model) that a segment trains. With a chat template the bridge streams each prompt
    as a user turn, which TRL templates as generation does (``tasks.backends.train.chat``)."""
    use_cpu = config.device == "cpu" or (config.device == "auto" and not torch.cuda.is_available())
    tokenizer = AutoTokenizer.from_pretrained(policy_dir)
    bridge = feed.feed
    if use_template(tokenizer, config.chat_template, policy_dir):
        bridge.prompt = lambda record: user_turn(record["prompt"])
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
        report_to=list(config.report_to),  # transformers' "none" is []: never its "all"
        save_strategy="no",
        disable_tqdm=True,
    )
    args = _trainer_args(config, common)
    model = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32)
    stops = stop_ids(tokenizer, model)
    reward = bridge.recording(_Reward(feed, stops))
    if config.kind == "online_dpo" and config.missing_eos_penalty == "auto":
        reward = cut_ranks_last(reward, stops)
    trainer = _trainer_class(config)(
        model=model,
        reward_funcs=reward,
        args=args,
        # One epoch longer than the segment: the loader fetches a batch ahead at every step,
        # the last included (an epoch's end would fetch none), and that batch is carried over.
        train_dataset=bridge.dataset(slots=(steps + 1) * config.prompts_per_step),
        processing_class=tokenizer,
        callbacks=[bridge.callback(), *callbacks],
    )
    trainer.remove_callback(PrinterCallback)
    if logging_dir is not None:
        log_tensorboard_to(trainer, logging_dir)
    return trainer


class TRLOnlineSolver:
    """``OnlineSolverConfig`` loaded: TRL's trainer for its ``kind``, as an ``OnlineSolver``."""

    def __init__(self, config: OnlineSolverConfig, logging_dir: str | None = None):
        self.config = config
        self.logging_dir = logging_dir

    def train_segment(
        self,
        policy_dir: str,
        feed: OnlineFeed,
        steps: int,
        output_dir: str,
        seed: int,
        progress: Progress = no_progress,
    ) -> list[dict[str, float]]:
        return train_segment(
            self.config, policy_dir, feed, steps, output_dir, seed, progress, self.logging_dir
        )


def train_segment(
    config: OnlineSolverConfig,
    policy_dir: str,
    feed: OnlineFeed,
    steps: int,
    output_dir: str,
    seed: int,
    progress: Progress = no_progress,
    logging_dir: str | None = None,
) -> list[dict[str, float]]:
    """Train ``steps`` optimizer steps from ``policy_dir`` on prompts from ``feed``; save the
    model and tokenizer to ``output_dir``; return the trainer's logged rows."""
    parent = os.path.dirname(os.path.abspath(output_dir))  # the stage's own scratch
    os.makedirs(parent, exist_ok=True)
    scratch = tempfile.TemporaryDirectory(prefix=f"eva-{config.kind}-", dir=parent)
    with scratch as trainer_dir, quiet():
        callbacks = [ProgressCallback(progress)]
        trainer = build_online_trainer(
            config, policy_dir, feed, steps, trainer_dir, seed, callbacks, logging_dir
        )
        trainer.train()
        rows = [numeric_row(e) for e in trainer.state.log_history if "loss" in e]
        if any(math.isnan(r["loss"]) for r in rows):
            raise FloatingPointError(f"{config.kind} loss became NaN (policy {policy_dir})")
        trainer.save_model(output_dir)
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(output_dir, "training_args.bin"))
    progress(1.0)
    return rows


def segment_stats(
    kind: str, rows: Sequence[dict[str, float]], rewards: Sequence[Sequence[float]]
) -> dict[str, float]:
    """What a segment's policy-gradient update did, as a person reads it: the KL to the start
    policy and the entropy (TRL's, averaged over the segment's steps), and the learning signal
    of the prompts trained on (``rewards``: each prompt's samples' rewards), the spread of
    RLOO's leave-one-out advantages r_i - mean_{j != i} r_j (0: no gradient at all; the stage
    counts the prompts whose samples all tied as ``tied_prompts``).

    RLOO's and GRPO's logged ``loss`` is not among them: with one update per generation the
    importance ratio is 1 and each prompt's advantages sum to 0, so the surrogate loss is 0 by
    construction (its gradient is not) and read as "-0" every segment. Online DPO's loss is a
    real DPO loss and is kept (its mean over the segment)."""
    stats: dict[str, float] = {}
    for key in ("kl", "entropy", *(("loss",) if kind == "online_dpo" else ())):
        values = [r[key] for r in rows if key in r and math.isfinite(r[key])]
        if values:
            stats[key] = round(sum(values) / len(values), 4)
    advantages: list[float] = []
    for samples in rewards:
        r = [x for x in samples if math.isfinite(x)]
        if len(r) < 2:
            continue  # no baseline to compare with
        total = sum(r)
        advantages += [x - (total - x) / (len(r) - 1) for x in r]
    if advantages:
        mean = sum(advantages) / len(advantages)
        spread = math.sqrt(sum((a - mean) ** 2 for a in advantages) / len(advantages))
        stats["advantage_std"] = round(spread, 4)
    return stats

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
accelerate's data loader has fetched one batch ahead by then. With a chat template the stream's
prompts are user turns, which all three template as the generation backends do, and the reward
function gets the messages' text back (``tasks.backends.train.chat``).

A segment starts from a checkpoint, trains ``steps`` optimizer steps at a constant learning rate
and saves the checkpoint; the optimizer starts afresh each segment (Adam's moments are
re-estimated within a few steps; carrying them would tie a checkpoint to one trainer).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, ClassVar, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tasks.backends.devices import Device
from tasks.backends.train.chat import CHAT_TEMPLATE_HELP, ChatTemplate


class OnlineFeed(Protocol):
    """What drives the trainer (``tasks.online_loop.OnlineLoop``)."""

    def prompts(self) -> Iterator[dict[str, Any]]:
        """The prompt stream: records with ``prompt`` and ``row`` (and ``prompt_id``)."""
        ...

    def score(
        self,
        rows: Sequence[str],
        prompts: Sequence[str],
        completions: Sequence[str],
        finished: Sequence[bool] | None = None,
    ) -> list[float]:
        """One reward per completion; ``rows[j]`` names the streamed prompt it answers;
        ``finished[j]``: whether the policy ended it before ``max_completion_length``."""
        ...

    def step_end(self) -> None:
        """An optimizer step has finished."""
        ...


class OnlineSolverConfig(BaseModel):
    """An online policy-gradient solver. Where the eva paper gives no online value, TRL's
    defaults apply (KL beta 0.05, clipping 0.2); the world's recipe sets its own."""

    # 2: prompts are sampled and trained in the policy's chat template when it has one.
    # 3: a completion cut at max_completion_length trains nothing (mask_truncated_completions).
    version: ClassVar[int] = 3  # bump when a change can change what it computes
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
    mask_truncated_completions: bool = Field(
        default=True,
        description="rloo/grpo: TRL's option of that name: a completion cut at "
        "max_completion_length is scored (its reward still counts in its group's baseline) but "
        "trains nothing, so the policy is never taught to stop where the cap cut it. false: "
        "TRL's default, every completion trains.",
    )
    missing_eos_penalty: float | None = Field(
        default=None,
        ge=0,
        description="online_dpo: TRL's option of that name, subtracted from the reward of a "
        "completion cut at max_completion_length before the better of the two is chosen; above "
        "the reward's range, a finished completion always wins over a cut one. None: off (a "
        "cut completion can be chosen; TRL's online DPO has no option to mask it).",
    )
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
    chat_template: ChatTemplate = Field(default="auto", description=CHAT_TEMPLATE_HELP)

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, data: Any) -> Any:
        if isinstance(data, dict) and {"dynamic_sampling", "max_resample_rounds"} & set(data):
            raise ValueError(
                "online.solver.dynamic_sampling was replaced by online.buffer.skip_tied, a filter "
                "before rollout (TRL has no public seam to replace a group after it)"
            )
        return data

    @model_validator(mode="after")
    def _dpo_needs_beta(self) -> OnlineSolverConfig:
        if self.kind == "online_dpo" and self.beta == 0:
            raise ValueError("online_dpo needs beta > 0 (its loss is constant at beta 0)")
        return self

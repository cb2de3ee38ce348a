"""Online solvers: RLOO (default), GRPO or the experimental online DPO on TRL, or a solver of
yours (``kind: python``), driven by eva's online loop (``tasks.online_loop``) for S optimizer
steps at a time.

The trainer is TRL's own; it meets the creator through the TRL bridge,
``eva_adapters.trl.CreatorFeed`` (``feed.feed``), at three points, none of which depends on the
order in which TRL calls things or on how it lays out a batch:

* the prompt dataset, ``feed.feed.dataset()``: one mini-batch of ``prompts_per_step`` prompts
  per optimizer step, drawn when the trainer's loader fetches it, each sampled
  ``num_generations`` times (``per_device_train_batch_size = prompts x generations``,
  ``steps_per_generation = 1``);
* the reward function, which only scores: ``feed.feed.recording`` around a function that hands
  each completion, with the ``eva_row`` of the prompt it answers, to ``feed.score`` (any
  pointwise reward backend behind it);
* the bridge's callback, whose ``on_step_end`` hands the trained batch's groups to the creator,
  which updates the buffer and evolves.

Checked in TRL 1.16's source and on CPU (tests/test_online.py): RLOO and GRPO pass every dataset
column but ``prompt`` to a reward function as a keyword argument, one value per completion
(``_calculate_rewards``); online DPO passes them from its collated batch, doubled like its
``2 * prompts`` (``training_step``). transformers calls ``on_step_end`` after the step's
optimizer update and before the next step's batch is fetched; accelerate's data loader has
fetched one batch ahead by then. With a chat template the dataset's prompts are user turns,
which all three template as the generation backends do, and the reward function gets the
messages' text back (``tasks.backends.train.chat``).

A solver of yours is ``{kind: python, factory: "package.module:Name", options: {...},
prompts_per_step: 16}``: ``factory(**options)`` builds an object with ``train_segment`` (the
``OnlineSolver`` protocol below), which trains on the same three seams.

A segment starts from a checkpoint, trains ``steps`` optimizer steps at a constant learning rate
and saves the checkpoint; the optimizer starts afresh each segment (Adam's moments are
re-estimated within a few steps; carrying them would tie a checkpoint to one trainer).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, ClassVar, Literal, Protocol, runtime_checkable

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    field_validator,
    model_validator,
)

from tasks.backends.devices import Device
from tasks.backends.protocols import Progress, no_progress
from tasks.backends.python import PythonComponent
from tasks.backends.train.chat import CHAT_TEMPLATE_HELP, ChatTemplate
from tasks.backends.train.dpo import REPORT_TO_HELP, known_reporters


class OnlineFeed(Protocol):
    """What an online solver trains on (``tasks.online_loop.OnlineLoop``)."""

    @property
    def feed(self) -> Any:
        """The TRL bridge (``eva_adapters.trl.CreatorFeed``): ``dataset()``, ``recording()``,
        ``callback()``."""
        ...

    def score(
        self,
        rows: Sequence[str],
        prompts: Sequence[str],
        completions: Sequence[str],
        finished: Sequence[bool] | None = None,
        **columns: Sequence[Any],
    ) -> list[float]:
        """One reward per completion; ``rows[j]`` names the streamed prompt it answers (its
        ``eva_row``); ``finished[j]``: whether the policy ended it before its length cap;
        ``columns``: prompt columns the reward reads (as streamed), one value per completion."""
        ...


@runtime_checkable
class OnlineSolver(Protocol):
    """Trains a segment of online RL on prompts from the creator: TRL's (``OnlineSolverConfig``)
    or yours (``kind: python``)."""

    def train_segment(
        self,
        policy_dir: str,
        feed: OnlineFeed,
        steps: int,
        output_dir: str,
        seed: int,
        progress: Progress = no_progress,
    ) -> list[dict[str, float]]:
        """Train ``steps`` optimizer steps from ``policy_dir`` on ``feed`` (its dataset, reward
        and callback), save the model and tokenizer to ``output_dir``, and return the logged
        rows (each with a ``loss`` where one was logged)."""
        ...


class OnlineSolverConfig(BaseModel):
    """An online policy-gradient solver. Where the eva paper gives no online value, TRL's
    defaults apply (KL beta 0.05, clipping 0.2); the world's recipe sets its own."""

    # 2: prompts are sampled and trained in the policy's chat template when it has one.
    # 3: a completion cut at max_completion_length trains nothing (mask_truncated_completions).
    # 4: online_dpo chooses a finished completion over a cut one (missing_eos_penalty auto).
    version: ClassVar[int] = 4  # bump when a change can change what it computes
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
    missing_eos_penalty: NonNegativeFloat | Literal["auto"] | None = Field(
        default="auto",
        description="online_dpo: how a completion cut at max_completion_length is ranked "
        "against the other of its pair before the better is chosen. auto: its reward, as TRL "
        "compares it, is lowered by the batch's reward span plus one, so a finished completion "
        "is always chosen over a cut one, whatever the reward's range (eva records the reward "
        "unchanged). A number: TRL's option of that name, that constant subtracted (it decides "
        "only above the reward's range). None: off, the rewards alone decide. A pair whose two "
        "completions are both cut still trains (TRL's online DPO has no option to mask it); it "
        "trains on the generated tokens with no end of turn appended, so it does not teach the "
        "policy to stop where the cap cut it.",
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
    # Added after runs were keyed: left out of the key while empty (tasks/keys.py).
    report_to: list[str] = Field(
        default_factory=list,
        description=REPORT_TO_HELP.replace("iter_t/train_logs", "iter_t/online_logs"),
        json_schema_extra={"key": "unless default"},
    )

    @field_validator("report_to")
    @classmethod
    def _known_reporters(cls, value: list[str]) -> list[str]:
        return known_reporters(value)

    def load(self, logging_dir: str | None = None) -> OnlineSolver:
        """TRL's trainer for ``kind``; TensorBoard's event files (``report_to``) go to
        ``logging_dir``."""
        from tasks.backends.train.online_trainer import TRLOnlineSolver

        return TRLOnlineSolver(self, logging_dir)

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


class PythonOnlineSolver(PythonComponent):
    """An online solver of yours: ``factory(**options)`` builds an ``OnlineSolver``."""

    prompts_per_step: int = Field(
        default=16,
        ge=1,
        description="Prompts a step of your solver trains on: the segment's steps and the "
        "budget are counted in them.",
    )

    def load(self, logging_dir: str | None = None) -> OnlineSolver:
        """``factory(**options)``; what it logs, and where, is its own (``logging_dir`` is for
        TRL's solvers)."""
        solver: OnlineSolver = super().load()
        return solver


# ``online.solver``: TRL's (kind rloo, grpo or online_dpo) or yours (kind python); a solver
# section without a kind is TRL's RLOO, the paper's (``tasks.online.OnlineConfig`` fills it in).
OnlineSolverBackend = Annotated[
    OnlineSolverConfig | PythonOnlineSolver, Field(discriminator="kind")
]

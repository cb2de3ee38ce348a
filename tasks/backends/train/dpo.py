"""The solver: TRL preference trainers on the pairs a round produced, DPO by default.

Here: the config every TRL objective shares (``TRLSolverConfig``) and DPO's; ``objectives`` adds
SimPO, ORPO, SPPO and DPO + NLL as configs naming a trainer and loss, and ``trl_solver`` builds
and runs the trainer (``build_trainer``, ``TRLSolver``), imported when a solver loads, so reading
a config does not import TRL.
Defaults are the eva paper's appendix A. For the DPO family the starting checkpoint doubles as
the frozen reference (TRL reloads it from ``policy_dir`` when ``ref_model`` is None), as in eva.

Pitfalls met with TRL 1.16 / transformers 5.23:
- TRL defaults ``bf16=True`` and gradient checkpointing on: both are always passed explicitly.
- transformers 5 dropped ``warmup_ratio``: a float in [0, 1) given as ``warmup_steps`` is a ratio.
- transformers 5 loads a checkpoint's saved dtype; weights load in float32 because AdamW updates
  at lr 5e-7 vanish in bf16 weights (``bf16=True`` still autocasts the matmuls).
- TRL 1.16 has no prompt-length cap; ``max_prompt_length`` is applied here, keeping the end
  (of the prompt's own text, the chat template's tokens counted against the cap).
- Given plain text, TRL trains on it untemplated even for a chat model; with a chat template
  the rows are conversational so TRL templates them as generation does (``chat``).
- The training arguments are built *before* the model: under ``accelerate launch`` with ZeRO-3
  that order lets ``from_pretrained`` load the weights already partitioned.
- transformers 5 dropped ``logging_dir``: TensorBoard's callback would write under the trainer's
  temporary ``output_dir``, so it is pointed at the run's folder once the trainer is built.
- ``Trainer.save_model`` gathers ZeRO-3 shards; the pickled ``training_args.bin`` it adds (full
  of temporary paths) is removed so checkpoints stay byte-reproducible.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tasks.backends.devices import Device
from tasks.backends.train.chat import CHAT_TEMPLATE_HELP, ChatTemplate

if TYPE_CHECKING:
    from transformers import Trainer, TrainingArguments
    from trl import DPOConfig

    from tasks.backends.train.trl_solver import TRLSolver

# Names the repo's solvers use, known valid: validating them needs no import of transformers.
COMMON_OPTIMIZERS = frozenset({"adamw_torch", "rmsprop", "sgd"})
COMMON_SCHEDULERS = frozenset({"cosine", "linear", "constant"})

EFFECTIVE_BATCH_HELP = (
    "Pairs per optimizer step over all processes, as the paper counts its batch size; "
    "per-device batch x gradient accumulation x processes must equal it."
)
MAX_LENGTH_HELP = (
    "Cap on prompt + response tokens (the response is cut). Lowered to the model's position "
    "table when that is smaller."
)
REPORT_TO_HELP = (
    "Trackers that receive TRL's training metrics (loss, rewards, learning rate per logged "
    'step), by transformers\' names: "tensorboard" (event files in the run, '
    '{run}/iter_t/train_logs), "wandb", "mlflow", ...; [] (the default) reports to none. Each '
    "needs its package installed; wandb and mlflow read their project or server from their "
    "own environment variables. Naming one retrains: a cached step logged nothing."
)
# transformers' reporter names (report_to): the package to install and the modules it provides
# (any one will do), checked at the edge (flows/inputs.py). Names not listed here are checked
# against transformers' own list when a config is read.
REPORTERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "tensorboard": ("tensorboard", ("tensorboard", "tensorboardX")),  # transformers takes either
    "wandb": ("wandb", ("wandb",)),
    "mlflow": ("mlflow", ("mlflow",)),
    "comet_ml": ("comet-ml", ("comet_ml",)),
    "clearml": ("clearml", ("clearml",)),
    "dvclive": ("dvclive", ("dvclive",)),
    "swanlab": ("swanlab", ("swanlab",)),
    "trackio": ("trackio", ("trackio",)),
    "neptune": ("neptune", ("neptune",)),
    "codecarbon": ("codecarbon", ("codecarbon",)),
    "azure_ml": ("azureml-core", ("azureml",)),
    "dagshub": ("dagshub", ("dagshub",)),
    "flyte": ("flytekit", ("flytekit",)),
}


def known_reporters(value: list[str]) -> list[str]:
    """``report_to`` checked: transformers' tracker names (``[]``: none); the online solver's
    too."""
    for name in value:
        if name in ("all", "none"):
            raise ValueError(
                f"{name!r}: name each tracker (e.g. [tensorboard]); [] reports to none"
            )
        if name in REPORTERS or name == "kubeflow":
            continue
        from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

        if name not in INTEGRATION_TO_CALLBACK:
            known = ", ".join(sorted(INTEGRATION_TO_CALLBACK))
            raise ValueError(f"unknown tracker {name!r}; one of {known}")
    return value


MAX_PROMPT_HELP = (
    "Cap on prompt tokens (the chat template's own included), applied before TRL sees the text "
    "by keeping the end of the prompt; also held below max_length so a response token always "
    "remains."
)


class TRLSolverConfig(BaseModel):
    """Fields every TRL preference solver shares; subclasses name the objective and its knobs."""

    # 2: prompts are trained in the policy's chat template when it has one (chat_template).
    version: ClassVar[int] = 2  # bump when a change can change what it computes
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
    chat_template: ChatTemplate = Field(default="auto", description=CHAT_TEMPLATE_HELP)
    # Added after runs were keyed: left out of the key while empty (tasks/keys.py).
    report_to: list[str] = Field(
        default_factory=list,
        description=REPORT_TO_HELP,
        json_schema_extra={"key": "unless default"},
    )

    @field_validator("optim")
    @classmethod
    def _known_optimizer(cls, value: str) -> str:
        if value in COMMON_OPTIMIZERS:  # checking them would import transformers (seconds)
            return value
        from transformers.training_args import OptimizerNames

        names = [o.value for o in OptimizerNames]
        if value not in names:
            raise ValueError(f"unknown optimizer {value!r}; e.g. adamw_torch, rmsprop, sgd")
        return value

    @field_validator("lr_scheduler_type")
    @classmethod
    def _known_scheduler(cls, value: str) -> str:
        if value in COMMON_SCHEDULERS:
            return value
        from transformers.trainer_utils import SchedulerType

        names = [t.value for t in SchedulerType]
        if value not in names:
            raise ValueError(f"unknown scheduler {value!r}; one of {', '.join(names)}")
        return value

    @field_validator("report_to")
    @classmethod
    def _known_reporters(cls, value: list[str]) -> list[str]:
        return known_reporters(value)

    def trainer_args(self, common: dict[str, Any]) -> TrainingArguments:
        """TRL's config object for this objective, from the shared ``common`` arguments."""
        raise NotImplementedError

    def trainer_class(self) -> type[Trainer]:
        raise NotImplementedError  # a class per objective, so tests can call it directly

    def load(self, logging_dir: str | None = None) -> TRLSolver:
        """A solver with this configuration (models are loaded per ``train`` call); a tracker
        of ``report_to`` that writes files (TensorBoard) writes them to ``logging_dir``."""
        from tasks.backends.train.trl_solver import TRLSolver

        return TRLSolver(self, logging_dir)


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
    from trl import DPOConfig

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
        from trl import DPOTrainer

        return DPOTrainer

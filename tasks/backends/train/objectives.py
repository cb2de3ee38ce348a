"""The other solver objectives of the eva paper (appendix A), on the shared TRL plumbing.

Each is a config with its own ``kind``; training, saving and prompt truncation are
``trl_solver.TRLSolver`` / ``build_trainer``. What each objective computes in TRL 1.16 (read from
its source, and checked against hand-computed losses in tests/test_backend_solvers.py):

- SimPO (``CPOTrainer``, ``loss_type="simpo"``, ``cpo_alpha=0``): with a = mean log-prob of the
  response tokens (+ eos), ``-logsigmoid(beta * (a_chosen - a_rejected) - gamma)``. TRL's
  ``simpo_gamma`` is gamma itself (it subtracts gamma / beta inside the beta product). No
  reference model.
- ORPO (``ORPOTrainer``; TRL's ``beta`` is the paper's lambda): with a as above,
  ``log_odds = (a_c - a_r) - (log(1 - e^a_c) - log(1 - e^a_r))`` and the loss
  ``NLL_chosen - lambda * mean(logsigmoid(log_odds))``. TRL's NLL is the token-mean cross-entropy
  over the chosen sequences' *prompt and response* tokens (the paper's is response-only).
- SPPO (DPO ``loss_type=["sppo_hard"]``): with r = summed log-ratio to the reference,
  ``(r_chosen - 1/(2 beta))^2 + (r_rejected + 1/(2 beta))^2`` (hard 1/0 win probabilities).
- DPO + NLL (DPO ``["sigmoid", "sft"]``, weights ``[1, alpha]``): TRL's ``sft`` term is the mean
  negative log-prob over *all chosen response tokens of the batch*, i.e. length-normalised per
  token, not per-sequence-then-averaged; the two agree when chosen responses have equal length.

CPO and ORPO (unlike DPO) prepend the tokenizer's BOS token to the prompt when it has one; the
demo world's character tokenizer uses ``<eos>`` as BOS, so those two train with it in front.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from tasks.backends.train.dpo import (
    EFFECTIVE_BATCH_HELP,
    MAX_LENGTH_HELP,
    MAX_PROMPT_HELP,
    DPOSolverConfig,
    TRLSolverConfig,
    dpo_args,
)

if TYPE_CHECKING:  # TRL is imported when a trainer is built, not when a config is read
    from transformers import Trainer, TrainingArguments


class SimPOSolverConfig(TRLSolverConfig):
    """SimPO (reference-free, length-normalised margin loss) via TRL's experimental CPOTrainer."""

    kind: Literal["simpo"] = "simpo"
    learning_rate: float = Field(default=8e-7, gt=0, description="Peak learning rate.")
    num_train_epochs: float = Field(default=1, gt=0, description="Passes over the pairs.")
    effective_batch_size: int = Field(default=32, ge=1, description=EFFECTIVE_BATCH_HELP)
    beta: float = Field(default=10.0, gt=0, description="Scale of the average log-prob reward.")
    gamma: float = Field(
        default=5.0, ge=0, description="Target reward margin (TRL simpo_gamma; gamma/beta = 0.5)."
    )

    def trainer_args(self, common: dict[str, Any]) -> TrainingArguments:
        from trl.experimental.cpo import CPOConfig  # experimental: imported only when used

        return CPOConfig(
            **common,
            loss_type="simpo",
            beta=self.beta,
            simpo_gamma=self.gamma,
            cpo_alpha=0.0,  # pure SimPO: CPO's behaviour-cloning term off
            remove_unused_columns=False,  # CPO's collator needs the raw columns (it warns else)
        )

    def trainer_class(self) -> type[Trainer]:
        from trl.experimental.cpo import CPOTrainer

        return CPOTrainer


class ORPOSolverConfig(TRLSolverConfig):
    """ORPO (NLL + odds-ratio term, no reference model) via TRL's experimental ORPOTrainer."""

    kind: Literal["orpo"] = "orpo"
    num_train_epochs: float = Field(default=1, gt=0, description="Passes over the pairs.")
    lambda_or: float = Field(
        default=0.5, gt=0, description="Weight lambda of the odds-ratio term (TRL's ORPO beta)."
    )

    def trainer_args(self, common: dict[str, Any]) -> TrainingArguments:
        from trl.experimental.orpo import ORPOConfig

        return ORPOConfig(**common, beta=self.lambda_or, remove_unused_columns=False)

    def trainer_class(self) -> type[Trainer]:
        from trl.experimental.orpo import ORPOTrainer

        return ORPOTrainer


class _DPOVariant(TRLSolverConfig):
    """A DPO loss variant: fixed TRL loss names, built as the equivalent DPOSolverConfig."""

    beta: float = Field(default=0.05, gt=0, description="KL strength towards the reference.")

    def to_dpo(self) -> DPOSolverConfig:
        raise NotImplementedError

    def trainer_args(self, common: dict[str, Any]) -> TrainingArguments:
        dpo = self.to_dpo()
        return dpo_args(common, dpo.beta, list(dpo.loss_type), dpo.loss_weights)

    def trainer_class(self) -> type[Trainer]:
        from trl import DPOTrainer

        return DPOTrainer

    def _shared(self) -> dict[str, Any]:
        """The schedule/batch/length/device fields, passed through unchanged."""
        return self.model_dump(include=set(TRLSolverConfig.model_fields) - {"kind"})


class SPPOSolverConfig(_DPOVariant):
    """SPPO with hard win probabilities: TRL DPO ``loss_type=["sppo_hard"]``."""

    kind: Literal["sppo"] = "sppo"
    beta: float = Field(default=0.001, gt=0, description="SPPO's eta^-1 scale: targets +-1/(2b).")
    optim: str = Field(default="rmsprop", description="transformers optimizer name.")
    lr_scheduler_type: str = Field(default="linear", description="transformers scheduler name.")
    num_train_epochs: float = Field(default=6, gt=0, description="Passes over the pairs.")
    max_length: int | None = Field(default=1024, ge=2, description=MAX_LENGTH_HELP)
    max_prompt_length: int | None = Field(default=512, ge=1, description=MAX_PROMPT_HELP)

    def to_dpo(self) -> DPOSolverConfig:
        return DPOSolverConfig(**self._shared(), beta=self.beta, loss_type=["sppo_hard"])


class DPONLLSolverConfig(_DPOVariant):
    """DPO plus a token-normalised NLL on the chosen response (RPO): ``["sigmoid", "sft"]``."""

    kind: Literal["dpo_nll"] = "dpo_nll"
    nll_alpha: float = Field(default=1.0, ge=0, description="Weight of the NLL term.")

    def to_dpo(self) -> DPOSolverConfig:
        return DPOSolverConfig(
            **self._shared(),
            beta=self.beta,
            loss_type=["sigmoid", "sft"],
            loss_weights=[1.0, self.nll_alpha],
        )

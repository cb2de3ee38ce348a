"""Every reward backend behind one config field, chosen by its ``kind``.

A stage's config declares ``reward: RewardBackend``; YAML/CLI input such as
``{"kind": "sequence_classifier", "model": "Skywork/..."}`` validates into the matching class,
and an unknown ``kind`` fails with one line listing the valid ones. Each class's ``load()``
returns an object satisfying ``tasks.backends.protocols.RewardModel``.

==================== ================================================================
kind                 backend
==================== ================================================================
sequence_classifier  a transformers reward model (Skywork-style logit, ArmoRM `score`);
                     the paper's ArmoRM is the default
vllm_pooling         a classifier reward model on vLLM's pooling runner (GPU, optional)
callable             any Python function ``package.module:function``
pairwise             an LLM judge's pairwise preferences -> mean win probability
python               an object of yours, ``factory(**options)`` (the built-in world's
                     verifier: ``eva_world.components:WorldVerifier``)
verifiable           a verifier ``f(response, answer)`` against known answers from a file,
                     and a majority vote of the N responses where none is known (needs
                     the N together: pointwise only with ``unknown: drop``)
instruction_following IFEval's checkers on the instructions each prompt carries
                     (``instruction_id_list``, ``kwargs``; the if-verifiable package)
==================== ================================================================
"""

from __future__ import annotations

from typing import Annotated, Any, TypeAlias

from pydantic import AfterValidator, Field

from tasks.backends.python import PythonComponent
from tasks.backends.reward.function import CallableReward
from tasks.backends.reward.instruction_following import InstructionFollowingReward
from tasks.backends.reward.pairwise import PairwiseReward
from tasks.backends.reward.sequence_classifier import SequenceClassifierReward
from tasks.backends.reward.verifiable import VerifiableReward
from tasks.backends.reward.vllm_pooling import VLLMPoolingReward


def _pointwise(reward: Any) -> Any:
    """Refuses a reward that labels unknown prompts by a majority vote where one response per
    prompt is scored: a vote of one response always agrees with itself."""
    if isinstance(reward, VerifiableReward) and reward.unknown != "drop":
        raise ValueError(
            "a verifiable reward scores one response per prompt only against known answers: "
            "set unknown: drop (a majority vote of one response always agrees with itself)"
        )
    return reward


# Scores one response on its own: what a stage with a single response per prompt can use. A
# verifiable reward is one only when it scores known answers alone (``unknown: drop``).
PointwiseRewardBackend: TypeAlias = Annotated[
    SequenceClassifierReward
    | VLLMPoolingReward
    | CallableReward
    | PythonComponent
    | VerifiableReward
    | InstructionFollowingReward,
    Field(discriminator="kind"),
    AfterValidator(_pointwise),
]

RewardBackend: TypeAlias = Annotated[
    SequenceClassifierReward
    | VLLMPoolingReward
    | CallableReward
    | PythonComponent
    | PairwiseReward
    | VerifiableReward
    | InstructionFollowingReward,
    Field(discriminator="kind"),
]

__all__ = [
    "CallableReward",
    "InstructionFollowingReward",
    "PairwiseReward",
    "PointwiseRewardBackend",
    "PythonComponent",
    "RewardBackend",
    "SequenceClassifierReward",
    "VLLMPoolingReward",
    "VerifiableReward",
]

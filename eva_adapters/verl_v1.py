"""eva's creator on verl 0.9's V1 trainer (the default, ``trainer.use_v1=true``): a replay
buffer that reports every sampled training batch's finished groups to eva.

    trainer.v1.sampler.custom_sampler.path=pkg://eva_adapters.verl_v1
    trainer.v1.sampler.custom_sampler.name=EvaReplayBuffer   # EvaReplayBufferAsync: async modes

together with ``eva_adapters.verl.EvaDataset`` as ``data.custom_cls``, which draws the prompts.
What this relies on, in the verl 0.9.1 wheel:

* ``PPOTrainer._build_replay_buffer`` (``verl/trainer/ppo/v1/trainer_base.py`` l. 139-185)
  loads the class named by ``trainer.v1.sampler.custom_sampler`` and builds it with the base
  arguments only (a custom sampler owns its filtering: ``algorithm.filter_groups`` is not
  applied). ``_step_once`` (l. 562-579) takes each training batch from its ``sample(...)``.
* ``ReplayBuffer.sample`` (``v1/replay_buffer.py`` l. 422; the async one's l. 593) returns a
  ``KVBatchMeta`` of the finished groups it picked; their trajectories sit in TransferQueue
  under keys ``{uid}_{session}_{index}`` with the dataset row's fields (``extra_info`` among
  them) and, when the reward is streamed (a rule-based reward, or a reward model with
  ``reward.reward_model.enable_resource_pool=True``), ``rm_scores`` (``v1/agent_loop_tq.py``
  l. 150-227). A colocated reward model scores only after ``sample`` (``_step_once``
  l. 577-579): eva cannot observe then, and says so.
* The dataset and the replay buffer live in the trainer's process, so the buffer finds the
  dataset with ``eva_adapters.verl.training_source()``.
"""

from __future__ import annotations

from typing import Any

import transfer_queue as tq
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync

from eva_adapters.verl import group_rollouts, training_source


class _Observing:
    """``sample`` as verl's, then eva observes the training groups it returns."""

    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> Any:
        batch, metrics = super().sample(global_steps, partition_id, batch_size)  # type: ignore[misc]
        if partition_id == "train":
            metrics.update(observe_batch(batch))
        return batch, metrics


class EvaReplayBuffer(_Observing, ReplayBuffer):
    """verl's synchronous replay buffer; eva observes each sampled batch."""


class EvaReplayBufferAsync(_Observing, ReplayBufferAsync):
    """verl's replay buffer of the async trainer modes; eva observes each sampled batch."""


def observe_batch(batch: Any) -> dict[str, float]:
    """Feed the groups of a sampled ``KVBatchMeta`` to the eva dataset's creator; returns
    metrics for verl's logger. One trajectory per rollout session: every output of a
    multi-turn session carries the session's final reward."""
    first: dict[tuple[str, str], str] = {}
    for key, tag in zip(batch.keys, batch.tags, strict=True):
        if tag.get("is_padding", False):
            continue
        uid, session, _ = key.rsplit("_", 2)
        first.setdefault((uid, session), key)
    if not first:
        return {}
    keys = list(first.values())
    try:
        data = tq.kv_batch_get(
            keys=keys, partition_id=batch.partition_id, select_fields=["rm_scores", "extra_info"]
        )
        scores = [float(s.sum().item()) for s in data["rm_scores"]]
    except (KeyError, ValueError, RuntimeError) as exc:
        raise RuntimeError(
            "eva reads each group's rewards when verl samples it, so the reward must be "
            "streamed: a rule-based reward, or reward.reward_model.enable_resource_pool=True"
        ) from exc
    extras = [getattr(e, "data", e) for e in data["extra_info"]]
    uids = [uid for uid, _ in first]
    seen = training_source().observe(group_rollouts(uids, extras, scores))
    source = training_source().creator
    assert source is not None
    return {
        "eva/groups": float(len(seen.informativeness)),
        "eva/parents": float(len(seen.parents)),
        "eva/children_joined": float(seen.joined),
        "eva/buffer_size": float(len(source.buffer.entries)),
    }

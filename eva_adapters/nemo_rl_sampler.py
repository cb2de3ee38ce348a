"""NeMo-RL's ``PromptGroupSampler`` with eva's creator behind it (``async_rl.sampler: {name:
custom, target: eva_adapters.nemo_rl:EvaSampler}``; ``eva_adapters.nemo_rl`` has the whole
setup and what it relies on in NeMo-RL).

The sampler observes every finished group into the creator the eva dataset draws from
(``eva_adapters.nemo_rl_shared``) and, among the groups NeMo-RL's staleness policy would take,
selects the most informative first. A group's rewards and prompt are read from the replay
buffer's DataPlane the first time the sampler sees it ready, before ``evict`` can drop it:
``total_reward`` and ``prompt_ids_for_adv``, the prompt's token ids, by which the group finds the
prompt eva handed out (nothing NeMo-RL commits carries the dataset's index).

NeMo-RL's private surface in use is one method, ``TQReplayBuffer._call_dp`` (a sampler is handed
the buffer only, and the buffer has no public read of a group's fields); the rest is public:
the staleness policy this sampler wraps, the buffer's lists and ``remove``, ``KVBatchMeta.concat``.
``tests/test_adapter_nemo_rl.py`` checks that method against the vendored commit.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
from nemo_rl.algorithms.async_utils.staleness_sampler import (
    PromptGroupSampler,
    ReadyFirstSampler,
    WindowedSampler,
)

from eva_adapters.nemo_rl_shared import shared
from eva_core.creator import Observation
from eva_core.informativeness import informativeness

logger = logging.getLogger(__name__)

REWARD = "total_reward"  # the DataPlane fields a committed group has (payload.py)
PROMPT = "prompt_ids_for_adv"


class EvaSampler:
    """NeMo-RL's ``PromptGroupSampler`` that observes every finished group into eva's creator
    and selects the most informative eligible groups first (module doc)."""

    POLICIES: ClassVar[dict[str, Callable[..., PromptGroupSampler]]] = {
        "ready_first": ReadyFirstSampler,
        "windowed": WindowedSampler,
    }

    def __init__(
        self,
        buffer: Any,
        *,
        staleness: str = "ready_first",
        max_staleness_versions: int = 1,
        order: str = "informative",
        eva_name: str = "eva",
        metric: str | None = None,
    ):
        self.buffer = buffer
        if staleness not in self.POLICIES:
            raise ValueError(
                f"eva selects among the groups a policy allows; staleness must be one of "
                f"{sorted(self.POLICIES)} (in_order and weight_fifo select whole dispatch "
                f"batches), got {staleness!r}"
            )
        if order not in ("informative", "fifo"):
            raise ValueError(f"order must be 'informative' or 'fifo', got {order!r}")
        self.staleness = staleness
        self.max_staleness_versions = max_staleness_versions
        self.policy = self.POLICIES[staleness](
            buffer, max_staleness_versions=max_staleness_versions
        )
        self.order = order
        self.eva_name = eva_name
        self._metric = metric
        self.info: dict[str, float] = {}  # group (its first sample id) -> informativeness
        if shared(eva_name) is None:
            logger.warning(
                f"eva: no EvaPromptDataset named {eva_name!r} in this process; the sampler "
                "orders groups by informativeness but nothing is evolved"
            )

    @property
    def metric(self) -> str:
        state = shared(self.eva_name)
        if self._metric is not None:
            return self._metric
        return state.creator.buffer.metric if state is not None else "a_avg"

    # NeMo-RL's staleness policy, unchanged.
    async def admit(self, *, trainer_version_fn: Callable[[], int]) -> int | None:
        return await self.policy.admit(trainer_version_fn=trainer_version_fn)

    def set_dispatch_index(self, resume_from_step: int) -> None:
        self.policy.set_dispatch_index(resume_from_step)

    def should_abort_inflight(self, *, start_weight_version: int,
                              current_train_weight: int) -> bool:  # fmt: skip
        return self.policy.should_abort_inflight(
            start_weight_version=start_weight_version, current_train_weight=current_train_weight
        )

    @property
    def is_on_policy(self) -> bool:
        return self.policy.is_on_policy

    def required_buffer_capacity(self, groups_per_step: int) -> int | None:
        return self.policy.required_buffer_capacity(groups_per_step)

    async def evict(self, *, current_train_weight: int) -> int:
        await self.read_finished()  # before any is dropped
        return await self.policy.evict(current_train_weight=current_train_weight)

    async def select(
        self, *, current_train_weight: int, min_prompt_groups: int, max_prompt_groups: int
    ) -> tuple[Any, int]:
        """The eligible groups (the staleness policy's), most informative first: up to
        ``max_prompt_groups`` of them, dropped from the buffer and concatenated; none below
        ``min_prompt_groups`` (NeMo-RL's built-in policies' contract)."""
        if not 1 <= min_prompt_groups <= max_prompt_groups:
            raise ValueError(
                f"need 1 <= min_prompt_groups <= max_prompt_groups, got {min_prompt_groups}, "
                f"{max_prompt_groups}"
            )
        await self.read_finished()
        buf = self.buffer
        low = max(0, current_train_weight - self.max_staleness_versions)
        eligible = [
            i for i, weight in enumerate(buf.start_weight_list)
            if buf.ready_list[i] and weight <= current_train_weight
            and (self.staleness == "ready_first" or weight >= low)
        ]  # fmt: skip
        if self.order == "informative":
            eligible.sort(key=lambda i: (-self._priority(i), i))
        if len(eligible) < min_prompt_groups:
            return None, 0
        chosen = eligible[:max_prompt_groups]
        metas = [buf.meta_list[i] for i in chosen]
        await buf.remove(chosen, remove_in_dp=False)
        return metas[0].concat(*metas[1:]), len(chosen)

    def _priority(self, i: int) -> float:
        value = self.info.get(self.buffer.meta_list[i].sample_ids[0], math.nan)
        return -math.inf if math.isnan(value) else value

    async def read_finished(self) -> list[Observation]:
        """Read the rewards and prompt of every ready group not read yet; observe the finished
        groups in creator batches. Returns the observations made."""
        buf = self.buffer
        live = set()
        state = shared(self.eva_name)
        for i, ready in enumerate(buf.ready_list):
            meta = buf.meta_list[i]
            if not ready or meta is None:
                continue
            group = meta.sample_ids[0]
            live.add(group)
            if group in self.info:
                continue
            fields = await buf._call_dp(
                "get_samples", sample_ids=list(meta.sample_ids), partition_id=meta.partition_id,
                select_fields=[REWARD, PROMPT],
            )  # fmt: skip
            rewards = [float(r) for r in fields[REWARD].reshape(len(meta.sample_ids), -1)[:, 0]]
            self.info[group] = float(informativeness(np.array([rewards]), self.metric)[0])
            if state is not None:
                state.finished(tuple(int(t) for t in _rows(fields[PROMPT])[0]), rewards)
        self.info = {g: v for g, v in self.info.items() if g in live}
        if state is None or len(state.pending) < state.batch:
            return []
        return await asyncio.to_thread(state.observe_due)  # the rewriter may be slow


def _rows(value: Any) -> list[list[Any]]:
    """A DataPlane field's rows as lists (a nested tensor's too)."""
    return [row.reshape(-1).tolist() for row in value.unbind(0)]

"""eva's creator inside NeMo-RL's async GRPO trainer (the SingleController, NVIDIA-NeMo/RL):
eva chooses the prompts NeMo-RL's dataloader yields, reads back every finished group's rewards
from the replay buffer, evolves the most informative prompts and feeds the children to the
same dataloader. Two seams, one creator between them:

    data:
      num_workers: 0
      train:
        dataset_name: eva_adapters.nemo_rl.EvaPromptDataset
        data_path: seeds.jsonl              # input_key / output_key as ResponseDataset's
        num_prompts_per_step: 32            # = grpo.num_prompts_per_step
        eva: {rewriter: my_pkg.evolve:rewrite, state_path: /ckpt/eva.json, ...}
    async_rl:
      sampler:
        name: custom
        target: eva_adapters.nemo_rl:EvaSampler
        staleness: ready_first              # or windowed
        max_staleness_versions: 1

What this relies on, in NeMo-RL at commit 7ea279a (2026-08-22):

* The prompt side. A sampler chooses only among generated groups (``PromptGroupSampler``:
  ``admit`` gates dispatch, ``select``/``evict`` pick and drop finished groups,
  ``nemo_rl/algorithms/async_utils/staleness_sampler.py`` l. 63-118); which prompts are
  generated is the dataloader's: ``_rollout_pump`` iterates ``self._dataloader``
  (``single_controller.py`` l. 586-613), a ``StatefulDataLoader`` over the training dataset
  with ``batch_size=grpo.num_prompts_per_step`` and ``drop_last`` (``single_controller_utils/
  setup.py`` l. 595-602). The public way in is the dataset: ``load_response_dataset`` imports a
  dotted ``dataset_name`` (``nemo_rl/data/datasets/response_datasets/__init__.py`` l. 111-125)
  and instantiates it with the dataset's config; ``setup_response_data`` wraps its ``dataset``
  in ``AllTaskProcessedDataset`` with its ``processor`` (``nemo_rl/data/utils.py`` l. 174-216).
  ``EvaPromptDataset`` answers each index with the next prompt of ``creator.draw`` (drawn
  ``num_prompts_per_step`` at a time, so one draw is one training step's batch; the index and
  ``data.shuffle`` are ignored) in ResponseDataset's row format (``messages``: the prompt, then
  the reference answer as the assistant turn).
* The rewards. ``TQReplayBuffer.commit`` writes each finished group as N rows of the DataPlane
  with ``total_reward`` and ``prompt_ids_for_adv``, the prompt's token ids (``replay_buffer.py``
  l. 768-834, ``nemo_rl/experience/payload.py`` l. 31-96); the group's ``KVBatchMeta`` tags
  carry only ``weight_version``, and nothing carries the dataset's index. So the prompt is known
  by its token ids, as GRPO's baseline knows it: the dataset's processor (wrapped) records the
  token ids of each prompt it hands out, and ``EvaSampler`` reads ``total_reward`` and
  ``prompt_ids_for_adv`` of every group the first time it sees it ready, through the buffer's
  DataPlane client (``TQReplayBuffer._call_dp``: a sampler is given the buffer only, and the
  buffer has no public read). It observes groups ``num_prompts_per_step`` at a time, before
  ``evict`` can drop any (``_train_pump`` calls ``evict`` then ``select``, l. 879-912).
* The sampler is loaded by ``create_sampler`` from ``CustomSamplerConfig`` (``target``
  ``module:ClassName``, the other keys its constructor's, l. 513-594), in the SingleController
  actor, after its dataloader: ``single_controller.py`` l. 140 and 194. Both find the creator
  in this module's registry (by ``eva_name``), so ``data.num_workers`` must be 0 (a worker
  process would draw from a copy). ``EvaSampler`` keeps NeMo-RL's staleness policy
  (``staleness``: ``ready_first`` or ``windowed``; admission, eviction and abort are that
  policy's) and selects, among the groups that policy would take, the most informative first
  (``order: informative``; ``fifo`` keeps NeMo-RL's order). The exact-batch policies
  (``in_order``, ``weight_fifo``) are refused: they select whole dispatch batches.
* State. NeMo-RL gives a sampler no checkpoint hook (it saves the dataloader and the replay
  buffer), so with ``eva.state_path`` the creator's state is written after every observation
  and read back when the dataset is built: a resumed run continues from eva's latest step, not
  from the checkpoint's. Groups NeMo-RL never commits (a prompt skipped after failed rollouts)
  stay drawn-but-unobserved in the creator.

``eva`` holds ``eva_adapters.common.build_creator``'s options (``rewriter``, ``size``,
``ratio_evol``, ``top_fraction``, ``n_new``, ``n_new_bootstrap``, ``metric``, ``seed``,
``max_chars``, ``skip_tied``, ``inherit``, ``state_path``). A child's reference answer is empty
unless ``inherit`` names ``answer`` (a rewritten question has its own answer).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
from nemo_rl.algorithms.async_utils.staleness_sampler import (
    BaseSampler,
    ReadyFirstSampler,
    WindowedSampler,
)
from nemo_rl.data.datasets.raw_dataset import RawDataset
from nemo_rl.data.datasets.utils import load_dataset_from_path

from eva_adapters.common import build_creator
from eva_core.creator import Creator, Observation
from eva_core.informativeness import informativeness

logger = logging.getLogger(__name__)

Record = dict[str, Any]
Key = tuple[int, ...]
REWARD = "total_reward"  # the DataPlane fields a committed group has (payload.py)
PROMPT = "prompt_ids_for_adv"
ANSWER = "answer"  # the seed column holding the reference answer
PROMPT_ID = "eva_prompt_id"  # the row key naming the prompt, for the processor

_REGISTRY: dict[str, _Shared] = {}


class _Shared:
    """The creator both seams use, with what ties a group back to its prompt: the token ids of
    each prompt handed out (a queue per key: the same prompt may be out twice)."""

    def __init__(self, name: str, creator: Creator, batch: int, state_path: str | None):
        self.name = name
        self.creator = creator
        self.batch = batch
        self.state_path = state_path
        self.lock = threading.Lock()
        self.queue: deque[Record] = deque()  # drawn, not handed to the dataloader yet
        self.keys: dict[Key, deque[str]] = {}  # handed out, not observed yet
        self.pending: list[tuple[str, list[float]]] = []  # finished, not observed yet
        self.last: Observation | None = None  # the latest observation
        self.unmatched = 0  # finished groups of prompts eva did not hand out

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "lock"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Unpickled in another process (the SingleController actor): the live copy there.
        self.__dict__.update(state)
        self.lock = threading.Lock()
        _REGISTRY[self.name] = self

    def next_record(self) -> Record:
        with self.lock:
            if not self.queue:
                self.queue.extend(self.creator.draw(self.batch))
            if not self.queue:
                raise IndexError("the creator has nothing left to draw")
            return self.queue.popleft()

    def handed_out(self, key: Key, prompt_id: str) -> None:
        with self.lock:
            self.keys.setdefault(key, deque()).append(prompt_id)

    def finished(self, key: Key, rewards: list[float]) -> None:
        with self.lock:
            ids = self.keys.get(key)
            if not ids:
                self.unmatched += 1
                return
            self.pending.append((ids.popleft(), rewards))
            if not ids:
                del self.keys[key]

    def observe_due(self) -> list[Observation]:
        """Observe the finished groups in creator batches (``batch`` groups each)."""
        done = []
        with self.lock:
            while len(self.pending) >= self.batch:
                rows, self.pending = self.pending[: self.batch], self.pending[self.batch :]
                done.append(self.creator.observe(rows))
            if done and self.state_path:
                self.creator.flush()
                _write_json(self.state_path, {**self.creator.state(), "nemo_rl": self._extra()})
        if done:
            self.last = done[-1]
        return done

    def _extra(self) -> dict[str, Any]:
        return {
            "queue": list(self.queue),
            "keys": [[list(k), list(ids)] for k, ids in self.keys.items()],
            "pending": [[pid, rewards] for pid, rewards in self.pending],
        }

    def restore(self, extra: Mapping[str, Any]) -> None:
        self.queue = deque(extra.get("queue", []))
        self.keys = {tuple(k): deque(ids) for k, ids in extra.get("keys", [])}
        self.pending = [(pid, list(r)) for pid, r in extra.get("pending", [])]


def shared(name: str = "eva") -> _Shared | None:
    """The creator this process's eva dataset registered under ``name``, if any."""
    return _REGISTRY.get(name)


# --- the dataset -----------------------------------------------------------------------------


class _Rows:
    """The map-style rows ``AllTaskProcessedDataset`` indexes: each index gets the next prompt
    eva draws (a pass over the seeds is one epoch for the dataloader)."""

    def __init__(self, state: _Shared, length: int, task_name: str):
        self.state = state
        self.length = length
        self.task_name = task_name

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, idx: int) -> dict[str, Any]:
        record = self.state.next_record()
        return {
            "messages": [
                {"role": "user", "content": record["prompt"]},
                {"role": "assistant", "content": _text(record.get(ANSWER))},
            ],
            "task_name": self.task_name,
            PROMPT_ID: record["prompt_id"],
        }


class _RecordingProcessor:
    """The dataset's processor, recording the token ids of each prompt it processes."""

    def __init__(self, inner: Callable[..., Any], name: str):
        self.inner = inner
        self.name = name

    def __call__(self, datum: dict[str, Any], spec: Any, tokenizer: Any, max_len: Any,
                 idx: int) -> Any:  # fmt: skip
        out = self.inner(datum, spec, tokenizer, max_len, idx)
        state = _REGISTRY.get(self.name)
        if state is not None and PROMPT_ID in datum:
            state.handed_out(prompt_key(out["message_log"]), datum[PROMPT_ID])
        return out


class EvaPromptDataset(RawDataset):
    """NeMo-RL's training dataset with eva's creator choosing the prompts (module doc).

    The seeds are ``data_path``'s rows as ``ResponseDataset`` reads them (``input_key`` the
    prompt, ``output_key`` the reference answer); ``eva`` the creator's options."""

    processor: Callable[..., Any]

    def __init__(
        self,
        data_path: str,
        input_key: str = "input",
        output_key: str = "output",
        subset: str | None = None,
        split: str | None = None,
        num_prompts_per_step: int | None = None,
        eva: Mapping[str, Any] | None = None,
        eva_name: str = "eva",
        **kwargs: Any,
    ):
        if not num_prompts_per_step or num_prompts_per_step < 1:
            raise ValueError(
                "EvaPromptDataset needs num_prompts_per_step (= grpo.num_prompts_per_step): "
                "eva draws one training step's prompts at a time"
            )
        self.task_name = "-".join(data_path.split("/")[-2:]).split(".")[0].lstrip("-")
        rows = load_dataset_from_path(data_path, subset, split)
        seeds = [{"prompt": _text(r[input_key]), ANSWER: _text(r.get(output_key))}
                 for r in rows]  # fmt: skip
        options = dict(eva or {})
        creator = build_creator(seeds, options)
        state = _Shared(eva_name, creator, num_prompts_per_step, options.get("state_path"))
        path = options.get("state_path")
        if path and os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                state.restore(json.load(f).get("nemo_rl", {}))
        _REGISTRY[eva_name] = state
        self.eva_name = eva_name
        self.shared = state
        self.dataset = _Rows(state, len(seeds), self.task_name)
        self.val_dataset = None

    def set_processor(self) -> None:
        super().set_processor()
        self.processor = _RecordingProcessor(self.processor, self.eva_name)


# --- the sampler -----------------------------------------------------------------------------


class EvaSampler(BaseSampler):
    """NeMo-RL's ``PromptGroupSampler`` that observes every finished group into eva's creator
    and selects the most informative eligible groups first (module doc)."""

    POLICIES: ClassVar[dict[str, type[BaseSampler]]] = {
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
        super().__init__(buffer)
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
        self._validate_group_bounds(min_prompt_groups, max_prompt_groups)
        await self.read_finished()
        buf = self._buffer
        low = max(0, current_train_weight - self.max_staleness_versions)
        eligible = [
            i for i, weight in enumerate(buf.start_weight_list)
            if buf.ready_list[i] and weight <= current_train_weight
            and (self.staleness == "ready_first" or weight >= low)
        ]  # fmt: skip
        if self.order == "informative":
            eligible.sort(key=lambda i: (-self._priority(i), i))
        return await self._finalize_selection(eligible, min_prompt_groups, max_prompt_groups)

    def _priority(self, i: int) -> float:
        value = self.info.get(self._buffer.meta_list[i].sample_ids[0], math.nan)
        return -math.inf if math.isnan(value) else value

    async def read_finished(self) -> list[Observation]:
        """Read the rewards and prompt of every ready group not read yet; observe the finished
        groups in creator batches. Returns the observations made."""
        buf = self._buffer
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


def prompt_key(message_log: Sequence[Mapping[str, Any]]) -> Key:
    """A prompt's token ids, as ``prompt_ids_for_adv`` holds them (its messages' in order)."""
    return tuple(int(t) for m in message_log for t in m["token_ids"].reshape(-1).tolist())


def _rows(value: Any) -> list[list[Any]]:
    """A DataPlane field's rows as lists (a nested tensor's too)."""
    return [row.reshape(-1).tolist() for row in value.unbind(0)]


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _write_json(path: str, state: Mapping[str, Any]) -> None:
    """Write ``state`` to ``path`` atomically (a crash leaves the old file whole)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(state, f)
    os.replace(tmp, path)

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

This module is the dataset; the sampler is ``eva_adapters.nemo_rl_sampler`` (named from here
by ``target``), and the creator the two find, with the state file, ``eva_adapters.nemo_rl_shared``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from nemo_rl.data.datasets.raw_dataset import RawDataset
from nemo_rl.data.datasets.utils import load_dataset_from_path

from eva_adapters.common import build_creator

# async_rl.sampler.target names the sampler here (docs/trainers.md); it lives in its own module.
from eva_adapters.nemo_rl_sampler import EvaSampler as EvaSampler
from eva_adapters.nemo_rl_shared import SharedCreator, prompt_key, register, shared

ANSWER = "answer"  # the seed column holding the reference answer
PROMPT_ID = "eva_prompt_id"  # the row key naming the prompt, for the processor


class _Rows:
    """The map-style rows ``AllTaskProcessedDataset`` indexes: each index gets the next prompt
    eva draws (a pass over the seeds is one epoch for the dataloader)."""

    def __init__(self, state: SharedCreator, length: int, task_name: str):
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
        state = shared(self.name)
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
        creator = build_creator(seeds, options, key="data.train.eva")
        state = SharedCreator(eva_name, creator, num_prompts_per_step, options.get("state_path"))
        state.restore()
        register(state)
        self.eva_name = eva_name
        self.shared = state
        self.dataset = _Rows(state, len(seeds), self.task_name)
        self.val_dataset = None

    def set_processor(self) -> None:
        super().set_processor()
        self.processor = _RecordingProcessor(self.processor, self.eva_name)


def _text(value: Any) -> str:
    return "" if value is None else str(value)

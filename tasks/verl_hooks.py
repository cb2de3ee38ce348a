"""eva's curriculum and prompt evolution as the classes verl loads by config (verl 0.7.1).

    data.dataloader_num_workers=0
    data.sampler.class_path=pkg://tasks.verl_hooks
    data.sampler.class_name=EvaCurriculumSampler
    data.custom_cls.path=pkg://tasks.verl_hooks  data.custom_cls.name=EvaGenDataset
    data.datagen.path=pkg://tasks.verl_hooks     data.datagen.name=EvaDataGenerator

(``configs/verl/grpo-eva.yaml`` has them with the ``eva`` sub-dicts.)

What this relies on, in the verl 0.7.1 wheel:

* ``verl/trainer/main_ppo.py`` ``create_rl_sampler`` (l. 408-422) builds the sampler as
  ``cls(data_source=dataset, data_config=config.data)`` and asserts
  ``dataloader_num_workers == 0``, so the DataLoader asks the sampler for each batch's indices
  only when that batch is needed (``RayPPOTrainer._create_dataloader``, ray_trainer.py
  l. 346-353: a StatefulDataLoader over the sampler), so a new order takes effect next step.
* ``verl/trainer/ppo/ray_trainer.py``: every prompt row of a step gets a fresh ``uid``
  (l. 1303), the batch is repeated ``rollout.n`` times interleaved (l. 1358), the rewards are
  ``batch.batch["token_level_scores"]`` (l. 1452; summed over tokens, as l. 435 does), then
  ``sampler.update(batch=batch)`` (l. 1599-1600) and ``train_dataset.on_batch_end(batch=batch)``
  (l. 1625-1627).
* ``verl/utils/dataset/rl_dataset.py`` l. 360-366: ``non_tensor_batch["index"]`` is the row's
  ``extra_info.index`` (0 when absent), not its position: eva maps it back and so needs it unique.
* ``DynamicGenDataset.__init__`` ends with ``self.on_batch_end()``, but ``on_batch_end`` requires
  ``batch``: the stock class raises TypeError when built. ``EvaGenDataset`` overrides
  ``on_batch_end(batch=None)``; the call from ``__init__`` (no rollouts yet) only adds lineage.
  The stock generator is also never shown the batch; ``EvaGenDataset`` hands it over first.

verl 0.8 and 0.9 removed ``verl.experimental.dataset`` and ``verl.experimental.dynamic_dataset``
and ``create_rl_sampler`` no longer reads ``data.sampler``. There, and without verl, this module
still imports, but building one of its classes raises an EvaError saying what is missing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from eva_runtime.errors import EvaError
from tasks.verl_curriculum import (
    PRIORITY_KEY,
    Curriculum,
    GeneratorSettings,
    SamplerSettings,
    children_rows,
    load_rewriter,
    pick_parents,
    prompt_rewards,
    prompt_text,
    settings,
    with_lineage,
)

try:
    import datasets
    from verl import DataProto
    from verl.experimental.dataset.sampler import AbstractCurriculumSampler
    from verl.experimental.dynamic_dataset.dynamicgen_dataset import (
        AbstractDataGenerator,
        DynamicGenDataset,
    )
except ImportError as exc:
    # The rest of eva never needs verl (and ``tasks.versions`` imports every module of tasks):
    # without it this module still imports, and building one of its classes says what is missing.
    _MISSING = str(exc)

    class _NeedsVerl:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise EvaError(
                f"verl's curriculum hooks cannot be imported ({_MISSING})",
                hint="pip install 'eva[verl]' (verl 0.7.1; verl 0.8+ removed "
                "verl.experimental.dataset and verl.experimental.dynamic_dataset)",
            )

    AbstractCurriculumSampler = AbstractDataGenerator = DynamicGenDataset = _NeedsVerl
    DataProto = datasets = Any


def _step_rewards(batch: DataProto) -> tuple[list[int], np.ndarray]:
    scores = batch.batch["token_level_scores"].sum(-1).float().cpu().numpy()
    return prompt_rewards(scores, batch.non_tensor_batch["uid"], batch.non_tensor_batch["index"])


def _extras(frame: Any, start: int) -> list[dict[str, Any]]:
    if "extra_info" not in frame.column_names:
        return [{} for _ in range(start, len(frame))]
    return [e or {} for e in frame.select(range(start, len(frame)))["extra_info"]]


class EvaCurriculumSampler(AbstractCurriculumSampler):
    """Each epoch draws the dataset's prompts without replacement, weighted by informativeness
    (``data.sampler.eva``: metric, seed), re-ranked after every step from its rollouts."""

    def __init__(self, data_source: Any, data_config: Any) -> None:
        super().__init__(data_source, data_config)
        self.data_source = data_source
        sampler_cfg = data_config.get("sampler") or {}
        cfg = settings(SamplerSettings, sampler_cfg.get("eva"), "data.sampler.eva")
        self.curriculum = Curriculum(cfg.metric, cfg.seed)
        self._sync()

    def _sync(self) -> None:
        """Rows the dataset gained (evolved children) join with their inherited priority."""
        have = len(self.curriculum)
        if len(self.data_source) > have:
            extras = _extras(self.data_source.dataframe, have)
            priorities: list[Any] = [e.get(PRIORITY_KEY) for e in extras]
            self.curriculum.extend([e.get("index") for e in extras], priorities)

    def __iter__(self) -> Iterator[int]:
        return self.curriculum.iterate(self._sync)

    def __len__(self) -> int:
        return len(self.data_source)

    def update(self, batch: DataProto) -> None:
        self._sync()
        self.curriculum.observe(*_step_rewards(batch))

    def state_dict(self) -> dict[str, Any]:
        return self.curriculum.state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._sync()
        self.curriculum.load(state)


class EvaDataGenerator(AbstractDataGenerator):
    """After a step, the most informative of its prompts (``data.datagen.eva``) are rewritten
    by the configured rewriter; the kept rewrites come back as rows with lineage."""

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.settings = settings(GeneratorSettings, config.get("eva"), "data.datagen.eva")
        self.rewrite = load_rewriter(self.settings.rewriter)
        self.step = 0
        self.last: tuple[list[int], np.ndarray] = ([], np.zeros(0))

    def observe(self, batch: DataProto) -> None:
        from eva_core.informativeness import informativeness

        indices, rewards = _step_rewards(batch)
        self.last = (indices, informativeness(rewards, self.settings.metric))

    def generate(self, dataset: Any) -> datasets.Dataset:
        s, (indices, info) = self.settings, self.last
        self.last, self.step = ([], np.zeros(0)), self.step + 1
        frame = dataset.dataframe
        picked = pick_parents(info, s.top_fraction, s.sample_method, s.seed + self.step)
        where = {int(e["index"]): p for p, e in enumerate(_extras(frame, 0))}
        parents = [frame[where[indices[i]]] for i in picked]
        rewrites = self.rewrite([prompt_text(p) for p in parents], s.n_new, s.seed + self.step)
        if len(rewrites) != len(parents):
            raise EvaError(f"the rewriter returned {len(rewrites)} lists for {len(parents)}")
        next_index = max(where, default=-1) + 1
        rows = children_rows(
            parents, [info[i] for i in picked], rewrites, next_index, "verl", s.max_chars
        )
        return datasets.Dataset.from_list(rows, features=frame.features)


class EvaGenDataset(DynamicGenDataset):
    """verl's DynamicGenDataset that can be built (see the module doc), keeps eva's lineage in
    ``extra_info`` and shows each step's batch to the generator before asking for rows."""

    dataframe: Any  # a datasets.Dataset, set by RLHFDataset.__init__

    def on_batch_end(self, batch: DataProto | None = None) -> None:
        if batch is None:  # DynamicGenDataset.__init__: no rollouts yet, nothing to evolve
            self.dataframe = self.dataframe.map(with_lineage)
            return
        if hasattr(self.data_generator, "observe"):
            self.data_generator.observe(batch)
        new = self.data_generator.generate(self)
        if len(new):
            self.append_dataframe(new)

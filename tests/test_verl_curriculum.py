"""eva inside verl: the curriculum logic on hand-built rollouts, and, where verl 0.7.1 imports,
verl's own DataProto, create_rl_sampler and DynamicGenDataset driving eva's classes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from eva_runtime.errors import EvaError
from tasks.verl_curriculum import (
    Curriculum,
    GeneratorSettings,
    SamplerSettings,
    children_rows,
    pick_parents,
    prompt_rewards,
    settings,
    with_lineage,
)


def rewrite(prompts: list[str], n: int, seed: int) -> list[list[str]]:
    """The test rewriter: n distinct, deterministic variants of each prompt."""
    return [[f"{p} Now with {j + 2} numbers." for j in range(n)] for p in prompts]


def _row(index: int, text: str) -> dict:
    return {
        "data_source": "toy",
        "prompt": [{"role": "user", "content": text}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(index)},
        "extra_info": {"index": index, "split": "train"},
    }


def test_rollouts_group_by_uid_into_one_reward_row_per_prompt() -> None:
    # verl repeats each prompt n times interleaved; uids name the prompt, index its row.
    scores = np.array([1.0, 0.0, 0.5, 0.5, 2.0])
    ids, matrix = prompt_rewards(scores, ["a", "a", "b", "b", "c"], [7, 7, 3, 3, 9])
    assert ids == [7, 3, 9]
    np.testing.assert_array_equal(matrix[:2], [[1.0, 0.0], [0.5, 0.5]])
    assert matrix[2, 0] == 2.0 and math.isnan(matrix[2, 1])


def test_the_prompt_with_the_reward_gap_is_drawn_first_every_epoch_seed() -> None:
    for seed in range(20):
        cur = Curriculum("a_min", seed)
        cur.extend([10, 11, 12, 13, 14])  # extra_info.index of positions 0..4
        # Prompt 13 (position 3): rewards 0 and 1, gap 1.0; every other prompt agrees: gap 0.
        rewards = np.array([[1.0, 1.0], [0.0, 0.0], [0.5, 0.5], [0.0, 1.0], [1.0, 1.0]])
        info = cur.observe([10, 11, 12, 13, 14], rewards)
        np.testing.assert_array_equal(info, [0, 0, 0, 1, 0])
        order = list(cur.iterate(lambda: None))
        assert order[0] == 3  # the only positive weight: drawn with probability 1
        assert sorted(order) == [0, 1, 2, 3, 4]  # without replacement: each once per epoch
        assert cur.epoch == 1


def test_unscored_prompts_are_tried_before_the_uninformative() -> None:
    cur = Curriculum("a_min", 0)
    cur.extend([0, 1, 2])
    cur.observe([0, 1], np.array([[0.0, 0.0], [0.0, 0.0]]))  # 0 and 1 teach nothing
    assert next(cur.iterate(lambda: None)) == 2  # 2 was never scored: weighted 1, others 0


def test_an_update_mid_epoch_reorders_the_rest_and_children_join_at_once() -> None:
    cur = Curriculum("a_min", 1)
    cur.extend([0, 1, 2, 3])
    cur.observe([0, 1, 2, 3], np.zeros((4, 2)))  # all zero: uniform order
    grown = {"done": False}

    def sync() -> None:
        if cur.epoch == 0 and not grown["done"] and len(drawn) == 1:
            cur.extend([4], [0.7])  # an evolved child with its parent's informativeness
            grown["done"] = True

    drawn: list[int] = []
    for position in cur.iterate(sync):
        drawn.append(position)
    # The epoch keeps its length (4, the dataset's size when it began); the child, the only
    # positive weight, is the second prompt drawn; one seed waits for the next epoch.
    assert len(drawn) == 4 and drawn[1] == 4 and len(set(drawn)) == 4


def test_a_saved_epoch_resumes_exactly_as_it_would_have_gone_on() -> None:
    def fresh() -> Curriculum:
        cur = Curriculum("a_min", 2)
        cur.extend(list(range(6)))
        return cur

    cur = fresh()
    whole = list(cur.iterate(lambda: None))
    cur = fresh()
    steps = cur.iterate(lambda: None)
    head = [next(steps), next(steps)]
    resumed = fresh()
    resumed.load(cur.state())
    assert head + list(resumed.iterate(lambda: None)) == whole
    assert resumed.epoch == 1


def test_rows_need_a_unique_extra_info_index() -> None:
    cur = Curriculum("a_min", 0)
    with pytest.raises(EvaError, match="not unique"):
        cur.extend([0, 0])


def test_eva_settings_are_validated_with_the_config_path() -> None:
    assert settings(SamplerSettings, None, "data.sampler.eva").metric == "a_min"
    with pytest.raises(EvaError, match=r"data\.sampler\.eva\.metric"):
        settings(SamplerSettings, {"metric": "gap"}, "data.sampler.eva")
    with pytest.raises(EvaError, match=r"data\.datagen\.eva\.rewriter"):
        settings(GeneratorSettings, {}, "data.datagen.eva")


def test_parents_are_the_top_fraction_with_positive_informativeness() -> None:
    info = np.array([0.0, 0.9, 0.2, 0.5, 0.0, 0.0, 0.0, 0.0])
    assert pick_parents(info, 0.25, "greedy", 0) == [1, 3]  # ceil(0.25 * 8) = 2
    assert pick_parents(np.array([0.3, 0.0, 0.0, 0.0]), 0.75, "greedy", 0) == [0]


def test_children_rows_carry_lineage_a_new_index_and_the_parent_priority() -> None:
    parents = [with_lineage(_row(5, "What is 2+3?"))]
    kids = children_rows(
        parents, [0.8], [["What is 2+3+4?", "What is 2+3?", "I'm sorry, I cannot."]], 100, "t"
    )
    # The copy of the parent and the refusal are dropped by eva_core's clean-up.
    assert len(kids) == 1
    kid = kids[0]
    assert kid["prompt"] == [{"role": "user", "content": "What is 2+3+4?"}]
    assert kid["reward_model"] == parents[0]["reward_model"]
    extra = kid["extra_info"]
    assert extra["index"] == 100 and extra["parent_index"] == 5 and extra["eva_depth"] == 1
    assert extra["eva_parent_id"] == parents[0]["extra_info"]["eva_prompt_id"]
    assert extra["eva_root_id"] == parents[0]["extra_info"]["eva_root_id"]
    assert extra["eva_priority"] == 0.8 and extra["split"] == "train"


# --- against verl's own classes (verl 0.7.1: pip install 'eva[verl]') ------------------------


def _verl():
    pytest.importorskip("verl.experimental.dataset.sampler")
    pytest.importorskip("verl.experimental.dynamic_dataset.dynamicgen_dataset")
    import torch
    from omegaconf import OmegaConf
    from verl import DataProto

    return torch, OmegaConf, DataProto


def _batch(DataProto, torch, index: list[int], per_rollout: list[float]):
    """A step as verl's trainer holds it at update(): rollout.n=2 rows per prompt,
    interleaved, the reward on the last response token of token_level_scores."""
    n = len(per_rollout)
    scores = torch.zeros(n, 4)
    scores[:, -1] = torch.tensor(per_rollout)
    uids = np.array([f"u{i // 2}" for i in range(n)], dtype=object)
    idx = np.array([index[i // 2] for i in range(n)], dtype=object)
    return DataProto.from_dict(
        tensors={"token_level_scores": scores}, non_tensors={"uid": uids, "index": idx}
    )


def _dataset(tmp_path, OmegaConf, with_gen: bool):
    import pandas as pd
    from verl.experimental.dynamic_dataset.dynamicgen_dataset import DynamicGenDataset

    from tasks.verl_hooks import EvaGenDataset

    path = tmp_path / "train.parquet"
    pd.DataFrame([_row(i, f"What is {i}+{i}?") for i in range(4)]).to_parquet(path)
    cfg = OmegaConf.create(
        {
            "filter_overlong_prompts": False,
            "cache_dir": str(tmp_path / "cache"),
            "datagen": {
                "path": "pkg://tasks.verl_hooks",
                "name": "EvaDataGenerator",
                "eva": {"rewriter": "tests.test_verl_curriculum:rewrite", "top_fraction": 0.25},
            },
        }
    )
    cls = EvaGenDataset if with_gen else DynamicGenDataset
    return cls(data_files=[str(path)], tokenizer=None, config=cfg)


def test_stock_dynamicgen_dataset_cannot_be_built(tmp_path) -> None:
    _, OmegaConf, _ = _verl()
    # The bug eva works around: __init__ calls self.on_batch_end() without its batch.
    with pytest.raises(TypeError, match="batch"):
        _dataset(tmp_path, OmegaConf, with_gen=False)


def test_verl_builds_the_sampler_and_its_update_ranks_prompt_3_first(tmp_path) -> None:
    torch, OmegaConf, DataProto = _verl()
    main_ppo = pytest.importorskip("verl.trainer.main_ppo")
    from tasks.verl_hooks import EvaCurriculumSampler

    data = _dataset(tmp_path, OmegaConf, with_gen=True)
    cfg = OmegaConf.create(
        {
            "shuffle": True,
            "dataloader_num_workers": 0,
            "sampler": {
                "class_path": "pkg://tasks.verl_hooks",
                "class_name": "EvaCurriculumSampler",
                "eva": {"metric": "a_min", "seed": 3},
            },
        }
    )
    sampler = main_ppo.create_rl_sampler(cfg, data)
    assert isinstance(sampler, EvaCurriculumSampler) and len(sampler) == 4
    # Prompt 3's two rollouts score 0 and 1; prompts 0-2 score the same twice.
    sampler.update(_batch(DataProto, torch, [0, 1, 2, 3], [1, 1, 0, 0, 1, 1, 0, 1]))
    order = list(sampler)
    assert order[0] == 3 and sorted(order) == [0, 1, 2, 3]

    cfg.dataloader_num_workers = 8  # verl's own guard against prefetching a stale order
    with pytest.raises(AssertionError, match="num_workers must be 0"):
        main_ppo.create_rl_sampler(cfg, data)


def test_on_batch_end_adds_evolved_children_that_the_sampler_draws_next(tmp_path) -> None:
    torch, OmegaConf, DataProto = _verl()
    from tasks.verl_hooks import EvaCurriculumSampler

    data = _dataset(tmp_path, OmegaConf, with_gen=True)
    assert data.dataframe[0]["extra_info"]["eva_depth"] == 0  # lineage added when built
    sampler = EvaCurriculumSampler(data, OmegaConf.create({"sampler": {"eva": {}}}))
    batch = _batch(DataProto, torch, [0, 1, 2, 3], [1, 1, 0, 0, 1, 1, 0, 1])
    sampler.update(batch)  # verl's order: sampler.update, then train_dataset.on_batch_end
    data.on_batch_end(batch=batch)
    # top_fraction 0.25 of 4 prompts: prompt 3 only, n_new=2 rewrites, both kept.
    assert len(data) == 6
    kids = [data.dataframe[i] for i in (4, 5)]
    assert [k["extra_info"]["index"] for k in kids] == [4, 5]
    assert {k["extra_info"]["parent_index"] for k in kids} == {3}
    assert all(k["extra_info"]["eva_depth"] == 1 for k in kids)
    assert kids[0]["prompt"][0]["content"] == "What is 3+3? Now with 2 numbers."
    # The children inherit priority 1.0 (their parent's gap); prompt 3 has it too.
    order = list(sampler)
    assert len(order) == 6 and set(order[:3]) == {3, 4, 5}
    item = data[4]  # verl's __getitem__ on a child row (tokenizer-free fields)
    assert item["index"] == 4


def test_a_rewriter_path_that_does_not_load_names_its_key() -> None:
    from tasks.verl_curriculum import load_rewriter

    assert load_rewriter("tests.test_verl_curriculum:rewrite")(["a"], 1, 0) == [
        ["a Now with 2 numbers."]
    ]
    with pytest.raises(EvaError, match="cannot load the rewriter") as err:
        load_rewriter("tests.test_verl_curriculum:nope")
    assert err.value.field == "data.datagen.eva.rewriter"


def test_without_verl_the_hooks_import_and_refuse_to_be_built() -> None:
    import importlib.util

    try:
        has_hooks = importlib.util.find_spec("verl.experimental.dataset.sampler") is not None
    except ModuleNotFoundError:
        has_hooks = False
    if has_hooks:
        pytest.skip("verl's curriculum hooks are installed")
    from tasks.verl_hooks import EvaCurriculumSampler

    with pytest.raises(EvaError, match="verl's curriculum hooks cannot be imported") as err:
        EvaCurriculumSampler([], {})
    assert "eva[verl]" in (err.value.hint or "")


def test_verls_dataloader_takes_the_new_order_at_the_next_step(tmp_path) -> None:
    # As RayPPOTrainer._create_dataloader builds it: StatefulDataLoader, num_workers=0,
    # drop_last, verl's collate_fn. Batch indices are asked for only when a batch is needed,
    # so children added after step 1 can fill step 2.
    torch, OmegaConf, DataProto = _verl()
    from torchdata.stateful_dataloader import StatefulDataLoader
    from verl.utils.dataset.rl_dataset import collate_fn

    from tasks.verl_hooks import EvaCurriculumSampler

    data = _dataset(tmp_path, OmegaConf, with_gen=True)
    sampler = EvaCurriculumSampler(data, OmegaConf.create({"sampler": {"eva": {"seed": 5}}}))
    # Every prompt scored once and uninformative: the epoch starts in a uniform order.
    sampler.update(_batch(DataProto, torch, [0, 1, 2, 3], [1, 1, 0, 0, 1, 1, 0, 0]))
    loader = StatefulDataLoader(
        data, batch_size=2, num_workers=0, drop_last=True, collate_fn=collate_fn, sampler=sampler
    )
    steps = iter(loader)
    first = [int(i) for i in next(steps)["index"]]
    # Step 1's rollouts: its first prompt splits its rewards (gap 1), the second does not.
    batch = _batch(DataProto, torch, first, [0, 1, 1, 1])
    sampler.update(batch)
    data.on_batch_end(batch=batch)
    second = next(steps)
    # The parent's two rewrites (priority 1) beat the two seeds left (priority 0).
    assert sorted(int(i) for i in second["index"]) == [4, 5]
    assert {e["parent_index"] for e in second["extra_info"]} == {first[0]}
    with pytest.raises(StopIteration):  # the epoch keeps its length: 4 prompts, 2 steps
        next(steps)


def test_the_recipe_merges_into_verls_data_config_and_builds_eva(tmp_path) -> None:
    from pathlib import Path

    _, OmegaConf, _ = _verl()
    main_ppo = pytest.importorskip("verl.trainer.main_ppo")
    import verl
    from verl.utils.dataset.rl_dataset import get_dataset_class

    from tasks.verl_hooks import EvaCurriculumSampler, EvaGenDataset

    stock = Path(verl.__file__).parent / "trainer" / "config" / "data" / "legacy_data.yaml"
    recipe = OmegaConf.load(Path(__file__).parents[1] / "infra" / "verl" / "grpo-eva.yaml")
    data_cfg = OmegaConf.merge(OmegaConf.load(stock), recipe.data)
    assert get_dataset_class(data_cfg) is EvaGenDataset
    data = _dataset(tmp_path, OmegaConf, with_gen=True)
    assert isinstance(main_ppo.create_rl_sampler(data_cfg, data), EvaCurriculumSampler)


def test_a_checkpoint_mid_epoch_resumes_with_the_prompts_not_yet_drawn(tmp_path) -> None:
    # verl saves train_dataloader.state_dict(); torchdata's StatefulDataLoader then skips
    # nothing for a sampler with a state of its own, so the sampler must remember the epoch.
    torch, OmegaConf, DataProto = _verl()
    from torchdata.stateful_dataloader import StatefulDataLoader
    from verl.utils.dataset.rl_dataset import collate_fn

    from tasks.verl_hooks import EvaCurriculumSampler

    def loader(sampler: EvaCurriculumSampler) -> StatefulDataLoader:
        return StatefulDataLoader(
            data,
            batch_size=2,
            num_workers=0,
            drop_last=True,
            collate_fn=collate_fn,
            sampler=sampler,
        )

    data = _dataset(tmp_path, OmegaConf, with_gen=True)
    cfg = OmegaConf.create({"sampler": {"eva": {"seed": 5}}})
    first_sampler = EvaCurriculumSampler(data, cfg)
    first_sampler.update(_batch(DataProto, torch, [0, 1, 2, 3], [1, 1, 0, 0, 1, 1, 0, 1]))
    run = loader(first_sampler)
    steps = iter(run)
    step1 = [int(i) for i in next(steps)["index"]]
    assert step1[0] == 3  # prompt 3's gap: drawn first
    saved = run.state_dict()
    step2 = [int(i) for i in next(steps)["index"]]

    resumed_sampler = EvaCurriculumSampler(data, cfg)
    resumed = loader(resumed_sampler)
    resumed.load_state_dict(saved)
    again = list(resumed)
    assert [int(i) for i in again[0]["index"]] == step2 and len(again) == 1
    np.testing.assert_array_equal(resumed_sampler.curriculum.priority, [0, 0, 0, 1])
    assert len(list(resumed)) == 2  # the next epoch is whole again

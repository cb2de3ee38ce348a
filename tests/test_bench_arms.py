"""The benchmark's baseline arms (bench.arms): new prompts every iteration instead of evolved
ones, never a held-out prompt, splits that never repeat."""

from __future__ import annotations

import pytest

from bench.arms import baseline_run, split_source
from eva_world import world
from flows.config import validate_config
from flows.run import eva_run
from tasks.store import RunStore
from tests.conftest import tiny_run_config, world_prompts

pytestmark = pytest.mark.usefixtures("prefect_api")


def test_fresh_arm_trains_on_a_new_disjoint_seed_split(tmp_path) -> None:
    root = str(tmp_path)
    # Fresh seed split: a new, disjoint prompt set from the seed distribution; no creator.
    cfg = validate_config(tiny_run_config(root, run="fresh"))
    baseline_run(cfg, "fresh")
    store = RunStore(root, "fresh")
    x0 = set(store.read_table(store.read_manifest(None, "prompts")["uri"]).column("prompt_id"))
    x1 = store.read_table(store.read_manifest(1, "prompts")["uri"])
    assert x1.num_rows == 24 and not x0 & set(x1.column("prompt_id"))
    assert set(x1.column("source").to_pylist()) == {"seed"}
    assert store.read_manifest(1, "score") is None and store.read_manifest(1, "train")


def _prompt_ids(store: RunStore, iteration: int | None, artifact: str) -> set[str]:
    manifest = store.read_manifest(iteration, artifact)
    return set(store.read_table(manifest["uri"]).column("prompt_id").to_pylist())


@pytest.mark.parametrize("strategy", ["eva", "fresh", "target"])
def test_no_arm_ever_trains_on_a_held_out_prompt(tmp_path, strategy) -> None:
    """End to end, for each arm: every prompt an iteration trains on (and every evolved prompt)
    is outside the held-out set, the baselines' splits never repeat one another, and the
    target arm draws from the target distribution. (Random collisions are rare at this size;
    test_split_and_evolve_skip_held_out_prompts forces them.)"""
    root = str(tmp_path)
    cfg = tiny_run_config(root, run=strategy, iterations=2)
    cfg["heldout"] = world_prompts("heldout", 400)
    if strategy == "eva":
        eva_run(validate_config(cfg))
    else:
        baseline_run(validate_config(cfg), strategy)
    store = RunStore(root, strategy)
    heldout = _prompt_ids(store, None, "heldout")
    trained = [_prompt_ids(store, t, "generate") for t in (0, 1, 2)]
    assert all(len(ids) == 24 for ids in trained)
    assert not heldout & set().union(*trained)
    if strategy == "eva":
        assert not heldout & _prompt_ids(store, 1, "evolve")
    else:
        assert not trained[0] & trained[1] and not trained[1] & trained[2]
        assert not trained[0] & trained[2]
        x2 = store.read_table(store.read_manifest(2, "prompts")["uri"]).column("prompt")
        dist = world.HELDOUT_DISTRIBUTION if strategy == "target" else world.SEED_DISTRIBUTION
        assert all(dist.contains(p) for p in x2.to_pylist())


def test_a_baseline_arm_refuses_a_prompt_file(tmp_path) -> None:
    cfg = tiny_run_config(str(tmp_path), prompts={"path": "x.jsonl"})
    with pytest.raises(ValueError, match="the fresh arm draws new prompts"):
        split_source(validate_config(cfg), "fresh")


def test_split_and_evolve_skip_held_out_prompts(tmp_path) -> None:
    """The guards themselves, with collisions forced: the held-out set is made of exactly the
    prompts an unguarded split (or the world evolver) would produce."""
    from bench.arms import load_split
    from eva_core.schema import seed_records
    from tasks.context import RunContext, StageContext, stage_seed
    from tasks.evolve import EvolveConfig, evolve
    from tasks.prompts import PromptsConfig
    from tests.conftest import world as component

    run = RunContext(root=str(tmp_path), run="t", seed=3)

    def ctx(t: int, artifact: str) -> StageContext:
        return StageContext(run, t, artifact, 5, {}, str(tmp_path), run.store(), lambda _: None)

    config = PromptsConfig.model_validate(world_prompts("seed", 20))
    unguarded = world.sample_prompts(
        world.SEED_DISTRIBUTION, 200, seed=stage_seed(3, None, "prompts")
    )
    # X_0 is the stream's first 20; split t starts window t of 2 x 20 prompts after it: split 1
    # would hold unguarded[20:40], split 2 unguarded[60:80].
    held = seed_records(unguarded[25:35])  # ten prompts split 1 would otherwise contain
    x0 = seed_records(unguarded[:20])
    split1 = load_split.fn(ctx(1, "prompts"), config, heldout=held, seed_set=x0).table
    split2 = load_split.fn(ctx(2, "prompts"), config, heldout=held, seed_set=x0).table
    p1, p2 = split1.column("prompt").to_pylist(), split2.column("prompt").to_pylist()
    assert p1[:5] == unguarded[20:25] and not set(p1) & set(unguarded[25:35])
    assert len(p1) == len(p2) == 20 and not set(p1) & set(p2)
    assert not set(unguarded[:20]) & set(p1 + p2)  # X_0 starts the stream: never drawn again
    # A split grown to reach the pair budget stays inside its window: still disjoint.
    grown = PromptsConfig.model_validate(world_prompts("seed", 20))
    options = {**grown.source.options, "topup": 2.0}
    grown = grown.model_copy(
        update={"source": grown.source.model_copy(update={"options": options})}
    )
    big1 = load_split.fn(ctx(1, "prompts"), grown, heldout=held, seed_set=x0).table
    big2 = load_split.fn(ctx(2, "prompts"), grown, heldout=held, seed_set=x0).table
    b1, b2 = big1.column("prompt").to_pylist(), big2.column("prompt").to_pylist()
    assert len(b1) == len(b2) == 40 and b1[:20] == p1 and not set(b1) & set(b2)
    # The target arm's stream has a seed of its own and skips X_0 too: made of exactly the
    # prompts its split 1 would otherwise start with, X_0 is never drawn by it.
    options = {**config.source.options, "distribution": "heldout", "stream": "target"}
    target = config.model_copy(
        update={"source": config.source.model_copy(update={"options": options})}
    )
    unguarded_target = world.sample_prompts(
        world.HELDOUT_DISTRIBUTION, 200, seed=stage_seed(3, None, "target")
    )
    x0_target = seed_records(unguarded_target[20:30])
    t1 = load_split.fn(ctx(1, "prompts"), target, heldout=held, seed_set=x0_target).table
    t1_prompts = t1.column("prompt").to_pylist()
    assert len(t1_prompts) == 20 and not set(t1_prompts) & set(unguarded_target[20:30])
    assert all(world.HELDOUT_DISTRIBUTION.contains(p) for p in t1_prompts)

    evolver = EvolveConfig.model_validate({"evolver": component("components:WorldRewriter")})
    parents = seed_records(["12+34=", "r:abc="], ["add", "rev"])
    everything = evolve.fn(ctx(1, "evolve"), evolver, subset=parents, heldout=held).table
    children = everything.column("prompt").to_pylist()
    blocked = seed_records(children[:3])
    out = evolve.fn(ctx(1, "evolve"), evolver, subset=parents, heldout=blocked)
    assert out.table.column("prompt").to_pylist() == children[3:]
    assert out.stats["dropped"]["heldout"] == 3

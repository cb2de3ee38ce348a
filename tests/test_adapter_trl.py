"""eva's creator in a user's own TRL script (``eva_adapters.trl``), driven by TRL's own
``GRPOTrainer`` with TRL's defaults (``shuffle_dataset`` on): every drawn group is observed once,
children are trained, and ``train(resume_from_checkpoint=...)`` continues exactly as an
uninterrupted run. Settings the feed cannot work with are refused when the trainer is built."""

from __future__ import annotations

import json
import re
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from eva_adapters.trl import CreatorFeed
from eva_core.creator import Creator

PROMPTS = [f"{i}+{i}=" for i in range(12)]


def tagger(parents: list[dict[str, Any]], n: int, seed: int) -> list[list[str]]:
    return [[f"{p['prompt']}{j}" for j in range(n)] for p in parents]


def first_char_reward(completions: list[str], answer: list[Any], **_: Any) -> list[Any]:
    """1 for a completion that starts with the prompt's answer digit (a column TRL passes); an
    evolved prompt has no answer (a rewrite has its own), so its reward is None, TRL's "not
    applicable", which the creator records as unscored."""
    return [None if a is None else float(c[:1] == a[:1])
            for c, a in zip(completions, answer, strict=True)]  # fmt: skip


def prompt_reward(prompts: list[str], **_: Any) -> list[float]:
    """A reward of the prompt and the sample's place in its group only (0, 1, 0, 1, ...: every
    group has a signal), so which prompts train does not depend on what the policy sampled."""
    return [float(len(p) % 3) + j % 2 for j, p in enumerate(prompts)]


def config(out: Path, **changes: Any) -> GRPOConfig:
    """A tiny GRPO run: what the docs' example sets, everything else TRL's default."""
    base: dict[str, Any] = dict(
        output_dir=str(out), max_steps=4, per_device_train_batch_size=4, num_generations=2,
        max_completion_length=3, learning_rate=1e-3, use_cpu=True, report_to=[], beta=0.0,
        save_strategy="no", disable_tqdm=True,
    )  # fmt: skip
    return GRPOConfig(**{**base, **changes})


def trainer(policy_dir: str, feed: CreatorFeed, args: GRPOConfig, reward: Any, **kw: Any):
    return GRPOTrainer(
        model=policy_dir, args=args, train_dataset=feed.dataset(),
        reward_funcs=[feed.recording(reward)], callbacks=[feed.callback(), *kw.get("more", [])],
    )  # fmt: skip


def watch(creator: Creator) -> list[str]:
    """The prompt ids the creator observes, in order."""
    observed: list[str] = []
    observe = creator.observe

    def spy(groups: Any) -> Any:
        groups = list(groups)
        observed.extend(pid for pid, _ in groups)
        return observe(groups)

    creator.observe = spy  # type: ignore[method-assign]
    return observed


def test_grpo_with_trls_defaults_trains_children_and_observes_each_group_once(
    policy_dir, tmp_path
) -> None:
    seeds = [{"prompt": p, "answer": str(2 * i)} for i, p in enumerate(PROMPTS)]
    creator = Creator(seeds, rewriter=tagger, size=4, n_new=2, top_fraction=0.5, seed=0)
    feed = CreatorFeed(creator, columns=["answer"])
    args = config(tmp_path)
    assert args.shuffle_dataset is True  # TRL's default
    observed = watch(creator)
    trainer(policy_dir, feed, args, first_char_reward).train()
    # 4 steps of 2 prompts, each group observed once, at its step's end; the loader fetched one
    # batch ahead (drawn, out, not trained): nothing more was drawn.
    assert len(observed) == 8 and len(set(observed)) == len(observed)
    assert creator.stats.drawn == 10 and len(creator.outstanding.records()) == 2
    assert creator.observations == 4 and creator.stats.parents == 4
    # Children (evolved evens with no answer column) joined B; mix-up drew from it later, and
    # the trainer sampled them: a group of a child came back to the creator.
    assert creator.stats.children > 0 and creator.buffer.phase == "mixup"
    seed_ids = {r["prompt_id"] for r in creator.buffer.seeds}
    assert any(pid not in seed_ids for pid in observed)
    print(f"trl {version('trl')}")


class StopAt(TrainerCallback):
    """Ends training after ``step`` (the checkpoint at that step is written first)."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if state.global_step == self.step:
            control.should_training_stop = True


def test_resume_from_checkpoint_continues_as_an_uninterrupted_run(policy_dir, tmp_path) -> None:
    def run(out: Path, resume: str | None = None, stop: int | None = None):
        creator = Creator(PROMPTS, rewriter=tagger, size=4, n_new=2, seed=0)
        feed = CreatorFeed(creator)
        args = config(out, max_steps=6, save_strategy="steps", save_steps=3)
        more = [StopAt(stop)] if stop else []
        observed = watch(creator)
        trainer(policy_dir, feed, args, prompt_reward, more=more).train(
            resume_from_checkpoint=resume
        )
        return creator, observed

    whole, everything = run(tmp_path / "whole")
    _, first = run(tmp_path / "cut", stop=3)
    saved = json.loads((tmp_path / "cut/checkpoint-3/trainer_state.json").read_text())
    pending = saved["stateful_callbacks"]["FeedCallback"]["attributes"]["eva"]["pending"]
    assert [d["step"] for d in pending] == [3]  # fetched ahead of step 3, not trained
    rest_creator, rest = run(tmp_path / "cut", resume=str(tmp_path / "cut/checkpoint-3"))
    # The same 12 prompts trained, each observed once, and the creators end alike.
    assert len(everything) == 12 and first + rest == everything
    assert json.dumps(rest_creator.state(), sort_keys=True) == json.dumps(
        whole.state(), sort_keys=True
    )
    # 6 steps of 2 prompts are one epoch of the 12 slots: its last batch has nothing after it to
    # fetch ahead, so nothing more than what trained was drawn.
    assert rest_creator.stats.drawn == whole.stats.drawn == 12 == whole.stats.observed


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        (dict(dataloader_num_workers=2), "dataloader_num_workers must be 0"),
        (dict(remove_unused_columns=True), "needs remove_unused_columns=False"),
        (dict(restore_callback_states_from_checkpoint=True),
         "needs restore_callback_states_from_checkpoint=False"),
        (dict(steps_per_generation=2, save_strategy="steps", save_steps=3),
         "save_steps=3 must be a multiple of steps_per_generation x num_iterations = 2"),
    ],
)  # fmt: skip
def test_what_the_feed_cannot_work_with_is_refused_when_the_trainer_is_built(
    policy_dir, tmp_path, changes: dict[str, Any], says: str
) -> None:
    feed = CreatorFeed(Creator(PROMPTS))
    with pytest.raises(ValueError, match=f"^eva_adapters.trl.CreatorFeed {says}"):
        trainer(policy_dir, feed, config(tmp_path, **changes), prompt_reward)
    assert feed.creator.stats.drawn == 0


def test_a_generation_batch_repeated_over_its_steps_is_one_draw(policy_dir, tmp_path) -> None:
    creator = Creator(PROMPTS, rewriter=tagger, size=4, n_new=2, seed=0)
    feed = CreatorFeed(creator)
    # 2 steps per generation batch of 4 prompts (2 a step): 4 steps are 2 generations.
    args = config(tmp_path, per_device_train_batch_size=4, steps_per_generation=2)
    observed = watch(creator)
    trainer(policy_dir, feed, args, prompt_reward).train()
    assert len(observed) == 8 and creator.observations == 2
    assert creator.stats.drawn == 12  # 2 generations of 4, and the next one fetched ahead


def test_a_trainer_without_the_callback_stops_at_the_next_draw(policy_dir, tmp_path) -> None:
    feed = CreatorFeed(Creator(PROMPTS))
    bare = GRPOTrainer(
        model=policy_dir, args=config(tmp_path), train_dataset=feed.dataset(),
        reward_funcs=[feed.recording(prompt_reward)],
    )  # fmt: skip
    with pytest.raises(RuntimeError, match=r"pass feed.callback\(\) in the trainer's callbacks"):
        bare.train()


def docs_example() -> str:
    """The TRL example of docs/trainers.md, as a user copies it."""
    docs = (Path(__file__).parents[1] / "docs" / "trainers.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", docs, re.S)
    (example,) = [b for b in blocks if "CreatorFeed" in b]
    return example


def test_the_docs_example_runs_as_written(policy_dir, tmp_path, monkeypatch) -> None:
    """docs/trainers.md's TRL example, run as written with TRL's defaults: only the sizes a CPU
    test needs are made small (steps, batch, completion length), through ``GRPOConfig``."""
    import trl

    small = dict(
        max_steps=4, per_device_train_batch_size=4, num_generations=2, max_completion_length=3,
        use_cpu=True, report_to=[], disable_tqdm=True,
    )  # fmt: skip
    monkeypatch.setattr(trl, "GRPOConfig", lambda **kw: GRPOConfig(**{**kw, **small}))
    monkeypatch.chdir(tmp_path)
    seeds = [{"prompt": p, "answer": str(2 * i)} for i, p in enumerate(PROMPTS)]
    space: dict[str, Any] = dict(seeds=seeds, my_rewriter=tagger, model=policy_dir,
                                 my_reward=first_char_reward, buffer_size=4)  # fmt: skip
    observed: list[str] = []
    observe = Creator.observe

    def watched(self: Creator, groups: Any) -> Any:
        groups = list(groups)
        observed.extend(pid for pid, _ in groups)
        return observe(self, groups)

    monkeypatch.setattr(Creator, "observe", watched)
    exec(compile(docs_example(), "docs/trainers.md", "exec"), space)
    creator, trainer = space["creator"], space["trainer"]
    assert trainer.args.shuffle_dataset is True and trainer.state.global_step == 4
    assert creator.stats.observed == 8 and creator.stats.drawn == 10  # one batch fetched ahead
    # each drawn group observed once; children joined B, B filled (mix-up), and the trainer
    # trained children: their groups came back to the creator.
    assert len(observed) == 8 and len(set(observed)) == 8
    seed_ids = {r["prompt_id"] for r in creator.buffer.seeds}
    assert creator.stats.children > 0 and creator.buffer.phase == "mixup"
    assert any(pid not in seed_ids for pid in observed)

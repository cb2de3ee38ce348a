"""eva's creator in a user's own TRL script (eva_adapters.trl), driven by TRL's GRPOTrainer and
its public seams only: the streaming dataset, a reward function, a callback."""

from __future__ import annotations

from importlib.metadata import version
from typing import Any

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


def test_grpo_trains_on_the_creators_draws_and_reports_every_group(policy_dir, tmp_path) -> None:
    seeds = [{"prompt": p, "answer": str(2 * i)} for i, p in enumerate(PROMPTS)]
    creator = Creator(seeds, rewriter=tagger, size=4, n_new=2, top_fraction=0.5, seed=0)
    feed = CreatorFeed(creator, prompts_per_step=2, columns=["answer"])
    args = GRPOConfig(
        output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=4, num_generations=2,
        steps_per_generation=1, max_completion_length=3, learning_rate=1e-3, use_cpu=True,
        report_to=[], save_strategy="no", logging_steps=1, shuffle_dataset=False, beta=0.0,
        disable_tqdm=True,
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=policy_dir, args=args, train_dataset=feed.dataset(),
        reward_funcs=[feed.recording(first_char_reward)], callbacks=[feed.callback()],
    )  # fmt: skip
    observed: list[str] = []
    observe = creator.observe
    creator.observe = lambda groups: observe(observed.extend(g[0] for g in groups) or groups)  # type: ignore[method-assign]
    trainer.train()
    # 4 steps x 2 prompts, each group of 2 rewards observed once, at its step's end.
    assert creator.stats.observed == 8 and not feed._rows
    assert creator.observations == 4 and creator.stats.parents == 4
    # Children (evolved evens with no answer column) joined B; mix-up drew from it later.
    assert creator.stats.children > 0 and creator.buffer.phase == "mixup"
    # and the trainer sampled them: a group of a child came back to the creator.
    seed_ids = {r["prompt_id"] for r in creator.buffer.seeds}
    assert any(pid not in seed_ids for pid in observed)
    print(f"trl {version('trl')}")

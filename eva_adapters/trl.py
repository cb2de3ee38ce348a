"""eva's creator in a TRL script of your own, on TRL's public seams only.

    from eva_adapters.trl import CreatorFeed
    feed = CreatorFeed(creator, prompts_per_step=16)
    trainer = GRPOTrainer(
        model=..., args=GRPOConfig(max_steps=500, per_device_train_batch_size=16 * 8,
                                   num_generations=8, steps_per_generation=1, ...),
        train_dataset=feed.dataset(),          # a streaming IterableDataset (max_steps required)
        reward_funcs=[feed.recording(my_reward)],   # your reward, its values also sent to eva
        callbacks=[feed.callback()],           # on_step_end: the creator observes the groups
    )

The stream yields ``prompts_per_step`` prompts per draw, each with its ``prompt_id`` and an
``eva_row`` column (its draw and position), which TRL hands back to reward functions as keyword
arguments; the recording reward groups each completion's reward under its row, and at each
optimizer step's end every group recorded so far goes to ``creator.observe``. Nothing depends on
how TRL lays out or orders a batch. One process: with several, each would need its own creator.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import datasets
from transformers import TrainerCallback

from eva_core.creator import Creator


class CreatorFeed:
    """The creator's draws as a TRL prompt stream; rewards back to it at every step's end."""

    def __init__(self, creator: Creator, prompts_per_step: int, columns: Sequence[str] = ()):
        if prompts_per_step < 1:
            raise ValueError(f"prompts_per_step must be >= 1, got {prompts_per_step}")
        self.creator = creator
        self.prompts_per_step = prompts_per_step
        self.columns = tuple(columns)  # record columns streamed beside prompt (e.g. "answer")
        self.draws = 0
        self._rows: dict[str, tuple[str, list[float]]] = {}  # eva_row -> (prompt_id, rewards)

    def records(self) -> Iterator[dict[str, Any]]:
        while True:
            for i, record in enumerate(self.creator.draw(self.prompts_per_step)):
                row = {"prompt": record["prompt"], "prompt_id": record["prompt_id"]}
                row.update({c: record.get(c) for c in self.columns})
                yield {**row, "eva_row": f"{self.draws}:{i}"}
            self.draws += 1

    def dataset(self) -> datasets.IterableDataset:
        """A streaming dataset over ``records()`` (pass it as ``train_dataset``)."""
        return datasets.IterableDataset.from_generator(_stream, gen_kwargs={"feed": _Handle(self)})

    def recording(self, reward: Callable[..., Sequence[float | None]]) -> Callable[..., Any]:
        """``reward`` as TRL calls it, its values also recorded for the creator (None, TRL's
        "not applicable", is recorded as NaN: an unscored response)."""

        def recorded(
            prompts: Sequence[Any], completions: Sequence[Any], eva_row: Sequence[str], **kw: Any
        ) -> list[float | None]:
            values = list(reward(prompts=prompts, completions=completions, **kw))
            ids = kw["prompt_id"]
            for row, pid, value in zip(eva_row, ids, values, strict=True):
                group = self._rows.setdefault(row, (pid, []))
                group[1].append(float("nan") if value is None else float(value))
            return values

        recorded.__name__ = getattr(reward, "__name__", "reward")
        return recorded

    def observe(self) -> int:
        """Hand every group recorded so far to the creator; returns how many."""
        groups = [(pid, rewards) for pid, rewards in self._rows.values()]
        self._rows.clear()
        if groups:
            self.creator.observe(groups)
        return len(groups)

    def callback(self) -> TrainerCallback:
        feed = self

        class ObserveAtStepEnd(TrainerCallback):
            def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                feed.observe()

        return ObserveAtStepEnd()


class _Handle:
    """Lets ``datasets`` fingerprint the stream without pickling the creator."""

    def __init__(self, feed: CreatorFeed):
        self.feed = feed

    def __reduce__(self) -> tuple[Any, ...]:
        return (str, ("eva-creator-feed",))


def _stream(feed: _Handle) -> Iterator[dict[str, Any]]:
    yield from feed.feed.records()

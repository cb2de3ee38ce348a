"""eva's creator in a TRL trainer (GRPO, RLOO, online DPO): the one bridge between TRL and the
creator, on TRL's and transformers' public seams only. ``eva online`` and the GRPO recipe
(``infra/trl/grpo_math.py``) run on it too.

    from eva_adapters.trl import CreatorFeed
    feed = CreatorFeed(creator, columns=["answer"])
    trainer = GRPOTrainer(
        model=..., args=GRPOConfig(max_steps=500, ...),   # TRL's defaults, shuffle included
        train_dataset=feed.dataset(),               # the creator's draws, as TRL asks for them
        reward_funcs=[feed.recording(my_reward)],   # your reward, its values also sent to eva
        callbacks=[feed.callback()],                # observes each step's groups; saves, resumes
    )
    trainer.train()                                  # or train(resume_from_checkpoint=...)

How, in TRL 1.16 / transformers 5.2x:

* The dataset is map-style: one anonymous ``eva_slot`` per prompt of a pass over the seeds, with
  a transform (``datasets.Dataset.with_transform``) that runs when the trainer's data loader
  fetches a batch. Whatever order TRL's sampler puts the slots in (``shuffle_dataset``, its
  default, permutes them), each fetch becomes one draw of as many prompts as it holds distinct
  slots, made when the batch is fetched: the creator is never drawn from ahead of what the
  next step needs (accelerate's loader fetches one batch ahead). GRPO and RLOO fetch a
  generation batch again for each of its ``steps_per_generation x num_iterations`` steps: a
  repeated fetch is the same draw.
* The reward wrapper records each completion's reward under its prompt's row (``eva_row``, a
  column TRL hands every reward function); nothing depends on how TRL lays out a batch.
* The callback observes every draw whose rows were all scored at each optimizer step's end, and
  is an ``ExportableState``: transformers writes the feed's state (the creator and the draws
  fetched ahead and not trained) into each checkpoint's ``trainer_state.json``, and when
  ``train(resume_from_checkpoint=...)`` starts from one, the callback restores it before the
  first fetch. A map-style loader skips the trained batches without fetching them, so the
  resumed run draws and trains exactly what an uninterrupted one does.
* Refused when the trainer is built, in one line naming the argument: several processes or data
  loader workers (each would draw from a copy of the creator), ``remove_unused_columns``
  (it would drop the slots), ``restore_callback_states_from_checkpoint`` (it would rebuild the
  callback without its feed), and checkpoints inside a generation batch's steps.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import datasets
from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from eva_core.creator import Creator, Observation
from eva_core.creator_records import Record

SLOT = "eva_slot"  # the dataset's one column, read by the transform only
ROW = "eva_row"  # the column naming each streamed prompt's draw and position


@dataclass
class Draw:
    """One fetch's prompts: its index (draws so far), records and the buffer's phase then."""

    index: int
    records: list[Record]
    phase: str

    def rows(self) -> list[str]:
        return [f"{self.index}:{i}" for i in range(len(self.records))]


Observed = Callable[[Draw, list[list[float]], Observation], None]


class CreatorFeed:
    """The creator's draws as a TRL dataset, rewards back at each step's end (module doc).

    ``columns``: record columns streamed beside the prompt (a seed's ``answer``: TRL passes them
    to reward functions); ``prompt``: how a record becomes TRL's ``prompt`` (default its text;
    ``eva online`` passes a user turn for a chat template); ``on_observed``: called with each
    draw, its rewards and the creator's ``Observation`` once observed."""

    def __init__(
        self,
        creator: Creator,
        columns: Sequence[str] = (),
        *,
        prompt: Callable[[Record], Any] | None = None,
        on_observed: Observed | None = None,
    ):
        self.creator = creator
        self.columns = tuple(columns)
        self.prompt = prompt or (lambda record: record["prompt"])
        self.on_observed = on_observed
        self.draws = 0  # draws made so far: the next draw's index
        self.pending: deque[Draw] = deque()  # drawn, not observed yet, oldest first
        self.repeats = 1  # fetches of one draw (GRPO/RLOO: steps_per_generation x num_iterations)
        self._replay: deque[Draw] = deque()  # restored draws, fetched again before any new one
        self._last: tuple[tuple[int, ...], Draw, int] | None = None  # slots, draw, times fetched
        self._scores: dict[str, list[float]] = {}  # row -> rewards recorded since the last step

    # --- TRL's three seams -----------------------------------------------------------------

    def dataset(self, slots: int | None = None) -> datasets.Dataset:
        """The training dataset: ``slots`` anonymous rows (default: one per seed prompt, so an
        epoch is a pass's worth of prompts), each turned into a drawn prompt when fetched."""
        count = slots or len(self.creator.buffer.seeds)
        table = datasets.Dataset.from_dict({SLOT: list(range(count))})
        return table.with_transform(_Transform(self))

    def recording(self, reward: Callable[..., Sequence[float | None]]) -> Callable[..., Any]:
        """``reward`` as TRL calls it (every keyword passed on), its values also recorded for
        the creator (None, TRL's "not applicable", is recorded as NaN: an unscored response).
        Wrap the one reward eva should read; rows of other datasets are not recorded."""

        def recorded(prompts: Sequence[Any], completions: Sequence[Any], **kw: Any) -> list[Any]:
            values = list(reward(prompts=prompts, completions=completions, **kw))
            if kw.get(ROW) is not None:
                self.record(kw[ROW], values)
            return values

        recorded.__name__ = getattr(reward, "__name__", "reward")
        return recorded

    def callback(self) -> FeedCallback:
        """The trainer callback: checks the trainer's arguments, observes at each step's end,
        saves the feed in checkpoints and restores it on resume."""
        return FeedCallback(self)

    # --- draw, record, observe -------------------------------------------------------------

    def fetch(self, slots: Sequence[int]) -> dict[str, list[Any]]:
        """The rows for one fetched batch of slots (the dataset's transform)."""
        key = tuple(int(s) for s in slots)
        distinct = list(dict.fromkeys(key))
        if self._last is not None and self._last[2] < self.repeats:
            last, draw, times = self._last
            if last != key:
                raise RuntimeError(
                    f"TRL fetched {len(distinct)} new slots where it repeats a generation batch "
                    f"({times} of {self.repeats} fetches): its loader no longer repeats as eva "
                    "expects"
                )
            self._last = (key, draw, times + 1)
        else:
            draw = self._replay.popleft() if self._replay else self._draw(len(distinct))
            if len(draw.records) != len(distinct):
                raise RuntimeError(
                    f"the trainer fetched {len(distinct)} prompts where the checkpoint's draw "
                    f"{draw.index} holds {len(draw.records)}: resume with the batch size it had"
                )
            self._last = (key, draw, 1)
        position = {slot: i for i, slot in enumerate(distinct)}
        records = [(draw.records[position[s]], position[s]) for s in key]
        return {
            "prompt": [self.prompt(r) for r, _ in records],
            "prompt_id": [r["prompt_id"] for r, _ in records],
            ROW: [f"{draw.index}:{i}" for _, i in records],
            **{c: [r.get(c) for r, _ in records] for c in self.columns},
        }

    def _draw(self, k: int) -> Draw:
        if any(all(row in self._scores for row in d.rows()) for d in self.pending):
            raise RuntimeError(
                "rewards were recorded for a whole draw and no step end observed them: pass "
                "feed.callback() in the trainer's callbacks"
            )
        records = self.creator.draw(k)
        if len(records) < k:
            raise RuntimeError(f"the creator ran dry: {len(records)} prompts for {k}")
        draw = Draw(self.draws, records, self.creator.buffer.phase)
        self.draws += 1
        self.pending.append(draw)
        return draw

    def record(self, rows: Sequence[str], values: Sequence[float | None]) -> None:
        """Record each completion's reward under its row (``rows[j]`` for ``values[j]``)."""
        live = {d.index for d in self.pending}
        for row, value in zip(rows, values, strict=True):
            if int(str(row).split(":")[0]) not in live:
                raise RuntimeError(f"row {row} was scored after its draw was observed")
            self._scores.setdefault(row, []).append(math.nan if value is None else float(value))

    def observe(self) -> int:
        """Hand every draw whose rows were all scored to the creator (one ``observe`` per draw,
        in draw order); returns how many groups. A draw scored in part is refused: the trainer
        trained on only part of what it fetched."""
        done = 0
        for draw in list(self.pending):
            rows = draw.rows()
            scored = sum(row in self._scores for row in rows)
            if scored == 0:
                continue
            if scored < len(rows):
                raise RuntimeError(
                    f"a step ended with {scored} of draw {draw.index}'s {len(rows)} prompts "
                    "scored (a second process, or a reward function wrapped twice?)"
                )
            rewards = [self._scores[row] for row in rows]
            seen = self.creator.observe(
                (r["prompt_id"], x) for r, x in zip(draw.records, rewards, strict=True)
            )
            for row in rows:
                del self._scores[row]
            self.pending.remove(draw)
            if self.on_observed is not None:
                self.on_observed(draw, rewards, seen)
            done += len(rows)
        return done

    # --- state -----------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """The creator's state and the draws fetched and not trained yet, JSON-ready."""
        return {
            "creator": self.creator.state(),
            "drawn": self.draws,
            "pending": [
                {"step": d.index, "records": d.records, "phase": d.phase} for d in self.pending
            ],
        }

    def load_state(self, state: dict[str, Any], *, creator: bool = True) -> None:
        """Resume at a saved ``state()``: the creator (unless ``creator`` is False: it was
        built from the state already) and the draws fetched and not trained, which the next
        fetches serve before anything new is drawn."""
        if creator:
            self.creator.load_state(state["creator"])
        self.draws = int(state.get("drawn", 0))
        self.pending = deque(
            Draw(int(d["step"]), list(d["records"]), str(d["phase"]))
            for d in state.get("pending", [])
        )
        out = {pid for r in self.creator.outstanding.records() for pid in [r["prompt_id"]]}
        if lost := [
            r["prompt_id"] for d in self.pending for r in d.records if r["prompt_id"] not in out
        ]:
            raise ValueError(
                f"saved feed state: pending prompt {lost[0]} is not out in its creator"
            )
        self._replay = deque(self.pending)
        self._last = None
        self._scores.clear()

    def check_trainer(self, args: Any) -> None:
        """Refuse, in one line naming the argument, a trainer the feed cannot work with."""
        self.repeats = int(getattr(args, "steps_per_generation", None) or 1) * int(
            getattr(args, "num_iterations", None) or 1
        )
        strategy = str(getattr(args.save_strategy, "value", args.save_strategy))
        steps = args.save_steps
        problems = [
            (args.dataloader_num_workers != 0, "dataloader_num_workers must be 0: a worker "
             "process would draw from a copy of the creator"),
            (args.world_size != 1, f"runs in one process, not {args.world_size}: each would "
             "need its own creator"),
            (args.remove_unused_columns, "needs remove_unused_columns=False (TRL's default): "
             f"the loader reads the {SLOT} column the trainer's model does not take"),
            (args.restore_callback_states_from_checkpoint, "needs "
             "restore_callback_states_from_checkpoint=False: the feed restores the creator from "
             "the checkpoint itself"),
            (strategy == "steps" and float(steps).is_integer() and steps >= 1
             and int(steps) % self.repeats != 0,
             f"save_steps={steps} must be a multiple of steps_per_generation x num_iterations "
             f"= {self.repeats}: a checkpoint inside a generation batch cannot resume it"),
        ]  # fmt: skip
        for bad, message in problems:
            if bad:
                raise ValueError(f"eva_adapters.trl.CreatorFeed {message}")


class FeedCallback(TrainerCallback, ExportableState):
    """The feed's callback (module doc)."""

    def __init__(self, feed: CreatorFeed):
        self.feed = feed

    def on_init_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.feed.check_trainer(args)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if state.global_step == 0:
            return
        saved = state.stateful_callbacks.get(type(self).__name__)
        if not isinstance(saved, dict) or "eva" not in saved.get("attributes", {}):
            raise ValueError(
                f"resuming at step {state.global_step} from a checkpoint that holds no eva "
                "creator state (saved without this feed's callback?)"
            )
        self.feed.load_state(saved["attributes"]["eva"])

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.feed.observe()

    def state(self) -> dict[str, Any]:
        """What transformers writes into each checkpoint (``ExportableState``)."""
        return {"args": {}, "attributes": {"eva": self.feed.state()}}


class _Transform:
    """The dataset's transform: a fetched batch of slots to drawn prompts. ``datasets`` hashes
    a transform to fingerprint the dataset; this one hashes as a constant instead of pickling
    the creator, and is never copied."""

    def __init__(self, feed: CreatorFeed):
        self.feed = feed

    def __call__(self, batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        return self.feed.fetch(batch[SLOT])

    def __reduce__(self) -> tuple[Any, ...]:
        return (str, ("eva-creator-feed",))

    def __deepcopy__(self, memo: dict[int, Any]) -> _Transform:
        return self

"""What NeMo-RL's two eva seams share (``eva_adapters.nemo_rl``): the dataset that draws
prompts and the sampler that reads back their groups find one creator, in this process's
registry under a name (``eva_name``), and a finished group finds its prompt by the prompt's
token ids, the only trace of it that NeMo-RL's replay buffer keeps.

NeMo-RL builds the dataset on the driver and ships it with the dataloader to the
SingleController actor, which builds the sampler there: unpickling registers the copy that
arrived, so the sampler observes into the creator the dataloader draws from. With a
``state_path`` the creator's state (and what this side holds: prompts drawn and not handed out,
handed out and not finished, finished and not observed) is written after every observation,
since NeMo-RL gives a sampler no checkpoint hook.
"""

from __future__ import annotations

import json
import os
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from eva_core.creator import Creator, Observation
from eva_core.creator_records import Record

Key = tuple[int, ...]  # a prompt's token ids

_REGISTRY: dict[str, SharedCreator] = {}


class SharedCreator:
    """The creator both seams use, with what ties a group back to its prompt: the token ids of
    each prompt handed out (a queue per key: the same prompt may be out twice). Registered
    under its name when made and again when unpickled, so each process finds its own copy."""

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
        register(self)

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

    def restore(self) -> None:
        """This side's part of the state file, where one was written (the creator's own part
        is read by ``eva_adapters.common.build_creator``)."""
        if not self.state_path or not os.path.exists(self.state_path):
            return
        with open(self.state_path, encoding="utf-8") as f:
            extra = json.load(f).get("nemo_rl", {})
        self.queue = deque(extra.get("queue", []))
        self.keys = {tuple(k): deque(ids) for k, ids in extra.get("keys", [])}
        self.pending = [(pid, list(r)) for pid, r in extra.get("pending", [])]


def shared(name: str = "eva") -> SharedCreator | None:
    """The creator this process's eva dataset registered under ``name``, if any."""
    return _REGISTRY.get(name)


def register(state: SharedCreator) -> None:
    """Make ``state`` the creator ``shared(state.name)`` finds in this process."""
    _REGISTRY[state.name] = state


def prompt_key(message_log: Sequence[Mapping[str, Any]]) -> Key:
    """A prompt's token ids, as ``prompt_ids_for_adv`` holds them (its messages' in order)."""
    return tuple(int(t) for m in message_log for t in m["token_ids"].reshape(-1).tolist())


def _write_json(path: str, state: Mapping[str, Any]) -> None:
    """Write ``state`` to ``path`` atomically (a crash leaves the old file whole)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(state, f)
    os.replace(tmp, path)

"""eva inside verl, the part that needs no verl: settings, per-prompt rewards from a step's
rollouts, the informativeness-weighted epoch order, and evolved children as verl rows.

``tasks.verl_hooks`` wraps these in the classes verl loads by config (a curriculum sampler,
a prompt generator, a dataset that calls it); this module imports neither verl nor torch, so its
logic is tested in the default suite. The metric, the weighted draw and the lineage/clean-up of
rewrites are eva_core's own (``informativeness``, ``select_subset``, ``evolved_records``).

A verl training row is ``prompt`` (a chat list), ``reward_model``, ``extra_info{index, ...}``;
eva keeps its lineage in ``extra_info`` (``eva_prompt_id``, ``eva_parent_id``, ``eva_root_id``,
``eva_depth``, ``parent_index``) and a child's starting priority in ``eva_priority``: its
parent's informativeness, the rule of eva's prioritized buffer (``eva_core.buffer``).
"""

from __future__ import annotations

import copy
import importlib
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from eva_core.evolution import evolved_records
from eva_core.informativeness import Metric, informativeness
from eva_core.sampling import SampleMethod, select_subset
from eva_core.schema import PROMPT_SCHEMA, prompt_id
from eva_runtime.errors import EvaError

LINEAGE_KEYS = ("eva_prompt_id", "eva_parent_id", "eva_root_id", "eva_depth", "parent_index")
PRIORITY_KEY = "eva_priority"
M = TypeVar("M", bound=BaseModel)


class SamplerSettings(BaseModel):
    """``data.sampler.eva``: how the curriculum sampler ranks the dataset's prompts."""

    model_config = ConfigDict(extra="forbid")
    metric: Metric = Field(
        default="a_min", description="Informativeness of a prompt from its rollouts' rewards."
    )
    seed: int = Field(default=0, description="Seed of the weighted draws (with epoch and step).")


class GeneratorSettings(BaseModel):
    """``data.datagen.eva``: which prompts are evolved after a step, and by what."""

    model_config = ConfigDict(extra="forbid")
    rewriter: str = Field(
        description="'module:function' called as f(prompts: list[str], n: int, seed: int) "
        "-> list[list[str]] (n rewrites of each prompt)."
    )
    metric: Metric = Field(default="a_min", description="Informativeness used to pick parents.")
    top_fraction: float = Field(
        default=0.25, gt=0, le=1, description="Share of each step's prompts that are evolved."
    )
    sample_method: SampleMethod = Field(
        default="greedy", description="How parents are picked: greedy (top), weighted, uniform."
    )
    n_new: int = Field(default=2, ge=1, description="Rewrites asked for each parent.")
    max_chars: int | None = Field(default=None, description="Drop rewrites longer than this.")
    seed: int = Field(default=0, description="Seed of parent picks and of the rewriter.")


def settings(model: type[M], raw: Any, where: str) -> M:
    """Validate an ``eva`` sub-dict of verl's config (an OmegaConf node or a plain dict)."""
    if raw is not None and not isinstance(raw, dict):
        from omegaconf import OmegaConf  # verl's config is OmegaConf; only then is this needed

        raw = OmegaConf.to_container(raw, resolve=True)
    try:
        return model.model_validate(raw or {})
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        raise EvaError(f"{where}.{field}: {err['msg']}", field=f"{where}.{field}") from exc


def prompt_rewards(
    scores: np.ndarray, uids: Sequence[Any], indices: Sequence[Any]
) -> tuple[list[int], np.ndarray]:
    """One reward row per prompt of a step: rollouts grouped by ``uid`` (verl gives the n
    rollouts of one drawn prompt one uid), in first-seen order; ragged groups NaN-padded.
    Returns each group's ``extra_info.index`` and the (prompts, n) matrix."""
    if not len(scores) == len(uids) == len(indices):
        raise ValueError(f"{len(scores)} scores, {len(uids)} uids, {len(indices)} indices")
    groups: dict[Any, list[int]] = {}
    for row, uid in enumerate(uids):
        groups.setdefault(uid, []).append(row)
    width = max((len(rows) for rows in groups.values()), default=0)
    matrix = np.full((len(groups), width), np.nan)
    for g, rows in enumerate(groups.values()):
        matrix[g, : len(rows)] = np.asarray(scores, dtype=np.float64)[rows]
    return [int(indices[rows[0]]) for rows in groups.values()], matrix


class Curriculum:
    """Per-position priorities over a growing dataset and the order of one epoch.

    A position not yet scored (and without an inherited ``eva_priority``) is weighted by the
    largest priority seen so far (1 before any score), so every prompt is tried early; a scored
    prompt keeps its latest informativeness. An epoch yields as many positions as the dataset
    had when it began, each at most once, drawn by ``select_subset(..., "weighted")`` among the
    positions not yet drawn, redrawn whenever scores or the dataset changed; children that
    arrive mid-epoch compete at once with the seeds still waiting.
    """

    def __init__(self, metric: str, seed: int) -> None:
        self.metric, self.seed = metric, seed
        self.priority = np.zeros(0)
        self.position: dict[int, int] = {}  # extra_info.index -> dataset position
        self.epoch = 0
        self.version = 0  # bumped by every change that can reorder the rest of an epoch
        # The epoch in progress: its length, positions drawn, the order drawn for the rest and
        # the version it was drawn at (all saved, so a resumed epoch goes on exactly as it would).
        self._total, self._resume, self._seen = 0, False, -1
        self._drawn: list[int] = []
        self._pending: list[int] = []

    def __len__(self) -> int:
        return len(self.priority)

    def extend(self, indices: Sequence[Any], priorities: Sequence[float] | None = None) -> None:
        """Positions ``len(self)...`` with these ``extra_info.index`` values."""
        start = len(self.priority)
        for offset, index in enumerate(indices):
            if index is None or int(index) in self.position:
                raise EvaError(
                    f"dataset row {start + offset} has extra_info.index {index!r}, which is "
                    "missing or not unique",
                    field="extra_info.index",
                    hint="give every row of the verl parquet a distinct extra_info.index",
                )
            self.position[int(index)] = start + offset
        new = np.full(len(indices), np.nan)
        if priorities is not None:
            new[:] = [np.nan if p is None else float(p) for p in priorities]
        self.priority = np.concatenate([self.priority, new])
        self.version += 1

    def observe(self, indices: Sequence[int], rewards: np.ndarray) -> np.ndarray:
        """Set each prompt's priority to its informativeness from this step's rewards."""
        info = informativeness(rewards, self.metric)
        for index, value in zip(indices, info, strict=True):
            if index not in self.position:
                raise EvaError(f"a rollout names extra_info.index {index}, not in the dataset")
            self.priority[self.position[index]] = 0.0 if np.isnan(value) else float(value)
        self.version += 1
        return info

    def weights(self) -> np.ndarray:
        scored = ~np.isnan(self.priority)
        prior = float(self.priority[scored].max()) if scored.any() else 1.0
        return np.where(scored, self.priority, prior if prior > 0 else 1.0)

    def iterate(self, sync: Callable[[], None]) -> Iterator[int]:
        """One epoch of positions; ``sync`` adds rows the dataset gained since the last call.
        After ``load`` it continues the saved epoch where it stopped: verl's StatefulDataLoader
        skips nothing itself for a sampler that has a state of its own."""
        sync()
        if not self._resume:
            self._total, self._drawn, self._pending, self._seen = len(self), [], [], -1
        self._resume = False
        drawn = np.zeros(len(self), dtype=bool)
        drawn[self._drawn] = True
        for step in range(len(self._drawn), self._total):
            sync()
            if len(drawn) < len(self):
                drawn = np.concatenate([drawn, np.zeros(len(self) - len(drawn), dtype=bool)])
            if self._seen != self.version or not self._pending:
                rest = np.flatnonzero(~drawn)
                w = self.weights()[rest]
                order = select_subset(w, len(rest), "weighted", _mix(self.seed, self.epoch, step))
                self._pending, self._seen = [int(rest[i]) for i in order.indices], self.version
            position = self._pending.pop(0)
            drawn[position] = True
            self._drawn.append(position)
            yield position
        self.epoch += 1
        self._total, self._drawn, self._pending = 0, [], []

    def state(self) -> dict[str, Any]:
        return {
            "priority": self.priority.tolist(),
            "epoch": self.epoch,
            "total": self._total,
            "drawn": list(self._drawn),
            "pending": list(self._pending),
            "stale": self._seen != self.version,  # scores changed since the order was drawn
        }

    def load(self, state: dict[str, Any]) -> None:
        """Priorities of the rows this dataset has (children a resumed dataset no longer holds
        are dropped) and the position in the saved epoch."""
        saved = np.asarray(state["priority"], dtype=np.float64)
        self.priority[: len(saved)] = saved[: len(self.priority)]
        self.epoch = int(state["epoch"])
        drawn = [int(p) for p in state.get("drawn", []) if int(p) < len(self.priority)]
        self._total = min(int(state.get("total", 0)), len(self.priority))
        self._drawn, self._resume = drawn, bool(drawn) and len(drawn) < self._total
        self._pending = [int(p) for p in state.get("pending", []) if int(p) < len(self.priority)]
        self.version += 1
        self._seen = -1 if state.get("stale", True) else self.version


def load_rewriter(path: str) -> Callable[[list[str], int, int], list[list[str]]]:
    module, _, name = path.partition(":")
    try:
        fn: Any = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise EvaError(
            f"cannot load the rewriter {path!r}: {exc}",
            field="data.datagen.eva.rewriter",
            hint="write it as 'package.module:function'",
        ) from exc
    if not callable(fn):
        raise EvaError(f"the rewriter {path!r} is not callable", field="data.datagen.eva.rewriter")
    return fn


def prompt_text(row: dict[str, Any]) -> str:
    """The last user turn of a verl ``prompt`` chat list (or the prompt, if it is a string)."""
    prompt = row["prompt"]
    if isinstance(prompt, str):
        return prompt
    return str([m for m in prompt if m["role"] == "user"][-1]["content"])


def with_lineage(row: dict[str, Any]) -> dict[str, Any]:
    """A seed row with eva's lineage keys in ``extra_info`` (depth 0, no parent)."""
    extra = dict(row.get("extra_info") or {})
    if "eva_prompt_id" not in extra:
        pid = prompt_id(prompt_text(row))
        extra.update(
            eva_prompt_id=pid, eva_parent_id="", eva_root_id=pid, eva_depth=0, parent_index=-1
        )
        extra.setdefault(PRIORITY_KEY, math.nan)
    return {**row, "extra_info": extra}


def pick_parents(info: np.ndarray, top_fraction: float, method: str, seed: int) -> list[int]:
    """Rows of a step to evolve: ``ceil(top_fraction * n)`` by eva_core's subset draw, among
    rows with positive informativeness only (a prompt every rollout agrees on teaches nothing)."""
    k = min(math.ceil(top_fraction * len(info)), int((np.nan_to_num(info) > 0).sum()))
    return [int(i) for i in select_subset(np.nan_to_num(info), k, method, seed).indices]


def children_rows(
    parents: Sequence[dict[str, Any]],
    parent_info: Sequence[float],
    rewrites: Sequence[Sequence[str]],
    next_index: int,
    method: str,
    max_chars: int | None = None,
) -> list[dict[str, Any]]:
    """verl rows for the kept rewrites (eva_core's clean-up, refusal and duplicate drops):
    a copy of the parent row with the last user turn replaced, ``extra_info.index`` from
    ``next_index`` on, lineage one level deeper and the parent's informativeness as priority.
    The parent's ``reward_model`` is kept: the rewriter must preserve the answer."""
    extras = [with_lineage(p)["extra_info"] for p in parents]
    table = pa.table(
        {
            "prompt_id": [e["eva_prompt_id"] for e in extras],
            "root_id": [e["eva_root_id"] for e in extras],
            "depth": pa.array([int(e["eva_depth"]) for e in extras], pa.int32()),
            "category": pa.array([None] * len(extras), pa.string()),
        }
    )
    kids, _ = evolved_records(
        table, [[(t, method) for t in r] for r in rewrites], iteration=0, max_chars=max_chars
    )
    by_id = {e["eva_prompt_id"]: i for i, e in enumerate(extras)}
    out = []
    for n, kid in enumerate(kids.select(PROMPT_SCHEMA.names).to_pylist()):
        i = by_id[kid["parent_id"]]
        row = copy.deepcopy(dict(parents[i]))
        if isinstance(row["prompt"], str):
            row["prompt"] = kid["prompt"]
        else:
            last = max(j for j, m in enumerate(row["prompt"]) if m["role"] == "user")
            row["prompt"][last] = {**row["prompt"][last], "content": kid["prompt"]}
        row["extra_info"] = {
            **extras[i],
            "index": next_index + n,
            "eva_prompt_id": kid["prompt_id"],
            "eva_parent_id": kid["parent_id"],
            "eva_root_id": kid["root_id"],
            "eva_depth": kid["depth"],
            "parent_index": int(extras[i]["index"]),
            PRIORITY_KEY: float(parent_info[i]),
        }
        out.append(row)
    return out


def _mix(*parts: int) -> int:
    return int(np.random.SeedSequence(list(parts)).generate_state(2, np.uint64)[0] >> 1)

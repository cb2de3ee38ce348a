"""eva's creator as verl's training dataset (verl 0.9.x): eva chooses every prompt verl rolls
out and adds the evolved ones, by verl's own config keys.

    data.custom_cls.path=pkg://eva_adapters.verl  data.custom_cls.name=EvaDataset
    data.dataloader_num_workers=0
    +data.eva.rewriter=my_pkg.evolve:rewrite      (and the other ``data.eva`` options below)

(``infra/verl/grpo-eva-0.9.yaml`` has them.) What this relies on, in the verl 0.9.1 wheel:

* Both trainers build their datasets with ``create_rl_dataset`` (``verl/trainer/ppo/utils.py``
  l. 110-137), which instantiates ``data.custom_cls`` (``rl_dataset.get_dataset_class``,
  l. 570-596) with the data config, for the training set and for the validation set alike.
* Both read the training set through a ``StatefulDataLoader`` with ``drop_last=True``, verl's
  ``collate_fn`` and the sampler of ``create_rl_sampler`` (random or sequential, ``utils.py``
  l. 140-168; legacy ``ray_trainer.py`` l. 405-412, V1 ``v1/trainer_base.py`` l. 743-750). A
  map-style batch is fetched by ``dataset.__getitems__(indices)`` (PyTorch's public batched
  fetch): ``EvaDataset`` answers it with ``creator.draw(len(indices))``, so eva picks each
  whole batch (its D/B mix included) and the sampler's indices only set how many.
* The legacy trainer (``trainer.use_v1=false``) calls ``train_dataset.on_batch_end(batch=batch)``
  after every step but the last (``ray_trainer.py`` l. 1818-1820). That batch holds each
  rollout's ``uid`` (one per drawn prompt, l. 1481-1484), its ``extra_info`` (kept by
  ``_get_gen_batch``, l. 572-586) and ``token_level_scores`` (l. 1633), but ``index`` only when
  the reward is not streamed (``AgentLoopWorker._postprocess``): eva's prompt id therefore
  travels in ``extra_info["eva_prompt_id"]``, and rollouts are grouped by ``uid``.
* The V1 trainer (the default) never calls ``on_batch_end``; it observes through a replay
  buffer, ``eva_adapters.verl_v1`` (``trainer.v1.sampler.custom_sampler``).
* verl saves ``train_dataloader.state_dict()`` in each checkpoint (``data.pt``) and restores it
  on resume; torchdata's ``StatefulDataLoader`` includes a dataset's own ``state_dict()`` in it
  and hands it back to ``load_state_dict`` (torchdata 0.11 ``stateful_dataloader.py``
  l. 496-557): the creator's state rides in verl's checkpoint. The legacy trainer saves a
  checkpoint before it calls ``on_batch_end`` (l. 1711-1712) and skips the dataloader restore
  when a checkpoint falls on an epoch boundary (l. 1103-1116, ``at_epoch_boundary``);
  ``data.eva.state_path`` covers both (see ``EvaDataset.state_dict``).

``data.eva`` holds ``eva_adapters.common.build_creator``'s options (``rewriter``, ``size``,
``ratio_evol``, ``top_fraction``, ``n_new``, ``n_new_bootstrap``, ``metric``, ``seed``,
``max_chars``, ``skip_tied``, ``evolve_lag``, ``duplicates``, ``state_path``) with two
differences: ``duplicates`` defaults to ``drop`` (a verl parquet may repeat a question: the
first row is kept), and ``inherit`` names verl columns (default ``data_source`` and ``ability``)
that a child copies from its seed row; every other column of a child is None (``reward_model``
among them unless named: a rewritten question has its own answer, so name it only with a
rewriter that keeps the answer). A child's chat is its seed row's with the last user turn
rewritten.
"""

from __future__ import annotations

import copy
import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from verl.utils.dataset.rl_dataset import RLHFDataset

from eva_adapters.common import build_creator, save_state
from eva_core.creator import Creator, Observation
from eva_core.creator_checks import OptionError

logger = logging.getLogger(__name__)

KEY = "data.eva"  # verl's config key holding the creator's options, named in their errors
PROMPT_ID = "eva_prompt_id"  # the key in each row's extra_info that names its eva prompt
DEFAULT_INHERIT = ("data_source", "ability")
LINEAGE = {"eva_parent_id": "parent_id", "eva_root_id": "root_id", "eva_depth": "depth"}

_TRAINING_SOURCE: EvaDataset | None = None


def training_source() -> EvaDataset:
    """The eva training set this process built last (what ``eva_adapters.verl_v1`` observes)."""
    if _TRAINING_SOURCE is None:
        raise RuntimeError(
            "no eva training set in this process: set data.custom_cls.path="
            "pkg://eva_adapters.verl and data.custom_cls.name=EvaDataset"
        )
    return _TRAINING_SOURCE


class EvaDataset(RLHFDataset):
    """verl's ``RLHFDataset`` whose training batches ``Creator.draw`` chooses (see the module
    doc). Built on ``data.val_files`` it is a plain ``RLHFDataset``."""

    def __init__(self, data_files: Any, tokenizer: Any, config: Any, *args: Any, **kwargs: Any):
        super().__init__(data_files, tokenizer, config, *args, **kwargs)
        self.creator: Creator | None = None
        if not _is_training_set(self.original_data_files, config):
            return
        if int(config.get("dataloader_num_workers", 0) or 0) != 0:
            raise ValueError(
                "eva draws each batch in the trainer's process: set data.dataloader_num_workers=0"
            )
        options = _plain(config.get("eva")) or {}
        if not isinstance(options, Mapping):
            raise ValueError(f"data.eva must be a mapping of eva creator options, got {options!r}")
        inherit = options.get("inherit", DEFAULT_INHERIT)
        if isinstance(inherit, str) or not all(isinstance(c, str) for c in inherit):
            raise OptionError("inherit", "must be a list of column names", inherit).under(KEY)
        self.inherit = tuple(inherit)
        self.state_path: str | None = options.get("state_path") or None
        self.duplicates = options.get("duplicates", "drop")
        # Each seed remembers its row; a child finds its seed's row by its root_id.
        self._seeds = [
            {"prompt": _user_text(chat), "verl_row": i}
            for i, chat in enumerate(self.dataframe[self.prompt_key])
        ]
        creator_options = {k: v for k, v in options.items() if k not in ("inherit", "state_path")}
        try:
            creator = build_creator(
                self._seeds, {**creator_options, "duplicates": self.duplicates}, key=KEY
            )
        except OptionError:
            raise
        except ValueError as exc:  # the seeds: name the files they came from
            raise ValueError(f"eva cannot use {self.original_data_files}: {exc}") from exc
        if creator.stats.duplicate_seeds:
            logger.warning(
                "eva: %d rows repeat an earlier row's user turn; only the first is drawn",
                creator.stats.duplicate_seeds,
            )
        self._position = {str(r["prompt_id"]): int(r["verl_row"]) for r in creator.buffer.seeds}
        self.creator = creator
        saved = self._saved_state()
        if saved is not None:  # a resume where verl does not restore the dataloader (module doc)
            self.creator = self._restore(saved)
        self._checkpointed = False
        global _TRAINING_SOURCE
        _TRAINING_SOURCE = self

    def maybe_filter_out_long_prompts(self, dataframe: Any = None) -> Any:
        """verl's filter (called on every file verl reads through this class), after a check
        that the file has the prompt column, naming the key that names it."""
        if dataframe is not None and self.prompt_key not in dataframe.column_names:
            raise ValueError(
                f"data.prompt_key {self.prompt_key!r} is not a column of "
                f"{self.original_data_files} (its columns: {', '.join(dataframe.column_names)})"
            )
        return super().maybe_filter_out_long_prompts(dataframe)

    # --- prompts out -----------------------------------------------------------------------

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """One batch for the DataLoader: ``len(indices)`` prompts drawn by the creator."""
        if self.creator is None:
            return [self[i] for i in indices]
        records = self.creator.draw(len(indices))
        if len(records) < len(indices):
            raise RuntimeError(f"eva's creator had {len(records)} prompts for {len(indices)}")
        return [self.row(record) for record in records]

    def row(self, record: Mapping[str, Any]) -> dict[str, Any]:
        """The verl row of a drawn record: its seed's row as ``RLHFDataset`` serves it, with the
        last user turn rewritten for a child, and eva's ids in ``extra_info``."""
        out: dict[str, Any] = super().__getitem__(self._position[record["root_id"]])
        if record["depth"]:
            extra = dict(out["extra_info"]) if "extra_info" in self.inherit else {}
            index = int(record["prompt_id"], 16) >> 2  # children's own index (fits an int64)
            extra["index"] = index
            for column in self.dataframe.column_names:
                if column not in (self.prompt_key, "extra_info", *self.inherit):
                    out[column] = None
            chat = _rewritten(out[self.prompt_key], record["prompt"])
            out[self.prompt_key] = chat
            out["raw_prompt"] = copy.deepcopy(chat)
            out["extra_info"], out["index"] = extra, index
            out["tools_kwargs"] = extra.get("tools_kwargs", {})
            out["interaction_kwargs"] = extra.get("interaction_kwargs", {})
        out["extra_info"] = {
            **out["extra_info"],
            PROMPT_ID: record["prompt_id"],
            **{key: record[name] for key, name in LINEAGE.items()},
            "eva_from_buffer": bool(record.get("from_buffer", False)),
        }
        return out

    # --- rewards in ------------------------------------------------------------------------

    def observe(self, groups: Iterable[tuple[str, Sequence[float]]]) -> Observation:
        """Feed finished groups ``(eva prompt id, rewards)`` to the creator."""
        if self.creator is None:
            raise RuntimeError("the validation set has no creator to observe with")
        seen = self.creator.observe(groups)
        logger.info(
            "eva observed %d groups: %d parents, %d children joined, buffer %d",
            len(seen.informativeness), len(seen.parents), seen.joined,
            len(self.creator.buffer.entries),
        )  # fmt: skip
        return seen

    def on_batch_end(self, batch: Any) -> None:
        """verl's legacy trainer after every step: observe the step's groups (a ``DataProto``);
        after a step verl checkpointed, write ``data.eva.state_path``."""
        if self.creator is None:
            return
        self.observe(groups_of(batch))
        if self.state_path and self._checkpointed:
            save_state(self.creator, self.state_path)
            self._checkpointed = False

    # --- state -----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The creator's state, for verl's checkpoint (``data.pt``). verl takes it inside a
        step, after its prompts were drawn: the legacy trainer before ``on_batch_end``, so
        that step's rewards are not in it; ``state_path`` then gets the state after them."""
        if self.creator is None:
            return {}
        self._checkpointed = True
        return {"eva_creator": self.creator.state()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from verl's checkpoint; the state at ``state_path`` instead when it is that
        same state one observation on (the checkpointed step's rewards observed)."""
        if self.creator is None or "eva_creator" not in state:
            return
        saved = state["eva_creator"]
        after = self._saved_state()
        if after is not None and _one_observation_on(saved, after):
            saved = after
        elif after is not None:
            logger.warning("eva: %s is not the checkpoint's next state; ignored", self.state_path)
        self.creator = self._restore(saved)

    def _saved_state(self) -> dict[str, Any] | None:
        if not self.state_path or not os.path.exists(self.state_path):
            return None
        with open(self.state_path, encoding="utf-8") as f:
            state: dict[str, Any] = json.load(f)
        return state

    def _restore(self, state: Mapping[str, Any]) -> Creator:
        live = self.creator
        assert live is not None
        return Creator.from_state(
            self._seeds, state, rewriter=live.rewriter, max_chars=live.max_chars,
            duplicates=self.duplicates, **({"executor": live.executor} if live.executor else {}),
        )  # fmt: skip


def groups_of(batch: Any) -> list[tuple[str, list[float]]]:
    """``(eva prompt id, rewards)`` per drawn prompt of a legacy-trainer batch (a ``DataProto``
    as ``on_batch_end`` gets it): rollouts grouped by ``uid`` in first-seen order, each
    rollout's reward its ``token_level_scores`` summed over tokens (``rm_scores`` before the
    trainer copies them there)."""
    tensors = batch.batch
    key = "token_level_scores" if "token_level_scores" in tensors else "rm_scores"
    scores = tensors[key].sum(-1).float().cpu().tolist()
    uids, extras = batch.non_tensor_batch["uid"], batch.non_tensor_batch["extra_info"]
    return group_rollouts(uids, extras, scores)


def group_rollouts(
    uids: Sequence[Any], extras: Sequence[Any], scores: Sequence[float]
) -> list[tuple[str, list[float]]]:
    """Rollouts ``(uid, extra_info, reward)`` as one ``(eva prompt id, rewards)`` per uid."""
    groups: dict[str, tuple[str, list[float]]] = {}
    for uid, extra, score in zip(uids, extras, scores, strict=True):
        pid = (extra or {}).get(PROMPT_ID)
        if pid is None:
            raise ValueError(f"a rollout (uid {uid}) has no extra_info.{PROMPT_ID}: not eva's")
        group = groups.setdefault(str(uid), (pid, []))
        if group[0] != pid:
            raise ValueError(f"uid {uid} holds two eva prompts, {group[0]} and {pid}")
        group[1].append(float(score))
    return list(groups.values())


def _is_training_set(data_files: Any, config: Any) -> bool:
    files, train = _files(data_files), _files(config.get("train_files"))
    if files != train:
        return False
    if train == _files(config.get("val_files")):
        raise ValueError(
            "data.train_files and data.val_files are the same: verl builds both with "
            "data.custom_cls, and eva tells the training set by its files; validate on a copy"
        )
    return True


def _files(value: Any) -> list[str]:
    value = _plain(value)
    if value is None:
        return []
    return [os.path.expanduser(str(v)) for v in ([value] if isinstance(value, str) else value)]


def _plain(value: Any) -> Any:
    """An OmegaConf node as plain Python (verl's config is OmegaConf)."""
    if hasattr(value, "_get_node") or type(value).__name__ in ("DictConfig", "ListConfig"):
        from omegaconf import OmegaConf  # verl's own dependency

        return OmegaConf.to_container(value, resolve=True)
    return value


def _user_text(chat: Any) -> str:
    """The last user turn of a verl chat (or the prompt itself, when it is a string)."""
    if isinstance(chat, str):
        return chat
    turns = [m for m in chat if m.get("role") == "user"]
    if not turns or not isinstance(turns[-1].get("content"), str):
        raise ValueError(f"eva evolves a text user turn; this prompt has none: {chat!r}")
    return str(turns[-1]["content"])


def _rewritten(chat: Any, text: str) -> Any:
    if isinstance(chat, str):
        return text
    chat = copy.deepcopy(list(chat))
    last = max(i for i, m in enumerate(chat) if m.get("role") == "user")
    chat[last] = {**chat[last], "content": text}
    return chat


def _one_observation_on(before: Mapping[str, Any], after: Mapping[str, Any]) -> bool:
    b, a = before["buffer"], after["buffer"]
    return bool(
        after["observations"] == before["observations"] + 1
        and (a["step"], a["consumed"], a["epoch"]) == (b["step"], b["consumed"], b["epoch"])
    )

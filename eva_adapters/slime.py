"""eva's creator as slime's prompt source (THUDM/slime): eva chooses every prompt group slime
rolls out, adds the evolved ones, and reads back the rewards of every finished group.

    --data-source-path eva_adapters.slime.EvaDataSource
    --rollout-all-samples-process-path eva_adapters.slime.observe_all_samples
    --custom-config-path eva.yaml          # eva_creator: {rewriter: my_pkg.evolve:rewrite, ...}

What this relies on, in slime at commit 624b824 (2026-08-21):

* ``RolloutManager.__init__`` builds the data source as ``load_function(args.data_source_path)
  (args)`` (``slime/ray/rollout.py`` l. 383-384). slime's ``DataSource`` base
  (``slime/rollout/data_source.py`` l. 17-46) asks for ``get_samples(num_samples) ->
  list[list[Sample]]`` (one list of ``n_samples_per_prompt`` samples per prompt),
  ``add_samples``, ``save(rollout_id)``, ``load(rollout_id)`` and ``__len__``.
* The default rollout function (``slime/rollout/sglang_rollout.py``) draws with
  ``get_samples(args.over_sampling_batch_size)`` until ``rollout_batch_size`` groups pass the
  dynamic sampling filter (l. 407-442); groups still running then are aborted (l. 451): with
  ``--partial-rollout`` they come back through ``add_samples`` (l. 646-648) to be finished in a
  later step, otherwise they are dropped. Then it calls ``--rollout-all-samples-process-path``
  as ``process_func(args, all_samples, data_source)`` with every group that finished this step,
  the ones the dynamic filter dropped included (l. 465-468); that is the one place rewards come
  back to a data source, and ``observe_all_samples`` is that function. (``data_source`` there is
  the data source's bound ``get_samples``; its ``__self__`` is the data source.)
* The rollout manager calls ``save(rollout_id)`` when it checkpoints (``train.py`` l. 80,
  ``rollout.py`` l. 530-531) and ``load(start_rollout_id - 1)`` on start
  (``slime/ray/placement_group.py`` l. 221-222); slime's own data source keeps its state in
  ``{args.save}/rollout/global_dataset_state_dict_{rollout_id}.pt`` (``data_source.py``
  l. 123-136), eva's goes beside it as ``eva_creator_{rollout_id}.json``.
* ``--custom-config-path`` sets every key of a YAML file on ``args`` (``slime/utils/
  arguments.py`` l. 2013-2018): ``eva_creator`` holds ``eva_adapters.common.build_creator``'s
  options (``rewriter``, ``size``, ``ratio_evol``, ``top_fraction``, ``n_new``,
  ``n_new_bootstrap``, ``metric``, ``seed`` (default ``--rollout-seed``), ``max_chars``,
  ``skip_tied``, ``inherit``). ``state_path`` is refused: the state follows slime's
  checkpoints.

Seeds are the rows of ``--prompt-data`` read by slime's own ``read_file`` with slime's keys:
``--input-key`` (a text, or a conversation of one user turn), ``--label-key`` (the sample's
``label``), ``--metadata-key`` and ``--tool-key`` (into ``metadata["tools"]``), and each drawn
prompt becomes samples as slime's ``Dataset`` makes them (``slime/utils/data.py`` l. 231-276),
the chat template applied under ``--apply-chat-template``; a sample's ``metadata["eva"]`` names
its prompt (``prompt_id``, ``parent_id``, ``depth``, ``from_buffer``). A child has no ``label``
and empty ``metadata`` unless ``inherit`` names them (a rewritten question has its own answer:
name ``label`` only with a rewriter that keeps it). Multimodal prompts are refused. Seeds longer
than ``--rollout-max-prompt-len`` tokens are dropped as slime drops them; children are bounded
by ``max_chars`` only.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
from collections.abc import Iterable, Sequence
from typing import Any

from slime.rollout.data_source import DataSource, pop_first
from slime.utils.data import read_file
from slime.utils.misc import load_function
from slime.utils.processing_utils import load_tokenizer
from slime.utils.types import Sample

from eva_adapters.common import build_creator
from eva_core.creator import Creator, Observation

logger = logging.getLogger(__name__)

Record = dict[str, Any]
OPTIONS = "eva_creator"  # the args attribute (a key of the --custom-config-path YAML)
STATE = "rollout/eva_creator_{}.json"  # under --save / --load, beside slime's own state
PROCESS_PATH = "eva_adapters.slime.observe_all_samples"


class EvaDataSource(DataSource):
    """slime's data source with eva's creator choosing the prompts (see the module doc)."""

    def __init__(self, args: Any):
        self.args = args
        if not args.rollout_global_dataset or args.prompt_data is None:
            raise ValueError("eva's data source needs --prompt-data (the seed prompts)")
        if args.multimodal_keys:
            raise ValueError("eva's data source evolves text prompts: drop --multimodal-keys")
        if not args.rollout_all_samples_process_path:
            raise ValueError(
                "eva needs every finished group's rewards: set --rollout-all-samples-process-path "
                f"{PROCESS_PATH} (or a function of yours that calls it)"
            )
        self.options = dict(getattr(args, OPTIONS, None) or {})
        if "state_path" in self.options:
            raise ValueError(
                "eva_creator.state_path is not used with slime: the creator is saved and "
                "loaded with slime's checkpoints (--save, --load)"
            )
        self.options.setdefault("seed", args.rollout_seed)
        self._tokenizer: Any = None
        self.seeds = self._read_seeds()
        self.creator: Creator = build_creator(self.seeds, self.options, key=OPTIONS)
        self.sample_index = 0
        self.sample_group_index = 0
        self.buffer: list[list[Sample]] = []  # groups given back unfinished (partial rollout)
        self.reissue: list[Record] = []  # prompts drawn before a restart, never finished
        self.handed: dict[int, Record] = {}  # group_index -> its prompt, until observed
        self.buffer_filter = (
            load_function(args.buffer_filter_path) if args.buffer_filter_path else pop_first
        )
        self.last: Observation | None = None

    # --- seeds and samples -----------------------------------------------------------------

    def _read_seeds(self) -> list[Record]:
        args = self.args
        seeds: list[Record] = []
        for row, data in enumerate(read_file(args.prompt_data)):
            metadata = dict(data.get(args.metadata_key) or {})
            if args.tool_key is not None and args.tool_key in data:
                tools = data[args.tool_key]
                metadata["tools"] = json.loads(tools) if isinstance(tools, str) else list(tools)
            seeds.append({
                "prompt": _prompt_text(data.get(args.input_key), row, args.input_key),
                "label": data[args.label_key] if args.label_key is not None else None,
                "metadata": metadata,
            })  # fmt: skip
        if args.rollout_max_prompt_len is not None:
            limit = args.rollout_max_prompt_len
            tok = self.tokenizer
            kept = [s for s in seeds if len(tok.encode(self._prompt(s), add_special_tokens=False))
                    <= limit]  # fmt: skip
            if dropped := len(seeds) - len(kept):
                logger.info(f"eva: dropped {dropped} seed prompts longer than {limit} tokens")
            seeds = kept
        return seeds

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.args.hf_checkpoint, trust_remote_code=True)
        return self._tokenizer

    def _prompt(self, record: Record) -> str:
        """The sample's prompt as slime's ``Dataset`` builds it from a text."""
        if not self.args.apply_chat_template:
            return str(record["prompt"])
        tools = (record.get("metadata") or {}).get("tools")
        return str(self.tokenizer.apply_chat_template(
            [{"role": "user", "content": record["prompt"]}], tools=tools, tokenize=False,
            add_generation_prompt=True, **(self.args.apply_chat_template_kwargs or {}),
        ))  # fmt: skip

    def _group(self, record: Record) -> list[Sample]:
        metadata = copy.deepcopy(record.get("metadata") or {})
        metadata["eva"] = {
            "prompt_id": record["prompt_id"],
            "parent_id": record.get("parent_id"),
            "depth": record.get("depth", 0),
            "from_buffer": bool(record.get("from_buffer")),
        }
        prompt = Sample(prompt=self._prompt(record), label=record.get("label"), metadata=metadata)
        group = []
        for _ in range(self.args.n_samples_per_prompt):
            sample = copy.deepcopy(prompt)
            sample.group_index = self.sample_group_index
            sample.index = self.sample_index
            self.sample_index += 1
            group.append(sample)
        self.handed[self.sample_group_index] = record
        self.sample_group_index += 1
        return group

    # --- slime's DataSource ----------------------------------------------------------------

    def get_samples(self, num_samples: int) -> list[list[Sample]]:
        """Unfinished groups given back first, then prompts drawn before a restart, then
        ``creator.draw`` for the rest (one draw per call: one creator batch)."""
        samples: list[list[Sample]] = []
        if self.buffer and num_samples > 0:
            samples = self.buffer_filter(self.args, None, self.buffer, num_samples)
        rest = num_samples - len(samples)
        records, self.reissue = self.reissue[:rest], self.reissue[rest:]
        if rest > len(records):
            records += self.creator.draw(rest - len(records))
        return samples + [self._group(record) for record in records]

    def add_samples(self, samples: list[list[Sample]]) -> None:
        """Unfinished groups (``--partial-rollout``), handed out again first."""
        if not samples:
            return
        for group in samples:
            if not isinstance(group, list) or len(group) != self.args.n_samples_per_prompt:
                raise ValueError(
                    f"expected groups of {self.args.n_samples_per_prompt} samples, got "
                    f"{len(group) if isinstance(group, list) else type(group).__name__}"
                )
            self.buffer.append(group)

    def save(self, rollout_id: int) -> None:
        if self.args.save is None:
            return
        self.creator.flush()
        state = {
            **self.creator.state(),
            "slime": {
                "sample_index": self.sample_index,
                "sample_group_index": self.sample_group_index,
            },
        }
        _write_json(os.path.join(self.args.save, STATE.format(rollout_id)), state)

    def load(self, rollout_id: int | None = None) -> None:
        """The creator saved at ``rollout_id``; prompts it had out then (unfinished groups slime
        does not save) are handed out again first, as fresh groups."""
        if self.args.load is None or rollout_id is None:
            return
        path = os.path.join(self.args.load, STATE.format(rollout_id))
        if not os.path.exists(path):
            logger.info(f"eva: no creator state at {path}; starting from the seeds")
            return
        with open(path, encoding="utf-8") as f:
            counters = json.load(f).get("slime", {})
        self.creator = build_creator(self.seeds, {**self.options, "state_path": path}, key=OPTIONS)
        self.sample_index = int(counters.get("sample_index", 0))
        self.sample_group_index = int(counters.get("sample_group_index", 0))
        self.buffer, self.handed = [], {}
        self.reissue = [r for drawn in self.creator.outstanding.values() for r in drawn]
        logger.info(f"eva: creator loaded from {path} ({len(self.reissue)} prompts to redo)")

    def __len__(self) -> int:
        return len(self.creator)

    # --- rewards back ----------------------------------------------------------------------

    def observe_groups(self, groups: Iterable[Sequence[Any]]) -> Observation | None:
        """Feed finished groups (each ``n_samples_per_prompt`` samples of one handed-out
        prompt, or of lists of samples where a custom generate function fans a response out
        into several; the last of those carries the response's reward) to ``creator.observe``,
        in one call: one creator step. Unscored responses (``reward`` None) count as NaN."""
        rows: list[tuple[str, list[float]]] = []
        for group in groups:
            leaves = [r[-1] if isinstance(r, list) else r for r in group]
            record = self.handed.pop(leaves[0].group_index, None)
            if record is None:
                logger.warning(f"eva: group {leaves[0].group_index} was not handed out by eva")
                continue
            rows.append((record["prompt_id"], [self._reward(s) for s in leaves]))
        self.last = self.creator.observe(rows) if rows else None
        return self.last

    def _reward(self, sample: Sample) -> float:
        if sample.reward is None:
            return math.nan
        value = sample.get_reward_value(self.args)
        return math.nan if value is None else float(value)

    def release_unfinished(self) -> int:
        """Forget the prompts of groups slime dropped unfinished (aborted without
        ``--partial-rollout``): they are never observed. Returns how many."""
        released = self.creator.release(r["prompt_id"] for r in self.handed.values())
        self.handed.clear()
        return released


def observe_all_samples(args: Any, all_samples: list[list[Any]], data_source: Any) -> None:
    """``--rollout-all-samples-process-path``: every group that finished this rollout step goes
    to the creator; the groups slime dropped unfinished are let go (without partial rollout)."""
    source = getattr(data_source, "__self__", data_source)
    if not isinstance(source, EvaDataSource):
        raise TypeError(
            f"{PROCESS_PATH} observes eva's data source; set --data-source-path "
            "eva_adapters.slime.EvaDataSource"
        )
    source.observe_groups(all_samples)
    if not args.partial_rollout:
        source.release_unfinished()


def _prompt_text(value: Any, row: int, key: str) -> str:
    """A row's prompt as text: a string, or a conversation of one user turn."""
    if isinstance(value, str):
        return value
    turn = value[0] if isinstance(value, list) and len(value) == 1 else None
    if (
        isinstance(turn, dict)
        and turn.get("role") == "user"
        and isinstance(turn.get("content"), str)
    ):
        return turn["content"]
    raise ValueError(
        f"row {row}: eva evolves a prompt's text; --input-key {key!r} must hold a string or "
        f"one user turn, got {type(value).__name__}"
    )


def _write_json(path: str, value: Any) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(value, f)
    os.replace(tmp, path)

"""Reading prompts from a Hugging Face dataset: a Hub id, a local dataset folder, or a folder
written by ``save_to_disk`` (local or at an fsspec URL).

``dataset`` names it and ``split`` picks the split (``dataset_config`` the Hub dataset's
configuration, if it has several). A Hub dataset is read through ``datasets.load_dataset``, so
it comes from the Hugging Face cache when it is there (``HF_DATASETS_OFFLINE=1`` reads only the
cache). What keys the stage: for a Hub id, the dataset's fingerprint (a new revision lands in
another cache folder); for a folder (local or at a URL), the bytes of its files. A folder's
fingerprint cannot be trusted: ``save_to_disk``'s ``state.json`` keeps it when the data files
are rewritten in place, and a folder of data files is fingerprinted by modification times. So
any change to a folder's files reruns the stage, and reading it again unchanged does not. What
the stage reads is what its key names: a saved folder is read from its files as they are
(``load_from_disk``), and a folder of data files is built afresh on every read, never taken
from the Hugging Face cache of an earlier one.
"""

from __future__ import annotations

import os
import re
import tempfile
from typing import Any

import pyarrow as pa

from eva_runtime.errors import first_line
from tasks.content_hashes import hash_directory
from tasks.prompt_rows import PromptRows, RowRules, select_prompts

# "org/name" or a canonical "name": what the Hub accepts as a dataset id.
_HUB_DATASET = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")
# What save_to_disk writes at the top of its folder: a DatasetDict, else one Dataset.
_SAVED = ("dataset_dict.json", "state.json")
_FILES = (".jsonl", ".json", ".ndjson", ".csv", ".parquet")


def check_dataset_name(name: str) -> str:
    """``name`` if it can name a dataset (a Hub id, a folder, a URL), else a ``ValueError``."""
    if not name.strip():
        raise ValueError("empty dataset name (a Hub id such as org/name, or a folder)")
    if os.path.isfile(name) or name.lower().endswith(_FILES):
        raise ValueError(f"{name!r} is a file: set it as prompts.path")
    if "://" in name or os.path.isdir(name) or _HUB_DATASET.fullmatch(name):
        return name
    raise ValueError(f"{name!r} is neither a folder nor a Hub dataset id (org/name)")


def _saved(name: str) -> bool:
    """Whether ``name`` is a folder written by ``save_to_disk``."""
    if "://" in name:
        return True  # only load_from_disk reads a remote folder
    return any(os.path.isfile(os.path.join(name, f)) for f in _SAVED)


def _one_format(folder: str) -> None:
    """A ``ValueError`` when a folder of data files mixes formats: ``load_dataset`` reads the
    files of one format and leaves the others out without a word."""
    formats: dict[str, str] = {}
    for _, _, files in os.walk(folder):
        for f in files:
            ext = os.path.splitext(f)[1].lower()
            if ext in _FILES and not f.startswith("."):  # JSON Lines are JSON to load_dataset
                formats.setdefault(".json" if ext in (".jsonl", ".ndjson") else ext, f)
    if len(formats) > 1:
        shown = ", ".join(sorted(formats.values()))
        raise ValueError(
            f"data files of {len(formats)} formats ({shown}): load_dataset would read one "
            "format and skip the rest; keep one format in the folder"
        )


def load_dataset_split(
    name: str, *, config_name: str | None, split: str, storage_options: dict[str, Any]
) -> Any:
    """The ``datasets.Dataset`` that ``name`` and ``split`` name; a ``ValueError`` in one line
    (the dataset cannot be found, reached offline, or has no such split)."""
    import datasets  # its import is slow: only runs that name a dataset pay for it

    saved = _saved(name)
    if saved and config_name:
        raise ValueError(
            f"{name}: dataset_config {config_name!r} names a Hub dataset's configuration, and "
            "this is a folder saved with save_to_disk (it has none): leave dataset_config out"
        )
    if not saved and os.path.isdir(name):
        _one_format(name)
    try:
        if saved:
            loaded = datasets.load_from_disk(name, storage_options=storage_options or None)
            if isinstance(loaded, datasets.DatasetDict):
                if split not in loaded:
                    raise ValueError(f"no split {split!r} (splits: {', '.join(loaded)})")
                loaded = loaded[split]
            return loaded
        if os.path.isdir(name):
            # Keyed by its bytes (``dataset_key``), so read from them: load_dataset's own cache
            # knows a folder's files by path, size and modification time, and would hand back
            # the rows of an earlier read of files rewritten since with those kept. Built in a
            # cache of this read's own, held in memory, and removed with it.
            with tempfile.TemporaryDirectory(prefix="eva-dataset-") as cache:
                return datasets.load_dataset(
                    name, config_name, split=split, cache_dir=cache, keep_in_memory=True
                )
        return datasets.load_dataset(name, config_name, split=split)
    except ValueError as exc:
        raise ValueError(f"{name}: {first_line(exc, with_type=False)}") from None
    except Exception as exc:  # not on the Hub, not in the cache offline, an unreadable folder
        raise ValueError(f"{name}: cannot be loaded ({first_line(exc)})") from None


def dataset_key(
    name: str, *, config_name: str | None, split: str, storage_options: dict[str, Any]
) -> dict[str, str]:
    """What keys a stage on the dataset it reads (see the module's docstring)."""
    if "://" in name or os.path.isdir(name):
        return {"dataset_sha256": hash_directory(name, storage_options)}
    dataset = load_dataset_split(
        name, config_name=config_name, split=split, storage_options=storage_options
    )
    return {"dataset_fingerprint": str(dataset._fingerprint)}


def read_prompt_dataset(
    name: str,
    *,
    config_name: str | None,
    split: str,
    prompt_column: str,
    category_column: str | None,
    rules: RowRules,
    storage_options: dict[str, Any],
) -> PromptRows:
    """The prompt records of a dataset's split; errors name the dataset and the row or column."""
    dataset = load_dataset_split(
        name, config_name=config_name, split=split, storage_options=storage_options
    )
    where = f"{name} (split {split})"
    if prompt_column not in dataset.column_names:
        raise ValueError(
            f"{where}: no column {prompt_column!r} (columns: "
            f"{', '.join(dataset.column_names) or 'none'}); set prompts.prompt_column"
        )
    columns = [prompt_column]
    if category_column and category_column in dataset.column_names:
        columns.append(category_column)
    table: pa.Table = dataset.select_columns(columns).with_format("arrow")[:]
    try:
        return select_prompts(table, prompt_column, category_column, rules)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None

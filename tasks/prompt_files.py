"""Reading a user's prompt file: JSONL, JSON, CSV or parquet, at any fsspec URL.

A file needs a prompt column (``prompt`` unless told otherwise); a list column such as
MT-Bench's ``turns`` contributes its first turn or all of them joined (``tasks.prompt_rows``); an
optional category column labels rows. Every problem is a ``ValueError`` that names the file and
the row or column, raised before a run writes anything (``flows.inputs``) and again when the
stage reads it; both make it a ``ConfigError`` naming the config key (``prompts.path``,
``heldout.path``), which a reader shared by several configs cannot know.
"""

from __future__ import annotations

import json
import os
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.csv as pacsv
from fsspec.implementations.local import LocalFileSystem

from eva_runtime.errors import first_line
from tasks.prompt_rows import PromptRows, RowRules, select_columns
from tasks.store import parquet_table


def _read_table(
    path: str, ext: str, storage_options: dict[str, Any]
) -> pa.Table | list[dict[str, Any]]:
    """A parquet or CSV file as a table; a JSON or JSON Lines file as its rows (Python values:
    Arrow would refuse the whole file for one row whose prompt is a number, which
    ``drop_invalid`` must be able to drop)."""
    with fsspec.open(path, "rb", **storage_options) as f:
        if ext == ".parquet":  # from an Arrow-owned copy of its bytes, never from ``f``
            return parquet_table(f.read())
        if ext == ".csv":
            return pacsv.read_csv(f)
        data = f.read()
    # A non-UTF-8 file fails here, and is named by the caller; a leading BOM (as Windows tools
    # write UTF-8) is no part of the first row: JSON refuses it, CSV already drops it.
    text = data.decode("utf-8-sig")
    if ext != ".json":
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"cannot be read as jsonl: line {n}: {exc.msg}") from None
        for i, r in enumerate(rows):
            if not isinstance(r, dict):
                raise ValueError(f"row {i}: expected an object, got {type(r).__name__}")
        return rows
    # A JSON array of objects, or of plain strings (each a prompt); anything else is named
    # rather than misread (a mapping of columns would silently become one row).
    rows = json.loads(text)
    if not isinstance(rows, list):
        raise ValueError(
            "a JSON file must hold an array of objects or of strings (one per prompt); "
            "for one object per line use .jsonl"
        )
    if rows and all(isinstance(r, str) for r in rows):
        rows = [{"prompt": r} for r in rows]
    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            raise ValueError(
                f"row {i}: expected an object or a string like every row, got {type(r).__name__}"
            )
    return rows


def read_prompt_file(
    path: str,
    *,
    prompt_column: str = "prompt",
    category_column: str | None = "category",
    rules: RowRules | None = None,
    storage_options: dict[str, Any] | None = None,
) -> PromptRows:
    """Read and validate a user prompt file into prompt records (``tasks.prompt_rows``: turns,
    invalid rows, the limit); errors name the row or field."""
    storage_options = storage_options or {}
    if not path.strip():
        raise ValueError("empty path (null uses the built-in world)")
    try:
        fs, fs_path = fsspec.core.url_to_fs(path, **storage_options)
        is_dir = fs.isdir(fs_path)
    except FileNotFoundError:
        raise
    except Exception as exc:  # a remote store that refuses or does not answer
        raise ValueError(f"{path}: cannot be reached ({first_line(exc)})") from None
    if is_dir:
        raise ValueError(f"{path} is a directory, not a prompt file")
    # A missing local file is named as missing whatever its name ends with. Remote stores are
    # left to the read below: their exists() can swallow the error that says why.
    if isinstance(fs, LocalFileSystem) and not fs.exists(fs_path):
        raise FileNotFoundError(path)
    ext = os.path.splitext(path.split("?")[0])[1].lower()
    if ext not in (".parquet", ".jsonl", ".json", ".ndjson", ".csv"):
        raise ValueError(f"unsupported file type {ext!r} (jsonl, json, csv, parquet)")
    try:
        table = _read_table(path, ext, storage_options)
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except (pa.ArrowInvalid, json.JSONDecodeError, UnicodeError) as exc:
        first = first_line(exc, with_type=False)
        raise ValueError(f"{path}: cannot be read as {ext[1:]}: {first}") from None
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise ValueError(f"{path}: cannot be read ({first_line(exc)})") from None
    # An empty file has no columns at all: zero rows of the prompt column, which the row
    # checks below refuse as they refuse a header alone.
    columns = as_columns(table) or {prompt_column: []}
    if prompt_column not in columns:
        raise ValueError(
            f"{path}: no column {prompt_column!r} (columns: "
            f"{', '.join(columns) or 'none'}); set prompts.prompt_column"
        )
    try:
        return select_columns(columns, prompt_column, category_column, rules or RowRules())
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def read_columns(path: str, ext: str, storage_options: dict[str, Any]) -> dict[str, list[Any]]:
    """A JSONL, JSON, CSV or parquet file as its columns of Python values (a row without a key
    has None there): for other files of the same formats (a verifier's known answers)."""
    return as_columns(_read_table(path, ext, storage_options))


def as_columns(table: pa.Table | list[dict[str, Any]]) -> dict[str, list[Any]]:
    """Columns by name, in order of first appearance."""
    if isinstance(table, pa.Table):
        return {name: table.column(name).to_pylist() for name in table.column_names}
    names = dict.fromkeys(k for r in table for k in r)
    return {name: [r.get(name) for r in table] for name in names}

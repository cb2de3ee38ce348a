"""Prompt records and their lineage.

Every prompt that enters or leaves a stage is a row of ``PROMPT_SCHEMA``. Lineage makes evolved
prompts inspectable: ``parent_id`` is the prompt it was rewritten from, ``root_id`` the seed
prompt at the top of its tree, ``depth`` how many evolutions separate it from that seed, and
``iteration`` the eva iteration that created it.

A prompt's id is a hash of its *normalized* text, so the same question written with different
spacing or case is one prompt (this is also how the mix stage recognises duplicates).
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

SEED = "seed"
EVOLVED = "evolved"

PROMPT_SCHEMA = pa.schema(
    [
        pa.field("prompt_id", pa.string(), nullable=False),
        pa.field("prompt", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),  # seed | evolved
        pa.field("parent_id", pa.string()),  # null for seed prompts
        pa.field("root_id", pa.string(), nullable=False),
        pa.field("depth", pa.int32(), nullable=False),  # evolution generation, 0 for seeds
        pa.field("iteration", pa.int32(), nullable=False),  # iteration that created it
        pa.field("evolve_method", pa.string()),
        pa.field("category", pa.string()),
        # Verifiable instructions, as IFEval's rows carry them (null: the prompt has none):
        # the checkers' ids, and their arguments as a JSON list, one mapping per id.
        pa.field("instruction_id_list", pa.list_(pa.string())),
        pa.field("kwargs", pa.string()),
    ]
)
PROMPT_COLUMNS: tuple[str, ...] = tuple(PROMPT_SCHEMA.names)
INSTRUCTION_COLUMNS: tuple[str, ...] = ("instruction_id_list", "kwargs")
# What a prompt's history is: follow parent_id back to root_id across iterations.
LINEAGE_COLUMNS: tuple[str, ...] = ("prompt_id", "parent_id", "root_id", "depth", "iteration")

_WHITESPACE = re.compile(r"\s+")


def normalize_prompt(text: str) -> str:
    """Unicode NFKC, case-folded, whitespace collapsed and trimmed.

    Deliberately conservative: punctuation and digits are kept, because "12+34=" and "12+35="
    are different questions.
    """
    return _WHITESPACE.sub(" ", unicodedata.normalize("NFKC", text)).strip().casefold()


def prompt_id(text: str) -> str:
    """Stable 16-hex-digit id of a prompt's normalized text."""
    return hashlib.sha256(normalize_prompt(text).encode("utf-8")).hexdigest()[:16]


def seed_records(
    prompts: Sequence[str],
    categories: Sequence[str | None] | None = None,
    iteration: int = 0,
    instructions: Sequence[Instructions | None] | None = None,
) -> pa.Table:
    """Prompt records for user-supplied (seed) prompts; ``instructions``: each prompt's
    ``(ids, kwargs JSON)`` (``instruction_cells``) or None.

    Raises ``ValueError`` naming the first offending row for an empty prompt or a prompt that
    repeats an earlier one after normalization: seed sets are small enough to fix by hand, and
    a silent drop would shift every downstream count.
    """
    if categories is not None and len(categories) != len(prompts):
        raise ValueError(f"{len(categories)} categories for {len(prompts)} prompts")
    if instructions is not None and len(instructions) != len(prompts):
        raise ValueError(f"{len(instructions)} instruction lists for {len(prompts)} prompts")
    ids: list[str] = []
    seen: dict[str, int] = {}
    for row, text in enumerate(prompts):
        if text is not None and not isinstance(text, str):
            raise ValueError(f"row {row}: prompt is not text (got {type(text).__name__} {text!r})")
        if text is None or not text.strip():
            raise ValueError(f"row {row}: prompt is empty")
        pid = prompt_id(text)
        if pid in seen:
            raise ValueError(f"row {row}: prompt duplicates row {seen[pid]} after normalization")
        seen[pid] = row
        ids.append(pid)
    n = len(prompts)
    return pa.table(
        {
            "prompt_id": ids,
            "prompt": list(prompts),
            "source": [SEED] * n,
            "parent_id": pa.nulls(n, pa.string()),
            "root_id": ids,
            "depth": pa.array([0] * n, pa.int32()),
            "iteration": pa.array([iteration] * n, pa.int32()),
            "evolve_method": pa.nulls(n, pa.string()),
            "category": pa.array(
                list(categories) if categories is not None else [None] * n, pa.string()
            ),
            "instruction_id_list": pa.array(
                [i[0] if i else None for i in instructions or [None] * n], pa.list_(pa.string())
            ),
            "kwargs": pa.array(
                [i[1] if i else None for i in instructions or [None] * n], pa.string()
            ),
        },
        schema=PROMPT_SCHEMA,
    )


Instructions = tuple[list[str], str]  # a prompt's instruction ids and their kwargs as JSON


def instruction_cells(ids: Any, kwargs: Any) -> Instructions:
    """A row's ``instruction_id_list`` and ``kwargs`` cells as the two columns hold them: a
    list of ids, and a JSON list of one argument mapping per id (null arguments dropped, as
    IFEval's rows list every argument name with null for the unused ones). ``kwargs`` may be
    that list, its JSON text, or None (no arguments). A ``ValueError`` says what is wrong."""
    if not isinstance(ids, list | tuple) or not all(isinstance(i, str) for i in ids):
        raise ValueError(f"instruction_id_list is not a list of ids: {ids!r:.80}")
    if isinstance(kwargs, str):
        try:
            kwargs = json.loads(kwargs)
        except json.JSONDecodeError as exc:
            raise ValueError(f"kwargs is not JSON: {exc.msg}") from None
    kwargs = [None] * len(ids) if kwargs is None else kwargs
    if not isinstance(kwargs, list | tuple) or len(kwargs) != len(ids):
        raise ValueError(f"kwargs must be a list of {len(ids)} mappings, one per instruction")
    cleaned = []
    for iid, args in zip(ids, kwargs, strict=True):
        if args is not None and not isinstance(args, dict):
            raise ValueError(f"kwargs of {iid!r} is not a mapping: {args!r:.60}")
        cleaned.append({k: v for k, v in (args or {}).items() if v is not None})
    return list(ids), json.dumps(cleaned, sort_keys=True)


def missing_columns(table: pa.Table | pa.Schema, required: Sequence[str]) -> list[str]:
    """Required column names that ``table`` lacks, in the order given."""
    names = set(table.names if isinstance(table, pa.Schema) else table.schema.names)
    return [c for c in required if c not in names]


def prompt_records(table: pa.Table) -> pa.Table:
    """The prompt-record columns of ``table``, cast to ``PROMPT_SCHEMA``; instruction columns a
    table written before they existed lacks are null."""
    for name in INSTRUCTION_COLUMNS:
        if name not in table.column_names:
            field = PROMPT_SCHEMA.field(name)
            table = table.append_column(field, pa.nulls(table.num_rows, field.type))
    return table.select(list(PROMPT_COLUMNS)).cast(PROMPT_SCHEMA)

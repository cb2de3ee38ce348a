"""From a table's prompt column to prompt records: turns, invalid rows, the limit.

A prompt cell is a string, or a list of turns (MT-Bench's ``turns``: strings; Arena-Hard's on
the Hub: ``{"content": ...}`` mappings; a chat's ``messages``: mappings with a ``role``, of which
the user's turns count). ``multi_turn`` says what a list becomes: ``first``, its first turn; or
``join``, every turn in order, separated by a blank line, sent as one user message. Generation
sends every prompt as one user message (no backend replays a conversation), so a second turn
that refers to "your previous response" reads, joined, as part of one request.

A row whose prompt is empty, not text, longer than ``max_chars`` or a repeat of an earlier
prompt (after normalization) is an error naming the row, unless ``drop_invalid``: then it is
dropped and counted under its reason. ``limit`` keeps the first N prompts that pass; rows after
them are never looked at.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import pyarrow as pa

from eva_core.schema import (
    INSTRUCTION_COLUMNS,
    Instructions,
    instruction_cells,
    prompt_id,
    seed_records,
)

MultiTurn = Literal["first", "join"]
TURN_SEPARATOR = "\n\n"
DROP_REASONS = ("empty", "not_text", "too_long", "duplicate")


@dataclass(frozen=True)
class RowRules:
    """What a prompt set's rows become (``PromptsConfig`` holds the user's choices)."""

    multi_turn: MultiTurn = "first"
    drop_invalid: bool = False
    max_chars: int | None = None
    limit: int | None = None


@dataclass(frozen=True)
class PromptRows:
    """Prompt records, with how many rows were read and, by reason, dropped."""

    table: pa.Table
    read: int
    dropped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DROP_REASONS, 0))


def _turn(turn: Any) -> Any:
    """One turn's text; ``None`` for a turn that is not the user's (an assistant's reply)."""
    if isinstance(turn, Mapping):
        if turn.get("role", "user") != "user":
            return None
        return turn.get("content", turn)  # no content: the mapping, named as not text
    return turn


def cell_text(value: Any, multi_turn: MultiTurn) -> Any:
    """A prompt cell as the text to send: a string as is, a list of turns as ``multi_turn``
    says; anything else is returned unchanged, for the caller to name."""
    if isinstance(value, Mapping):
        return _turn(value)
    if not isinstance(value, (list, tuple)):
        return value
    turns = [t for t in (_turn(v) for v in value) if t is not None]
    if multi_turn == "first" or not turns:
        return turns[0] if turns else None
    odd = [t for t in turns if not isinstance(t, str)]
    if odd:
        return odd[0]  # named as not text
    return TURN_SEPARATOR.join(t for t in turns if t.strip())


def _problem(text: Any, max_chars: int | None) -> tuple[str, str] | None:
    """``(reason, message)`` for a prompt that cannot be used, else None."""
    if text is not None and not isinstance(text, str):
        shown = repr(text)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        return "not_text", f"prompt is not text (got {type(text).__name__} {shown})"
    if text is None or not text.strip():
        return "empty", "prompt is empty"
    if max_chars is not None and len(text) > max_chars:
        return "too_long", f"prompt has {len(text)} characters, more than max_chars={max_chars}"
    return None


def select_prompts(
    table: pa.Table, prompt_column: str, category_column: str | None, rules: RowRules
) -> PromptRows:
    """The prompt records of ``table`` under ``rules``; a ``ValueError`` names the first row that
    cannot be used (unless ``rules.drop_invalid``) or says that nothing was left."""
    wanted = (prompt_column, category_column, *INSTRUCTION_COLUMNS)
    columns = {n: table.column(n).to_pylist() for n in table.column_names if n in wanted}
    return select_columns(columns, prompt_column, category_column, rules)


def select_columns(
    columns: dict[str, list[Any]],
    prompt_column: str,
    category_column: str | None,
    rules: RowRules,
) -> PromptRows:
    """``select_prompts`` on a table's columns as Python values (what a JSON file holds, where
    one row's prompt may be a number and the rest text). Where the table has IFEval's
    ``instruction_id_list`` (and ``kwargs``), each prompt keeps its instructions."""
    cells = columns[prompt_column]
    labels = columns.get(category_column or "", [None] * len(cells))
    ids = columns.get("instruction_id_list")
    given = list(zip(ids, columns.get("kwargs", [None] * len(cells)), strict=True)) if ids else None
    return select_cells(cells, labels, rules, given)


def select_cells(
    cells: list[Any],
    labels: list[Any],
    rules: RowRules,
    instructions: list[tuple[Any, Any]] | None = None,
) -> PromptRows:
    """``select_columns`` on the prompt cells, category labels and instruction cells (ids,
    kwargs) of each row."""
    if not cells:
        raise ValueError("no prompts (0 rows)")
    dropped = dict.fromkeys(DROP_REASONS, 0)
    texts: list[str] = []
    categories: list[str | None] = []
    kept: list[Instructions | None] = []
    seen: dict[str, int] = {}
    read = 0
    for row, cell in enumerate(cells):
        if rules.limit is not None and len(texts) == rules.limit:
            break
        read += 1
        text = cell_text(cell, rules.multi_turn)
        problem = _problem(text, rules.max_chars)
        if problem is None:
            pid = prompt_id(text)
            if pid in seen:
                problem = "duplicate", f"prompt duplicates row {seen[pid]} after normalization"
            else:
                seen[pid] = row
        if problem is not None:
            if not rules.drop_invalid:
                raise ValueError(f"row {row}: {problem[1]}")
            dropped[problem[0]] += 1
            continue
        texts.append(text)
        categories.append(None if labels[row] is None else str(labels[row]))
        ids, kwargs = instructions[row] if instructions else (None, None)
        try:
            kept.append(None if ids is None else instruction_cells(ids, kwargs))
        except ValueError as exc:  # never dropped: a prompt's instructions are its reward
            raise ValueError(f"row {row}: {exc}") from None
    if not texts:
        counts = ", ".join(f"{n} {reason}" for reason, n in dropped.items() if n)
        raise ValueError(f"no prompts left of {read} rows (dropped: {counts})")
    records = seed_records(texts, categories, instructions=kept if instructions else None)
    return PromptRows(records, read=read, dropped=dropped)


def dropped_line(rows: PromptRows) -> str:
    """One line for the log: what was kept of what was read, and why the rest was dropped."""
    counts = ", ".join(f"{n} {reason}" for reason, n in rows.dropped.items() if n)
    return f"kept {rows.table.num_rows} of {rows.read} rows read" + (
        f"; dropped {counts}" if counts else ""
    )

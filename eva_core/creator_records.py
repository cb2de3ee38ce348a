"""The prompt records eva's creator (``eva_core.creator``) takes in and makes: its seeds, given
as texts or as a framework's rows, and the children a rewriter writes of its parents.

A record is a dict with the prompt schema's fields (``eva_core.schema``) and, beside them, a
framework's own columns: a seed row's other keys travel with its prompt, and a child copies
only those its parent's columns named in ``inherit`` (a data source tag, never a ground truth:
a rewritten question has its own answer).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Literal

import pyarrow as pa

from eva_core.creator_checks import checked_rewrites, rewriter_name
from eva_core.evolution import EvolveStats, clean_rewrite, evolved_records
from eva_core.schema import PROMPT_SCHEMA, instruction_cells, prompt_id, seed_records

Record = dict[str, Any]
Rewrite = str | tuple[str, str]
Rewriter = Callable[[list[Record], int, int], Sequence[Sequence[Rewrite]]]
# What an evolution made: the children, the priority each starts with, what the rewrites'
# post-processing counted, and how many parents the rewriter gave nothing usable.
Evolved = tuple[list[Record], list[float], EvolveStats, int]


def as_records(
    seeds: Sequence[str] | Sequence[Mapping[str, Any]],
    duplicates: Literal["refuse", "drop"] = "refuse",
) -> list[Record]:
    """Seed prompt records from texts, or from dicts with a ``prompt`` (other keys are kept,
    so a framework's own columns, such as a ground truth, travel with the prompt). A prompt
    that repeats an earlier one after normalization is refused, naming its row, or with
    ``duplicates="drop"`` dropped (the first one is kept)."""
    if not seeds:
        raise ValueError("the seed set is empty")
    rows = [{"prompt": s} if isinstance(s, str) else dict(s) for s in seeds]
    if missing := [i for i, r in enumerate(rows) if not isinstance(r.get("prompt"), str)]:
        raise ValueError(f"seed row {missing[0]} has no text 'prompt'")
    if duplicates == "drop":
        firsts: dict[str, dict[str, Any]] = {}
        for row in rows:
            if row["prompt"].strip():  # an empty prompt is refused below, with its row
                firsts.setdefault(prompt_id(row["prompt"]), row)
        rows = list(firsts.values()) + [r for r in rows if not r["prompt"].strip()]
    # A row's verifiable instructions (IFEval's columns) stay its own, as the columns hold them.
    given = [
        instruction_cells(r["instruction_id_list"], r.get("kwargs"))
        if r.get("instruction_id_list") is not None
        else None
        for r in rows
    ]
    texts, categories = [r["prompt"] for r in rows], [r.get("category") for r in rows]
    table = seed_records(texts, categories, instructions=given if any(given) else None)
    return [{**row, **record} for row, record in zip(rows, table.to_pylist(), strict=True)]


def evolve_children(
    rewriter: Rewriter,
    parents: list[Record],
    priorities: list[float],
    n: int,
    seed: int,
    at: int,
    *,
    max_chars: int | None = None,
    categorize: Callable[[str], str | None] | None = None,
    exclude_ids: Collection[str] = (),
    inherit: Sequence[str] = (),
) -> Evolved:
    """Children of ``parents`` as prompt records with lineage, each starting at its parent's
    informativeness as priority, made at observation ``at`` (their ``iteration``); and the
    parents the rewriter gave nothing usable. A rewriter's own error goes up with a note naming
    it; an answer other than up to ``n`` rewrites per parent raises ``ValueError`` naming it."""
    try:
        answer = rewriter(parents, n, seed)
    except Exception as exc:  # its own error (a caller may handle its type), naming it
        if hasattr(exc, "add_note"):  # Python 3.11+
            exc.add_note(f"raised by the creator's rewriter {rewriter_name(rewriter)}")
        raise
    raw = checked_rewrites(rewriter, answer, parents, n)
    failed = sum(not any(clean_rewrite(r[0]) for r in rewrites) for rewrites in raw)
    table = pa.Table.from_pylist(
        [{name: p.get(name) for name in PROMPT_SCHEMA.names} for p in parents],
        schema=PROMPT_SCHEMA,
    )
    children, stats = evolved_records(
        table, raw, at, max_chars, categorize, exclude_ids=exclude_ids
    )
    by_parent = dict(zip((p["prompt_id"] for p in parents), priorities, strict=True))
    extra = {p["prompt_id"]: {k: p[k] for k in inherit if k in p} for p in parents}
    records = [{**extra[r["parent_id"]], **r} for r in children.to_pylist()]
    return records, [by_parent[r["parent_id"]] for r in records], stats, failed

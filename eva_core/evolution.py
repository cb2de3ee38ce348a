"""Turning an evolver's raw rewrites into prompt records with lineage.

Whatever produced the rewrites (the world's operators, distilabel EvolInstruct, an API model),
the same clean-up applies, and every dropped candidate is counted under its reason so a run can
tell a bad rewriter from a strict filter.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import pyarrow as pa

from eva_core.schema import EVOLVED, PROMPT_SCHEMA, prompt_id

# Lower-cased openings of a rewriter declining the task; such output is not a prompt.
REFUSAL_PREFIXES = (
    "i'm sorry",
    "i am sorry",
    "sorry, i",
    "i cannot",
    "i can't",
    "as an ai",
    "i apologize",
)


@dataclass
class EvolveStats:
    parents: int = 0
    candidates: int = 0
    kept: int = 0
    dropped: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(
            ("empty", "refusal", "too_long", "same_as_parent", "duplicate"), 0
        )
    )

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def evolved_records(
    parents: pa.Table,
    candidates: Sequence[Sequence[tuple[str, str]]],
    iteration: int,
    max_chars: int | None = None,
    categorize: Callable[[str], str | None] | None = None,
) -> tuple[pa.Table, EvolveStats]:
    """Prompt records for the rewrites of each parent row.

    ``candidates[i]`` holds ``(text, method)`` pairs for ``parents`` row ``i``. Kept rewrites
    inherit the parent's root, one level deeper. ``categorize`` labels a rewrite (in-breadth
    rewrites may change category); without it the parent's category is inherited.
    """
    if len(candidates) != parents.num_rows:
        raise ValueError(f"{len(candidates)} candidate lists for {parents.num_rows} parents")
    stats = EvolveStats(parents=parents.num_rows)
    cols = {
        name: parents.column(name).to_pylist()
        for name in ("prompt_id", "root_id", "depth", "category")
    }
    rows: dict[str, list] = {name: [] for name in PROMPT_SCHEMA.names}
    seen: set[str] = set()
    for i, rewrites in enumerate(candidates):
        for text, method in rewrites:
            stats.candidates += 1
            reason = _drop_reason(text, max_chars)
            pid = prompt_id(text) if reason is None else ""
            if reason is None and pid == cols["prompt_id"][i]:
                reason = "same_as_parent"
            elif reason is None and pid in seen:
                reason = "duplicate"
            if reason is not None:
                stats.dropped[reason] += 1
                continue
            seen.add(pid)
            text = text.strip()
            rows["prompt_id"].append(pid)
            rows["prompt"].append(text)
            rows["source"].append(EVOLVED)
            rows["parent_id"].append(cols["prompt_id"][i])
            rows["root_id"].append(cols["root_id"][i])
            rows["depth"].append(cols["depth"][i] + 1)
            rows["iteration"].append(iteration)
            rows["evolve_method"].append(method)
            rows["category"].append(categorize(text) if categorize else cols["category"][i])
    stats.kept = len(rows["prompt_id"])
    return pa.table(rows, schema=PROMPT_SCHEMA), stats


def _drop_reason(text: str, max_chars: int | None) -> str | None:
    stripped = text.strip() if isinstance(text, str) else ""
    if not stripped:
        return "empty"
    if stripped.lower().startswith(REFUSAL_PREFIXES):
        return "refusal"
    if max_chars is not None and len(stripped) > max_chars:
        return "too_long"
    return None

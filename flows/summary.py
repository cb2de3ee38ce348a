"""The per-iteration summary a run prints and publishes, read back from stage manifests."""

from __future__ import annotations

from typing import Any

from flows.config import RunConfig
from tasks.store import RunStore

COLUMNS = (
    "iteration",
    "prompts",
    "complexity",
    "mean_informativeness",
    "evolved_kept",
    "pairs",
    "heldout_score",
    "heldout_solved",
)


def iteration_summary(store: RunStore, config: RunConfig) -> list[dict[str, Any]]:
    def stat(it: int | None, stage: str, key: str) -> Any:
        m = store.read_manifest(it, stage)
        return None if m is None else m["stats"].get(key)

    rows = [
        {
            "iteration": "theta_0",
            "prompts": stat(None, "prompts", "prompts"),
            "heldout_score": stat(None, "evaluate", "score"),
            "heldout_solved": stat(None, "evaluate", "solved"),
        }
    ]
    first = 0 if config.iteration0_dpo else 1
    for t in range(first, config.iterations + 1):
        rows.append({
            "iteration": t,
            "prompts": stat(t, "generate", "prompts"),
            "complexity": stat(t, "complexity", "mean_complexity"),
            "mean_informativeness": stat(t, "score", "mean_informativeness"),
            "evolved_kept": stat(t, "mix", "evolved"),
            "pairs": stat(t, "pairs", "pairs"),
            "heldout_score": stat(t, "evaluate", "score"),
            "heldout_solved": stat(t, "evaluate", "solved"),
        })  # fmt: skip
    return rows


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def summary_table(rows: list[dict[str, Any]]) -> str:
    """A plain-text table for the terminal."""
    cells = [list(COLUMNS)] + [[_fmt(r.get(c)) for c in COLUMNS] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
    return "\n".join(
        "  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells
    )


def summary_markdown(run: str, rows: list[dict[str, Any]]) -> str:
    head = "| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS)
    body = "\n".join("| " + " | ".join(_fmt(r.get(c)) for c in COLUMNS) + " |" for r in rows)
    return f"## eva run `{run}`\n\n{head}\n{body}\n"

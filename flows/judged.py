"""The LLM judge's win rate in a run's summary and charts, read back from its ``judge`` stages:
per checkpoint with its bootstrap interval, and per category.

A summary row of a judged checkpoint carries ``judge_win_rate`` and ``judge_interval`` (the
columns the terminal and the UI show) and ``judge_detail`` (what the lines under the table and
the per-category table are made of). A run without a judge has none of them, so its summary is
exactly what it was before the judge existed.
"""

from __future__ import annotations

from typing import Any

from flows.charts import Chart, line_chart
from flows.markdown import md_table
from tasks.store import RunStore

COLUMNS = ("judge_win_rate", "judge_interval")
# More categories than this are left to the UI, the charts and `eva show`: a terminal table of
# Arena-Hard's 250 clusters would bury the summary.
TERMINAL_CATEGORIES = 12


def judge_columns(store: RunStore, iteration: int | None) -> dict[str, Any]:
    """A summary row's judge fields for the checkpoint at ``iteration`` (None: theta_0); {}
    before it was judged."""
    manifest = store.read_manifest(iteration, "judge")
    if manifest is None:
        return {}
    stats = manifest["stats"]
    per = stats.get("per_category") or {}
    low, high = stats.get("per_category_low") or {}, stats.get("per_category_high") or {}
    return {
        "judge_win_rate": stats.get("win_rate"),
        "judge_interval": [stats.get("ci_low"), stats.get("ci_high")],
        "judge_detail": {
            "model": stats.get("judge_model"),
            "confidence": stats.get("confidence"),
            "judged": stats.get("judged"),
            "unjudged": stats.get("unjudged"),
            "unparseable": stats.get("unparseable"),
            "failed": stats.get("failed"),
            "per_category": {c: [per[c], low.get(c), high.get(c)] for c in per},
        },
    }


def judged(rows: list[dict[str, Any]]) -> bool:
    return any("judge_win_rate" in r for r in rows)


def _cell(rate: Any, interval: Any) -> str:
    def number(v: Any) -> str:
        return "-" if v is None else f"{v:.3f}"

    if rate is None:
        return "-"
    low, high = interval if isinstance(interval, list | tuple) else (None, None)
    return f"{number(rate)} [{number(low)}, {number(high)}]"


def _category_table(rows: list[dict[str, Any]], key: str) -> tuple[list[str], list[list[str]]]:
    """Categories down, checkpoints across: the header and one row of cells per category."""
    done = [r for r in rows if "judge_detail" in r]
    names = sorted({c for r in done for c in r["judge_detail"]["per_category"]})
    header = ["category", *(str(r[key]) for r in done)]
    body = []
    for name in names:
        cells = [r["judge_detail"]["per_category"].get(name) for r in done]
        body.append([name, *(_cell(c[0], c[1:]) if c else "-" for c in cells)])
    return header, body


def judge_lines(rows: list[dict[str, Any]], key: str) -> list[str]:
    """The lines under the terminal's summary: what the judge's columns mean, what it could
    not judge, and its win rate per category (or where to find it)."""
    done = [r for r in rows if "judge_detail" in r]
    if not done:
        return []
    detail = done[-1]["judge_detail"]
    confidence = detail.get("confidence") or 0.95
    lines = [
        f"judge_win_rate: {detail['model']}'s verdicts against the reference answers, both "
        f"orders, ties half; judge_interval: {confidence:.0%} bootstrap interval over the "
        f"{detail['judged']} judged prompts"
    ]
    for r in done:
        d = r["judge_detail"]
        if d.get("unjudged"):
            lines.append(
                f"judge, {key} {r[key]}: {d['unjudged']} prompts without a usable verdict "
                f"({d.get('unparseable')} unparseable, {d.get('failed')} failed requests), "
                "left out"
            )
    header, body = _category_table(rows, key)
    if len(body) > TERMINAL_CATEGORIES:
        lines.append(
            f"judge win rate per category: {len(body)} categories, in the UI's "
            "summary and charts and in each judge stage (eva show --stage judge)"
        )
    elif body:
        cells = [header, *body]
        widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
        lines.append("judge win rate per category:")
        lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True))
                  for row in cells]  # fmt: skip
    return lines


def judge_markdown(rows: list[dict[str, Any]], key: str) -> str:
    """The per-category win rates as a markdown table ("" without a judge)."""
    header, body = _category_table(rows, key)
    if not body:
        return ""
    table = "\n".join(md_table(header, body))
    return f"\n### Judge win rate per category\n\n{table}\n"


def judge_charts(
    rows: list[dict[str, Any]], key: str, prefix: str, unit: str
) -> list[tuple[str, Chart | None]]:
    """The win rate per checkpoint with its interval, and per category ([] without a judge)."""
    if not judged(rows):
        return []
    names = {float(i): "theta_0" if r[key] == "theta_0" else f"{prefix}.{r[key]}"
             for i, r in enumerate(rows)}  # fmt: skip
    done = [(i, r) for i, r in enumerate(rows) if r.get("judge_win_rate") is not None]
    name = "judge win rate"
    bands = {name: [(i, *_interval(r)) for i, r in done]}
    overall = line_chart(
        "Judge win rate against the reference answers (bootstrap interval)",
        {name: [(i, r["judge_win_rate"]) for i, r in done]},
        f"checkpoint (after {unit})", names=names, bands=bands,
    )  # fmt: skip
    series: dict[str, list[tuple[float, float]]] = {}
    for i, r in enumerate(rows):
        for category, (rate, *_) in r.get("judge_detail", {}).get("per_category", {}).items():
            if rate is not None:
                series.setdefault(category, []).append((i, rate))
    per_category: Chart | None = line_chart(
        "Judge win rate per category", series, f"checkpoint (after {unit})", names=names
    )
    return [("judge win rate", overall), ("judge win rate per category", per_category)]


def _interval(row: dict[str, Any]) -> tuple[float, float]:
    low, high = row.get("judge_interval") or (None, None)
    nan = float("nan")
    return (nan if low is None else low), (nan if high is None else high)

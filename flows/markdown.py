"""eva's one markdown table writer: the run summary, the judge's tables and the benchmarks'
reports all build their tables here (a library, tabulate, would be a dependency for three
lines)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def md_table(head: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """The lines of a markdown table: header, separator, one line per row."""
    return [md_row(head), "|" + "---|" * len(head), *map(md_row, rows)]


def md_row(cells: Sequence[str]) -> str:
    """One line of a markdown table (for a table printed a row at a time)."""
    return "| " + " | ".join(cells) + " |"

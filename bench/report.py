"""Tables and plots from ``bench.method`` results (mean +- std over seeds)."""

from __future__ import annotations

import os
import platform
import time
from typing import Any

import numpy as np

Results = dict[str, dict[str, Any]]  # seed -> arm -> result


def _stat(values: list[float]) -> str:
    a = np.asarray(values, dtype=float)
    return f"{a.mean():.3f} ± {a.std(ddof=1):.3f}" if len(a) > 1 else f"{a.mean():.3f}"


def _rows(results: Results, arm: str, t: int | None) -> list[dict[str, Any]]:
    out = []
    for per_seed in results.values():
        entry = per_seed[arm]
        out.append(entry if t is None else entry["iterations"][t - 1])
    return out


def _line(label: str, rows: list[dict[str, Any]], cats: list[str]) -> str:
    cells = [label, _stat([r["score"] for r in rows]), _stat([r["solved"] for r in rows])]
    cells += [_stat([r.get(f"cat_{c}", np.nan) for r in rows]) for c in cats]
    if "pairs" in rows[0]:
        cells.append(_stat([r["pairs"] for r in rows]))
        cells.append(_stat([r["difficulty"] for r in rows]))
    else:
        cells += ["-", "-"]
    return "| " + " | ".join(cells) + " |"


def _table(title: str, lines: list[str], cats: list[str]) -> str:
    head = [
        "arm",
        "held-out score",
        "solved",
        *[f"score {c}" for c in cats],
        "pairs",
        "train difficulty",
    ]
    return "\n".join(
        [f"### {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head), *lines, ""]
    )


def write_method_report(
    results: Results, out_dir: str, name: str, seconds: float, quick: bool
) -> str:
    first = next(iter(results.values()))
    cats = sorted(k.removeprefix("cat_") for k in first["theta_0"] if k.startswith("cat_"))
    arms = [a for a in first if a not in ("theta_0", "theta_1")]
    base = [
        _line("theta_0", _rows(results, "theta_0", None), cats),
        _line("theta_1 (DPO, seed split 1)", _rows(results, "theta_1", None), cats),
    ]

    parts = [
        f"## Method benchmark ({'quick' if quick else 'full'})",
        "",
        f"{len(results)} seed(s): {', '.join(results)}; {seconds / 60:.1f} min on "
        f"{platform.machine()} with {os.cpu_count()} cores, "
        f"{time.strftime('%Y-%m-%d')}. Score = mean dense reward of greedy answers on the "
        "held-out set; ± is the standard deviation over seeds.",
        "",
    ]
    t2 = [
        *base,
        _line("+new seed prompts (fresh)", _rows(results, "fresh", 1), cats),
        _line("+eva", _rows(results, "eva", 1), cats),
    ]
    parts.append(_table("Table 2 analogue: one iteration from theta_1", t2, cats))
    t4 = [
        _line(a.removeprefix("metric-"), _rows(results, a, 1), cats)
        for a in arms
        if a.startswith("metric-")
    ]
    t4.append(_line("a_min (default)", _rows(results, "eva", 1), cats))
    parts.append(_table("Table 4 analogue: informativeness metric", t4, cats))
    t5 = [
        _line(label, _rows(results, a, 1), cats)
        for a, label in (
            ("subset-greedy", "no evolving, greedy"),
            ("subset-weighted", "no evolving, weighted"),
            ("eva-greedy", "evolving, greedy"),
            ("eva", "evolving, weighted"),
        )
        if a in arms
    ]
    parts.append(_table("Table 5 analogue: evolving and sampling", t5, cats))
    iterations = len(first["eva"]["iterations"])
    t13 = [*base]
    for t in range(1, iterations + 1):
        t13.append(_line(f"fresh, iteration {t}", _rows(results, "fresh", t), cats))
        t13.append(_line(f"eva, iteration {t}", _rows(results, "eva", t), cats))
    parts.append(_table(f"Table 13 analogue: {iterations} iterations", t13, cats))
    parts.append(_plots(results, out_dir, name, iterations))
    md = "\n".join(parts)
    with open(os.path.join(out_dir, f"{name}.md"), "w") as f:
        f.write(md)
    return md


def _plots(results: Results, out_dir: str, name: str, iterations: int) -> str:
    """Training-set difficulty and category mix over iterations (Table 7 / Figure 6)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    ts = list(range(1, iterations + 1))
    for arm in ("fresh", "eva"):
        d = np.array(
            [
                [r["iterations"][t - 1]["difficulty"] for t in ts]
                for r in (per_seed[arm] for per_seed in results.values())
            ]
        )
        ax1.errorbar(ts, d.mean(0), yerr=d.std(0), marker="o", label=arm, capsize=3)
    ax1.set(xlabel="iteration", ylabel="mean difficulty of X_t", title="Training-set difficulty")
    ax1.set_xticks(ts)
    ax1.legend()
    cats = ["add", "sub", "rev"]
    shares = np.zeros((iterations, len(cats)))
    for per_seed in results.values():
        for t in ts:
            c = per_seed["eva"]["iterations"][t - 1]["categories"]
            total = sum(c.values())
            shares[t - 1] += [c.get(k, 0) / total / len(results) for k in cats]
    bottom = np.zeros(iterations)
    for i, cat in enumerate(cats):
        ax2.bar(ts, shares[:, i], bottom=bottom, label=cat)
        bottom += shares[:, i]
    ax2.set(xlabel="iteration", ylabel="share of X_t", title="eva: category mix")
    ax2.set_xticks(ts)
    ax2.legend()
    fig.tight_layout()
    path = os.path.join(out_dir, f"{name}-curriculum.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return (
        f"### Table 7 / Figure 6 analogue: curriculum\n\n![curriculum]({os.path.basename(path)})\n"
    )

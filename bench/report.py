"""Tables and plots from ``bench.method`` results (mean +- std over seeds), and the cells and
machine line the other bench reports share."""

from __future__ import annotations

import os
import platform
import time
from typing import Any

import numpy as np

from flows.markdown import md_table

Results = dict[str, dict[str, Any]]  # seed -> arm -> result


def mean_std(values: list[float]) -> str:
    """'mean ± sample std' over seeds (just the mean for one seed)."""
    a = np.asarray(values, dtype=float)
    return f"{a.mean():.3f} ± {a.std(ddof=1):.3f}" if len(a) > 1 else f"{a.mean():.3f}"


def _rows(results: Results, arm: str, t: int | None) -> list[dict[str, Any]]:
    """One row per seed for ``arm`` at iteration ``t`` (None: a base model), each carrying
    ``delta``: its score minus the same seed's starting model (``base``: theta_1 for the offline
    arms, theta_0 for theta_1 itself and the online arms), a paired difference that removes
    most of the seed-to-seed spread. Empty when the arm was not run (or not that long)."""
    out = []
    for per_seed in results.values():
        if arm not in per_seed:
            return []
        entry = per_seed[arm]
        if t is not None and len(entry["iterations"]) < t:
            return []
        row = entry if t is None else entry["iterations"][t - 1]
        base = entry.get("base")
        start = per_seed[base]["score"] if base else row["score"]
        out.append({**row, "delta": row["score"] - start, "topup": entry.get("topup", 1.0)})
    return out


def _line(label: str, rows: list[dict[str, Any]], cats: list[str]) -> list[str]:
    """A table row over seeds; empty when the arm was not run."""
    if not rows:
        return []
    cells = [label, mean_std([r["score"] for r in rows]), mean_std([r["delta"] for r in rows])]
    cells.append(mean_std([r["solved"] for r in rows]))
    cells += [mean_std([r.get(f"cat_{c}", np.nan) for r in rows]) for c in cats]
    if "difficulty" in rows[0]:
        cells.append(mean_std([r["pairs"] for r in rows]))
        cells.append(mean_std([r["difficulty"] for r in rows]))
    else:
        cells += ["-", "-"]
    if "responses" in rows[0]:
        cells.append(f"{np.mean([r['responses'] for r in rows]):.0f}")
        cells.append("x" + "/".join(sorted({f"{r['topup']:g}" for r in rows})))
    else:
        cells += ["-", "-"]
    return cells


def _table(title: str, lines: list[list[str]], cats: list[str], vs: str = "start") -> str:
    head = [
        "arm",
        "held-out score",
        f"Δ vs {vs}",
        "solved",
        *[f"score {c}" for c in cats],
        "pairs",
        "train difficulty",
        "responses generated",
        "source grown",
    ]
    return "\n".join([f"### {title}", "", *md_table(head, [ln for ln in lines if ln]), ""])


_TAUGHT = ("pairs", "sample_reward", "chosen_exact", "steps", "train_loss", "train_margin")


def _taught_table(results: Results, arms: list[str]) -> str:
    """What each solver step was given and how far it moved (see bench.method_results)."""
    lines = []
    first = next(iter(results.values()))
    for arm in ["theta_1", *arms]:
        its = [first[arm]] if arm == "theta_1" else first[arm]["iterations"]
        for t in range(len(its)):
            rows = _rows(results, arm, None if arm == "theta_1" else t + 1)
            if not rows or "chosen_exact" not in rows[0]:
                continue
            cells = [f"{arm}, iteration {0 if arm == 'theta_1' else t + 1}"]
            cells += [mean_std([r[k] for r in rows]) for k in _TAUGHT]
            lines.append(cells)
    head = ["arm", "pairs", "mean sample reward on X_t", "chosen exact", "optimizer steps",
            "final loss", "final margin"]  # fmt: skip
    return "\n".join(["### What the solver was taught", "", *md_table(head, lines), ""])


def write_method_report(
    results: Results, out_dir: str, name: str, seconds: float, quick: bool, command: str
) -> str:
    first = next(iter(results.values()))
    cats = sorted(k.removeprefix("cat_") for k in first["theta_0"] if k.startswith("cat_"))
    arms = [a for a in first if not a.startswith("theta_")]

    def line(label: str, arm: str, t: int | None = 1) -> list[str]:
        return _line(label, _rows(results, arm, t), cats)

    base = [
        line("theta_0", "theta_0", None),
        line("theta_1 (world solver: DPO+NLL)", "theta_1", None),
    ]
    parts = [
        f"## Method benchmark ({'quick' if quick else 'full'})",
        "",
        f"`{command}`",
        "",
        f"{len(results)} seed(s): {', '.join(results)}; {seconds / 60:.1f} min; "
        f"{machine()}. Score = mean dense reward of greedy answers on the "
        "held-out set; ± is the standard deviation over seeds; Δ is the paired difference "
        "from the same seed's starting model (theta_0 for theta_1 and the online arms, the "
        "arm's theta_1 otherwise).",
        "",
    ]
    t2 = [
        *base,
        line("+new seed prompts (fresh)", "fresh"),
        line("+eva", "eva"),
        line("+target prompts (upper bound)", "target"),
    ]
    for s in ("dpo", "simpo", "orpo", "sppo"):
        t2 += [
            line(f"theta_1 ({s})", f"theta_1-{s}", None),
            line(f"{s}: +new seed prompts", f"fresh-{s}"),
            line(f"{s}: +eva", f"eva-{s}"),
        ]
    parts.append(_table("Table 2 analogue: one iteration from theta_1", t2, cats))
    t4 = [line(a.removeprefix("metric-"), a) for a in arms if a.startswith("metric-")]
    t4.append(line("a_min (default)", "eva"))
    parts.append(_table("Table 4 analogue: informativeness metric", t4, cats, "theta_1"))
    t5 = [
        line(label, a)
        for a, label in (
            ("subset-greedy", "no evolving, greedy"),
            ("subset-weighted", "no evolving, weighted"),
            ("eva-greedy", "evolving, greedy"),
            ("eva", "evolving, weighted"),
        )
        if a in arms
    ]
    parts.append(_table("Table 5 analogue: evolving and sampling", t5, cats, "theta_1"))
    iterations = len(first["eva"]["iterations"]) if "eva" in first else 0
    both = "fresh" in first and iterations > 0
    if both:
        t13 = [*base]
        for t in range(1, iterations + 1):
            for arm in ("fresh", "eva", "eva-previous", "target"):
                t13.append(line(f"{arm}, iteration {t}", arm, t))
        parts.append(_table(f"Table 13 analogue: {iterations} iterations", t13, cats, "theta_1"))
    if "online-rloo" in first:
        t1 = [line("theta_0", "theta_0", None)]
        for arm, label in (("online-rloo", "RLOO"), ("online-eva", "RLOO-eva")):
            for t in range(1, len(first[arm]["iterations"]) + 1):
                t1.append(line(f"{label} ({t}x)", arm, t))
        parts.append(_table("Table 1 analogue: online, by prompt budget", t1, cats, "theta_0"))
    nulls = [
        line(label, a)
        for a, label in (
            ("eva", "eva (reward-guided selection, directed evolution)"),
            ("metric-uniform", "uniform selection, directed evolution"),
            ("random-evolution", "uniform selection, random evolution"),
            ("subset-weighted", "reward-guided selection, no evolution"),
        )
        if a in arms or a == "eva"
    ]
    parts.append(_table("Null controls: selection and evolution apart", nulls, cats, "theta_1"))
    from bench.claims import claims_table

    parts.append(claims_table(results))
    parts.append(_taught_table(results, [a for a in ("fresh", "eva", "target") if a in arms]))
    if both:
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
    for arm in ("fresh", "eva", "target"):
        if arm not in next(iter(results.values())):
            continue
        runs = [per_seed[arm]["iterations"] for per_seed in results.values()]
        arm_ts = list(range(1, min(len(r) for r in runs) + 1))
        d = np.array([[r[t - 1]["difficulty"] for t in arm_ts] for r in runs])
        ax1.errorbar(arm_ts, d.mean(0), yerr=d.std(0), marker="o", label=arm, capsize=3)
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


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}"

"""``eva bench report STUDY``: the tables, the plots and the verdicts of a study from whatever its
results file holds (a study half run reports its finished seeds). Every figure is a mean ± sd
over the seeds that have it; every difference is paired by seed."""

from __future__ import annotations

import os
import platform
import time
from typing import Any, Literal

import numpy as np

from bench.claims import by_t, judge, no_worse
from bench.study import Claim, Plot, Study, split_at
from flows.markdown import md_table

Point = tuple[str, int | Literal["last"] | None]  # (arm, iteration; None: theta_0; "last":
# an arm read at its last iteration that has none recorded)
Index = dict[Point, dict[int, dict[str, Any]]]  # (arm, t) -> seed -> record


def index(records: list[dict[str, Any]]) -> Index:
    out: Index = {}
    for r in records:
        out.setdefault((r["arm"], r["iteration"]), {})[r["seed"]] = r
    return out


def value(record: dict[str, Any] | None, measure: str) -> float | None:
    """A record's number at ``measure`` (a dotted path into nested figures), else None."""
    v: Any = record
    for key in measure.split("."):
        v = v.get(key) if isinstance(v, dict) else None
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def mean_std(values: list[float]) -> str:
    """'mean ± sample sd' over seeds (the mean alone for one seed; '-' for none); counts
    without decimals."""
    a = np.asarray(values, dtype=float)
    if not a.size:
        return "-"
    f = ",.0f" if np.all(a == np.round(a)) and np.abs(a).max() >= 2 else ".3f"
    return f"{a.mean():{f}} ± {a.std(ddof=1):{f}}" if a.size > 1 else f"{a.mean():{f}}"


def column(idx: Index, key: Point, measure: str) -> dict[int, float]:
    """seed -> the measure at (arm, t), for the seeds that have it."""
    got = {s: value(r, measure) for s, r in idx.get(key, {}).items()}
    return {s: v for s, v in got.items() if v is not None}


def where(idx: Index, ref: str, t: int | None = None) -> Point:
    """(arm, iteration) of 'ARM' (its last recorded, or ``t``), 'ARM@T' or 'ARM@theta_0'."""
    name, at = split_at(ref)
    if at == "last":
        if t is not None:
            return name, t
        done = [it for arm, it in idx if arm == name and isinstance(it, int)]
        return name, max(done, default="last")  # none recorded: no point, not its theta_0
    return name, at


def label(point: Point) -> str:
    """'ARM@T', 'ARM@theta_0', or 'ARM' for an arm with no iteration recorded."""
    if point[1] == "last":
        return point[0]
    return f"{point[0]}@{'theta_0' if point[1] is None else point[1]}"


def diff(idx: Index, a: Point, b: Point, measure: str) -> np.ndarray:
    x, y = column(idx, a, measure), column(idx, b, measure)
    return np.asarray([x[s] - y[s] for s in sorted(x) if s in y], dtype=float)


def cell(d: np.ndarray) -> str:
    if not d.size:
        return "-"
    sd = f" ± {d.std(ddof=1):.3f}" if d.size > 1 else ""
    return f"{d.mean():+.3f}{sd} ({int((d > 0).sum())} of {d.size} > 0)"


def verdict(claim: Claim, idx: Index, t: int | None) -> list[str]:
    """The claim's row: the comparison in words, the paired differences, the verdict, the
    margin."""
    a, b = where(idx, claim.a, t), where(idx, claim.b, t)
    d = diff(idx, a, b, claim.measure)
    if claim.rule == "t":
        held = by_t(d, claim.sign, claim.t)
    elif claim.rule == "no-worse":
        held = no_worse(d, np.asarray(list(column(idx, b, claim.measure).values())), claim.sign)
    else:
        held = judge(d, claim.sign, claim.sds, claim.floor)
    if 1 < d.size < claim.min_seeds:  # the rule as written needs more seeds than have run
        held = (f"{d.size} of {claim.min_seeds} seeds: not judged", f"{d.mean() * claim.sign:+.3f}")
    if (
        a in idx
        and b in idx
        and not (column(idx, a, claim.measure) or column(idx, b, claim.measure))
    ):
        held = (f"no number at {claim.measure}", "-")  # a misspelt measure is not "not run"
    return [claim.name, f"{label(a)} - {label(b)}", claim.measure, cell(d), *held]


def table(
    study: Study, idx: Index, title: str, points: list[tuple[str, Point]], columns: list[str]
) -> list[str]:
    """A table, a row per (label, (arm, t)): seeds, each column, Δ of the first column from the
    arm's start (paired), and how far its source grew."""
    rows = []
    for name, key in points:
        if key not in idx:
            continue
        arm = study.arm(key[0])
        start = where(idx, arm.start) if arm.start and key[1] is not None else None
        grown = sorted({f"x{r.get('grown', 1.0):g}" for r in idx[key].values()})
        cells = [mean_std(list(column(idx, key, c).values())) for c in columns]
        delta = cell(diff(idx, key, start, columns[0])) if start else "-"
        rows.append([name, str(len(idx[key])), *cells, delta, "/".join(grown)])
    head = ["arm", "seeds", *columns, f"Δ {columns[0]} vs start", "grown"]
    return [f"### {title}", "", *md_table(head, rows), ""]


def of_study(
    study: Study, records: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The records of the study's own seeds, arms and iterations, and the others. A results
    file may hold others (a seed since taken out of the file, an arm renamed, a merge): no
    figure and no verdict may count a seed the study does not declare."""
    arms = {a.name: a for a in study.arms}

    def planned(r: dict[str, Any]) -> bool:
        arm, t = arms.get(r["arm"]), r["iteration"]
        if arm is None or r["seed"] not in study.seeds:
            return False
        return t is None or (t >= 1 if arm.source == "online" else 0 <= t <= arm.iterations)

    ours = [r for r in records if planned(r)]
    return ours, [r for r in records if not planned(r)]


def write_report(study: Study, records: list[dict[str, Any]], out_dir: str) -> str:
    """``<out_dir>/<name>.md`` and its plots; returns the markdown."""
    records, others = of_study(study, records)
    idx = index(records)
    seeds = sorted({r["seed"] for r in records})
    parts = [
        f"## {study.name}",
        "",
        f"Seeds with records: {', '.join(map(str, seeds)) or 'none yet'} "
        f"(of {', '.join(map(str, study.seeds))}); "
        f"{platform.machine()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}. ± is the sd "
        "over seeds; Δ is paired by seed, from the checkpoint the arm started from.",
        "",
    ]
    if others:
        named = "; ".join(f"seed {r['seed']}, {label((r['arm'], r['iteration']))}"
                          for r in others[:3])  # fmt: skip
        more = f" and {len(others) - 3} more" if len(others) > 3 else ""
        parts += [f"Left out of every figure: {len(others)} record(s) of a seed, an arm or an "
                  f"iteration this study does not run ({named}{more}).", ""]  # fmt: skip
    points = []
    for arm in study.arms:
        its = sorted({t for a, t in idx if a == arm.name}, key=lambda t: -1 if t is None else t)
        points += [(label((arm.name, t)), (arm.name, t)) for t in its]
    parts += table(study, idx, "Every arm, every checkpoint", points, study.report.columns)
    for t in study.report.tables:
        chosen = [(name, where(idx, ref)) for name, ref in t.rows]
        parts += table(study, idx, t.title, chosen, t.columns or study.report.columns)
    if study.claims:
        rows = [verdict(c, idx, t) for c in study.claims for t in c.at or (None,)]
        head = ["claim", "paired difference", "measure", "mean ± sd", "verdict", "margin"]
        parts += ["### The claims, judged by the rule written before any arm ran", "",
                  *md_table(head, rows), ""]  # fmt: skip
    os.makedirs(out_dir, exist_ok=True)
    for plot in study.report.plots:
        parts.append(draw(study, idx, plot, out_dir))
    md = "\n".join(parts)
    with open(os.path.join(out_dir, f"{study.name}.md"), "w") as f:
        f.write(md)
    return md


def draw(study: Study, idx: Index, plot: Plot, out_dir: str) -> str:
    """The measure against the iteration (or the cumulative responses generated), a line per
    arm from its start, ± sd bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for arm in [study.arm(a) for a in plot.arms] or study.arms:
        its = sorted(t for a, t in idx if a == arm.name and isinstance(t, int) and t > 0)
        if not its:
            continue
        points = [where(idx, arm.start)] if arm.start else []
        xs = [0.0] if arm.start else []
        spent = 0.0
        for t in its:
            responses = column(idx, (arm.name, t), "responses").values()
            spent += float(np.mean(list(responses))) if responses else 0.0
            xs.append(spent if plot.x == "responses" else float(t))
            points.append((arm.name, t))
        ys = [list(column(idx, p, plot.measure).values()) for p in points]
        keep = [i for i, y in enumerate(ys) if y]
        ax.errorbar([xs[i] for i in keep], [np.mean(ys[i]) for i in keep],
                    yerr=[float(np.std(ys[i], ddof=1)) if len(ys[i]) > 1 else 0.0 for i in keep],
                    marker="o", capsize=3, label=arm.name)  # fmt: skip
    xlabel = "cumulative generated responses" if plot.x == "responses" else "iteration"
    ax.set(xlabel=xlabel, ylabel=plot.measure)
    ax.legend(fontsize=8)
    fig.tight_layout()
    name = f"{study.name}-{plot.measure}-{plot.x}.png"
    fig.savefig(os.path.join(out_dir, name), dpi=110)
    plt.close(fig)
    return f"### {plot.measure} against {xlabel}\n\n![{plot.measure}]({name})\n"

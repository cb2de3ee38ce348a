"""The paper's claims, each judged by the rule written before any arm ran (docs/benchmarks.md).

A claim compares two arms (or two iterations of one) seed by seed: the paired difference per seed,
its mean and standard deviation over seeds. It *holds* when the mean has the paper's sign and
exceeds 2 standard deviations; otherwise it does not, and the margin says by how much it missed
(mean minus 2 sd, in the paper's direction). The preconditions use their own, stricter rule (a
floor and 3 sd). eva's share of the possible gain, (eva - fresh) / (target - fresh), is given per
seed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from bench.report import md_table

Results = dict[str, dict[str, Any]]  # seed -> arm -> result
Score = Callable[[dict[str, Any]], float | None]  # one seed's result -> a score (None: absent)


def at(arm: str, t: int | None = 1) -> Score:
    """The held-out score of ``arm`` at iteration ``t`` (None: a base model)."""

    def score(per_seed: dict[str, Any]) -> float | None:
        entry = per_seed.get(arm)
        if entry is None:
            return None
        if t is None:
            return float(entry["score"])
        its = entry.get("iterations", [])
        return float(its[t - 1]["score"]) if len(its) >= t else None

    return score


def difficulty(arm: str, t: int) -> Score:
    def value(per_seed: dict[str, Any]) -> float | None:
        its = per_seed.get(arm, {}).get("iterations", [])
        return float(its[t - 1]["difficulty"]) if len(its) >= t else None

    return value


def paired(results: Results, a: Score, b: Score) -> np.ndarray:
    """a - b per seed, over the seeds where both exist."""
    out = []
    for per_seed in results.values():
        x, y = a(per_seed), b(per_seed)
        if x is not None and y is not None:
            out.append(x - y)
    return np.asarray(out, dtype=float)


def judge(d: np.ndarray, sign: int = 1, sds: float = 2.0, floor: float = 0.0) -> tuple[str, str]:
    """(verdict, margin) of a paired difference whose expected sign is ``sign``."""
    if d.size == 0:
        return "not run", "-"
    mean = float(d.mean()) * sign
    sd = float(d.std(ddof=1)) if d.size > 1 else float("nan")
    if d.size < 2:
        return "one seed: not judged", f"{mean:+.3f}"
    margin = min(mean - sds * sd, mean - floor)
    return ("**held**" if margin > 0 else "not held"), f"{margin:+.3f}"


def _cell(d: np.ndarray) -> str:
    if d.size == 0:
        return "-"
    sd = f" ± {d.std(ddof=1):.3f}" if d.size > 1 else ""
    positive = int((d > 0).sum())
    return f"{d.mean():+.3f}{sd} ({positive} of {d.size} > 0)"


# (claim, table, comparison, a, b, expected sign)
CLAIMS: list[tuple[str, str, str, Score, Score, int]] = [
    ("eva beats new seed prompts, world solver", "T2", "eva - fresh, it. 1",
     at("eva"), at("fresh"), 1),
    *[(f"eva beats new seed prompts, {s}", "T2", f"eva-{s} - fresh-{s}",
       at(f"eva-{s}"), at(f"fresh-{s}"), 1) for s in ("dpo", "simpo", "orpo", "sppo")],
    *[(f"a_min beats {m}", "T4", f"eva - metric-{m}", at("eva"), at(f"metric-{m}"), 1)
      for m in ("a_avg", "a_dis", "var", "avg", "inv_avg", "inv_a_min", "uniform")],
    ("evolving beats the informative subset alone, weighted", "T5", "eva - subset-weighted",
     at("eva"), at("subset-weighted"), 1),
    ("evolving beats the informative subset alone, greedy", "T5", "eva-greedy - subset-greedy",
     at("eva-greedy"), at("subset-greedy"), 1),
    ("weighted sampling beats greedy", "T5", "eva - eva-greedy", at("eva"), at("eva-greedy"), 1),
    ("reward-guided selection beats uniform selection (null control)", "null",
     "eva - metric-uniform", at("eva"), at("metric-uniform"), 1),
    ("directed evolution beats random evolution (null control)", "null",
     "eva - random-evolution", at("eva"), at("random-evolution"), 1),
    ("eva keeps gaining over iterations", "T13", "eva it. 3 - it. 1", at("eva", 3), at("eva"), 1),
    ("eva beats new seed prompts at iteration 2", "T13", "eva - fresh, it. 2",
     at("eva", 2), at("fresh", 2), 1),
    ("eva beats new seed prompts at iteration 3", "T13", "eva - fresh, it. 3",
     at("eva", 3), at("fresh", 3), 1),
    ("prompts grow harder over iterations", "T7 / Fig. 6", "eva difficulty, it. 3 - it. 1",
     difficulty("eva", 3), difficulty("eva", 1), 1),
    ("online: RLOO-eva at 1x reaches RLOO at 6x", "T1", "RLOO-eva 1x - RLOO 6x",
     at("online-eva", 1), at("online-rloo", 6), 1),
    *[(f"online: RLOO-eva beats RLOO at {x}x", "T1", f"RLOO-eva - RLOO, {x}x",
       at("online-eva", x), at("online-rloo", x), 1) for x in (1, 2, 3)],
]  # fmt: skip


def claims_table(results: Results) -> str:
    """The preconditions, every claim with its verdict, and eva's share of the possible gain."""
    pre = [
        ("the baseline learns", "theta_1 - theta_0", at("theta_1", None), at("theta_0", None),
         0.03),
        ("the prompt distribution matters", "target - fresh, it. 1", at("target"), at("fresh"),
         0.05),
    ]  # fmt: skip
    rows = []
    for name, comparison, a, b, floor in pre:
        d = paired(results, a, b)
        verdict, margin = judge(d, 1, sds=3.0, floor=floor)
        rows.append([f"precondition: {name} (>= {floor:+.2f}, 3 sd)", "-", comparison,
                     _cell(d), verdict, margin])  # fmt: skip
    for name, table, comparison, a, b, sign in CLAIMS:
        d = paired(results, a, b)
        if d.size:
            rows.append([name, table, comparison, _cell(d), *judge(d, sign)])
    head = ["claim", "table", "paired difference", "mean ± sd (seeds > 0)", "held?", "margin"]
    parts = ["### The claims, judged (held: the paper's sign beyond 2 sd)", "",
             *md_table(head, rows), ""]  # fmt: skip
    share = _share_lines(results)
    if share:
        parts += ["### eva's share of the possible gain, (eva - fresh) / (target - fresh)", "",
                  *share, ""]  # fmt: skip
    return "\n".join(parts)


def _share_lines(results: Results) -> list[str]:
    rows = []
    for t in (1, 2, 3):
        gain = paired(results, at("eva", t), at("fresh", t))
        room = paired(results, at("target", t), at("fresh", t))
        if gain.size == 0 or gain.size != room.size:
            continue
        share = gain / np.where(room == 0, np.nan, room)
        cells = ", ".join(f"{s:.2f}" for s in share)
        rows.append([f"iteration {t}", cells, f"{np.nanmean(share):.2f}"])
    return md_table(["iteration", "per seed", "mean"], rows) if rows else []

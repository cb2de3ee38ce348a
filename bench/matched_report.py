"""Tables and the plot of ``bench.matched``: held-out score at equal generation, the claim's
verdicts, and where each arm's generated responses went (pair yield)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from bench.claims import _cell, at, judge, paired
from bench.report import machine, md_table, mean_std

Results = dict[str, dict[str, Any]]  # seed -> arm -> result
EVA_ARMS = ("eva", "eva-previous", "eva-predicted")
CLAIM = "eva beats fresh seed prompts at equal generation"


def _arms(results: Results) -> list[str]:
    first = next(iter(results.values()))
    return [a for a in first if isinstance(first[a], dict) and "iterations" in first[a]]


def _iterations(results: Results, arm: str) -> int:
    return min(len(per_seed[arm]["iterations"]) for per_seed in results.values())


def _values(results: Results, arm: str, t: int, key: str) -> list[float]:
    return [float(per_seed[arm]["iterations"][t - 1][key]) for per_seed in results.values()]


def _count(values: list[float]) -> str:
    """'mean ± sd' of a count over seeds (just the mean for one seed)."""
    a = np.asarray(values, dtype=float)
    return f"{a.mean():,.0f} ± {a.std(ddof=1):,.0f}" if len(a) > 1 else f"{a.mean():,.0f}"


def cumulative(results: Results, arm: str, t: int) -> list[int]:
    """Each seed's generated responses of ``arm`` through iteration ``t``."""
    return [
        sum(int(r["responses"]) for r in per_seed[arm]["iterations"][:t])
        for per_seed in results.values()
    ]


def matched_table(results: Results) -> list[str]:
    """arm x iteration: cumulative responses, |X_t|, pairs trained, score, paired Δ vs fresh."""
    head = ["arm", "iteration", "cumulative generated", "solver prompts (X_t)", "pairs trained",
            "held-out score", "Δ vs fresh (paired)"]  # fmt: skip
    first = next(iter(results.values()))
    rows = [["theta_1", "0", "0", "-", "-", mean_std([r["theta_1"]["score"] for r in
             results.values()]), "-"]]  # fmt: skip
    for arm in _arms(results):
        for t in range(1, _iterations(results, arm) + 1):
            d = paired(results, at(arm, t), at("fresh", t)) if arm != "fresh" else None
            rows.append([
                arm, str(t), f"{np.mean(cumulative(results, arm, t)):,.0f}",
                f"{np.mean(_values(results, arm, t, 'prompts')):,.0f}",
                _count(_values(results, arm, t, "pairs")),
                mean_std(_values(results, arm, t, "score")),
                _cell(d) if d is not None else "-",
            ])  # fmt: skip
    g = first.get("budget")
    return [f"G = {g:,} generated responses per iteration for every arm." if g else "", "",
            *md_table(head, rows)]  # fmt: skip


def verdicts(results: Results) -> list[tuple[str, int, np.ndarray, str, str]]:
    """(eva arm, iteration, paired differences, verdict, margin) for every eva arm that ran."""
    out: list[tuple[str, int, np.ndarray, str, str]] = []
    arms = _arms(results)
    if "fresh" not in arms:
        return out
    for arm in (a for a in EVA_ARMS if a in arms):
        for t in range(1, min(_iterations(results, arm), _iterations(results, "fresh")) + 1):
            d = paired(results, at(arm, t), at("fresh", t))
            out.append((arm, t, d, *judge(d, 1)))
    return out


def verdict_table(results: Results) -> list[str]:
    rows = [[f"{arm} - fresh", str(t), _cell(d), verdict, margin]
            for arm, t, d, verdict, margin in verdicts(results)]  # fmt: skip
    head = ["paired difference", "iteration", "mean ± sd (seeds > 0)", "held?", "margin"]
    return [f"### The claim, judged: {CLAIM} (held: beyond 2 sd of the paired difference)", "",
            *md_table(head, rows), ""]  # fmt: skip


YIELD_COLUMNS = (
    ("responses", "generated"),
    ("creator_responses", "creator's (never paired)"),
    ("in_pairs", "in pairs (2 per pair)"),
    ("pairs", "pairs"),
    ("skipped_low_chosen", "skipped: no correct chosen"),
    ("skipped_tied", "skipped: tied"),
    ("skipped_unscored", "skipped: unscored"),
    ("dropped_over_budget", "dropped by the pair cap"),
    ("paper_pairs", "paper's pairs (best vs worst, any correctness, uncapped)"),
)


def yield_table(results: Results, arms: list[str] | None = None) -> list[str]:
    """Per arm and iteration, means over seeds: where the generated responses went (prompt
    counts for the skipped and the dropped: each held N responses)."""
    head = ["arm", "it.", *[label for _, label in YIELD_COLUMNS], "share of responses in pairs"]
    rows = []
    for arm in arms or _arms(results):
        if any(arm not in per_seed for per_seed in results.values()):
            continue
        for t in range(1, _iterations(results, arm) + 1):
            means = {k: float(np.mean(_values(results, arm, t, k))) for k, _ in YIELD_COLUMNS}
            share = means["in_pairs"] / means["responses"] if means["responses"] else 0.0
            rows.append([arm, str(t), *[f"{means[k]:,.0f}" for k, _ in YIELD_COLUMNS],
                         f"{share:.1%}"])  # fmt: skip
    return md_table(head, rows)


def write_matched_report(
    results: Results,
    method_yields: Results,
    out_dir: str,
    name: str,
    seconds: float,
    quick: bool,
    command: str,
) -> str:
    parts = [
        f"## Compute-matched evaluation ({'quick' if quick else 'full'})",
        "",
        f"`{command}`",
        "",
        f"{len(results)} seed(s): {', '.join(results)}; {seconds / 60:.1f} min; {machine()}. "
        "Every arm generates the same responses per iteration (creator and solver together; "
        "held-out evaluation left out) and trains on every pair they yield. Score = mean dense "
        "reward of greedy answers on the held-out set; ± is the standard deviation over seeds; "
        "Δ is paired by seed.",
        "",
        "### Held-out score at equal generation",
        "",
        *matched_table(results),
        "",
        *verdict_table(results),
        "### Pair yield: where the generated responses went (means over seeds)",
        "",
        "Skipped and dropped columns count prompts (N responses each). A prompt is skipped for "
        "no correct chosen answer when its best response is wrong (`pairs.min_chosen_reward: "
        "1`); the paper's solvers would train on it (best vs worst regardless of correctness).",
        "",
        *yield_table(results),
        "",
    ]
    if method_yields:
        parts += ["### Pair yield of `bench.method`'s arms (equal pairs: K = 320, capped)", "",
                  *yield_table(method_yields), ""]  # fmt: skip
    parts.append(_plot(results, out_dir, name))
    md = "\n".join(parts)
    with open(os.path.join(out_dir, f"{name}.md"), "w") as f:
        f.write(md)
    return md


def _plot(results: Results, out_dir: str, name: str) -> str:
    """Held-out score against cumulative generated responses, one line per arm (± sd)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    start = np.array([r["theta_1"]["score"] for r in results.values()])
    for arm in _arms(results):
        ts = range(1, _iterations(results, arm) + 1)
        x = [0.0, *[float(np.mean(cumulative(results, arm, t))) for t in ts]]
        s = np.array([start, *[_values(results, arm, t, "score") for t in ts]])
        sd = s.std(1, ddof=1) if s.shape[1] > 1 else np.zeros(len(s))
        ax.errorbar(x, s.mean(1), yerr=sd, marker="o", label=arm, capsize=3)
    ax.set(xlabel="cumulative generated responses", ylabel="held-out score",
           title="Held-out score at equal generation")  # fmt: skip
    ax.legend()
    fig.tight_layout()
    path = os.path.join(out_dir, f"{name}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return (
        f"### Held-out score against generated responses\n\n![matched]({os.path.basename(path)})\n"
    )

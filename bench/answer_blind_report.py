"""The tables of ``bench.answer_blind``: held-out scores of both arms and their paired
difference, then the blind arm's label quality and the majority vote's threshold sweep."""

from __future__ import annotations

import math
import os
import platform
from collections.abc import Mapping
from typing import Any

import numpy as np

from bench.answer_blind import ARMS, ITERATIONS
from bench.report import md_table, mean_std


def _cell(values: list[float]) -> str:
    """mean ± sd over seeds, "-" where no seed has a value."""
    finite = [v for v in values if not math.isnan(v)]
    return mean_std(finite) if finite else "-"


def report(results: Mapping[str, Any], seconds: float, command: str, agreement: float) -> str:
    """The markdown tables: scores and paired differences, then label quality."""
    seeds = list(results)

    def col(arm: str, t: int, *keys: str) -> list[float]:
        vals = []
        for s in seeds:
            v: Any = results[s][arm]["iterations"][t - 1]
            for k in keys:
                v = v.get(k) if isinstance(v, dict) else None
            vals.append(math.nan if v is None else float(v))
        return vals

    its = range(1, ITERATIONS + 1)
    lines = [
        f"`{command}`",
        "",
        f"{len(seeds)} seed(s): {', '.join(seeds)}; {seconds / 60:.1f} min; "
        f"{platform.machine()}, {os.cpu_count()} cores. Agreement threshold {agreement:.4g} of "
        "N = 6 samples. Score = mean dense reward of greedy answers on the held-out set, by the "
        "world's verifier in both arms; ± is the sd over seeds; Δ = blind - exact, paired by seed.",
        "",
    ]
    head = ["seed", "theta_1"]
    for t in its:
        head += [f"exact it{t}", f"blind it{t}", f"Δ it{t}"]
    rows = []
    for s in seeds:
        r = results[s]
        row = [s, f"{r['theta_1']['score']:.3f}"]
        for t in its:
            e, b = (r[arm]["iterations"][t - 1]["score"] for arm in ARMS)
            row += [f"{e:.3f}", f"{b:.3f}", f"{b - e:+.3f}"]
        rows.append([*row, f"x{r['exact']['topup']}/x{r['blind']['topup']}"])
    mean = ["mean", mean_std([results[s]["theta_1"]["score"] for s in seeds])]
    for t in its:
        e, b = np.array(col("exact", t, "score")), np.array(col("blind", t, "score"))
        mean += [mean_std(list(e)), mean_std(list(b)), mean_std(list(b - e))]
    rows.append([*mean, "-"])
    lines += [*md_table([*head, "grown (exact/blind)"], rows), ""]
    cats = sorted(k[4:] for k in results[seeds[0]]["theta_1"] if k.startswith("cat_"))
    head = ["model", *(f"score {c}" for c in cats)]
    rows = [["theta_1", *(_cell([results[s]["theta_1"][f"cat_{c}"] for s in seeds]) for c in cats)]]
    rows += [
        [f"{arm} it{t}", *(_cell(col(arm, t, f"cat_{c}")) for c in cats)]
        for t in its
        for arm in ARMS
    ]
    lines += [*md_table(head, rows), ""]
    head = ["iteration", "stage", "labelled by majority", "label accuracy", "unknown dropped",
            "wrong label = careless", "reward error", "stored rewards reproduced"]  # fmt: skip
    rows = []
    for t in its:
        for artifact in ("creator_annotate", "annotate"):
            checks = [results[s]["blind"]["iterations"][t - 1].get(artifact) for s in seeds]
            if any(c is None for c in checks) or not any(
                c["majority"] + c["dropped"] for c in checks
            ):
                continue  # not run, or every prompt known (X_0): nothing voted
            rows.append([
                str(t), artifact, *(_cell(col("blind", t, artifact, k)) for k in (
                    "majority", "label_accuracy", "dropped_share", "wrong_careless", "reward_error"
                )), "yes" if all(c["reproduced"] for c in checks) else "NO",
            ])  # fmt: skip
    lines += [*md_table(head, rows), ""]
    head = ["iteration", "category", "unknown prompts", "dropped", "label accuracy"]
    rows = [
        [str(t), c, *(_cell(col("blind", t, "annotate", "by_category", c, k))
                      for k in ("unknown", "dropped_share", "label_accuracy"))]
        for t in its for c in cats
    ]  # fmt: skip
    lines += [*md_table(head, rows), ""]
    head = ["iteration", "arm", "pairs", "on majority labels", "chosen answer truly correct",
            "children", "child's answer = parent's (inherited accuracy)"]  # fmt: skip
    rows = [
        [str(t), arm, *(_cell(col(arm, t, k)) for k in (
            "pairs", "pairs_voted", "chosen_correct", "children", "inherited_accuracy"))]
        for t in its for arm in ARMS
    ]  # fmt: skip
    lines += [*md_table(head, rows), ""]
    lines += [
        "The majority vote's trade-off at every threshold, recomputed offline on the blind "
        "arm's iteration-1 rollouts (the unknown prompts of X_1; only the threshold above "
        "trained):",
        "",
    ]
    head = ["threshold (of N)", "children labelled", "label accuracy"]
    sweeps = [results[s]["sweep"] for s in seeds if "sweep" in results[s]]

    def swept(k: int, key: str) -> str:
        return _cell([math.nan if sw[k][key] is None else sw[k][key] for sw in sweeps])

    rows = [
        [row["threshold"], swept(k, "labelled"), swept(k, "label_accuracy")]
        for k, row in enumerate(sweeps[0] if sweeps else [])
    ]
    return "\n".join(lines + md_table(head, rows))

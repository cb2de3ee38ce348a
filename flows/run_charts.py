"""The charts an ML engineer looks for in a run, read back from its artifacts: the held-out
score across checkpoints, the informativeness distribution per iteration, the curriculum
(complexity, category and depth mix of each X_t) and the training loss and reward margin over
steps. Published as one markdown artifact (``{run}-charts``) at the end of every launch."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import numpy as np

from flows.charts import bar_chart, embed, line_chart
from flows.config import RunConfig
from tasks.store import RunStore


def _heldout(rows: list[dict[str, Any]]) -> str:
    series = {
        "held-out score": [(i, r["heldout_score"]) for i, r in enumerate(rows)
                           if r.get("heldout_score") is not None],
        "win rate vs theta_0": [(i, r["win_vs_theta_0"]) for i, r in enumerate(rows)
                                if r.get("win_vs_theta_0") is not None],
    }  # fmt: skip
    labels = ", ".join(f"{i} = {r['iteration']}" for i, r in enumerate(rows))
    return line_chart(f"Held-out across checkpoints ({labels})", series, "checkpoint")


def _informativeness(store: RunStore, iterations: range) -> str:
    values = {}
    for t in iterations:
        m = store.read_manifest(t, "score")
        if m is not None:
            info = np.asarray(store.read_table(m["uri"]).column("informativeness"), float)
            values[t] = info[np.isfinite(info)]
    if not values:
        return ""
    top = max((float(v.max()) for v in values.values() if v.size), default=1.0) or 1.0
    edges = np.linspace(0.0, top, 9)
    labels = [f"{lo:.2g}-{hi:.2g}" for lo, hi in pairwise(edges)]
    groups = {
        f"X_{t - 1} (iter {t})": list(
            zip(labels, (np.histogram(v, edges)[0] / max(v.size, 1)).tolist(), strict=True)
        )
        for t, v in values.items()
    }
    return bar_chart("Informativeness: share of prompts per bin", groups, "informativeness")


def _curriculum(store: RunStore, iterations: range) -> list[str]:
    complexity: list[tuple[float, float]] = []
    categories: dict[str, list[tuple[float, float]]] = {}
    depths: dict[str, list[tuple[float, float]]] = {}
    for t in iterations:
        c = store.read_manifest(t, "complexity")
        if c is not None and c["stats"].get("mean_complexity") is not None:
            complexity.append((t, c["stats"]["mean_complexity"]))
        mix = store.read_manifest(t, "mix")
        if mix is None:
            continue
        for key, into in (("categories", categories), ("depths", depths)):
            counts = mix["stats"].get(key, {})
            total = sum(counts.values()) or 1
            for name, n in counts.items():
                into.setdefault(name if key == "categories" else f"depth {name}", []).append(
                    (t, n / total)
                )
    return [
        line_chart("Curriculum: mean complexity of X_t", {"complexity": complexity}, "iteration t"),
        line_chart("Curriculum: category mix of X_t", categories, "iteration t", True),
        line_chart("Curriculum: depth mix of X_t", depths, "iteration t", True),
    ]


def _training(store: RunStore, iterations: range) -> str:
    loss, margin, offset = [], [], 0.0
    for t in iterations:
        m = store.read_manifest(t, "train")
        if m is None or not m["rows"]:
            continue
        rows = store.read_table(m["uri"]).to_pylist()
        for r in rows:
            loss.append((offset + r["step"], r.get("loss", float("nan"))))
            margin.append((offset + r["step"], r.get("rewards/margins", float("nan"))))
        offset += max(r["step"] for r in rows)
    return line_chart(
        "Training: loss and reward margin (iterations one after another)",
        {"loss": loss, "reward margin": margin},
        "optimizer step",
    )


def run_charts(store: RunStore, config: RunConfig, rows: list[dict[str, Any]]) -> str:
    """The run's charts as markdown with embedded SVG images; ``rows`` is its summary
    (``flows.summary.iteration_summary``), already read by the caller."""
    first = 0 if config.iteration0_dpo else 1
    iterations = range(first, config.iterations + 1)
    complexity, categories, depths = _curriculum(store, iterations)
    return "\n\n".join([
        f"## Charts of eva run `{config.run}`",
        embed(_heldout(rows), "held-out score"),
        embed(_informativeness(store, iterations), "informativeness distribution"),
        embed(complexity, "curriculum: complexity"),
        embed(categories, "curriculum: category mix"),
        embed(depths, "curriculum: depth mix"),
        embed(_training(store, iterations), "training loss and reward margin"),
    ])  # fmt: skip

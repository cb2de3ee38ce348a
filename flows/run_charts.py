"""The charts an ML engineer looks for in a run, read back from its artifacts, published as one
markdown artifact (``{run}-charts``) at the end of every launch.

An eva run: the held-out score and win rate across checkpoints and the held-out score per
category (with an LLM judge, its win rate with the bootstrap interval, overall and per
category), the informativeness distribution per iteration (the score table's bins), the
curriculum (complexity, category and depth mix of each X_t), and the training loss and reward
margin over optimizer steps with each iteration's start marked. An online run: the same
held-out charts per segment, the mean reward and informativeness of the prompts trained on at
each step with each segment's start marked, and the buffer's category and depth mix.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from flows.charts import Chart, embed, histogram, line_chart
from flows.config import RunConfig
from flows.judged import judge_charts
from tasks.store import RunStore

# The score stage's distribution table splits informativeness into this many equal bins
# (tasks.score.distribution); the chart uses the same, so the two read alike.
BINS = 10

Charts = list[tuple[str, Chart | None]]  # (what it shows, the chart or None: nothing yet)


def checkpoint_name(label: Any, prefix: str) -> str:
    """How a checkpoint reads on an x axis: theta_0, it.1 (offline), seg.1 (online)."""
    return "theta_0" if label == "theta_0" else f"{prefix}.{label}"


def _heldout(rows: list[dict[str, Any]], key: str, prefix: str, unit: str) -> Chart | None:
    names = {float(i): checkpoint_name(r[key], prefix) for i, r in enumerate(rows)}
    series = {
        "held-out score": [(i, r["heldout_score"]) for i, r in enumerate(rows)
                           if r.get("heldout_score") is not None],
        "win rate vs theta_0": [(i, r["win_vs_theta_0"]) for i, r in enumerate(rows)
                                if r.get("win_vs_theta_0") is not None],
    }  # fmt: skip
    return line_chart(
        "Held-out score and win rate vs theta_0", series, f"checkpoint (after {unit})",
        names=names,
    )  # fmt: skip


def _heldout_categories(
    store: RunStore, iterations: Sequence[int], prefix: str, unit: str
) -> Chart | None:
    names: dict[float, str] = {}
    series: dict[str, list[tuple[float, float]]] = {}
    for i, t in enumerate([None, *iterations]):
        m = store.read_manifest(t, "evaluate")
        if m is None:
            continue
        names[float(i)] = checkpoint_name("theta_0" if t is None else t, prefix)
        for category, score in m["stats"].get("per_category", {}).items():
            series.setdefault(category, []).append((i, score))
    return line_chart(
        "Held-out score per category", series, f"checkpoint (after {unit})", names=names
    )


def _informativeness(store: RunStore, iterations: Sequence[int]) -> Chart | None:
    values = {}
    for t in iterations:
        m = store.read_manifest(t, "score")
        if m is not None:
            info = np.asarray(store.read_table(m["uri"]).column("informativeness"), float)
            if (finite := info[np.isfinite(info)]).size:
                values[t] = finite
    if not values:
        return None
    # One iteration's bins are exactly its score table's; several share one range.
    everything = np.concatenate(list(values.values()))
    edges = np.histogram_bin_edges(everything, bins=BINS)
    groups = {
        f"X_{t - 1} (it.{t})": (np.histogram(v, edges)[0] / v.size).tolist()
        for t, v in values.items()
    }
    return histogram(
        "Informativeness: share of prompts per bin", edges.tolist(), groups, "informativeness"
    )


def _shares(
    counts_at: dict[int, dict[str, int]], label: str = "{}"
) -> dict[str, list[tuple[float, float]]]:
    """Each name's share of the counts at every x that has counts, 0 where it is absent (a
    depth that appears later starts from 0 rather than from nowhere); names in order."""
    names = sorted({n for c in counts_at.values() for n in c}, key=lambda n: (len(n), n))
    return {
        label.format(n): [(x, c.get(n, 0) / (sum(c.values()) or 1)) for x, c in counts_at.items()]
        for n in names
    }


def _curriculum(store: RunStore, iterations: Sequence[int]) -> list[Chart | None]:
    complexity: list[tuple[float, float]] = []
    categories: dict[int, dict[str, int]] = {}
    depths: dict[int, dict[str, int]] = {}
    for t in iterations:
        c = store.read_manifest(t, "complexity")
        if c is not None and c["stats"].get("mean_complexity") is not None:
            complexity.append((t, c["stats"]["mean_complexity"]))
        mix = store.read_manifest(t, "mix")
        if mix is not None:
            categories[t] = mix["stats"].get("categories") or {}
            depths[t] = mix["stats"].get("depths") or {}
    names = {float(t): f"it.{t}" for t in iterations}
    return [
        line_chart("Curriculum: mean complexity of X_t", {"complexity": complexity},
                   "iteration t", names=names),
        line_chart("Curriculum: category mix of X_t (share)", _shares(categories),
                   "iteration t", True, names=names),
        line_chart("Curriculum: depth mix of X_t (share)", _shares(depths, "depth {}"),
                   "iteration t", True, names=names),
    ]  # fmt: skip


def _training(store: RunStore, iterations: Sequence[int]) -> list[Chart | None]:
    """Loss and reward margin on charts of their own (their scales differ), over the
    optimizer steps of every iteration one after another, each iteration's start marked."""
    loss: list[tuple[float, float]] = []
    margin: list[tuple[float, float]] = []
    marks: list[tuple[float, str]] = []
    offset = 0.0
    for t in iterations:
        m = store.read_manifest(t, "train")
        if m is None or not m["rows"]:
            continue
        rows = store.read_table(m["uri"]).to_pylist()
        marks.append((offset + min(r["step"] for r in rows) - 0.5, f"it.{t}"))
        for r in rows:
            loss.append((offset + r["step"], r.get("loss", float("nan"))))
            margin.append((offset + r["step"], r.get("rewards/margins", float("nan"))))
        offset += max(r["step"] for r in rows)
    return [
        line_chart("Training loss", {"loss": loss}, "optimizer step (all iterations)",
                   marks=marks),
        line_chart("Training reward margin (chosen - rejected)", {"reward margin": margin},
                   "optimizer step (all iterations)", marks=marks),
    ]  # fmt: skip


def offline_charts(store: RunStore, config: RunConfig, rows: list[dict[str, Any]]) -> Charts:
    """Every chart of an eva run, with what each shows; ``rows`` is its summary
    (``flows.summary.iteration_summary``), already read by the caller."""
    first = 0 if config.iteration0_dpo else 1
    iterations = list(range(first, config.iterations + 1))
    complexity, categories, depths = _curriculum(store, iterations)
    loss, margin = _training(store, iterations)
    return [
        ("held-out score", _heldout(rows, "iteration", "it", "iteration")),
        ("held-out score per category",
         _heldout_categories(store, iterations, "it", "iteration")),
        ("informativeness distribution", _informativeness(store, iterations)),
        ("curriculum: complexity", complexity),
        ("curriculum: category mix", categories),
        ("curriculum: depth mix", depths),
        ("training loss", loss),
        ("training reward margin", margin),
        *judge_charts(rows, "iteration", "it", "iteration"),
    ]  # fmt: skip


def _online_steps(store: RunStore, segments: Sequence[int]) -> Chart | None:
    reward: list[tuple[float, float]] = []
    info: list[tuple[float, float]] = []
    marks: list[tuple[float, str]] = []
    for s in segments:
        m = store.read_manifest(s, "online")
        if m is None or not m["rows"]:
            continue
        table = store.read_table(m["uri"]).select(["step", "rewards", "informativeness"])
        by_step: dict[int, tuple[list[float], list[float]]] = {}
        for r in table.to_pylist():
            rewards, infos = by_step.setdefault(int(r["step"]) + 1, ([], []))  # 1-based
            rewards += [float(x) for x in r["rewards"]]
            infos.append(float(r["informativeness"]))
        marks.append((min(by_step) - 0.5, f"seg.{s}"))
        for step, (rewards, infos) in sorted(by_step.items()):
            reward.append((step, float(np.nanmean(rewards)) if rewards else float("nan")))
            info.append((step, float(np.nanmean(infos)) if infos else float("nan")))
    return line_chart(
        "Online training: the prompts of each step",
        {"mean reward": reward, "mean informativeness": info},
        "optimizer step (all segments)",
        marks=marks,
    )


def _buffer_mix(store: RunStore, segments: Sequence[int]) -> list[Chart | None]:
    categories: dict[int, dict[str, int]] = {}
    depths: dict[int, dict[str, int]] = {}
    for s in segments:
        m = store.read_manifest(s, "online")
        if m is not None:
            categories[s] = m["stats"].get("buffer_categories") or {}
            depths[s] = m["stats"].get("buffer_depths") or {}
    names = {float(s): f"seg.{s}" for s in segments}
    return [
        line_chart("Buffer B: category mix at each segment's end (share)", _shares(categories),
                   "segment", True, names=names),
        line_chart("Buffer B: depth mix at each segment's end (share)",
                   _shares(depths, "depth {}"), "segment", True, names=names),
    ]  # fmt: skip


def online_charts(store: RunStore, rows: list[dict[str, Any]]) -> Charts:
    """Every chart of an online run; ``rows`` is its summary (``flows.summary.online_summary``)."""
    done = [r["segment"] for r in rows if r["segment"] != "theta_0"]
    categories, depths = _buffer_mix(store, done)
    return [
        ("held-out score", _heldout(rows, "segment", "seg", "segment")),
        ("held-out score per category", _heldout_categories(store, done, "seg", "segment")),
        ("reward and informativeness per step", _online_steps(store, done)),
        ("buffer: category mix", categories),
        ("buffer: depth mix", depths),
        *judge_charts(rows, "segment", "seg", "segment"),
    ]


def charts_markdown(title: str, charts: Charts) -> str:
    """The charts as one markdown page, each an embedded SVG image."""
    return "\n\n".join([f"## {title}", *(embed(chart, alt) for alt, chart in charts)])


def run_charts(store: RunStore, config: RunConfig, rows: list[dict[str, Any]]) -> str:
    """An eva run's charts as markdown with embedded SVG images."""
    return charts_markdown(f"Charts of eva run `{config.run}`", offline_charts(store, config, rows))


def online_run_charts(store: RunStore, run: str, rows: list[dict[str, Any]]) -> str:
    """An online run's charts as markdown with embedded SVG images."""
    return charts_markdown(f"Charts of eva online run `{run}`", online_charts(store, rows))

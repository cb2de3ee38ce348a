"""Tables from ``bench.costs`` results: stage times, overhead above Prefect's floor, the cached
rerun, rollouts and generation per pair."""

from __future__ import annotations

import os
import platform
import time
from typing import Any

import numpy as np

from flows.markdown import md_table


def _overhead_cells(
    label: str, where: str, wall: float, backend: float, row: dict[str, Any]
) -> list[str]:
    """One overhead row; the subflow, stage I/O and orchestration exist per iteration only."""
    sub, io, orch = (f"{row[k]:.2f}" if k in row else "-" for k in SPLIT)
    floor, eva = (f"{100 * row[k]:.1f}%" if k in row else "-" for k in SHARES)
    share = f"{100 * row['overhead_share']:.1f}%"
    return [label, where, f"{wall:.2f}", sub, f"{backend:.2f}", io, orch, share, floor, eva]


SPLIT = ("subflow", "stage_io", "orchestration")
SHARES = ("floor_share", "eva_share")  # bench.costs_timing.above_floor
# eva's overhead above Prefect's floor, as a share of a demo iteration (issue 23).
EVA_TARGET = 0.01


def _floor_lines(results: dict[str, Any]) -> list[str]:
    """Prefect's own floor under an iteration's orchestration, against demo iteration 1."""
    floor = results.get("prefect_floor")
    if floor is None:
        return []
    first = results["demo"]["iterations"][0]
    share = first.get("floor_share", floor["seconds"] / first["wall"])  # as the table has it
    runs = ", ".join(f"{x:.2f}" for x in floor["runs"])
    lines = [
        f"Prefect's floor: a subflow of {floor['tasks']} task runs that do nothing, called "
        f"the same way on the same server, takes {floor['seconds']:.2f} s (median of {runs} "
        f"s), {100 * share:.1f}% of demo iteration 1's wall time.",
        "",
    ]
    its = [it for it in results["demo"]["iterations"] if "eva_share" in it]
    if its:
        worst = max(it["eva_share"] for it in its)
        shares = ", ".join(
            f"iteration {it['t']}: overhead {100 * it['overhead_share']:.1f}% = floor "
            f"{100 * it['floor_share']:.1f}% + eva {100 * it['eva_share']:.1f}%"
            for it in its
        )
        verdict = "held" if worst <= EVA_TARGET else "missed"
        lines += [
            f"eva's overhead above Prefect's floor, target at most {100 * EVA_TARGET:.0f}% of "
            f"a demo iteration: **{verdict}** (largest {100 * worst:.1f}%; {shares}).",
            "",
        ]
    return lines


def _mean_stage(run: dict[str, Any], stage: str, key: str) -> float:
    values = [it["stages"][stage][key] for it in run["iterations"] if stage in it["stages"]]
    return float(np.mean(values)) if values else float("nan")


def write_costs_report(results: dict[str, Any], out_dir: str, name: str, command: str) -> str:
    """Markdown for ``bench.costs`` results: stage times, overhead, cache, rollouts, per pair."""
    runs = {"demo": results["demo"]}
    if "demo_10x" in results:
        runs["10x"] = results["demo_10x"]
    first = results["demo"]["iterations"][0]["stages"]
    head = ["stage"] + [f"{r} {k}" for r in runs for k in ("task s", "backend s")]
    if len(runs) == 2:
        head.append("10x / demo (task)")
    lines = []
    for stage in first:
        cells = [stage]
        for run in runs.values():
            cells += [f"{_mean_stage(run, stage, 'task'):.3f}"]
            cells += [f"{_mean_stage(run, stage, 'backend'):.3f}"]
        if len(runs) == 2:
            ratio = _mean_stage(runs["10x"], stage, "task") / _mean_stage(
                runs["demo"], stage, "task"
            )
            cells.append(f"{ratio:.1f}x")
        lines.append(cells)
    over = [
        _overhead_cells(label, str(it["t"]), it["wall"], it["backend"], it)
        for label, run in runs.items()
        for it in run["iterations"]
    ]
    over += [
        _overhead_cells(label, "whole run", run["total"], run["backend"], run)
        for label, run in runs.items()
    ]
    cached = results["cached_rerun"]
    best = 100 * cached.get("best_share", cached["share"])
    roll = [
        [label, str(r["prompts"]), str(r["tokens"]), f"{r['direct_tokens_per_s']:.0f}",
         f"{r['stage_tokens_per_s']:.0f}", f"{100 * r['efficiency']:.1f}%",
         str(r["same_outputs"])]
        for label, key in (("demo", "rollout_demo"), ("10x", "rollout_10x"))
        if (r := results.get(key)) is not None
    ]  # fmt: skip
    per_pair: list[list[str]] = []
    dpo = results["generation_per_pair"]["dpo"]["responses_per_pair"]
    for arm, label in (
        ("dpo", "iterative DPO (fresh seed prompts)"),
        ("eva", "eva (fresh creator rollouts)"),
        ("eva-previous", "eva, creator_rollouts=previous"),
        ("eva-predicted", "eva, creator_rollouts=predicted"),
    ):
        if (g := results["generation_per_pair"].get(arm)) is None:
            continue  # a report from before the arm existed
        vs_dpo = f"{g['responses_per_pair'] / dpo:.2f}x" if dpo else "-"
        per_pair.append(
            [label, str(g["responses"]), str(g["pairs"]), str(g["responses_per_pair"]), vs_dpo]
        )
    over_head = ["run", "iteration", "wall s", "subflow s", "backends s", "stage I/O s",
                 "orchestration s", "overhead", "Prefect's floor", "eva above floor"]  # fmt: skip
    roll_head = ["run", "prompts", "tokens", "direct tok/s", "stage tok/s", "stage / direct",
                 "same output"]  # fmt: skip
    pair_head = ["arm", "responses generated", "pairs trained", "responses per pair",
                 "vs iterative DPO"]  # fmt: skip
    md = "\n".join(
        [
            "## Pipeline costs",
            "",
            f"`{command}`, {machine()}. The temporary Prefect server took "
            f"{results['prefect_startup']:.1f} s to start (once per process; excluded below).",
            "",
            "### Time per stage (mean over the run's eva iterations)",
            "",
            "*task* = the stage's Prefect task run; *backend* = load, call and close of the "
            "generator, reward model, evolver or solver inside it.",
            "",
            *md_table(head, lines),
            "",
            "### Orchestration and I/O overhead per iteration",
            "",
            "overhead = (wall - backends) / wall; stage I/O = time inside stages outside "
            "their backends (parquet, hashing, checkpoint copies, and the arithmetic of the "
            "stages that have no backend: score, sample, mix, complexity, pairs); "
            "orchestration = Prefect task and subflow runs. An "
            "iteration's wall time is the run's call of its subflow: creating the subflow "
            "run and reporting its end are in it, which the subflow's own recorded start to "
            "end (*subflow*) leaves out. *whole run* is the caller's clock around `eva_run` "
            "(setup, iteration 0 and the top-level flow run included) against every stage's "
            "backend time. The overhead splits into *Prefect's floor* (below: an iteration's "
            "subflow and task runs doing nothing, measured in the same process) and *eva above "
            "floor* (what eva's stages and flows add to it), each a share of the iteration.",
            "",
            *md_table(over_head, over),
            "",
            *_floor_lines(results),
            "### Cached rerun of the finished demo run",
            "",
            f"{cached['seconds']:.2f} s (median of "
            f"{', '.join(f'{x:.2f}' for x in cached.get('runs', [cached['seconds']]))} s) "
            f"against {results['demo']['total']:.2f} s for the original run "
            f"({100 * cached['share']:.1f}%; best {best:.1f}%), "
            f"with {cached.get('retries_503', 0)} request(s) retried after a 503 from the API "
            f"server (SQLite contention; 2 s back-off each); {cached['stages']} stage manifests, "
            f"re-executed: {', '.join(cached['reexecuted']) or 'none'}. The "
            f"{cached['cached_tasks']} stage tasks (each a cache check) took "
            f"{cached['cached_tasks_seconds']:.2f} s together; the rest is the "
            f"{cached['flow_runs']} flow runs around them.",
            "",
            "### Rollout efficiency (iteration 1's generate stage)",
            "",
            *md_table(roll_head, roll),
            "",
            "### Generation per training pair (iterations 1..T, demo size)",
            "",
            *md_table(pair_head, per_pair),
            "",
        ]
    )
    with open(os.path.join(out_dir, f"{name}.md"), "w") as f:
        f.write(md)
    return md


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}"

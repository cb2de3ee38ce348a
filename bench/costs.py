"""Benchmark: what the pipeline itself costs (issue 4, part 2).

    python -m bench.costs [--quick] [--root runs-bench/costs] [--out docs/bench]
    python -m bench.costs --cached-rerun eva|prefect|configured [--root runs-bench/costs]
    python -m bench.costs --profile [--quick] [--root runs-bench/costs] [--lines 40]

Everything is measured in one process, after the temporary Prefect server is up (its start-up
is timed on its own), on the world run at 1,000 prompts with a 300-step theta_0 (what is
measured is the pipeline, not the model: the demo's 3,000-step SFT would only add a constant)
and on the same run with 10x the prompts:

* time per stage of each eva iteration: the stage's Prefect task run (what the UI shows), the
  part inside the stage function, and the part inside the backend (``backend_seconds``: load,
  call and close of the generator, reward model, evolver or solver);
* orchestration and I/O overhead: the iteration subflow's wall time minus its backends' time,
  as a share of the iteration, split into Prefect's floor (the same subflow of task runs that
  do nothing, in the same process) and eva's share above it;
* a cached rerun of the finished run, as a share of the original, and proof that no stage ran
  (every manifest is byte-identical afterwards);
* rollout efficiency: the generate stage's tokens per second against the same backend, loaded
  and called directly on the same checkpoint, prompts, n and seed (the outputs must match);
* extra generation per training pair: responses generated per iteration divided by pairs
  trained, for plain iterative DPO (fresh seed prompts), eva, and eva with informativeness
  taken from the previous iteration's rollouts (``creator_rollouts=previous``).

``--cached-rerun API`` runs the demo once from an empty ``ROOT/cached-rerun``, then relaunches
it three times with flow-run heartbeats on (what eva does against a lasting server) and three
times with them off (what eva does on its temporary server), and prints each time and the
requests the API answered 503 (each retried after 2 s, then 4 s). The API is ``eva``: eva's
temporary server (``eva_runtime.prefect_server``: SQLite writes begin IMMEDIATE); ``prefect``:
Prefect's own temporary server (SQLite writes begin DEFERRED and fail on a race); or
``configured``: ``PREFECT_API_URL``, e.g. a server on PostgreSQL (docs/benchmarks.md, 2).

``--profile`` relaunches the finished demo run a costs run left under ``ROOT/full`` (``--quick``:
``ROOT/quick``) under cProfile and prints where the time went; the server's start and one
relaunch come first, so neither is counted.

The creator's CPU path at 1M prompts is ``bench.creator_cpu``.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import os
import platform
import pstats
import shutil
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import numpy as np

import flows  # noqa: F401  (eva's Prefect defaults, before prefect is imported)
from bench.arms import baseline_run, sft_steps, start_from, world_sizes
from eva_runtime.poll import PollTimeout, wait_until
from eva_runtime.prefect_api import no_heartbeats, prefect_api
from eva_runtime.prefect_server import counting_retries
from flows.config import RunConfig, load_config, validate_config
from flows.config_layers import deep_merge
from flows.markdown import md_table
from tasks.run_paths import iteration_dir
from tasks.store import RunStore

# The world's own config (deep-merged: a partial section would start from paper defaults).
DEMO = validate_config(
    deep_merge(
        load_config(None).model_dump(mode="json"),
        {**world_sizes(1000), **sft_steps(300)},
    )
)
SCALE = 10
# Generation per training pair: each arm's label and the config it changes (eva: the demo run).
PER_PAIR = {
    "dpo": ("iterative DPO (fresh seed prompts)", {}),
    "eva": ("eva (fresh creator rollouts)", None),
    "eva-previous": ("eva, creator_rollouts=previous", {"creator_rollouts": "previous"}),
    "eva-predicted": ("eva, creator_rollouts=predicted", {"creator_rollouts": "predicted"}),
}
# eva's overhead above Prefect's floor, as a share of a demo iteration (issue 23).
EVA_TARGET = 0.01


def _manifest(store: RunStore, t: int | None, artifact: str) -> dict[str, Any]:
    manifest = store.read_manifest(t, artifact)
    if manifest is None:
        raise RuntimeError(f"{store.base}: no {artifact} manifest for iteration {t}")
    return manifest


# What Prefect recorded: flow runs, task runs, wall times.


def _flow_runs(name: str, since: datetime, launch: bool = False) -> list[Any]:
    """Flow runs called ``name`` that started after ``since`` (oldest first); ``launch``: the
    top-level runs of eva run ``name``, whose names add the start time (``demo @11-22 ...``)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas import filters

    if launch:
        named = filters.FlowRunFilterName(like_=f"{name} @")
    else:
        named = filters.FlowRunFilterName(any_=[name])
    started = filters.FlowRunFilterStartTime(after_=since)  # type: ignore[arg-type]
    flow_run = filters.FlowRunFilter(name=named, start_time=started)
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=flow_run)
    return sorted(runs, key=lambda r: r.start_time)


def _task_runs(flow_run_id: Any) -> dict[str, Any]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    flow_run = FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
    with get_client(sync_client=True) as client:
        return {r.name: r for r in client.read_task_runs(flow_run_filter=flow_run)}


def _wall(run: Any) -> float:
    return (run.end_time - run.start_time).total_seconds()


def timed_run(cfg: RunConfig) -> dict[str, Any]:
    """Run ``cfg`` and break each eva iteration's wall time down by stage."""
    import flows.run
    from flows.run import eva_run

    # Each iteration as the run sees it: the call of its subflow, so creating the subflow run
    # and reporting its final state (outside the subflow's own recorded start and end) count.
    called: list[float] = []
    subflow = flows.run.eva_iteration

    def timed_iteration(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return subflow(*args, **kwargs)
        finally:
            called.append(time.perf_counter() - started)

    since = datetime.now(UTC)
    started = time.perf_counter()
    flows.run.eva_iteration = timed_iteration  # type: ignore[assignment]
    try:
        eva_run(cfg)
    finally:
        flows.run.eva_iteration = subflow
    total = time.perf_counter() - started
    store = RunStore(cfg.root, cfg.run)
    manifests = {
        (t, artifact): m
        for t in (None, *range(cfg.iterations + 1))
        for artifact in store.artifacts(t)
        if (m := store.read_manifest(t, artifact)) is not None
    }
    iterations = []
    for t in range(1, cfg.iterations + 1):
        (sub,) = _flow_runs(f"{cfg.run}-iter-{t}", since)[-1:]
        tasks = _task_runs(sub.id)
        stages = {
            artifact: {
                "task": round(_wall(tasks[f"{artifact}-{iteration_dir(t).replace('_', '-')}"]), 3),
                "stage": manifest["seconds"],
                "backend": manifest["stats"].get("backend_seconds", 0.0),
                "stats": manifest["stats"],
            }
            for (it, artifact), manifest in manifests.items()
            if it == t
        }
        wall = called[t - 1]
        backend = sum(s["backend"] for s in stages.values())
        inside = sum(s["stage"] for s in stages.values())
        iterations.append(
            {
                "t": t,
                "wall": round(wall, 3),
                "subflow": round(_wall(sub), 3),  # its recorded start to end
                "backend": round(backend, 3),
                "stage_io": round(inside - backend, 3),  # parquet, hashing, checkpoints
                "orchestration": round(wall - inside, 3),  # Prefect task and subflow runs
                "overhead_share": round((wall - backend) / wall, 4),
                "stages": stages,
            }
        )
    # The whole run as the caller sees it: setup, iteration 0 and the top-level flow run too.
    backend_all = sum((m["stats"] or {}).get("backend_seconds", 0.0) for m in manifests.values())
    return {
        "total": round(total, 3),
        "backend": round(backend_all, 3),
        "overhead_share": round((total - backend_all) / total, 4),
        "iterations": iterations,
    }


def _manifest_bytes(root: str, run: str) -> dict[str, bytes]:
    out = {}
    for dirpath, _, files in os.walk(os.path.join(root, run)):
        for name in files:
            if name.endswith(".manifest.json"):
                path = os.path.join(dirpath, name)
                with open(path, "rb") as f:
                    out[path] = f.read()
    return out


def cached_rerun(cfg: RunConfig, original_seconds: float, repeats: int = 3) -> dict[str, Any]:
    """Launch the finished run again, ``repeats`` times: every stage must come back from its
    manifest. The median is reported; each run's time and the 503 retries are kept."""
    from flows.run import eva_run

    before = _manifest_bytes(cfg.root, cfg.run)
    times = []
    with counting_retries() as retries:
        for _ in range(repeats):
            since = datetime.now(UTC)
            started = time.perf_counter()
            eva_run(cfg)
            times.append(round(time.perf_counter() - started, 3))
    after = _manifest_bytes(cfg.root, cfg.run)
    # Where the last rerun's time went: the stage tasks (cache checks) against the flow runs.
    flow_runs = [
        r for t in range(cfg.iterations + 1) for r in _flow_runs(f"{cfg.run}-iter-{t}", since)
    ]
    (top,) = _flow_runs(cfg.run, since, launch=True)[-1:]
    # The server files task runs from their events, a moment after the run: wait for all.
    stage_tasks: list[Any] = []

    def all_filed() -> bool:
        tasks = [tr for fr in (top, *flow_runs) for tr in _task_runs(fr.id).values()]
        stage_tasks[:] = [tr for tr in tasks if tr.state_name == "Cached"]
        return len(stage_tasks) >= len(before)

    with contextlib.suppress(PollTimeout):  # report what was filed by then
        wait_until(all_filed, 30, interval_s=0.5, what="cached task runs filed")
    changed = sorted(os.path.relpath(p, cfg.root) for p in before if before[p] != after.get(p))
    median = sorted(times)[len(times) // 2]
    return {
        "seconds": median,
        "runs": times,
        "share": round(median / original_seconds, 4),
        "best_share": round(min(times) / original_seconds, 4),
        "retries_503": retries.count,
        "stages": len(before),
        "reexecuted": changed,
        "cached_tasks": len(stage_tasks),
        "cached_tasks_seconds": round(sum(_wall(tr) for tr in stage_tasks), 3),
        "flow_runs": 1 + len(flow_runs),
    }


def prefect_floor(tasks: int, repeats: int = 9) -> dict[str, Any]:
    """What Prefect itself costs an iteration of this shape here: a subflow of ``tasks`` task
    runs that do nothing, called from a flow as ``eva_run`` calls an iteration (each call timed
    by the caller; the median of nine is reported: single calls vary widely on a shared
    machine). No iteration's orchestration costs less on this machine: it is the API round
    trips of the subflow and the server's work on the task runs' events, against the same
    server."""
    from prefect import flow, task
    from prefect.cache_policies import NONE

    @task(name="eva-bench-noop", cache_policy=NONE, persist_result=False)
    def noop(i: int) -> int:
        return i

    @flow(name="eva-bench-iteration")
    def iteration(n: int) -> None:
        for i in range(n):
            noop(i)

    times: list[float] = []

    @flow(name="eva-bench-floor")
    def run() -> None:
        for _ in range(repeats):
            started = time.perf_counter()
            iteration(tasks)
            times.append(round(time.perf_counter() - started, 3))

    run()
    return {"tasks": tasks, "seconds": sorted(times)[len(times) // 2], "runs": times}


def above_floor(run: dict[str, Any], floor_seconds: float) -> None:
    """Split each iteration's overhead into Prefect's floor and what eva adds above it, as
    shares of the iteration's wall time (``floor_share``, ``eva_share``: the overhead's two
    parts, side by side)."""
    for it in run["iterations"]:
        it["floor_share"] = round(floor_seconds / it["wall"], 4)
        it["eva_share"] = round(it["overhead_share"] - floor_seconds / it["wall"], 4)


def prefect_startup() -> float:
    """Run an empty flow first (Prefect's client, its event workers), so later timings
    exclude what the first flow run of a process pays once."""
    from prefect import flow

    @flow(name="eva-bench-warmup")
    def warmup() -> None:
        return None

    started = time.perf_counter()
    warmup()
    return round(time.perf_counter() - started, 3)


# What the run's rollouts and pairs cost.


def rollout_efficiency(cfg: RunConfig, t: int, stage_seconds: float) -> dict[str, Any]:
    """The generate stage of iteration ``t`` (its task run took ``stage_seconds``) against its
    backend loaded and called directly on the same checkpoint, prompts, n and seed."""
    from transformers import AutoTokenizer

    from tasks.backends.protocols import close_after
    from tasks.context import stage_seed

    store = RunStore(cfg.root, cfg.run)
    manifest = _manifest(store, t, "generate")
    policy_hash = manifest["inputs"]["policy"]["content_hash"]
    candidates = [store.read_manifest(t - 1, "train"), store.read_manifest(None, "bootstrap")]
    (policy,) = [m for m in candidates if m and m["content_hash"] == policy_hash][:1]
    prompts = store.read_table(manifest["inputs"]["prompts"]["uri"]).column("prompt").to_pylist()
    model_dir = store.local_model(policy["model_uri"], policy_hash)

    started = time.perf_counter()
    with close_after(cfg.generate.backend.load(model_dir)) as generator:
        seed = stage_seed(cfg.seed, t, "generate")
        responses = generator.generate(prompts, cfg.generate.n, seed).texts
    direct = time.perf_counter() - started

    stored = store.read_table(manifest["uri"]).column("responses").to_pylist()
    # Generated tokens, end-of-sequence included (the model spends a step on it too).
    ids = AutoTokenizer.from_pretrained(model_dir)(
        [r for rs in responses for r in rs], add_special_tokens=False
    )["input_ids"]
    tokens = sum(len(i) + 1 for i in ids)
    return {
        "prompts": len(prompts),
        "tokens": tokens,
        "direct_seconds": round(direct, 3),
        "stage_seconds": stage_seconds,
        "direct_tokens_per_s": round(tokens / direct, 1),
        "stage_tokens_per_s": round(tokens / stage_seconds, 1),
        "efficiency": round(direct / stage_seconds, 4),
        "same_outputs": responses == stored,
    }


def generation_per_pair(store: RunStore, iterations: int) -> dict[str, Any]:
    """Responses sampled per iteration (creator and solver) and the pairs they yielded."""
    generated = pairs = 0
    for t in range(1, iterations + 1):
        for artifact in ("creator_generate", "generate"):
            if (m := store.read_manifest(t, artifact)) is not None:
                generated += m["stats"]["responses"]
        pairs += _manifest(store, t, "pairs")["stats"]["pairs"]
    return {
        "responses": generated,
        "pairs": pairs,
        "responses_per_pair": round(generated / pairs, 2) if pairs else None,
    }


def run_costs(root: str, quick: bool, base: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every figure of the report; ``base`` replaces the embedded demo config (tests)."""
    from flows.run import eva_run

    shutil.rmtree(root, ignore_errors=True)  # timings of a fresh run, never of a cached one
    base = {**(base or DEMO.model_dump(mode="json")), "root": root}
    results: dict[str, Any] = {"prefect_startup": prefect_startup()}

    demo = validate_config({**base, "run": "demo"})
    results["demo"] = timed_run(demo)
    results["cached_rerun"] = cached_rerun(demo, results["demo"]["total"])
    results["prefect_floor"] = prefect_floor(len(results["demo"]["iterations"][0]["stages"]))
    above_floor(results["demo"], results["prefect_floor"]["seconds"])
    gen = results["demo"]["iterations"][0]["stages"]["generate"]
    results["rollout_demo"] = rollout_efficiency(demo, 1, gen["task"])

    # The same theta_0 for every other run: bootstrap is setup, not part of an iteration.
    demo_store = RunStore(root, "demo")
    theta0 = demo_store.absolute(_manifest(demo_store, None, "bootstrap")["model_uri"])
    shared = deep_merge(base, {"bootstrap": start_from(theta0)})
    if not quick:
        assert demo.prompts.source is not None
        size = demo.prompts.source.options["size"] * SCALE
        big = validate_config(deep_merge(shared, {"run": "demo-10x", **world_sizes(size)}))
        results["demo_10x"] = timed_run(big)
        above_floor(results["demo_10x"], results["prefect_floor"]["seconds"])
        gen = results["demo_10x"]["iterations"][0]["stages"]["generate"]
        results["rollout_10x"] = rollout_efficiency(big, 1, gen["task"])

    per_pair = {"eva": generation_per_pair(demo_store, demo.iterations)}
    for name, (_, extra) in PER_PAIR.items():
        if extra is None:
            continue  # the demo run
        cfg = validate_config(deep_merge(shared, {"run": name, **extra}))
        if name == "dpo":  # iterative DPO on fresh seed prompts
            baseline_run(cfg, "fresh")
        else:
            eva_run(cfg)
        per_pair[name] = generation_per_pair(RunStore(root, name), cfg.iterations)
    results["generation_per_pair"] = per_pair
    return results


# The report.


def _overhead_cells(label: str, where: str, wall: float, row: dict[str, Any]) -> list[str]:
    """One overhead row; the subflow, stage I/O, orchestration and the overhead's split exist
    per iteration only."""
    seconds = [f"{row[k]:.2f}" if k in row else "-" for k in SECONDS]
    shares = [f"{100 * row[k]:.1f}%" if k in row else "-" for k in SHARES]
    return [label, where, f"{wall:.2f}", *seconds, *shares]


SECONDS = ("subflow", "backend", "stage_io", "orchestration")
SHARES = ("overhead_share", "floor_share", "eva_share")


def _floor_lines(results: dict[str, Any]) -> list[str]:
    """Prefect's own floor under an iteration's orchestration, against demo iteration 1."""
    floor, its = results["prefect_floor"], results["demo"]["iterations"]
    runs = ", ".join(f"{x:.2f}" for x in floor["runs"])
    worst = max(it["eva_share"] for it in its)
    shares = ", ".join(
        f"iteration {it['t']}: overhead {100 * it['overhead_share']:.1f}% = floor "
        f"{100 * it['floor_share']:.1f}% + eva {100 * it['eva_share']:.1f}%"
        for it in its
    )
    verdict = "held" if worst <= EVA_TARGET else "missed"
    return [
        f"Prefect's floor: a subflow of {floor['tasks']} task runs that do nothing, called "
        f"the same way on the same server, takes {floor['seconds']:.2f} s (median of {runs} "
        f"s), {100 * its[0]['floor_share']:.1f}% of demo iteration 1's wall time.",
        "",
        f"eva's overhead above Prefect's floor, target at most {100 * EVA_TARGET:.0f}% of "
        f"a demo iteration: **{verdict}** (largest {100 * worst:.1f}%; {shares}).",
        "",
    ]


def _mean_stage(run: dict[str, Any], stage: str, key: str) -> float:
    values = [it["stages"][stage][key] for it in run["iterations"] if stage in it["stages"]]
    return float(np.mean(values)) if values else float("nan")


def write_costs_report(results: dict[str, Any], out_dir: str, name: str, command: str) -> str:
    """Markdown for ``run_costs``' results: stage times, overhead, cache, rollouts, per pair."""
    runs = {"demo": results["demo"]}
    if "demo_10x" in results:
        runs["10x"] = results["demo_10x"]
    head = ["stage"] + [f"{r} {k}" for r in runs for k in ("task s", "backend s")]
    stages = []
    for stage in results["demo"]["iterations"][0]["stages"]:
        task = {label: _mean_stage(run, stage, "task") for label, run in runs.items()}
        cells = [stage]
        for label, run in runs.items():
            cells += [f"{task[label]:.3f}", f"{_mean_stage(run, stage, 'backend'):.3f}"]
        if "10x" in runs:
            cells.append(f"{task['10x'] / task['demo']:.1f}x")
        stages.append(cells)
    if "10x" in runs:
        head.append("10x / demo (task)")
    over = [
        _overhead_cells(label, str(it["t"]), it["wall"], it)
        for label, run in runs.items()
        for it in run["iterations"]
    ]
    over += [_overhead_cells(label, "whole run", run["total"], run) for label, run in runs.items()]
    cached = results["cached_rerun"]
    roll = [
        [label, str(r["prompts"]), str(r["tokens"]), f"{r['direct_tokens_per_s']:.0f}",
         f"{r['stage_tokens_per_s']:.0f}", f"{100 * r['efficiency']:.1f}%",
         str(r["same_outputs"])]
        for label, key in (("demo", "rollout_demo"), ("10x", "rollout_10x"))
        if (r := results.get(key)) is not None
    ]  # fmt: skip
    gens = results["generation_per_pair"]
    dpo = gens["dpo"]["responses_per_pair"]
    per_pair = [
        [label, *(str(gens[arm][k]) for k in ("responses", "pairs", "responses_per_pair")),
         f"{gens[arm]['responses_per_pair'] / dpo:.2f}x" if dpo else "-"]
        for arm, (label, _) in PER_PAIR.items()
    ]  # fmt: skip
    over_head = ["run", "iteration", "wall s", "subflow s", "backends s", "stage I/O s",
                 "orchestration s", "overhead", "Prefect's floor", "eva above floor"]  # fmt: skip
    roll_head = ["run", "prompts", "tokens", "direct tok/s", "stage tok/s", "stage / direct",
                 "same output"]  # fmt: skip
    pair_head = ["arm", "responses generated", "pairs trained", "responses per pair",
                 "vs iterative DPO"]  # fmt: skip
    machine = f"{platform.machine()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}"
    md = "\n".join(
        [
            "## Pipeline costs",
            "",
            f"`{command}`, {machine}. The temporary Prefect server took "
            f"{results['prefect_startup']:.1f} s to start (once per process; excluded below).",
            "",
            "### Time per stage (mean over the run's eva iterations)",
            "",
            "*task* = the stage's Prefect task run; *backend* = load, call and close of the "
            "generator, reward model, evolver or solver inside it.",
            "",
            *md_table(head, stages),
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
            f"{cached['seconds']:.2f} s (median of {', '.join(f'{x:.2f}' for x in cached['runs'])}"
            f" s) against {results['demo']['total']:.2f} s for the original run "
            f"({100 * cached['share']:.1f}%; best {100 * cached['best_share']:.1f}%), "
            f"with {cached['retries_503']} request(s) retried after a 503 from the API "
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


# The other modes: a cached rerun against a chosen API, and a profile of one.


@contextlib.contextmanager
def _api(server: str) -> Iterator[None]:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    if server == "configured":
        if not PREFECT_API_URL.value():
            raise SystemExit("--cached-rerun configured needs PREFECT_API_URL")
        yield
    elif server == "eva":
        from eva_runtime.prefect_server import temporary_server

        with temporary_server():
            yield
    else:
        from prefect.server.api.server import SubprocessASGIServer

        with (
            SubprocessASGIServer() as prefect_server,
            temporary_settings(updates={PREFECT_API_URL: prefect_server.api_url}),
        ):
            yield


def heartbeats_on_and_off(server: str, root: str) -> None:
    """The demo once from an empty ``root``, then its cached reruns with flow-run heartbeats on
    and off, against the API ``server`` names."""
    from flows.run import eva_run

    shutil.rmtree(root, ignore_errors=True)
    cfg = validate_config({**DEMO.model_dump(mode="json"), "root": root, "run": "demo"})
    with _api(server):
        started = time.perf_counter()
        eva_run(cfg)
        first = time.perf_counter() - started
        on = cached_rerun(cfg, first)
        with no_heartbeats():
            off = cached_rerun(cfg, first)
    print(f"API: {server}; original run {first:.2f} s")
    for label, rerun in (("heartbeats on", on), ("heartbeats off", off)):
        print(
            f"cached rerun, {label}: {rerun['runs']} s, median {100 * rerun['share']:.1f}% of "
            f"it; {rerun['retries_503']} request(s) retried after a 503"
        )


def profile_rerun(root: str, lines: int) -> None:
    """cProfile of relaunching the finished demo run under ``root``, after one relaunch."""
    from flows.run import eva_run
    from flows.runs import stored_config

    config = stored_config(root, "demo")
    assert isinstance(config, RunConfig), "the demo run is an offline run"
    eva_run(config)  # warm: server up, modules imported
    profile = cProfile.Profile()
    started = time.perf_counter()
    profile.runcall(eva_run, config)
    print(f"cached rerun: {time.perf_counter() - started:.2f} s")
    pstats.Stats(profile).sort_stats("cumulative").print_stats(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="demo size only (no 10x run)")
    ap.add_argument("--root", default=os.path.join("runs-bench", "costs"))
    ap.add_argument("--out", default=os.path.join("docs", "bench"))
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument(
        "--cached-rerun",
        choices=["eva", "prefect", "configured"],
        help="only the cached reruns, heartbeats on and off, against this API",
    )
    mode.add_argument("--profile", action="store_true", help="profile a cached rerun")
    ap.add_argument("--lines", type=int, default=40, help="functions --profile prints")
    args = ap.parse_args(argv)
    root = os.path.abspath(os.path.join(args.root, "quick" if args.quick else "full"))
    if args.cached_rerun:
        return heartbeats_on_and_off(args.cached_rerun, os.path.join(args.root, "cached-rerun"))
    if args.profile:
        return profile_rerun(root, args.lines)
    # As `eva bench` runs it: the configured or a running server, else a temporary one.
    started = time.perf_counter()
    with prefect_api():
        server_start = time.perf_counter() - started  # 0 with a configured or running server
        results = run_costs(root, args.quick)
    results["prefect_startup"] = round(server_start + results["prefect_startup"], 3)
    os.makedirs(args.out, exist_ok=True)
    name = "costs-quick" if args.quick else "costs"
    with open(os.path.join(args.out, f"{name}.json"), "w") as f:
        json.dump(results, f, indent=1)
    command = "python -m bench.costs " + " ".join(sys.argv[1:] if argv is None else argv)
    print(write_costs_report(results, args.out, name, command))


if __name__ == "__main__":
    main()

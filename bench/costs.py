"""Benchmark: what the pipeline itself costs (issue 4, part 2).

    python -m bench.costs [--quick] [--root runs-bench/costs] [--out docs/bench]

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

The creator's CPU path at 1M prompts is ``bench.creator_cpu``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import time
from datetime import UTC, datetime
from typing import Any

import flows  # noqa: F401  (eva's Prefect defaults, before prefect is imported)
from bench.arms import baseline_run, sft_steps, start_from, world_sizes
from eva_runtime.poll import PollTimeout, wait_until
from eva_runtime.prefect_api import prefect_api
from eva_runtime.prefect_server import counting_retries
from flows.config import RunConfig, load_config, validate_config
from flows.config_layers import deep_merge
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


def _manifest(store: RunStore, t: int | None, artifact: str) -> dict[str, Any]:
    manifest = store.read_manifest(t, artifact)
    if manifest is None:
        raise RuntimeError(f"{store.base}: no {artifact} manifest for iteration {t}")
    return manifest


def _flow_runs(name: str, since: datetime, launch: bool = False) -> list[Any]:
    """Flow runs called ``name`` that started after ``since`` (oldest first); ``launch``: the
    top-level runs of eva run ``name``, whose names add the start time (``demo @11-22 ...``)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterName,
        FlowRunFilterStartTime,
    )

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                name=FlowRunFilterName(like_=f"{name} @")
                if launch
                else FlowRunFilterName(any_=[name]),
                start_time=FlowRunFilterStartTime(after_=since),  # type: ignore[arg-type]
            )
        )
    return sorted(runs, key=lambda r: r.start_time)


def _task_runs(flow_run_id: Any) -> dict[str, Any]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
        )
    return {r.name: r for r in runs}


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
        stages = {}
        for (it, artifact), manifest in manifests.items():
            if it != t:
                continue
            task_run = tasks[f"{artifact}-{iteration_dir(t).replace('_', '-')}"]
            stages[artifact] = {
                "task": round(_wall(task_run), 3),
                "stage": manifest["seconds"],
                "backend": manifest["stats"].get("backend_seconds", 0.0),
                "stats": manifest["stats"],
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


def _manifests(root: str, run: str) -> dict[str, bytes]:
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

    before = _manifests(cfg.root, cfg.run)
    times = []
    with counting_retries() as retries:
        for _ in range(repeats):
            since = datetime.now(UTC)
            started = time.perf_counter()
            eva_run(cfg)
            times.append(round(time.perf_counter() - started, 3))
    after = _manifests(cfg.root, cfg.run)
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


def rollout_efficiency(cfg: RunConfig, t: int, stage_seconds: float) -> dict[str, Any]:
    """The generate stage of iteration ``t`` (its task run took ``stage_seconds``) against its
    backend loaded and called directly on the same checkpoint, prompts, n and seed."""
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
        responses = generator.generate(prompts, cfg.generate.n, seed)
    direct = time.perf_counter() - started

    stored = store.read_table(manifest["uri"]).column("responses").to_pylist()
    tokens = _tokens(model_dir, responses)
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


def _tokens(model_dir: str, responses: list[list[str]]) -> int:
    """Generated tokens, end-of-sequence included (the model spends a step on it too)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    texts = [r for rs in responses for r in rs]
    return sum(len(ids) + 1 for ids in tok(texts, add_special_tokens=False)["input_ids"])


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


def _prefect_startup() -> float:
    """Run an empty flow first (Prefect's client, its event workers), so later timings
    exclude what the first flow run of a process pays once."""
    from prefect import flow

    @flow(name="eva-bench-warmup")
    def warmup() -> None:
        return None

    started = time.perf_counter()
    warmup()
    return round(time.perf_counter() - started, 3)


def run_costs(root: str, quick: bool, base: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every figure of the report; ``base`` replaces the embedded demo config (tests)."""
    from flows.run import eva_run

    shutil.rmtree(root, ignore_errors=True)  # timings of a fresh run, never of a cached one
    base = {**(base or DEMO.model_dump(mode="json")), "root": root}
    results: dict[str, Any] = {"prefect_startup": _prefect_startup()}

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

    per_pair = {"eva": generation_per_pair(RunStore(root, "demo"), demo.iterations)}
    for name, extra in (
        ("dpo", {}),
        ("eva-previous", {"creator_rollouts": "previous"}),
        ("eva-predicted", {"creator_rollouts": "predicted"}),
    ):
        cfg = validate_config(deep_merge(shared, {"run": name, **extra}))
        if name == "dpo":  # iterative DPO on fresh seed prompts
            baseline_run(cfg, "fresh")
        else:
            eva_run(cfg)
        per_pair[name] = generation_per_pair(RunStore(root, name), cfg.iterations)
    results["generation_per_pair"] = per_pair
    return results


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="demo size only (no 10x run)")
    ap.add_argument("--root", default=os.path.join("runs-bench", "costs"))
    ap.add_argument("--out", default=os.path.join("docs", "bench"))
    args = ap.parse_args(argv)
    root = os.path.abspath(os.path.join(args.root, "quick" if args.quick else "full"))
    # As `eva bench` runs it: the configured or a running server, else a temporary one.
    started = time.perf_counter()
    with prefect_api():
        server_start = time.perf_counter() - started  # 0 with a configured or running server
        results = run_costs(root, args.quick)
    results["prefect_startup"] = round(server_start + results["prefect_startup"], 3)
    from bench.report import write_costs_report

    os.makedirs(args.out, exist_ok=True)
    name = "costs-quick" if args.quick else "costs"
    with open(os.path.join(args.out, f"{name}.json"), "w") as f:
        json.dump(results, f, indent=1)
    command = "python -m bench.costs " + " ".join(sys.argv[1:] if argv is None else argv)
    print(write_costs_report(results, args.out, name, command))


if __name__ == "__main__":
    main()

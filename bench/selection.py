"""Benchmark (issue 32, part 1): when does informativeness-guided selection beat uniform?

    python -m bench.selection [--seeds 0 1 2 3 4] [--n 4 8 16 32] [--root runs-bench]

Design (pre-registered in docs/benchmarks.md, "When does selection matter?"): from each seed's
theta_1 of ``bench.method`` (same root, same base runs), one eva iteration per setting, where a
setting is N (responses per prompt, the creator's and the solver's) and a selection rule: uniform
(the control), a_min proportional (the paper), a_min top-k, a_avg and var proportional, and
(the addendum) a_min at temperatures 0.25 and 4 (``sample.temperature``). Every
arm trains K pairs (topped up as in ``bench.method``). Reported per setting: the held-out gain
over the uniform arm of the same N and seed (paired), and rho, how well theta_1's reading of a
prompt predicts the trained policy's reading of the same prompt (Spearman, first
``RHO_PROMPTS`` prompts of X_0 by id, N fresh samples each).

Runs are ordinary eva runs under ``--root``/full: a rerun reuses every finished stage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import numpy as np

import flows  # noqa: F401  (eva's Prefect defaults, before prefect is imported)
from bench.arms import start_from
from bench.held_apart import T_CRITICAL, paired
from bench.method import run_arm, seed_base
from bench.method_arms import Arm
from bench.method_results import iteration_row, model_path
from eva_core.informativeness import informativeness, reward_matrix
from eva_runtime.seeds import content_seed

NS = (4, 8, 16, 32)
# name -> overrides of one eva iteration; the reading each one's rho is measured with
SELECTIONS: dict[str, tuple[dict[str, Any], str]] = {
    "uniform": ({"score": {"metric": "uniform"}}, "a_min"),
    "a_min": ({}, "a_min"),
    "a_min-topk": ({"sample": {"method": "greedy"}}, "a_min"),
    "a_avg": ({"score": {"metric": "a_avg"}}, "a_avg"),
    "var": ({"score": {"metric": "var"}}, "var"),
    # The addendum: a_min drawn in proportion to a_min ** (1 / T)
    "a_min-t0.25": ({"sample": {"temperature": 0.25}}, "a_min"),
    "a_min-t4": ({"sample": {"temperature": 4.0}}, "a_min"),
}
RHO_PROMPTS = 500


def spearman(x: np.ndarray, y: np.ndarray) -> float | None:
    """Spearman's rho (ties ranked by their mean); None when a reading is constant."""
    from scipy.stats import spearmanr

    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    return float(spearmanr(x, y).statistic)


def reading_rho(store: Any, n: int, metric: str, seed: int) -> dict[str, Any]:
    """theta_1's reading of the first prompts of X_0 (the creator's rollouts) against the
    trained policy's reading of the same prompts from ``n`` fresh samples."""
    from eva_world import world
    from tasks.backends.generate.transformers import TransformersGeneration

    manifest = store.read_manifest(1, "creator_annotate")
    table = store.read_table(manifest["uri"]).sort_by("prompt_id").slice(0, RHO_PROMPTS)
    prompts = table.column("prompt").to_pylist()
    before = informativeness(reward_matrix(table.column("rewards")), metric)
    with store.fs.open(f"{store.base}/config.json") as f:
        config = json.load(f)
    backend = TransformersGeneration.model_validate(config["generate"]["backend"])
    generator = backend.load(model_path(store, 1))
    responses = generator.generate(prompts, n=n, seed=content_seed(seed, "selection-rho")).texts
    pairs = zip(prompts, responses, strict=True)
    rewards = np.array([[world.reward(p, r) for r in rs] for p, rs in pairs])
    after = informativeness(rewards, metric)
    return {
        "rho": spearman(before, after),
        "reading_before": round(float(before.mean()), 4),
        "reading_after": round(float(after.mean()), 4),
    }


def run_setting(base: dict[str, Any], theta1: str, seed: int, n: int, name: str) -> dict[str, Any]:
    overrides, metric = SELECTIONS[name]
    arm = Arm(f"sel-n{n}-{name}", "selection", 1, {"generate": {"n": n}, **overrides})
    started = time.perf_counter()
    store, factor = run_arm(base, f"s{seed}-{arm.name}", arm, {
        "iterations": 1, "iteration0_dpo": False, "bootstrap": start_from(theta1),
        **arm.overrides,
    })  # fmt: skip
    row = {**iteration_row(store, 1), "topup": factor}
    row.update(reading_rho(store, n, metric, seed))
    row["seconds"] = round(time.perf_counter() - started, 1)
    return row


def summarize(results: dict[str, dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """One object per setting: its N, metric, rule, seeds, rho, and gain over uniform."""
    out = []
    for key in sorted({k for per_seed in results.values() for k in per_seed}):
        n_text, name = key.split("/", 1)
        seeds = [s for s in results if key in results[s] and f"{n_text}/uniform" in results[s]]
        if not seeds:
            continue
        gains = [results[s][key]["score"] - results[s][f"{n_text}/uniform"]["score"] for s in seeds]
        rhos = [r for s in seeds if (r := results[s][key]["rho"]) is not None]
        mean, sd, t = paired(gains)
        sample = SELECTIONS[name][0].get("sample", {})
        temperature = "inf" if name == "uniform" else 0 if sample.get("method") == "greedy" else (
            sample.get("temperature", 1)
        )  # fmt: skip
        out.append({
            "n": int(n_text), "selection": name, "metric": SELECTIONS[name][1],
            "temperature": temperature,
            "seeds": [int(s) for s in seeds],
            "score": round(float(np.mean([results[s][key]["score"] for s in seeds])), 4),
            "gain_over_uniform": round(mean, 4), "gain_sd": round(sd, 4),
            "gains": [round(g, 4) for g in gains], "t": t,
            "rho": round(float(np.mean(rhos)), 3) if rhos else None,
            "rho_sd": round(float(np.std(rhos, ddof=1)), 3) if len(rhos) > 1 else None,
            "responses": round(float(np.mean([results[s][key]["responses"] for s in seeds]))),
            "verdict": None if name == "uniform" or len(gains) < 5 else (
                "matters" if (t or 0) > T_CRITICAL else "hurts" if (t or 0) < -T_CRITICAL
                else "no difference"
            ),
        })  # fmt: skip
    return out


def report(rows: list[dict[str, Any]], out_dir: str, command: str, seconds: float) -> str:
    from bench.report import md_table

    header = ["N", "selection", "T", "seeds", "held-out", "gain over uniform (sd)", "t",
              "rho (sd)", "responses", "verdict"]  # fmt: skip
    body = [
        [str(r["n"]), r["selection"], str(r["temperature"]), str(len(r["seeds"])),
         f"{r['score']:.3f}",
         "-" if r["selection"] == "uniform"
         else f"{r['gain_over_uniform']:+.3f} ({r['gain_sd']:.3f})",
         "-" if r["t"] is None else f"{r['t']:+.2f}",
         "-" if r["rho"] is None else f"{r['rho']:.2f} ({r['rho_sd'] or 0:.2f})",
         str(r["responses"]), r["verdict"] or "-"]
        for r in sorted(rows, key=lambda r: (r["n"], r["selection"]))
    ]  # fmt: skip
    md = (
        f"# Selection sweep (issue 32)\n\n`{command}`, {seconds / 60:.1f} min for the arms it "
        "ran (arms already recorded in selection.json are kept, not rerun).\n\n"
        + "\n".join(md_table(header, body))
        + "\n\nrho for `uniform` is a_min's (the reading it ignores).\n"
    )
    with open(os.path.join(out_dir, "selection.md"), "w") as f:
        f.write(md)
    _plot(rows, os.path.join(out_dir, "selection.png"))
    return md


def _plot(rows: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name in (s for s in SELECTIONS if s != "uniform"):
        pts = sorted((r for r in rows if r["selection"] == name and r["rho"] is not None),
                     key=lambda r: r["n"])  # fmt: skip
        if not pts:
            continue
        ax.errorbar(
            [r["rho"] for r in pts], [r["gain_over_uniform"] for r in pts],
            yerr=[r["gain_sd"] for r in pts], marker="o", capsize=3, label=name,
        )  # fmt: skip
        for r in pts:
            ax.annotate(f"N={r['n']}", (r["rho"], r["gain_over_uniform"]), fontsize=7,
                        xytext=(3, 3), textcoords="offset points")  # fmt: skip
    ax.axhline(0.0, color="grey", lw=0.8)
    ax.set_xlabel("rho: theta_1's reading vs the trained policy's (Spearman)")
    ax.set_ylabel("held-out gain over uniform selection")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--n", type=int, nargs="+", default=list(NS))
    ap.add_argument("--selections", nargs="+", default=list(SELECTIONS), choices=list(SELECTIONS))
    ap.add_argument("--root", default="runs-bench")
    ap.add_argument("--out", default=os.path.join("docs", "bench"))
    args = ap.parse_args(argv)
    root = os.path.abspath(os.path.join(args.root, "full"))
    path = os.path.join(args.out, "selection.json")
    saved: dict[str, Any] = {}
    if os.path.exists(path):  # a stopped sweep resumes from the arms it recorded
        with open(path) as f:
            saved = json.load(f)
    results: dict[str, dict[str, dict[str, Any]]] = saved.get("runs", {})
    started = time.perf_counter()
    bases: dict[int, tuple[dict[str, Any], str]] = {}
    theta0: str | None = None
    for n in args.n:  # every seed at one N before the next N (the pre-registered order)
        for seed in args.seeds:
            if seed not in bases:
                base, store, _ = seed_base(root, seed, False, [], theta0)
                theta0 = theta0 or model_path(store, None)
                bases[seed] = (base, model_path(store, 0))
            base, theta1 = bases[seed]
            for name in args.selections:
                key = f"{n}/{name}"
                if key in results.get(str(seed), {}):
                    continue
                row = run_setting(base, theta1, seed, n, name)
                results.setdefault(str(seed), {})[key] = row
                print(f"seed {seed} N={n} {name}: held-out {row['score']:.4f} rho {row['rho']} "
                      f"({row['seconds']} s)", flush=True)  # fmt: skip
                rows = summarize(results)
                os.makedirs(args.out, exist_ok=True)
                with open(path, "w") as f:  # after every arm: a stopped sweep keeps what it ran
                    json.dump({"settings": rows, "runs": results}, f, indent=1)
    command = "python -m bench.selection " + " ".join(sys.argv[1:] if argv is None else argv)
    print(report(summarize(results), args.out, command, time.perf_counter() - started))


if __name__ == "__main__":
    main()

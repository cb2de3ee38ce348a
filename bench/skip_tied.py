"""Read the issue-30 arms (docs/benchmarks.md, "Pre-rollout tie filter against post-rollout
replacement") from their run folders and write docs/bench/skip_tied.json and a table.

    python -m bench.skip_tied --root /work/meas/R

The arms are ordinary ``eva online`` runs (commands in docs/benchmarks.md); this only reads
their manifests: per segment, the held-out score and the responses generated."""

from __future__ import annotations

import argparse
import json
import os
import statistics
from typing import Any

from flows.markdown import md_row, md_table

ARMS = ("replace", "filter", "off", "baseline-off", "baseline-filter")
LEVEL = 0.55  # the pre-registered held-out level


def _manifest(root: str, run: str, where: str, stage: str) -> dict[str, Any]:
    with open(os.path.join(root, run, where, f"{stage}.manifest.json")) as f:
        return json.load(f)


def read_run(root: str, run: str) -> dict[str, Any]:
    """Per segment: held-out score, cumulative responses and steps; and the run's totals."""
    segments, responses, steps, skipped, replaced = [], 0, 0, 0, 0
    i = 1
    while os.path.exists(os.path.join(root, run, f"iter_{i}", "online.manifest.json")):
        stats = _manifest(root, run, f"iter_{i}", "online")["stats"]
        generations = 6  # configs/world-online.yaml, num_generations
        dyn = stats.get("dynamic_sampling") or {}
        # Every batch slot's first draw is sampled once, and so is every replacement (kept or
        # itself dropped); a skipped prompt is never sampled.
        responses += (stats["trained_prompts"] + dyn.get("replacement_prompts", 0)) * generations
        replaced += dyn.get("replacement_prompts", 0)
        skipped += stats.get("skipped", 0)
        steps += stats["steps"]
        score = _manifest(root, run, f"iter_{i}", "evaluate")["stats"]["score"]
        segments.append({"segment": i, "steps": steps, "responses": responses, "score": score})
        i += 1
    reached = next((s for s in segments if s["score"] >= LEVEL), None)
    return {
        "segments": segments,
        "final_score": segments[-1]["score"] if segments else None,
        "responses": responses,
        "steps": steps,
        "skipped": skipped,
        "replaced": replaced,
        "to_level": None if reached is None else {k: reached[k] for k in ("steps", "responses")},
    }


def _spread(values: list[float]) -> dict[str, float]:
    return {
        "mean": round(statistics.fmean(values), 4),
        "sd": round(statistics.stdev(values), 4) if len(values) > 1 else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--out", default="docs/bench/skip_tied.json")
    args = parser.parse_args()
    report: dict[str, Any] = {"level": LEVEL, "arms": {}}
    head = ["arm", "seeds", "final held-out", "responses", "skipped", "replaced",
            f"steps to {LEVEL}", f"responses to {LEVEL}"]  # fmt: skip
    print("\n".join(md_table(head, [])))  # the rows follow as each arm is read
    for arm in ARMS:
        runs = {s: read_run(args.root, f"{arm}-s{s}") for s in range(args.seeds)
                if os.path.exists(os.path.join(args.root, f"{arm}-s{s}", "iter_8"))}  # fmt: skip
        if not runs:
            continue
        reached = [r["to_level"] for r in runs.values() if r["to_level"]]
        summary: dict[str, Any] = {
            "seeds": sorted(runs),
            "final_score": _spread([r["final_score"] for r in runs.values()]),
            "responses": _spread([r["responses"] for r in runs.values()]),
            "skipped": _spread([r["skipped"] for r in runs.values()]),
            "replaced": _spread([r["replaced"] for r in runs.values()]),
            "reached_level": len(reached),
            "steps_to_level": _spread([x["steps"] for x in reached]) if reached else None,
            "responses_to_level": _spread([x["responses"] for x in reached]) if reached else None,
            "runs": runs,
        }
        report["arms"][arm] = summary

        def fmt(x: dict[str, float] | None) -> str:
            return "-" if x is None else f"{x['mean']:g} ± {x['sd']:g}"

        print(md_row([arm, str(len(runs)), fmt(summary["final_score"]),
                      fmt(summary["responses"]), fmt(summary["skipped"]),
                      fmt(summary["replaced"]),
                      f"{fmt(summary['steps_to_level'])} ({len(reached)}/{len(runs)})",
                      fmt(summary["responses_to_level"])]))  # fmt: skip
    # Paired by seed (each seed's arms share a theta_0): arm minus its reference.
    report["paired"] = {}
    for arm, ref in (("filter", "replace"), ("filter", "off"), ("baseline-filter", "baseline-off")):
        a, b = report["arms"].get(arm), report["arms"].get(ref)
        if not a or not b:
            continue
        seeds = sorted(set(a["runs"]) & set(b["runs"]))
        if not seeds:
            continue
        diff = {
            key: _spread([a["runs"][s][key] - b["runs"][s][key] for s in seeds])
            for key in ("final_score", "responses")
        }
        report["paired"][f"{arm} - {ref}"] = {"seeds": seeds, **diff}
        score, spent = diff["final_score"], diff["responses"]
        print(f"{arm} - {ref} ({len(seeds)} seeds): final held-out {score['mean']:+.4f} ± "
              f"{score['sd']:.4f}, responses {spent['mean']:+.0f} ± {spent['sd']:.0f}")  # fmt: skip
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()

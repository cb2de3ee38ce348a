"""Benchmark (issue 22): eva when nobody knows the evolved prompts' answers.

    python -m bench.answer_blind [--seeds 0 1 2] [--agreement 0.5] [--root runs-bench]
        [--out docs/bench]

The world's rewriter knows every child's answer; an LLM rewriter does not. Per seed, on the
benchmark's world and from the same start as ``bench.method``'s eva arm (its base run:
X_0, the held-out set, theta_0 -> theta_1), two arms of 2 eva iterations:

* ``exact``: rewards by the world's verifier (the world's solver knows every answer): it is
  ``bench.method``'s ``eva`` arm, run by the same ``run_arm``.
* ``answer-blind``: ``annotate.reward`` is ``verifiable`` (``eva_world.components:match``)
  with known answers for the seed prompts X_0 only (a human-labelled seed set: the answers
  file is written from the base run's X_0 with ``world.solve``) and the majority vote of the
  policy's N samples for every evolved child, labelled at ``--agreement``; below it the child
  is unscored. ``annotate.max_unscored_share`` is 1.0 so that dropped children never fail the
  stage (their share is reported instead). ``evaluate.reward`` stays the world's verifier, so
  held-out scores are comparable with the exact arm's.

Reported per seed and as mean ± sd: held-out score per iteration for both arms and their
paired difference; for every annotate stage of the blind arm, the majority labels recomputed
from the stored rollouts with the same function (``eva_core.answers.answer_rewards``; the
stored rewards must be reproduced exactly), their accuracy against ``world.solve``, the share
of unknown prompts dropped, and the share of the pairs the solver trained on whose chosen
answer is truly correct. The rewriter's reference answer and an inherited parent answer are
measured where the world allows (``inherited_accuracy``: how often a child's answer equals
its parent's); see docs/benchmarks.md for what cannot be measured here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

import flows  # noqa: F401  (eva's Prefect defaults, before prefect is imported)
from bench.arms import start_from
from bench.method import run_arm, seed_base
from bench.method_arms import Arm
from bench.method_results import iteration_row, model_path
from eva_core.answers import answer_rewards, majority_answers, normalize_answer
from eva_core.schema import prompt_id
from eva_world import world
from eva_world.components import match
from flows.config_layers import deep_merge

ITERATIONS = 2
MATCH = "eva_world.components:match"
WORLD_VERIFIER = {"kind": "python", "factory": "eva_world.components:WorldVerifier"}
ARMS = ("exact", "blind")


def blind_overrides(answers: str, agreement: float) -> dict[str, Any]:
    """The answer-blind arm's settings on top of the exact arm's."""
    reward = {"kind": "verifiable", "function": MATCH, "answers": answers, "agreement": agreement}
    return {
        "annotate": {"reward": reward, "max_unscored_share": 1.0},
        "evaluate": {"reward": WORLD_VERIFIER},
    }


def write_answers(prompts: Sequence[str], path: str) -> dict[str, str]:
    """The seed set's answers file (JSONL: prompt, answer); returns them by prompt id."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        for p in prompts:
            f.write(json.dumps({"prompt": p, "answer": world.solve(p)}) + "\n")
    return {prompt_id(p): world.solve(p) for p in prompts}


def label_check(
    prompts: Sequence[str],
    responses: Sequence[Sequence[str]],
    stored: Sequence[Sequence[float]],
    known: Mapping[str, str],
    agreement: float,
) -> dict[str, Any]:
    """The labels an annotate stage used, recomputed, and how right they were.

    ``reproduced``: the recomputed rewards equal the stored ones (NaN equal to NaN);
    ``label_accuracy``: the share of majority-labelled prompts whose label is the true answer;
    ``dropped_share``: the share of unknown prompts left unscored; ``wrong_careless``: the
    share of wrong labels that are exactly the careless demonstrator's answer
    (``world.careless_answer``, the slip theta_0 imitates); ``reward_error``: the mean absolute
    difference from the exact reward over the majority-labelled responses; ``by_category``:
    unknown prompts, dropped share and label accuracy per category.
    """
    answers = [known.get(prompt_id(p)) for p in prompts]
    got = answer_rewards(responses, answers, match, agreement)
    flat_got = np.array([r for rs in got.rewards for r in rs], dtype=float)
    flat_stored = np.array([r for rs in stored for r in rs], dtype=float)
    reproduced = flat_got.shape == flat_stored.shape and bool(
        np.array_equal(flat_got, flat_stored, equal_nan=True)
    )
    truth = {
        i: normalize_answer(world.solve(p)) for i, p in enumerate(prompts) if answers[i] is None
    }
    right = {i: got.labels[i] == truth[i] for i in truth if got.sources[i] == "majority"}
    wrong = [i for i, ok in right.items() if not ok]
    careless = sum(
        got.labels[i] == normalize_answer(world.careless_answer(prompts[i])) for i in wrong
    )
    errors = [
        abs(match(r, str(got.labels[i])) - match(r, truth[i])) for i in right for r in responses[i]
    ]
    counts = got.counts()
    by_category: dict[str, dict[str, Any]] = {}
    for c in sorted({str(world.category_of(prompts[i])) for i in truth}):
        idx = [i for i in truth if world.category_of(prompts[i]) == c]
        ok = [right[i] for i in idx if i in right]
        by_category[c] = {
            "unknown": len(idx),
            "dropped_share": _share(len(idx) - len(ok), len(idx)),
            "label_accuracy": _share(sum(ok), len(ok)),
        }
    return {
        "prompts": len(prompts),
        **counts,
        "reproduced": reproduced,
        "label_accuracy": _share(sum(right.values()), len(right)),
        "dropped_share": _share(counts["dropped"], len(truth)),
        "wrong_careless": _share(careless, len(wrong)),
        "reward_error": round(float(np.mean(errors)), 4) if errors else None,
        "by_category": by_category,
    }


def threshold_sweep(
    prompts: Sequence[str], responses: Sequence[Sequence[str]], known: Mapping[str, str], n: int
) -> list[dict[str, Any]]:
    """Offline, on one stage's stored rollouts: for every threshold k/n, the share of the
    unknown prompts the majority vote labels and the accuracy of those labels."""
    unknown = [i for i, p in enumerate(prompts) if prompt_id(p) not in known]
    out = []
    for k in range(1, n + 1):
        vote = majority_answers([responses[i] for i in unknown], k / n)
        kept = [j for j, keep in enumerate(vote.keep) if keep]
        right = sum(
            vote.answers[j] == normalize_answer(world.solve(prompts[unknown[j]])) for j in kept
        )
        out.append({
            "threshold": f"{k}/{n}", "labelled": _share(len(kept), len(unknown)),
            "label_accuracy": _share(right, len(kept)),
        })  # fmt: skip
    return out


def chosen_correct(prompts: Sequence[str], chosen: Sequence[str]) -> float | None:
    """The share of pairs whose chosen answer is exactly right by the world's solver."""
    right = sum(world.reward(p, c) == 1.0 for p, c in zip(prompts, chosen, strict=True))
    return _share(right, len(chosen))


def inherited_accuracy(children: Sequence[str], parents: Sequence[str]) -> float | None:
    """The share of children whose answer is their parent's: an inherited answer's accuracy."""
    same = sum(world.solve(c) == world.solve(p) for c, p in zip(children, parents, strict=True))
    return _share(same, len(children))


def _share(k: int, n: int) -> float | None:
    return round(k / n, 4) if n else None


def _table(store: Any, t: int | None, artifact: str) -> Any:
    manifest = store.read_manifest(t, artifact)
    return None if manifest is None else store.read_table(manifest["uri"])


def blind_stats(store: Any, t: int, known: Mapping[str, str], agreement: float) -> dict[str, Any]:
    """Label checks of iteration ``t``'s annotate stages, and the share of its pairs whose
    prompt had no known answer (trained on a majority label)."""
    out: dict[str, Any] = {}
    for artifact in ("creator_annotate", "annotate"):
        table = _table(store, t, artifact)
        if table is not None:
            cols = [table.column(c).to_pylist() for c in ("prompt", "responses", "rewards")]
            out[artifact] = label_check(cols[0], cols[1], cols[2], known, agreement)
    pairs = _table(store, t, "pairs").column("prompt").to_pylist()
    out["pairs_voted"] = _share(sum(prompt_id(p) not in known for p in pairs), len(pairs))
    return out


def solver_stats(store: Any, t: int) -> dict[str, Any]:
    """What any arm's iteration ``t`` trained on and evolved: pair correctness, and how often
    an evolved child kept its parent's answer."""
    pairs = _table(store, t, "pairs")
    chosen = chosen_correct(pairs.column("prompt").to_pylist(), pairs.column("chosen").to_pylist())
    evolved = _table(store, t, "evolve")
    previous = _table(store, None, "prompts") if t == 1 else _table(store, t - 1, "mix")
    ids, texts = (previous.column(c).to_pylist() for c in ("prompt_id", "prompt"))
    text = dict(zip(ids, texts, strict=True))
    kids = [
        (c, text[p])
        for c, p in zip(
            evolved.column("prompt").to_pylist(),
            evolved.column("parent_id").to_pylist(),
            strict=True,
        )
        if p in text
    ]
    return {
        "chosen_correct": chosen,
        "children": len(kids),
        "inherited_accuracy": inherited_accuracy([c for c, _ in kids], [p for _, p in kids]),
    }


def blind_name(agreement: float) -> str:
    """The blind arm's run name: the default threshold's, or one per other threshold."""
    return "eva-answer-blind" if agreement == 0.5 else f"eva-answer-blind-{agreement:.4g}"


def run_seed(root: str, seed: int, theta0: str | None, agreement: float) -> dict[str, Any]:
    """Both arms of one seed from the seed's base run (``bench.method.seed_base``)."""
    base, store, factor = seed_base(root, seed, True, [], theta0)
    x0 = _table(store, None, "prompts").column("prompt").to_pylist()
    answers = os.path.join(root, "answers", f"s{seed}-x0.jsonl")
    known = write_answers(x0, answers)
    start = {
        "iterations": ITERATIONS,
        "iteration0_dpo": False,
        "bootstrap": start_from(model_path(store, 0)),
    }
    result: dict[str, Any] = {
        "theta_0_model": model_path(store, None),
        "theta_1": {**iteration_row(store, 0), "topup": factor},
    }
    # The blind arm's reward is another kind: the base's is cleared, not merged into.
    blind_base = deep_merge(base, {"annotate": {"reward": None}})
    for arm, arm_base, overrides in (
        ("exact", base, start),
        ("blind", blind_base, {**start, **blind_overrides(answers, agreement)}),
    ):
        name = "eva" if arm == "exact" else blind_name(agreement)
        started = time.perf_counter()
        s, grown = run_arm(arm_base, f"s{seed}-{name}", Arm(name, "issue22", ITERATIONS), overrides)
        its = []
        for t in range(1, ITERATIONS + 1):
            row = {**iteration_row(s, t), **solver_stats(s, t)}
            row.update(blind_stats(s, t, known, agreement) if arm == "blind" else {})
            its.append(row)
        if arm == "blind":  # the threshold's trade-off on the first children, offline
            table = _table(s, 1, "annotate")
            cols = [table.column(c).to_pylist() for c in ("prompt", "responses")]
            n = len(cols[1][0])
            result["sweep"] = threshold_sweep(cols[0], cols[1], known, n)
        result[arm] = {
            "topup": grown,
            "seconds": round(time.perf_counter() - started, 1),
            "iterations": its,
        }
    return result


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument(
        "--agreement",
        type=lambda v: float(Fraction(v)),
        default=0.5,
        help="the majority label's share of the N samples, e.g. 0.5 or 5/6 (default 0.5)",
    )
    ap.add_argument("--root", default="runs-bench")
    ap.add_argument("--out", default=os.path.join("docs", "bench"))
    args = ap.parse_args(argv)
    root = os.path.abspath(os.path.join(args.root, "answer-blind"))
    started = time.perf_counter()
    results: dict[str, Any] = {}
    theta0: str | None = None  # one theta_0 for every seed, as bench.method
    for s in args.seeds:
        results[str(s)] = run_seed(root, s, theta0, args.agreement)
        model = results[str(s)].pop("theta_0_model")  # a path on this machine: not reported
        theta0 = theta0 or model
    command = "python -m bench.answer_blind " + " ".join(sys.argv[1:] if argv is None else argv)
    from bench.answer_blind_report import report

    md = report(results, time.perf_counter() - started, command, args.agreement)
    os.makedirs(args.out, exist_ok=True)
    name = blind_name(args.agreement).removeprefix("eva-")
    with open(os.path.join(args.out, f"{name}.json"), "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(args.out, f"{name}.md"), "w") as f:
        f.write("## Answer-blind evolution (issue 22)\n\n" + md + "\n")
    print(md)


if __name__ == "__main__":
    main()

"""What one run of a real model did, read from its artifacts: each stage's seconds and, where it
generated, its tokens, tokens/s and truncated share; each checkpoint's held-out scores.

    python -m bench.run_report --run smollm2-if [--root runs] [--json out.json]

Held-out, per checkpoint: the mean reward, the share of answers with reward 1 (with the
instruction-following reward's ``partial`` score: IFEval's prompt-level strict accuracy), the
instruction-level accuracy where the reward counts instructions (``followed / instructions``),
the mean answer length in tokens, the truncated share and ``answers_changed``. Tokens are the
stored texts re-tokenized with the run's own tokenizer, plus one for the end-of-turn token of a
finished answer: within a token or two of what the sampler produced.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from flows.markdown import md_table
from flows.summary import answers_changed
from tasks.store import RunStore

GENERATING = ("creator_generate", "generate", "evaluate")


class Tokens:
    """Token counts of stored answers, with the run's tokenizer (theta_0's)."""

    def __init__(self, store: RunStore):
        from transformers import AutoTokenizer

        boot = store.read_manifest(None, "bootstrap")
        assert boot is not None, "the run has no theta_0 yet"
        self.tok = AutoTokenizer.from_pretrained(
            store.local_model(boot["model_uri"], boot["content_hash"])
        )

    def count(self, texts: list[str], finished: list[bool]) -> int:
        ids = self.tok(texts, add_special_tokens=False)["input_ids"] if texts else []
        return sum(len(i) + int(f) for i, f in zip(ids, finished, strict=True))


def _answers(store: RunStore, manifest: dict[str, Any]) -> tuple[list[str], list[bool]]:
    table = store.read_table(manifest["uri"])
    if manifest["stage"] == "evaluate":
        return table.column("response").to_pylist(), table.column("finished").to_pylist()
    texts = [t for ts in table.column("responses").to_pylist() for t in ts]
    return texts, [f for fs in table.column("finished").to_pylist() for f in fs]


def stage_rows(store: RunStore, tokens: Tokens) -> list[dict[str, Any]]:
    rows = []
    for it in [None, *store.iterations()]:
        for artifact in store.artifacts(it):
            m = store.read_manifest(it, artifact)
            if m is None:
                continue
            row: dict[str, Any] = {"iteration": "setup" if it is None else it,
                                   "stage": artifact, "seconds": m["seconds"]}  # fmt: skip
            if m["stage"] in GENERATING:
                texts, finished = _answers(store, m)
                n = tokens.count(texts, finished)
                row.update(
                    responses=len(texts), tokens=n, tokens_per_s=round(n / m["seconds"], 1),
                    truncated_share=round(finished.count(False) / max(len(texts), 1), 3),
                )  # fmt: skip
            rows.append(row)
    return rows


def checkpoint_rows(store: RunStore, tokens: Tokens) -> list[dict[str, Any]]:
    rows, previous = [], None
    evaluated = [it for it in [None, *store.iterations()] if store.read_manifest(it, "evaluate")]
    for it in evaluated:
        m = store.read_manifest(it, "evaluate")
        assert m is not None
        stats, reward = m["stats"], m["stats"].get("reward", {})
        texts, finished = _answers(store, m)
        row = {
            "checkpoint": "theta_0" if it is None else it,
            "score": stats["score"],
            "prompt_level": stats["solved"],
            "instruction_level": (
                round(reward["followed"] / reward["instructions"], 4)
                if reward.get("instructions") else None
            ),
            "mean_tokens": round(tokens.count(texts, finished) / max(len(texts), 1), 1),
            "truncated_share": stats.get("truncated_share"),
            "answers_changed": None if it is None else answers_changed(store, it, previous),
        }  # fmt: skip
        rows.append(row)
        previous = it
    return rows


def markdown(stages: list[dict[str, Any]], checkpoints: list[dict[str, Any]]) -> str:
    def cell(v: Any) -> str:
        return "-" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))

    s_cols = ("iteration", "stage", "seconds", "responses", "tokens", "tokens_per_s",
              "truncated_share")  # fmt: skip
    c_cols = ("checkpoint", "score", "prompt_level", "instruction_level", "mean_tokens",
              "truncated_share", "answers_changed")  # fmt: skip
    return "\n".join([
        *md_table(c_cols, ([cell(r.get(c)) for c in c_cols] for r in checkpoints)), "",
        *md_table(s_cols, ([cell(r.get(c)) for c in s_cols] for r in stages)),
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", required=True)
    p.add_argument("--root", default="runs")
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args(argv)
    store = RunStore(args.root, args.run)
    tokens = Tokens(store)
    stages, checkpoints = stage_rows(store, tokens), checkpoint_rows(store, tokens)
    print(markdown(stages, checkpoints))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"stages": stages, "checkpoints": checkpoints}, f, indent=1)


if __name__ == "__main__":
    main()

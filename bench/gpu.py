"""Benchmark: eva's GPU rollout and reward paths against vLLM's own (issue 33). Needs CUDA + vLLM.

    python -m bench.gpu --out DIR [--vllm-bin vllm] [--prompts 2000] [--n 6] [--max-tokens 64]

One checkpoint (a random Llama of about 180M parameters with the world's character tokenizer,
bf16), one prompt set (the world's seed distribution), one run:

* rollouts, each arm in a process of its own (a vLLM engine does not hand its GPU memory back
  inside one), with the same engine settings (bf16, CUDA graphs, ``--max-model-len 128``), the
  same sampling (temperature 0.7, top_p 0.9) and the same per-prompt seeds:
    - ``plain``: vLLM's offline engine called directly, ``LLM.generate`` with one
      ``SamplingParams`` per prompt: the reference;
    - ``vllm``: eva's ``vllm`` backend (``VLLMGenerator``) on the same engine;
    - ``served``: eva's ``served`` backend, ``vllm serve`` started by ``ServedGeneration`` and
      sampled over HTTP by eva's client, at its default concurrency (16) and at 256.
  The timed part is ``generate`` alone, after a warm-up call; the engine's start is timed apart.
  Tokens are the responses re-encoded by the tokenizer (one token per character), counted the
  same way for every arm; ``same_as_plain`` is the share of responses equal to the reference's.
* rewards: ``vllm_pooling`` against ``sequence_classifier`` on the same conversations (a random
  Llama reward head, float32, a chat template): the largest absolute difference, and each time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

MAX_LEN = 128
GPU_MEMORY = 0.5
SAMPLING = {"temperature": 0.7, "top_p": 0.9}
TEMPLATE = "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}{{ eos_token }}{% endfor %}"


def build(work: Path, n_prompts: int) -> None:
    """The policy, the reward model and the prompts, under ``work``."""
    import torch
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        LlamaForSequenceClassification,
    )

    from eva_world import world
    from eva_world.tiny_lm import build_char_tokenizer

    tok = build_char_tokenizer(world.ALPHABET + "ua\n")
    special = dict(
        vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, max_position_embeddings=256,
    )  # fmt: skip
    torch.manual_seed(0)
    policy = LlamaConfig(
        hidden_size=1024, intermediate_size=2816, num_hidden_layers=16, num_attention_heads=16,
        num_key_value_heads=4, **special,
    )  # fmt: skip
    LlamaForCausalLM(policy).bfloat16().save_pretrained(work / "policy")
    tok.save_pretrained(work / "policy")
    reward = LlamaConfig(
        hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=4, initializer_range=0.5, **special,
    )  # fmt: skip
    reward.num_labels = 1  # one reward logit
    LlamaForSequenceClassification(reward).save_pretrained(work / "reward")
    tok.chat_template = TEMPLATE
    tok.save_pretrained(work / "reward")
    prompts = world.sample_prompts(world.SEED_DISTRIBUTION, n_prompts, seed=0)
    (work / "prompts.json").write_text(json.dumps(prompts))


def _timed(generate: Callable[[list[str]], list[list[str]]], work: Path) -> dict[str, Any]:
    """``generate`` warmed up on 32 prompts, then timed on every prompt."""
    prompts = json.loads((work / "prompts.json").read_text())
    generate(prompts[:32])
    t0 = time.perf_counter()
    responses = generate(prompts)
    return {"generate_s": time.perf_counter() - t0, "responses": responses}


def arm_plain(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    from vllm import LLM, SamplingParams

    from tasks.backends.generate.openai import derive_seed

    t0 = time.perf_counter()
    llm = LLM(
        model=str(work / "policy"), dtype="bfloat16", gpu_memory_utilization=GPU_MEMORY,
        max_model_len=MAX_LEN, seed=0,
    )  # fmt: skip
    start_s = time.perf_counter() - t0

    def generate(batch: list[str]) -> list[list[str]]:
        params = [
            SamplingParams(n=args.n, max_tokens=args.max_tokens, seed=derive_seed(0, i), **SAMPLING)
            for i in range(len(batch))
        ]
        outs = llm.generate(batch, params, use_tqdm=False)
        return [[c.text for c in sorted(o.outputs, key=lambda c: c.index)] for o in outs]

    return {"start_s": start_s, **_timed(generate, work)}


def _eva_arm(backend: Any, work: Path, args: argparse.Namespace, **load: Any) -> dict[str, Any]:
    """An eva generation backend loaded on the policy (the start timed) and timed generating;
    the served backend's engine starts too (its second load reuses the first's server)."""
    from tasks.backends.protocols import close_after

    t0 = time.perf_counter()
    with close_after(backend.load(str(work / "policy"), **load)) as gen:
        start_s = time.perf_counter() - t0
        timed = _timed(lambda batch: gen.generate(batch, args.n, seed=0).texts, work)
    starts = {"engine_starts": gen.engine_starts} if hasattr(gen, "engine_starts") else {}
    return {"start_s": start_s, **starts, **timed}


def arm_vllm(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    from tasks.backends.generate.vllm import VLLMGeneration

    cfg = VLLMGeneration.model_validate(
        {"max_tokens": args.max_tokens, "dtype": "bfloat16", "gpu_memory_utilization": GPU_MEMORY,
         "max_model_len": MAX_LEN, **SAMPLING}
    )  # fmt: skip
    return _eva_arm(cfg, work, args)


def arm_served(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """``vllm serve`` through eva's served backend at 16 and at 256 requests in flight."""
    from eva_runtime.engines import EnginePool
    from tasks.backends.generate.served import ServedGeneration

    pool = EnginePool()
    out: dict[str, Any] = {}
    for concurrency in (16, 256):
        backend = ServedGeneration.model_validate(
            {
                "command": [args.vllm_bin, "serve", "{model}", "--port", "{port}", "--seed", "0",
                            "--served-model-name", "{name}"],
                "extra_args": ["--dtype", "bfloat16", "--gpu-memory-utilization",
                               str(GPU_MEMORY), "--max-model-len", str(MAX_LEN)],
                "startup_timeout_s": 600.0,
                "client": {"endpoint": "completions", "max_tokens": args.max_tokens, **SAMPLING,
                           "llm": {"concurrency": concurrency}},
            }
        )  # fmt: skip
        out[f"c{concurrency}"] = _eva_arm(backend, work, args, pool=pool)
    pool.stop_all()
    return out


def arm_rewards(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Both reward backends on the plain arm's first 1,000 prompts' responses."""
    import gc

    import torch

    from tasks.backends.reward.sequence_classifier import SequenceClassifierReward
    from tasks.backends.reward.vllm_pooling import VLLMPoolingReward

    prompts = json.loads((work / "prompts.json").read_text())[:1000]
    responses = json.loads((work / "plain.json").read_text())["responses"][: len(prompts)]
    model = str(work / "reward")
    out: dict[str, Any] = {"conversations": sum(len(r) for r in responses)}
    scores = []
    for name, reward in (
        ("sequence_classifier", SequenceClassifierReward(model=model, dtype="float32",
                                                         batch_size=256)),
        ("vllm_pooling", VLLMPoolingReward(model=model, dtype="float32", max_length=256,
                                           gpu_memory_utilization=0.1)),
    ):  # fmt: skip
        t0 = time.perf_counter()
        scorer = reward.load()
        t1 = time.perf_counter()
        scores.append(scorer.score(prompts, responses))
        out[name] = {"load_s": t1 - t0, "score_s": time.perf_counter() - t1}
        del scorer  # the classifier's GPU memory back before vLLM takes its share
        gc.collect()
        torch.cuda.empty_cache()
    pairs = [(a, b) for ra, rb in zip(*scores, strict=True) for a, b in zip(ra, rb, strict=True)]
    out["max_abs_diff"] = max(abs(a - b) for a, b in pairs)
    out["reward_range"] = [min(a for a, _ in pairs), max(a for a, _ in pairs)]
    return out


ARMS: dict[str, Callable[[Path, argparse.Namespace], dict[str, Any]]] = {
    "plain": arm_plain, "vllm": arm_vllm, "served": arm_served, "rewards": arm_rewards,
}  # fmt: skip


def run_arm(name: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One arm in a fresh interpreter; its result (or its error's last lines) as a dict."""
    argv = [
        *(sys.executable, "-m", "bench.gpu", "--arm", name, "--work", str(work)),
        *("--n", str(args.n), "--max-tokens", str(args.max_tokens), "--vllm-bin", args.vllm_bin),
    ]
    log = work / f"{name}.log"
    t0 = time.perf_counter()
    with open(log, "w") as f:
        code = subprocess.call(argv, stdout=f, stderr=subprocess.STDOUT, timeout=args.arm_timeout)
    wall = time.perf_counter() - t0
    path = work / f"{name}.json"
    if code != 0 or not path.exists():
        tail = log.read_text(errors="replace").splitlines()[-25:]
        return {"error": f"exit {code}", "tail": tail, "wall_s": wall}
    return {**json.loads(path.read_text()), "wall_s": wall}


def summarize(results: dict[str, Any], work: Path) -> dict[str, Any]:
    """Tokens per second per rollout arm, against the plain arm's, and agreement with it."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(work / "policy"))
    runs = {
        "plain": results.get("plain", {}),
        "eva vllm": results.get("vllm", {}),
        **{f"eva served ({k[1:]} in flight)": v for k, v in results.get("served", {}).items()},
    }
    rows: dict[str, dict[str, Any]] = {}
    ref = [x for rs in runs["plain"].get("responses", []) for x in rs]
    for name, r in runs.items():
        if not isinstance(r, dict) or "responses" not in r:
            continue  # the arm failed or was not run
        flat = [x for rs in r["responses"] for x in rs]
        tokens = sum(len(tok.encode(x, add_special_tokens=False)) for x in flat)
        row = rows[name] = {
            "start_s": round(r["start_s"], 1),
            "generate_s": round(r["generate_s"], 2),
            "tokens": tokens,
            "tokens_per_s": round(tokens / r["generate_s"]),
        }
        if ref:
            row["same_as_plain"] = round(
                sum(a == b for a, b in zip(flat, ref, strict=True)) / len(ref), 4
            )
    if "plain" in rows:
        for row in rows.values():
            row["vs_plain"] = round(row["tokens_per_s"] / rows["plain"]["tokens_per_s"], 3)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gpu", description=__doc__)
    p.add_argument("--out", default="gpu-bench", help="folder for gpu.json and the arms' logs")
    p.add_argument("--vllm-bin", default="vllm", help="the vllm binary for the served arm")
    p.add_argument("--prompts", type=int, default=2000)
    p.add_argument("--n", type=int, default=6, help="responses per prompt (the paper's 6)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--arm-timeout", type=float, default=300.0, help="seconds per arm")
    p.add_argument("--arms", nargs="*", default=list(ARMS), choices=list(ARMS))
    p.add_argument("--arm", choices=list(ARMS), help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.arm:  # inside one arm's process
        work = Path(args.work)
        try:
            result = ARMS[args.arm](work, args)
        except Exception:
            traceback.print_exc()
            return 1
        (work / f"{args.arm}.json").write_text(json.dumps(result))
        return 0
    work = Path(args.out).resolve()
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    build(work, args.prompts)
    print(f"built the checkpoints and {args.prompts} prompts in {time.perf_counter() - t0:.1f} s")
    results: dict[str, Any] = {}
    for name in args.arms:
        results[name] = run_arm(name, work, args)
        status = results[name].get("error", "ok")
        print(f"arm {name}: {status} ({results[name]['wall_s']:.0f} s)", flush=True)
        if "tail" in results[name]:
            print("\n".join(results[name]["tail"]))
    report = {
        "settings": {
            "prompts": args.prompts,
            "n": args.n,
            "max_tokens": args.max_tokens,
            "max_model_len": MAX_LEN,
            "dtype": "bfloat16",
            **SAMPLING,
        },
        "rollouts": summarize(results, work),
        "rewards": results.get("rewards"),
        "errors": {k: v for k, v in results.items() if "error" in v},
    }
    (work / "gpu.json").write_text(json.dumps(report, indent=1))
    print(json.dumps({k: report[k] for k in ("rollouts", "rewards")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

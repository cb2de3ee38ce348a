"""Math RLVR on TRL's GRPO, with eva's creator evolving the prompt set between rounds.

    pip install -e '.[math]'
    python infra/trl/grpo_math.py --model Qwen/Qwen2.5-0.5B-Instruct --prompts math.jsonl \\
        --rounds 3 --steps-per-round 100 --num-generations 8 --out runs/grpo-math

``--prompts`` is a jsonl file of ``{"prompt": ..., "answer": ...}`` rows. A prompt goes to GRPO as
a user message, which GRPO wraps in the model's chat template, when its tokenizer has one (as
eva's generation does; ``--chat`` requires a template, ``--no-chat`` sends raw text). Each round:

1. GRPO trains ``--steps-per-round`` steps on the current prompt set. The reward is
   ``tasks.backends.reward.math_verify.grpo_reward``: a completion scores 1.0 when its final
   answer (its last ``\\boxed{}``, else what follows "the answer is", else its last number)
   equals the row's answer by math-verify. A prompt with no answer (an evolved child) is
   labelled by the majority vote of its own completions in the batch, or left unscored (None)
   when the vote is too weak.
2. The creator reads GRPO's own rewards (recorded by the reward wrapper below): a prompt's
   informativeness is max - mean of its rewards (eva's online metric), a weighted subset of
   the informative prompts is drawn, and a rewriter (``--evolver``) writes children of them.
3. The next set is 80% children and 20% prompts of this round's set (``eva_core.mixing``).
   Children enter without answers: they are labelled by majority vote in the next round.

Per round it prints the mean reward, the share of prompt groups with a learning signal (not
every completion scored the same) and how many children got a label or were dropped, and it
appends the same to ``OUT/rounds.jsonl``; each round's prompt set is ``OUT/round_K/prompts.jsonl``,
and the final policy is saved to ``OUT/model``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from eva_core.evolution import evolved_records
from eva_core.informativeness import informativeness
from eva_core.mixing import mix_prompt_sets
from eva_core.sampling import select_subset, subset_size
from eva_core.schema import seed_records
from eva_runtime.errors import ConfigError
from tasks.backends.python import resolve
from tasks.backends.reward.math_verify import VOTE_THRESHOLD, grpo_reward
from tasks.backends.train.chat import ChatTemplate, use_template, user_turn

# ---------------------------------------------------------------------------------------------
# The default rewriter: a placeholder. A real run names an LLM rewriter with --evolver (a
# function from a list of prompts to each one's children); this one only changes numbers, so
# that the loop runs end to end with nothing to download. Its children's answers change with
# the numbers and are unknown to it, exactly as an LLM rewriter's would be.


def change_a_number(prompts: Sequence[str], children: int = 4) -> list[list[str]]:
    """Per prompt, up to ``children`` copies with one of its integers changed."""
    out: list[list[str]] = []
    for text in prompts:
        numbers = list(re.finditer(r"\d+", text))
        kids: list[str] = []
        for j in range(children if numbers else 0):
            m = numbers[-1 - j % len(numbers)]  # the last number first: usually the question's
            new = str(int(m.group()) + j + 1)
            kids.append(text[: m.start()] + new + text[m.end() :])
        out.append(kids)
    return out


# ---------------------------------------------------------------------------------------------
# The reward wrapper: it scores with grpo_reward and keeps every reward under its prompt, which
# is all the creator needs after the round (no second generation pass to score the prompts).


class RecordedReward:
    """``grpo_reward``, recording each prompt's rewards (None as NaN) and each group's signal."""

    __name__ = "math_verify"  # TRL names the reward in its logs after this

    def __init__(self, vote_threshold: float):
        self.vote_threshold = vote_threshold
        self.rewards: dict[str, list[float]] = {}
        self.groups = 0
        self.groups_with_signal = 0

    def __call__(
        self, prompts: list[Any], completions: list[Any], answer: list[Any], **kwargs: Any
    ) -> list[float | None]:
        out = grpo_reward(prompts, completions, answer, vote_threshold=self.vote_threshold)
        batch: dict[str, list[float]] = {}
        for p, r in zip(prompts, out, strict=True):
            batch.setdefault(prompt_text(p), []).append(math.nan if r is None else r)
        for text, rs in batch.items():
            self.rewards.setdefault(text, []).extend(rs)
            finite = [r for r in rs if not math.isnan(r)]
            self.groups += 1
            # GRPO's advantage is reward minus the group's mean: equal rewards teach nothing.
            self.groups_with_signal += len(set(finite)) > 1
        return out


def prompt_text(prompt: Any) -> str:
    """A dataset prompt as text: plain, or the user message of a conversation."""
    return prompt if isinstance(prompt, str) else str(prompt[-1]["content"])


def reward_rows(recorded: dict[str, list[float]], prompts: Sequence[str]) -> np.ndarray:
    """A (prompts, max samples) reward matrix, NaN-padded; a prompt never drawn is all NaN."""
    width = max((len(recorded.get(p, [])) for p in prompts), default=0)
    out = np.full((len(prompts), max(width, 1)), np.nan)
    for i, p in enumerate(prompts):
        rs = recorded.get(p, [])
        out[i, : len(rs)] = rs
    return out


def read_prompts(path: str) -> tuple[list[str], list[str | None]]:
    """Prompts and their answers (None where a row has none); ValueError naming the line."""
    try:
        with open(path) as f:
            lines = [(n, line) for n, line in enumerate(f, 1) if line.strip()]
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    prompts: list[str] = []
    answers: list[str | None] = []
    for n, line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}, line {n}: not JSON ({exc.msg})") from None
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
            keys = sorted(row) if isinstance(row, dict) else type(row).__name__
            raise ValueError(f"{path}, line {n}: no text 'prompt' field (it has {keys})")
        prompts.append(row["prompt"])
        answers.append(None if row.get("answer") is None else str(row["answer"]))
    if not prompts:
        raise ValueError(f"{path} holds no prompts")
    return prompts, answers


def write_prompts(path: str, table: pa.Table, answers: dict[str, str | None]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        for row in table.select(["prompt_id", "prompt", "source", "parent_id"]).to_pylist():
            f.write(json.dumps({**row, "answer": answers.get(row["prompt_id"])}) + "\n")


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="policy: a Hub id or a local folder")
    ap.add_argument("--prompts", required=True, help="jsonl of {prompt, answer}")
    ap.add_argument("--out", required=True, help="folder for rounds.jsonl, prompt sets, model")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps-per-round", type=int, default=100)
    ap.add_argument("--num-generations", type=int, default=8, help="completions per prompt")
    ap.add_argument("--prompts-per-step", type=int, default=4)
    ap.add_argument("--max-completion-length", type=int, default=512)
    ap.add_argument("--learning-rate", type=float, default=1e-6)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument(
        "--chat",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="send prompts as user messages, in the model's chat template (default: when its "
        "tokenizer has one, as eva's generation does; --no-chat: raw text)",
    )
    ap.add_argument("--sample-fraction", type=float, default=0.25, help="share of prompts evolved")
    ap.add_argument("--ratio-evolved", type=float, default=0.8, help="children's share of a set")
    ap.add_argument("--vote-threshold", type=float, default=VOTE_THRESHOLD)
    ap.add_argument("--evolver", default=None, help="package.module:function, prompts -> children")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    # Everything checked before a round trains: a bad value found after one would lose it.
    for problem in _argument_problems(args):
        ap.error(problem)
    try:
        evolve: Callable[[list[str]], Sequence[Any]] = (
            resolve(args.evolver, "function") if args.evolver else change_a_number
        )
    except ValueError as exc:
        ap.error(f"--evolver: {exc}")
    if not callable(evolve):
        ap.error(f"--evolver: {args.evolver} is not a function")
    try:
        texts, given = read_prompts(args.prompts)
        current = seed_records(texts)  # ids, lineage: eva's prompt records
    except ValueError as exc:  # one line, naming the file and the row
        ap.error(f"--prompts: {exc}")
    answers: dict[str, str | None] = dict(zip(current["prompt_id"].to_pylist(), given, strict=True))
    gpu = torch.cuda.is_available()
    try:
        model = AutoModelForCausalLM.from_pretrained(
            args.model, dtype=torch.bfloat16 if gpu else torch.float32
        )
        tokenizer = AutoTokenizer.from_pretrained(args.model)
    except (OSError, ValueError) as exc:  # not found, offline, not a causal LM
        ap.error(f"--model {args.model}: {str(exc).splitlines()[0]}")
    # GRPO templates conversational prompts itself; plain text would train a chat model on
    # questions laid out as it is never asked them.
    setting: ChatTemplate = "auto" if args.chat is None else "always" if args.chat else "never"
    try:
        chat = use_template(tokenizer, setting, args.model)
    except ConfigError as exc:  # its field is a run config's key; here the option is --chat
        ap.error(f"--chat: {exc.message}")
    os.makedirs(args.out, exist_ok=True)
    open(os.path.join(args.out, "rounds.jsonl"), "w").close()  # this run's rounds only
    log: list[dict[str, Any]] = []

    for k in range(1, args.rounds + 1):
        # --- solver: GRPO on the current set. A new trainer each round (its optimizer state
        # restarts), over the same model object, so training carries over.
        ids, prompts = current["prompt_id"].to_pylist(), current["prompt"].to_pylist()
        write_prompts(os.path.join(args.out, f"round_{k}", "prompts.jsonl"), current, answers)
        dataset = Dataset.from_dict(
            {
                "prompt": [user_turn(p) for p in prompts] if chat else prompts,
                "answer": [answers.get(i) or "" for i in ids],  # "" = none: majority vote
            }
        )
        config = GRPOConfig(
            output_dir=os.path.join(args.out, f"round_{k}", "trainer"),
            max_steps=args.steps_per_round,
            per_device_train_batch_size=args.prompts_per_step * args.num_generations,
            steps_per_generation=1,  # one reward call sees every prompt's whole group
            num_generations=args.num_generations,
            max_completion_length=args.max_completion_length,
            learning_rate=args.learning_rate,
            temperature=args.temperature,
            use_cpu=not gpu,
            bf16=gpu,
            seed=args.seed + k,
            logging_steps=max(1, args.steps_per_round // 10),
            report_to=[],
            save_strategy="no",
            disable_tqdm=True,
        )
        reward = RecordedReward(args.vote_threshold)
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=[reward],
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
        )
        trainer.train()
        # Saved before the creator runs: a rewriter that fails next loses no training.
        trainer.save_model(os.path.join(args.out, "model"))
        tokenizer.save_pretrained(os.path.join(args.out, "model"))

        # --- what the round did: rewards, signal, and the fate of last round's children
        # (a child is labelled when a majority vote scored it at least once this round).
        matrix = reward_rows(reward.rewards, prompts)
        # Rewards against a known answer and against a majority label are different things:
        # a child's label can be the policy's own wrong answer, so they are reported apart.
        known = np.array([bool(answers.get(i)) for i in ids])
        children = [p for i, p in zip(ids, prompts, strict=True) if not answers.get(i)]
        labelled = sum(any(not math.isnan(r) for r in reward.rewards.get(p, [])) for p in children)
        drawn = sum(p in reward.rewards for p in children)
        stats: dict[str, Any] = {
            "round": k,
            "prompts": len(prompts),
            "reward_mean_known": _nanmean(matrix[known]),
            "reward_mean_voted": _nanmean(matrix[~known]),
            "signal_share": reward.groups_with_signal / reward.groups if reward.groups else 0.0,
            "groups": reward.groups,
            "children": len(children),
            "children_labelled": labelled,
            "children_dropped": drawn - labelled,  # drawn, but no vote reached the threshold
            "children_not_drawn": len(children) - drawn,
        }

        # --- creator: informative prompts -> weighted subset -> children -> 80/20 mix.
        if k < args.rounds:
            # max - mean of GRPO's own rewards; prompts never drawn or never scored are NaN,
            # which the sampler treats as weight 0, so only prompts GRPO saw are candidates.
            scored = np.flatnonzero(np.isfinite(matrix).any(axis=1))
            weights = informativeness(matrix[scored], "a_avg")
            n = subset_size(len(scored), args.sample_fraction) if len(scored) else 0
            pick = scored[select_subset(weights, n, "weighted", args.seed + k).indices]
            parents = current.take(pa.array(pick, pa.int64()))
            try:
                candidates = _children(evolve, parents["prompt"].to_pylist())
            except ValueError as exc:
                raise SystemExit(
                    f"grpo_math: --evolver {args.evolver or 'change_a_number'}: {exc} (round "
                    f"{k}'s policy is saved in {os.path.join(args.out, 'model')})"
                ) from None
            evolved, evolve_stats = evolved_records(
                parents, candidates, iteration=k, exclude_ids=set(ids)
            )
            current, mix = mix_prompt_sets(current, evolved, args.ratio_evolved, args.seed + k)
            stats |= {
                "parents": len(pick),
                "informativeness_mean": float(np.nanmean(weights)) if len(scored) else None,
                "evolved": evolve_stats.kept,
                "next_evolved": mix.evolved,
                "next_original": mix.original,
            }

        log.append(stats)
        with open(os.path.join(args.out, "rounds.jsonl"), "a") as f:
            f.write(json.dumps(stats) + "\n")
        known_mean, voted_mean = (
            "n/a" if stats[key] is None else f"{stats[key]:.3f}"
            for key in ("reward_mean_known", "reward_mean_voted")
        )
        print(
            f"round {k}: reward mean {known_mean} on known answers, {voted_mean} on majority "
            f"labels, groups with signal {stats['signal_share']:.0%} "
            f"of {reward.groups}, children labelled {labelled} / dropped {drawn - labelled} "
            f"/ not drawn {len(children) - drawn}",
            flush=True,
        )

    return log


def _argument_problems(args: argparse.Namespace) -> list[str]:
    """What is wrong with the arguments, each as argparse's error line would say it."""
    checks = [
        (args.rounds >= 1, "--rounds must be >= 1"),
        (args.steps_per_round >= 1, "--steps-per-round must be >= 1"),
        (args.num_generations >= 2, "--num-generations must be >= 2 (GRPO compares a group)"),
        (args.prompts_per_step >= 1, "--prompts-per-step must be >= 1"),
        (args.max_completion_length >= 1, "--max-completion-length must be >= 1"),
        (args.learning_rate > 0, "--learning-rate must be > 0"),
        (args.temperature > 0, "--temperature must be > 0"),
        (0 < args.sample_fraction <= 1, "--sample-fraction must be in (0, 1]"),
        (0 <= args.ratio_evolved <= 1, "--ratio-evolved must be in [0, 1]"),
        (0 < args.vote_threshold <= 1, "--vote-threshold must be in (0, 1]"),
        (not os.path.isfile(args.out), f"--out {args.out} is a file; give a folder"),
    ]
    return [message for ok, message in checks if not ok]


def _children(evolve: Callable[[list[str]], Sequence[Any]], parents: list[str]) -> list[Any]:
    """The rewriter's children of each parent as ``(text, method)`` candidates; a ValueError
    in one line when it raises or returns something else than one list (or string) per
    parent."""
    try:
        kids = evolve(parents)
    except Exception as exc:
        raise ValueError(
            f"raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        ) from None
    if isinstance(kids, str | bytes) or not isinstance(kids, Sequence) or len(kids) != len(parents):
        raise ValueError(
            f"returned {type(kids).__name__}; expected one list of children per parent "
            f"({len(parents)})"
        )
    out = []
    for i, cs in enumerate(kids):
        texts = [cs] if isinstance(cs, str) else cs
        if not isinstance(texts, Sequence) or not all(isinstance(c, str) for c in texts):
            raise ValueError(f"parent {i}: children {cs!r:.60} are not strings")
        out.append([(c, "evolver") for c in texts])
    return out


def _nanmean(x: np.ndarray) -> float | None:
    return float(np.nanmean(x)) if np.isfinite(x).any() else None


if __name__ == "__main__":
    main()

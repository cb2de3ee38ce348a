"""Math RLVR on TRL's GRPO with eva's creator as the prompt source: online eva, on the one TRL
bridge (``eva_adapters.trl.CreatorFeed``) that ``eva online`` runs on too.

    pip install -e '.[math]'
    python infra/trl/grpo_math.py --model Qwen/Qwen2.5-0.5B-Instruct --prompts math.jsonl \\
        --steps 300 --num-generations 8 --prompts-per-step 4 --out runs/grpo-math \\
        [--save-steps 50] [--resume]

``--prompts`` is a jsonl file of ``{"prompt": ..., "answer": ...}`` rows, the seed set D. A
prompt goes to GRPO as a user message, which GRPO wraps in the model's chat template, when its
tokenizer has one (as eva's generation does; ``--chat`` requires a template, ``--no-chat`` sends
raw text). Every step:

1. The creator draws ``--prompts-per-step`` prompts: seeds while its buffer B of evolved prompts
   fills (warm-up), then ``--ratio-evolved`` of each batch from B by priority (mix-up).
2. GRPO samples ``--num-generations`` completions of each and trains. The reward is
   ``tasks.backends.reward.math_verify.grpo_reward``: a completion scores 1.0 when its final
   answer (its last ``\\boxed{}``, else what follows "the answer is", else its last number)
   equals the row's answer by math-verify. A prompt with no answer (an evolved child: a
   rewritten question has its own answer) is labelled by the majority vote of its own
   completions, or left unscored (None) when the vote is too weak.
3. At the step's end the creator reads GRPO's own rewards: each prompt's informativeness is max
   - mean of its rewards, the top ``--top-fraction`` are rewritten by ``--evolver`` (a function
   from a list of prompts to each one's children) and their children join B.

Each step appends a line to ``OUT/steps.jsonl``: the mean reward on known answers and on
majority labels, the share of groups with a learning signal, how many children were trained
and how many got no label, the parents and children the creator added; the final policy is
saved to ``OUT/model``. With ``--save-steps`` the trainer checkpoints into ``OUT/trainer`` (the
creator's state inside each checkpoint), and ``--resume`` continues from the last one exactly
as an uninterrupted run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
from collections.abc import Callable, Sequence
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.trainer_utils import get_last_checkpoint
from trl import GRPOConfig, GRPOTrainer

from eva_adapters.trl import CreatorFeed, Draw
from eva_core.creator import Creator, Observation
from eva_core.creator_records import as_records
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


class EvolverFailed(Exception):
    """The --evolver raised or answered something else than children per prompt (one line)."""


class Rewriter:
    """An --evolver (prompts -> each one's children, a list or one string) as the creator's
    ``rewriter(parents, n, seed)``: the first ``n`` children of each parent are kept."""

    def __init__(self, evolve: Callable[[list[str]], Sequence[Any]]):
        self.evolve = evolve

    def __call__(self, parents: list[dict[str, Any]], n: int, seed: int) -> list[list[str]]:
        try:
            kids = self.evolve([p["prompt"] for p in parents])
        except Exception as exc:
            first = str(exc).splitlines()[0] if str(exc) else ""
            raise EvolverFailed(f"raised {type(exc).__name__}: {first}") from None
        if (
            isinstance(kids, str | bytes)
            or not isinstance(kids, Sequence)
            or len(kids) != len(parents)
        ):
            raise EvolverFailed(
                f"returned {type(kids).__name__}; expected one list of children per parent "
                f"({len(parents)})"
            )
        out = []
        for i, cs in enumerate(kids):
            texts = [cs] if isinstance(cs, str) else cs
            if not isinstance(texts, Sequence) or not all(isinstance(c, str) for c in texts):
                raise EvolverFailed(f"parent {i}: children {cs!r:.60} are not strings")
            out.append(list(texts)[:n])
        return out


# ---------------------------------------------------------------------------------------------
# The reward GRPO trains on (the bridge records it for the creator) and what each step did.


def math_reward(vote_threshold: float) -> Callable[..., list[float | None]]:
    """``grpo_reward`` as TRL calls it: each row's ``answer`` column, a child's None a vote."""

    def math_verify(prompts: list[Any], completions: list[Any], answer: list[Any], **_: Any):
        return grpo_reward(prompts, completions, answer, vote_threshold=vote_threshold)

    return math_verify


class StepLog:
    """The bridge's ``on_observed``: one line per trained batch in ``path`` (and ``rows``)."""

    def __init__(self, path: str, creator: Creator):
        self.path, self.creator = path, creator
        self.rows: list[dict[str, Any]] = []

    def __call__(self, draw: Draw, rewards: list[list[float]], seen: Observation) -> None:
        known = [r for rec, rs in zip(draw.records, rewards, strict=True) if rec.get("answer")
                 for r in rs]  # fmt: skip
        voted = [r for rec, rs in zip(draw.records, rewards, strict=True) if not rec.get("answer")
                 for r in rs]  # fmt: skip
        # GRPO's advantage is reward minus the group's mean: equal rewards teach nothing.
        signal = [len({r for r in rs if not math.isnan(r)}) > 1 for rs in rewards]
        children = [rs for rec, rs in zip(draw.records, rewards, strict=True) if rec["depth"]]
        row = {
            "step": draw.index,
            "phase": draw.phase,
            "prompts": len(draw.records),
            "reward_mean_known": _mean(known),
            "reward_mean_voted": _mean(voted),
            "signal_share": sum(signal) / len(signal),
            "children_trained": len(children),
            "children_unlabelled": sum(all(math.isnan(r) for r in rs) for rs in children),
            "parents": len(seen.parents),
            "children_joined": seen.joined,
            "buffer": len(self.creator.buffer.entries),
        }
        self.rows.append(row)
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")


def _mean(values: list[float]) -> float | None:
    finite = [v for v in values if not math.isnan(v)]
    return sum(finite) / len(finite) if finite else None


def read_prompts(path: str) -> list[dict[str, Any]]:
    """Seed rows ``{prompt, answer}`` (answer None where a row has none); ValueError naming the
    line."""
    try:
        with open(path) as f:
            lines = [(n, line) for n, line in enumerate(f, 1) if line.strip()]
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    rows: list[dict[str, Any]] = []
    for n, line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}, line {n}: not JSON ({exc.msg})") from None
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
            keys = sorted(row) if isinstance(row, dict) else type(row).__name__
            raise ValueError(f"{path}, line {n}: no text 'prompt' field (it has {keys})")
        answer = None if row.get("answer") is None else str(row["answer"])
        rows.append({"prompt": row["prompt"], "answer": answer})
    if not rows:
        raise ValueError(f"{path} holds no prompts")
    return rows


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="policy: a Hub id or a local folder")
    ap.add_argument("--prompts", required=True, help="jsonl of {prompt, answer}: the seeds")
    ap.add_argument("--out", required=True, help="folder for steps.jsonl, checkpoints, model")
    ap.add_argument("--steps", type=int, default=300, help="optimizer steps")
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
    ap.add_argument("--buffer-size", type=int, default=64, help="|B|, the evolved prompts kept")
    ap.add_argument("--ratio-evolved", type=float, default=0.5, help="B's share of a batch")
    ap.add_argument("--top-fraction", type=float, default=0.5, help="share of a batch evolved")
    ap.add_argument("--children", type=int, default=4, help="children per evolved prompt")
    ap.add_argument("--vote-threshold", type=float, default=VOTE_THRESHOLD)
    ap.add_argument("--evolver", default=None, help="package.module:function, prompts -> children")
    ap.add_argument("--save-steps", type=int, default=0, help="checkpoint every N steps (0: none)")
    ap.add_argument("--resume", action="store_true", help="continue from OUT/trainer's last")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    # Everything checked before a step trains: a bad value found after one would lose it.
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
        seeds = read_prompts(args.prompts)
        as_records(seeds)  # a prompt repeated after normalization is refused, naming its row
    except ValueError as exc:  # one line, naming the file and the row
        ap.error(f"--prompts: {exc}")
    creator = Creator(
        seeds, rewriter=Rewriter(evolve), size=args.buffer_size, n_new=args.children,
        ratio_evol=args.ratio_evolved, top_fraction=args.top_fraction, seed=args.seed,
    )  # fmt: skip
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
    trainer_dir = os.path.join(args.out, "trainer")
    resume = (
        get_last_checkpoint(trainer_dir) if args.resume and os.path.isdir(trainer_dir) else None
    )
    if args.resume and resume is None:
        ap.error(f"--resume: no checkpoint in {trainer_dir}")
    os.makedirs(args.out, exist_ok=True)
    steps_path = os.path.join(args.out, "steps.jsonl")
    if resume is None:
        open(steps_path, "w").close()  # this run's steps only
    log = StepLog(steps_path, creator)
    feed = CreatorFeed(
        creator, columns=["answer"], on_observed=log,
        prompt=(lambda r: user_turn(r["prompt"])) if chat else None,
    )  # fmt: skip
    config = GRPOConfig(
        output_dir=trainer_dir,
        max_steps=args.steps,
        per_device_train_batch_size=args.prompts_per_step * args.num_generations,
        num_generations=args.num_generations,
        max_completion_length=args.max_completion_length,
        learning_rate=args.learning_rate,
        temperature=args.temperature,
        use_cpu=not gpu,
        bf16=gpu,
        seed=args.seed,
        logging_steps=max(1, args.steps // 10),
        report_to=[],
        save_strategy="steps" if args.save_steps else "no",
        save_steps=args.save_steps or 500,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[feed.recording(math_reward(args.vote_threshold))],
        args=config,
        train_dataset=feed.dataset(),
        processing_class=tokenizer,
        callbacks=[feed.callback()],
    )
    try:
        trainer.train(resume_from_checkpoint=resume)
    except EvolverFailed as exc:
        # The policy so far is saved before the run ends: a rewriter that fails loses no training.
        trainer.save_model(os.path.join(args.out, "model"))
        raise SystemExit(
            f"grpo_math: --evolver {args.evolver or 'change_a_number'}: {exc} (step "
            f"{trainer.state.global_step}'s policy is saved in {os.path.join(args.out, 'model')})"
        ) from None
    trainer.save_model(os.path.join(args.out, "model"))
    tokenizer.save_pretrained(os.path.join(args.out, "model"))
    _summary(log.rows, creator)
    return log.rows


def _summary(rows: list[dict[str, Any]], creator: Creator) -> None:
    known = [r["reward_mean_known"] for r in rows if r["reward_mean_known"] is not None]
    voted = [r["reward_mean_voted"] for r in rows if r["reward_mean_voted"] is not None]
    mean = {
        k: "n/a" if not v else f"{sum(v) / len(v):.3f}" for k, v in (("k", known), ("v", voted))
    }
    signal = sum(r["signal_share"] for r in rows) / len(rows) if rows else 0.0
    print(
        f"{len(rows)} steps: reward mean {mean['k']} on known answers, {mean['v']} on majority "
        f"labels, groups with signal {signal:.0%}; children trained "
        f"{sum(r['children_trained'] for r in rows)}, added {creator.stats.children}, buffer "
        f"{len(creator.buffer.entries)} ({creator.buffer.phase})",
        flush=True,
    )


def _argument_problems(args: argparse.Namespace) -> list[str]:
    """What is wrong with the arguments, each as argparse's error line would say it."""
    checks = [
        (args.steps >= 1, "--steps must be >= 1"),
        (args.num_generations >= 2, "--num-generations must be >= 2 (GRPO compares a group)"),
        (args.prompts_per_step >= 1, "--prompts-per-step must be >= 1"),
        (args.max_completion_length >= 1, "--max-completion-length must be >= 1"),
        (args.learning_rate > 0, "--learning-rate must be > 0"),
        (args.temperature > 0, "--temperature must be > 0"),
        (args.buffer_size >= 1, "--buffer-size must be >= 1"),
        (0 <= args.ratio_evolved <= 1, "--ratio-evolved must be in [0, 1]"),
        (0 < args.top_fraction <= 1, "--top-fraction must be in (0, 1]"),
        (args.children >= 1, "--children must be >= 1"),
        (0 < args.vote_threshold <= 1, "--vote-threshold must be in (0, 1]"),
        (args.save_steps >= 0, "--save-steps must be >= 0"),
        (not os.path.isfile(args.out), f"--out {args.out} is a file; give a folder"),
    ]
    return [message for ok, message in checks if not ok]


if __name__ == "__main__":
    main()

"""Stage ``judge``: a checkpoint's win rate against reference answers, judged by an LLM, as the
paper reports its results (Arena-Hard: GPT-4-0314's answers, judged by GPT-4-Turbo).

Each held-out prompt with a reference answer is judged twice, the checkpoint's answer shown
first (as A) and then second (as B), on Arena-Hard's five-label scale; the prompt's score is the
mean of the two games' (a win 1, a tie 0.5, a loss 0: ``eva_core.verdicts``), so a judge that
prefers a position cancels out. An answer identical to the reference is a tie and costs no
request. The win rate is the mean score over the judged prompts, with a bootstrap interval over
the prompts (seeded by the run, alike for every checkpoint), for the whole set and for each
category.

What could not be judged is counted, never guessed: unparseable verdicts, failed requests, and
the prompts with no usable verdict in either order (``unjudged``: left out of the win rate).
More than ``max_unjudged_share`` of them fails the stage, as does a judge that is down or
refuses the key (one line naming the endpoint).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from typing import Any

import pyarrow as pa

from eva_core.verdicts import TIE, consistent, count_labels, prompt_score
from eva_core.winrate import bootstrap_interval, mean_score
from tasks.backends.judge.llm import JudgeConfig, Judgment
from tasks.backends.protocols import close_after
from tasks.context import StageContext, StageOutput
from tasks.stage import StageError, stage

UI_ROWS = 50  # prompts the UI's table shows, with both answers side by side
# Verdicts are Arena-Hard labels (None: unparseable, failed or not asked); a judgment is the
# judge's whole answer. "policy_as_a": the checkpoint's answer was shown first.
SCHEMA = pa.schema([
    ("prompt_id", pa.string()), ("category", pa.string()), ("score", pa.float64()),
    ("verdict_policy_as_a", pa.string()), ("verdict_policy_as_b", pa.string()),
    ("identical", pa.bool_()), ("prompt", pa.string()), ("response", pa.string()),
    ("reference", pa.string()), ("judgment_policy_as_a", pa.string()),
    ("judgment_policy_as_b", pa.string()),
])  # fmt: skip
OUTPUTS = tuple(SCHEMA.names)
NO_JUDGMENT = Judgment(None, None, False)


@stage(
    "judge",
    version=1,
    inputs={
        "evaluated": ("prompt_id", "prompt", "category", "response"),
        "reference": ("prompt_id", "reference"),
    },
    outputs=OUTPUTS,
)
def judge(
    ctx: StageContext, config: JudgeConfig, evaluated: pa.Table, reference: pa.Table
) -> StageOutput:
    known = dict(
        zip(reference.column("prompt_id").to_pylist(), reference.column("reference").to_pylist(),
            strict=True)
    )  # fmt: skip
    rows = evaluated.select(["prompt_id", "prompt", "category", "response"]).to_pylist()
    for row in rows:
        row["reference"] = known.get(row["prompt_id"])
        row["category"] = str(row["category"])
    asked = [r for r in rows if r["reference"] is not None and r["response"] != r["reference"]]
    games = [g for r in asked for g in ((r["prompt"], r["response"], r["reference"]),
                                        (r["prompt"], r["reference"], r["response"]))]  # fmt: skip
    started = time.perf_counter()
    with close_after(config.load()) as judge_llm:
        judgments = judge_llm.compare(games, ctx.progress) if games else []
        counts = judge_llm.stats()
    seconds = time.perf_counter() - started
    by_id = {r["prompt_id"]: (judgments[2 * i], judgments[2 * i + 1]) for i, r in enumerate(asked)}
    for row in rows:
        first, second = by_id.get(row["prompt_id"], (NO_JUDGMENT, NO_JUDGMENT))
        row["identical"] = row["reference"] is not None and row["response"] == row["reference"]
        row["verdict_policy_as_a"], row["verdict_policy_as_b"] = first.label, second.label
        row["judgment_policy_as_a"], row["judgment_policy_as_b"] = first.text, second.text
        row["score"] = 0.5 if row["identical"] else prompt_score(first.label, second.label)

    # The run's seed, not the stage's: every checkpoint is resampled alike, so equal scores
    # get equal intervals and two checkpoints' intervals differ only by what was judged.
    stats = _stats(config, ctx.run.seed, rows, judgments)
    stats |= {"backend_seconds": round(seconds, 3), "backend": counts}
    _check_judged(ctx.artifact, config, stats)
    out = pa.Table.from_pylist([{c: r[c] for c in OUTPUTS} for r in rows], schema=SCHEMA)
    shown = [{c: r[c] for c in OUTPUTS} for r in rows[:UI_ROWS]]
    note = f"first {len(shown)} of {len(rows)} prompts, in held-out order"
    return StageOutput(out, stats=stats, ui_tables={"verdicts": shown},
                       ui_notes={"verdicts": note})  # fmt: skip


def _stats(
    config: JudgeConfig, seed: int, rows: list[dict[str, Any]], judgments: list[Judgment]
) -> dict[str, Any]:
    """The win rate with its interval, overall and per category, and what could not be judged."""
    referenced = [r for r in rows if r["reference"] is not None]
    scores = [r["score"] for r in referenced]
    low, high = bootstrap_interval(scores, config.bootstrap_rounds, config.confidence, seed)
    by_category: dict[str, list[float]] = defaultdict(list)
    for r in referenced:
        by_category[r["category"]].append(r["score"])
    per_category = {c: _category(v, config, seed) for c, v in sorted(by_category.items())}
    agree = [consistent(r["verdict_policy_as_a"], r["verdict_policy_as_b"]) for r in referenced]
    both = [a for a in agree if a is not None]
    labels = [j.label for j in judgments if not j.failed]
    return {
        "win_rate": _number(mean_score(scores)),
        "ci_low": _number(low),
        "ci_high": _number(high),
        "confidence": config.confidence,
        "prompts": len(rows),
        "judged": sum(not math.isnan(s) for s in scores),
        "unjudged": sum(math.isnan(s) for s in scores),
        "no_reference": len(rows) - len(referenced),
        "identical": sum(r["identical"] for r in rows),
        "comparisons": len(judgments),
        "failed": sum(j.failed for j in judgments),
        "unparseable": sum(j.label is None for j in judgments if not j.failed),
        "ties": labels.count(TIE),
        # Share of prompts whose two verdicts name the same winner: low means position bias.
        "consistent": round(sum(both) / len(both), 4) if both else None,
        "verdicts": count_labels(labels),
        "per_category": {c: v[0] for c, v in per_category.items()},
        "per_category_low": {c: v[1] for c, v in per_category.items()},
        "per_category_high": {c: v[2] for c, v in per_category.items()},
        "judge_model": config.llm.model,
    }


def _category(scores: list[float], config: JudgeConfig, seed: int) -> tuple[Any, Any, Any]:
    low, high = bootstrap_interval(scores, config.bootstrap_rounds, config.confidence, seed)
    return _number(mean_score(scores)), _number(low), _number(high)


def _number(value: float) -> float | None:
    """Rounded for the manifest; None for NaN (no number a JSON reader takes)."""
    return None if math.isnan(value) else round(value, 4)


def _check_judged(artifact: str, config: JudgeConfig, stats: dict[str, Any]) -> None:
    """Too few usable verdicts is a broken judge or template, not a result."""
    asked = stats["prompts"] - stats["no_reference"]
    if not asked:
        raise StageError(
            f"{artifact}: no held-out prompt has a reference answer", field="evaluate.judge"
        )
    if stats["unjudged"] > config.max_unjudged_share * asked:
        raise StageError(
            f"{artifact}: {stats['unjudged']} of {asked} prompts got no usable verdict in "
            f"either order ({stats['unparseable']} unparseable verdicts, {stats['failed']} "
            f"failed requests of {stats['comparisons']})",
            field="evaluate.judge.max_unjudged_share",
            hint="the judge must end with one of [[A>>B]], [[A>B]], [[A=B]], [[B>A]], "
            "[[B>>A]]; check its model, system_prompt and max_tokens",
        )

"""Stage ``reference``: the reference answer to each held-out prompt, which the LLM judge
(``tasks.judge``) compares every checkpoint's answer with.

It runs once per run, in setup, and only when ``evaluate.judge`` is set. The answers come from
a column of the held-out file or dataset, a file of the user's, or a model that generates them
(``tasks.backends.judge.reference``); a generated reference is paid for once, and every later
launch reuses the artifact. A prompt the answers do not cover is left out of the table and
counted (``missing``); a reference that covers none of the held-out prompts fails the stage.
"""

from __future__ import annotations

import time
from typing import Any

import pyarrow as pa

from tasks.backends.judge.reference import ColumnReference, FileReference, GeneratedReference
from tasks.backends.protocols import stats_of
from tasks.context import StageContext, StageOutput
from tasks.stage import StageError, stage

COLUMNS = ("prompt_id", "prompt", "category", "reference")
Source = ColumnReference | FileReference | GeneratedReference


def _origin_key(config: Any) -> dict[str, str]:
    """What the source points at: a file's or dataset's bytes, a local checkpoint's."""
    return config.origin_key()


@stage(
    "reference",
    version=1,
    inputs={"heldout": ("prompt_id", "prompt", "category")},
    outputs=COLUMNS,
    extra_key=_origin_key,
)
def reference(ctx: StageContext, config: Source, heldout: pa.Table) -> StageOutput:
    prompts = heldout.column("prompt").to_pylist()
    started = time.perf_counter()
    source = config.load()
    answers = source.answers(prompts, ctx.seed, ctx.progress)
    seconds = time.perf_counter() - started
    have = [i for i, a in enumerate(answers) if a is not None]
    if not have:
        raise StageError(
            f"{ctx.artifact}: no reference answer to any of the {len(prompts)} held-out prompts",
            field="evaluate.judge.reference",
            hint="the answers must be keyed by the held-out prompts' text (spacing and case "
            "ignored)",
        )
    out = heldout.select(["prompt_id", "prompt", "category"]).take(have)
    out = out.append_column("reference", pa.array([answers[i] for i in have], pa.string()))
    counts = stats_of(source)
    stats = {
        "references": len(have),
        "missing": len(prompts) - len(have),
        "source": config.kind,
        "backend_seconds": round(seconds, 3),
        **({"backend": counts} if counts else {}),
    }
    if len(have) < len(prompts):
        ctx.log.warning(
            "%s: %d of %d held-out prompts have no reference answer: the judge leaves them out",
            ctx.artifact, len(prompts) - len(have), len(prompts),
        )  # fmt: skip
    return StageOutput(out, stats=stats, ui_tables={"answers": out.slice(0, 20).to_pylist()})

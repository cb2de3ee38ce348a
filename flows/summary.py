"""The per-iteration summary a run prints and publishes, read back from stage manifests."""

from __future__ import annotations

from typing import Any

from eva_core.winrate import paired_by_id, win_rate
from flows.config import OnlineRunConfig, RunConfig
from flows.judged import COLUMNS as JUDGE_COLUMNS
from flows.judged import judge_columns, judge_lines, judge_markdown, judged
from flows.markdown import md_table
from flows.summary_warnings import (
    CAPS,
    PAIRED_AS,
    SKIPPED,
    TRAINED,
    online_training_of_cut,
    row_key,
    skipped,
    truncation_lines,
    unmoved,
)
from tasks.backends.generate import length_cap
from tasks.store import RunStore

COLUMNS = (
    "iteration",
    "prompts",
    "complexity",
    "mean_informativeness",
    "evolved_kept",
    "pairs",
    "truncated",
    "heldout_score",
    "heldout_solved",
    "heldout_truncated",
    "answers_changed",
    "win_vs_theta_0",
)


Rewards = tuple[list[Any], list[Any]]  # prompt ids and rewards of one evaluate table


def evaluated(store: RunStore, iteration: int | None, column: str) -> Rewards | None:
    """The prompt ids and ``column`` (reward, response) of the checkpoint evaluated at
    ``iteration`` (None: theta_0), or None before it was evaluated."""
    manifest = store.read_manifest(iteration, "evaluate")
    if manifest is None:
        return None
    table = store.read_table(manifest["uri"])
    return table.column("prompt_id").to_pylist(), table.column(column).to_pylist()


def evaluated_rewards(store: RunStore, iteration: int | None) -> Rewards | None:
    return evaluated(store, iteration, "reward")


def answers_changed(store: RunStore, iteration: int, previous: int | None) -> float | None:
    """Share of held-out prompts whose greedy answer at ``iteration`` differs from the previous
    checkpoint's (``previous``; None: theta_0). 0.0 means training left every answer as it
    was: at a small learning rate a run can report a result of a policy that did not move."""
    current, prior = (evaluated(store, it, "response") for it in (iteration, previous))
    if current is None or prior is None:
        return None
    now = dict(zip(*current, strict=True))
    before = dict(zip(*prior, strict=True))
    shared = [i for i in now if i in before]
    if not shared:
        return None
    return round(sum(now[i] != before[i] for i in shared) / len(shared), 4)


def win_vs_theta0(store: RunStore, iteration: int, reference: Rewards | None) -> float | None:
    """Win rate of the checkpoint evaluated at ``iteration`` against theta_0's held-out
    responses (``reference``, read once per summary), judged by the run's evaluation reward
    (ties half); None until both exist."""
    current = evaluated_rewards(store, iteration)
    if reference is None or current is None:
        return None
    rate = win_rate(*paired_by_id(*current, *reference))
    return None if rate != rate else round(rate, 4)  # NaN: no prompt scored on both sides


def iteration_summary(store: RunStore, config: RunConfig) -> list[dict[str, Any]]:
    def stat(it: int | None, stage: str, key: str) -> Any:
        m = store.read_manifest(it, stage)
        return None if m is None else m["stats"].get(key)

    # Only a run that judges reads judge stages: one a judge was dropped from may have some
    # left, of checkpoints since retrained.
    judging = config.evaluate.judge is not None
    caps = {
        "truncated": _cap("generate.backend", config.generate.backend),
        "heldout_truncated": _cap("evaluate.generation", config.evaluate.generation),
        TRAINED: PAIRED_AS[config.pairs.truncated],
    }
    rows = [
        {
            "iteration": "theta_0",
            "prompts": stat(None, "prompts", "prompts"),
            "heldout_score": stat(None, "evaluate", "score"),
            "heldout_solved": stat(None, "evaluate", "solved"),
            "heldout_truncated": stat(None, "evaluate", "truncated_share"),
            CAPS: caps,
            **(judge_columns(store, None) if judging else {}),
        }
    ]
    first = 0 if config.iteration0_dpo else 1
    reference = evaluated_rewards(store, None)
    for t in range(first, config.iterations + 1):
        rows.append({
            "iteration": t,
            "prompts": stat(t, "generate", "prompts"),
            "complexity": stat(t, "complexity", "mean_complexity"),
            "mean_informativeness": stat(t, "score", "mean_informativeness"),
            "evolved_kept": stat(t, "mix", "evolved"),
            "pairs": stat(t, "pairs", "pairs"),
            SKIPPED: skipped(store, t),
            "truncated": stat(t, "generate", "truncated_share"),
            "heldout_score": stat(t, "evaluate", "score"),
            "heldout_solved": stat(t, "evaluate", "solved"),
            "heldout_truncated": stat(t, "evaluate", "truncated_share"),
            CAPS: caps,
            "answers_changed": answers_changed(store, t, t - 1 if t > first else None),
            "win_vs_theta_0": win_vs_theta0(store, t, reference),
            **(judge_columns(store, t) if judging else {}),
        })  # fmt: skip
    return rows


ONLINE_COLUMNS = (
    "segment",
    "steps",
    "phase",
    "budget",
    "buffer",
    "mean_reward",
    "mean_informativeness",
    "children",
    "truncated",
    "heldout_score",
    "heldout_solved",
    "heldout_truncated",
    "answers_changed",
    "win_vs_theta_0",
)


def _cap(field: str, backend: Any) -> str:
    name, value = length_cap(backend)
    return f"{field}.{name} ({value})"


def online_summary(store: RunStore, config: OnlineRunConfig, segments: int) -> list[dict[str, Any]]:
    """One row per finished segment of an online run (and theta_0), ``segments`` at most; with
    the judge's columns when the run has a judge."""
    judging = config.evaluate.judge is not None
    cap = getattr(config.online.solver, "max_completion_length", None)  # a solver of yours: its own
    caps = {
        "truncated": f"online.solver.max_completion_length ({cap})" if cap else "the solver's cap",
        "heldout_truncated": _cap("evaluate.generation", config.evaluate.generation),
        TRAINED: online_training_of_cut(config.online.solver),
    }

    def stats(it: int | None, stage: str) -> dict[str, Any]:
        m = store.read_manifest(it, stage)
        return {} if m is None else m["stats"]

    theta0 = stats(None, "evaluate")
    reference = evaluated_rewards(store, None)
    rows = [{"segment": "theta_0", "heldout_score": theta0.get("score"),
             "heldout_solved": theta0.get("solved"),
             "heldout_truncated": theta0.get("truncated_share"), CAPS: caps,
             **(judge_columns(store, None) if judging else {})}]  # fmt: skip
    for s in range(1, segments + 1):
        seg, ev = stats(s, "online"), stats(s, "evaluate")
        if not seg:
            break
        rows.append({
            "segment": s,
            "steps": seg.get("trained_steps"),
            "phase": seg.get("phase"),
            "budget": seg.get("budget"),
            "buffer": seg.get("buffer", {}).get("size"),
            "mean_reward": seg.get("mean_reward"),
            "mean_informativeness": seg.get("mean_informativeness"),
            "children": seg.get("children_added"),
            "truncated": seg.get("truncated_share"),
            "heldout_score": ev.get("score"),
            "heldout_solved": ev.get("solved"),
            "heldout_truncated": ev.get("truncated_share"),
            CAPS: caps,
            "answers_changed": answers_changed(store, s, s - 1 if s > 1 else None),
            "win_vs_theta_0": win_vs_theta0(store, s, reference),
            **(judge_columns(store, s) if judging else {}),
        })  # fmt: skip
    return rows


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, list | tuple):  # an interval
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def _columns(rows: list[dict[str, Any]]) -> tuple[str, ...]:
    columns = ONLINE_COLUMNS if row_key(rows) == "segment" else COLUMNS
    return (*columns, *JUDGE_COLUMNS) if judged(rows) else columns


def summary_table(rows: list[dict[str, Any]]) -> str:
    """A plain-text table for the terminal (an offline or an online run's rows), followed by a
    line for each checkpoint that did not move (``unmoved``)."""
    columns = _columns(rows)
    cells = [list(columns)] + [[_fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    table = "\n".join(
        "  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells
    )
    lines = [*unmoved(rows), *truncation_lines(rows)]
    return "\n".join([table, *lines, *judge_lines(rows, columns[0])])


HELDOUT_COLUMNS = (
    "heldout_score", "heldout_solved", "heldout_truncated", "answers_changed", "win_vs_theta_0",
)  # fmt: skip


def summary_markdown(run: str, rows: list[dict[str, Any]], title: str = "eva run") -> str:
    """The summary as two markdown tables, each led by the iteration (or segment) column: the
    held-out results, then what each iteration (segment) did. One table of every column lost
    its right-hand ones (``win_vs_theta_0``) on a 1400-1600 px screen."""
    columns = _columns(rows)
    key = columns[0]
    heldout = (key, *HELDOUT_COLUMNS, *(JUDGE_COLUMNS if judged(rows) else ()))
    work = tuple(c for c in columns if c not in heldout[1:])
    what = "segment" if key == "segment" else "iteration"
    done = [r for r in rows if any(r.get(c) is not None for c in work[1:])]
    return (
        f"## {title} `{run}`\n\n### Held-out, per checkpoint\n\n{_markdown_table(rows, heldout)}"
        + (f"\n### What each {what} did\n\n{_markdown_table(done, work)}")
        + judge_markdown(rows, key)
    )


def _markdown_table(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> str:
    return "\n".join(md_table(columns, ([_fmt(r.get(c)) for c in columns] for r in rows))) + "\n"

"""The summary's warning lines: checkpoints that did not move, an iteration with no pair to
train on, and answers cut at the length cap, each with what the run itself did about it."""

from __future__ import annotations

import itertools
from typing import Any

from tasks.generate import TRUNCATED_WARNING_SHARE
from tasks.store import RunStore

# Under this key a row names the length cap behind each of its truncated shares, for the
# warning line (not a column).
CAPS = "length_caps"
# Under this key the caps say what training does with a cut sample, for the warning line.
TRAINED = "trained"
# Offline, by pairs.truncated.
PAIRED_AS = {
    "reject_only": "they are never trained as the chosen side",
    "exclude": "they are kept out of pairs",
    "allow": "they are paired by reward alone, as the chosen side too (pairs.truncated: allow)",
}


def online_training_of_cut(solver: Any) -> str | None:
    """What an online solver's training does with a cut completion (None: a solver of yours)."""
    kind = getattr(solver, "kind", None)
    if kind in ("rloo", "grpo"):
        if solver.mask_truncated_completions:
            return "they train nothing (online.solver.mask_truncated_completions)"
        return "they train as finished ones (online.solver.mask_truncated_completions: false)"
    if kind == "online_dpo":
        penalty = solver.missing_eos_penalty
        if penalty == "auto":
            return (
                "a finished one is always chosen over a cut one, but a pair of two cut ones "
                "still trains, as online DPO cannot mask it"
            )
        if penalty is None:
            return "they are chosen by reward alone (online.solver.missing_eos_penalty: null)"
        return f"their reward is lowered by online.solver.missing_eos_penalty ({penalty:g})"
    return None


# Under this key a row holds why its prompts gave no pair, by reason (not a column).
SKIPPED = "pairs_skipped"
# The pairs stage's reasons, as the warning says them.
WHY_SKIPPED = {
    "skipped_truncated": "with no finished answer to choose (pairs.truncated)",
    "skipped_tied": "tied",
    "skipped_unscored": "unscored",
    "skipped_low_chosen": "with their best below pairs.min_chosen_reward",
}


def skipped(store: RunStore, iteration: int) -> dict[str, int]:
    """How many prompts of ``iteration`` gave no pair, by the pairs stage's reasons."""
    manifest = store.read_manifest(iteration, "pairs")
    stats = {} if manifest is None else manifest["stats"]
    return {why: int(stats[key]) for key, why in WHY_SKIPPED.items() if stats.get(key)}


def row_key(rows: list[dict[str, Any]]) -> str:
    """The rows' first column: an online run's segments, or an offline run's iterations."""
    return "segment" if rows and "segment" in rows[0] else "iteration"


def truncation_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One warning for the solver's samples and one for the held-out answers, where more than
    ``TRUNCATED_WARNING_SHARE`` of some checkpoint's were cut at the length cap: their shares,
    which checkpoints, and the cap (the field that sets it and its value)."""
    key = row_key(rows)
    lines = []
    for column, what in (("truncated", "samples"), ("heldout_truncated", "held-out answers")):
        over = [
            (row[key], row[column])
            for row in rows
            if isinstance(row.get(column), float) and row[column] > TRUNCATED_WARNING_SHARE
        ]
        if not over:
            continue
        caps = [row[CAPS][column] for row in rows if row.get(CAPS, {}).get(column)]
        low, high = min(s for _, s in over), max(s for _, s in over)
        shares = f"{low:.0%}" if low == high else f"{low:.0%}-{high:.0%}"
        where = f"{key}{'s' if len(over) > 1 else ''} " + ", ".join(str(k) for k, _ in over)
        # What training does with them, for the samples it trains on (the run's own rule).
        trained = [row[CAPS][TRAINED] for row in rows if row.get(CAPS, {}).get(TRAINED)]
        note = f"; {trained[0]}" if column == "truncated" and trained else ""
        lines.append(
            f"warning: {shares} of the {what} of {where} were cut at "
            f"{caps[0] if caps else 'the length cap'} before the policy ended them: raise it "
            f"(cut answers score as unfinished{note})"
        )
    return lines


def unmoved(rows: list[dict[str, Any]]) -> list[str]:
    """A warning per trained checkpoint that answers every held-out prompt exactly as the one
    before it did: its scores are the previous checkpoint's, not a result of training."""
    key = row_key(rows)
    lr = "online.solver.learning_rate" if key == "segment" else "train.solver.learning_rate"
    lines = []
    for previous, row in itertools.pairwise(rows):
        if row.get("pairs") == 0:  # nothing was trained: the learning rate is not the cause
            why = ", ".join(f"{n} {reason}" for reason, n in row.get(SKIPPED, {}).items())
            lines.append(
                f"warning: {key} {row[key]} had no preference pair to train on (of its "
                f"{row.get('prompts')} prompts: {why or 'none skipped'}), so its policy is "
                f"{previous[key]}'s (eva show --iteration {row[key]} --stage pairs)"
            )
        elif row.get("answers_changed") == 0.0:
            lines.append(
                f"warning: {key} {row[key]} gives every held-out prompt the same greedy answer "
                f"as {previous[key]}: training did not move the policy (raise {lr} or train "
                "longer; the training loss says how far it got)"
            )
    return lines

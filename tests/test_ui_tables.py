"""Tables as the Prefect UI shows them: what identifies a row comes before the wide text, and the
summary splits so that its held-out columns are never the ones cut off on the right."""

from __future__ import annotations

import os

from eva_runtime.prefect_ui import narrow_first
from flows.summary import summary_markdown


def test_wide_columns_go_last_in_their_order() -> None:
    # The sample stage's drawn table, as it builds it: the prompt comes second.
    prompt = "What is 12 + 7? Answer with the number only, please."
    rows = [
        {"draw_rank": 0, "prompt": prompt, "informativeness": 0.5, "weight_share": 0.1,
         "category": "add", "prompt_id": "a" * 16, "parent_id": None, "root_id": "a" * 16,
         "depth": 0, "iteration": 0},
        {"draw_rank": 1, "prompt": "short", "informativeness": 0.25, "weight_share": 0.05,
         "category": "add", "prompt_id": "b" * 16, "parent_id": "a" * 16, "root_id": "a" * 16,
         "depth": 1, "iteration": 1, "responses": ["x" * 30]},
    ]  # fmt: skip
    ordered = narrow_first(rows)
    assert list(ordered[0]) == ["draw_rank", "informativeness", "weight_share", "category",
                                "prompt_id", "parent_id", "root_id", "depth", "iteration",
                                "prompt"]  # fmt: skip
    assert list(ordered[1])[-2:] == ["prompt", "responses"]  # a column one row lacks stays out
    assert ordered[1]["responses"] == ["x" * 30] and ordered[0]["prompt"] == prompt


def test_online_summary_splits_into_heldout_and_training_tables() -> None:
    rows = [
        {"segment": "theta_0", "heldout_score": 0.365, "heldout_solved": 0.2},
        {"segment": 1, "steps": 25, "phase": "warm-up", "budget": 0.4, "buffer": 320,
         "mean_reward": 0.41, "mean_informativeness": 0.3, "children": 640, "truncated": 0.05,
         "heldout_score": 0.497, "heldout_solved": 0.3, "heldout_truncated": 0.0,
         "answers_changed": 0.4, "win_vs_theta_0": 0.72},
    ]  # fmt: skip
    md = summary_markdown("online", rows, "eva online run")
    heldout, work = md.split("### What each segment did")
    assert (
        "| segment | heldout_score | heldout_solved | heldout_truncated | answers_changed "
        "| win_vs_theta_0 |" in heldout
    )
    assert "| 1 | 0.497 | 0.300 | 0.000 | 0.400 | 0.720 |" in heldout
    assert "| theta_0 | 0.365 |" in heldout
    assert work.strip().splitlines()[0] == (
        "| segment | steps | phase | budget | buffer | mean_reward | mean_informativeness "
        "| children | truncated |"
    )
    assert "theta_0" not in work and "| 1 | 25 | warm-up | 0.400 | 320 |" in work


def test_ui_check_leaves_the_docs_screenshots_alone_unless_asked(tmp_path) -> None:
    from bench.ui_check import parser, update_docs

    args = parser().parse_args([])
    assert args.out == os.path.join("runs-bench", "ui") and not args.update_docs
    assert parser().parse_args(["--update-docs"]).update_docs
    out, docs = tmp_path / "out", tmp_path / "docs"
    out.mkdir(), docs.mkdir()
    (out / "charts.png").write_bytes(b"new")
    (out / "notes.txt").write_text("not a screenshot")
    (docs / "charts.png").write_bytes(b"old")
    assert update_docs(str(out), str(docs)) == ["charts.png"]
    assert (docs / "charts.png").read_bytes() == b"new" and not (docs / "notes.txt").exists()

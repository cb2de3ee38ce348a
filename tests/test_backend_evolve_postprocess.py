"""Post-processing shared by every evolver: template echo stripped before the drop rules."""

from __future__ import annotations

import pytest

from eva_core.evolution import clean_rewrite, evolved_records, is_refusal
from eva_core.schema import seed_records


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("#Rewritten Prompt#:\nWrite a sonnet about rain.", "Write a sonnet about rain."),
        ("#Created Prompt#:\n  Plan a week in Kyoto.  ", "Plan a week in Kyoto."),
        ("Rewritten Prompt: Explain entropy.", "Explain entropy."),
        ("**Rewritten Prompt:** Explain entropy.", "Explain entropy."),
        ("## New Prompt\nList three metals.", "List three metals."),
        ('Evolved prompt:\n"Compare two sorts."', "Compare two sorts."),
        ("\u201cWhy is the sky blue?\u201d", "Why is the sky blue?"),
        ("'Name a prime.'", "Name a prime."),
        ("```\nWrite a regex for dates.\n```", "Write a regex for dates."),
        ("```text\nWrite a regex.\n```", "Write a regex."),
        ('#Rewritten Prompt#:\n```\n"Quoted and fenced."\n```', "Quoted and fenced."),
        # The model echoed the whole template: what follows the last label is the rewrite.
        ("#The Given Prompt#:\nOld.\n#Rewritten Prompt#:\nNew one.", "New one."),
        (None, ""),
        ("   ", ""),
    ],
)
def test_clean_rewrite_strips_template_echo(raw: str | None, clean: str):
    assert clean_rewrite(raw) == clean


@pytest.mark.parametrize(
    "kept",
    [
        '"Hello" and "goodbye": translate both.',  # inner quotes: not a wrapper
        "Prompt: write a limerick.",  # "Prompt:" alone may be the user's own text
        "What does the prompt #1 mean?",
        "Explain ```code``` fences in markdown.",  # a fence inside, not around
        "12+34=",
        "Fix this:\n```py\nx = 1\n```",  # code after text stays a code block
    ],
)
def test_clean_rewrite_leaves_real_prompts_alone(kept: str):
    assert clean_rewrite(kept) == kept


def test_refusals_include_curly_apostrophes():
    assert is_refusal("I\u2019m sorry, but I can't help.")
    assert is_refusal("  As an AI, I cannot rewrite this.")
    assert not is_refusal("Sorry-state analysis: explain the term.")


def test_cleaning_runs_before_the_drop_rules():
    parents = seed_records(["Explain tides.", "Name a planet."])
    cands = [
        [
            ("#Rewritten Prompt#:\nExplain tides.", "deepening"),  # the parent once unwrapped
            ('"Explain spring tides."', "concretizing"),
            ("Rewritten Prompt: Explain spring tides.", "constraints"),  # duplicate once clean
            ("#Rewritten Prompt#:\n", "reasoning"),  # nothing but the label
            ("#Rewritten Prompt#: I'm sorry, I cannot.", "breadth"),
        ],
        [("```\nName a dwarf planet.\n```", "concretizing"), ("Name a gas giant.", "breadth")],
    ]
    table, stats = evolved_records(parents, cands, iteration=2)
    assert table.column("prompt").to_pylist() == [
        "Explain spring tides.", "Name a dwarf planet.", "Name a gas giant.",
    ]  # fmt: skip
    assert stats.dropped == {
        "empty": 1, "refusal": 1, "too_long": 0, "same_as_parent": 1, "unrelated": 0,
        "duplicate": 1, "heldout": 0,
    }  # fmt: skip
    assert stats.cleaned == 6 and stats.candidates == 7 and stats.kept == 3

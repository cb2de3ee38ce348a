"""The buffer state an online segment's checkpoint carries for the next segment: a missing, cut
or edited file is one line naming it, its field, and how to make it again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eva_runtime.errors import StageError
from tasks.online import STATE_FILE, read_state

GOOD = {"creator": {"buffer": {}}, "trained_steps": 4, "drawn": 2, "pending": []}


def _refused(path: Path) -> str:
    with pytest.raises(StageError) as refused:
        read_state(str(path), 3, "demo")
    line = refused.value.line()
    assert str(path) in line and "\n" not in line
    assert line.endswith("(make it again from the segment before: eva stage online --run demo "
                          "--iteration 2 --force)")  # fmt: skip
    return line


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (json.dumps(GOOD)[:40], "not JSON: Unterminated string starting at (character 28)"),
        (json.dumps({**GOOD, "trained_steps": "lots"}), 'trained_steps "lots" is not a count'),
        (json.dumps({**GOOD, "trained_steps": -1}), "trained_steps -1 is not a count"),
        (json.dumps({**GOOD, "drawn": True}), "drawn true is not a count"),
        (json.dumps({**GOOD, "pending": {}}), "pending is not a list of draws"),
        (json.dumps([1, 2]), "no creator state in it"),
        (json.dumps({"trained_steps": 1}), "no creator state in it"),
    ],
)
def test_a_state_file_that_was_cut_or_edited_is_one_line(tmp_path: Path, text: str, says: str):
    path = tmp_path / STATE_FILE
    path.write_text(text)
    assert says in _refused(path)


def test_a_missing_state_file_says_how_to_make_it_again(tmp_path: Path) -> None:
    assert "there is no such file" in _refused(tmp_path / STATE_FILE)


def test_a_whole_state_file_is_read_as_written(tmp_path: Path) -> None:
    path = tmp_path / STATE_FILE
    path.write_text(json.dumps(GOOD))
    assert read_state(str(path), 3, "demo") == GOOD

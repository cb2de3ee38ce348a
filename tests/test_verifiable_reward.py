"""The ``verifiable`` reward: known answers from a file, a majority vote where none is known."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eva_runtime.errors import ConfigError, EvaError
from eva_world.components import match
from tasks.backends.reward.verifiable import AnswersError, VerifiableReward, read_answers
from tasks.keys import keyed_config

MATCH = "eva_world.components:match"


def flaky(response: str, answer: str) -> float:
    """A verifier that cannot read a response starting with "?"."""
    if response.startswith("?"):
        raise ValueError("unreadable")
    return float(response == answer)


def last_word(response: str) -> str:
    """A final-answer extractor: the response's last word ("?" cannot be read)."""
    if "?" in response:
        raise ValueError("unreadable")
    return response.split()[-1] if response.split() else ""


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _same(got: list[list[float]], want: list[list[float]]) -> None:
    """Equal row by row, NaN equal to NaN."""
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert len(g) == len(w)
        for a, b in zip(g, w, strict=True):
            assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b), (got, want)


def test_world_match_is_the_worlds_reward_against_a_given_answer() -> None:
    from eva_world import world

    assert match("64", "64") == 1.0
    assert match(" 6\n", "64") == 0.5
    assert match("640", "64") == pytest.approx(2 / 3)
    assert match("", "64") == 0.0
    assert match("46", "64") == 0.0
    # world.reward is match against world.solve: the same numbers.
    for prompt, response in (("12+34=", "640"), ("r:abcd=", "dcbx"), ("50-48=", " 2")):
        assert world.reward(prompt, response) == match(response, world.solve(prompt))


def test_read_answers_keys_by_normalized_prompt_and_refuses_conflicts(tmp_path: Path) -> None:
    path = _jsonl(
        tmp_path / "a.jsonl",
        [
            {"prompt": "12+34=", "answer": "64"},
            {"prompt": "  12+34= ", "answer": "64"},  # the same prompt, the same answer: fine
            {"prompt": "R:AB=", "answer": "ba"},
            {"prompt": "5+5=", "answer": None},  # no answer: the prompt stays unknown
        ],
    )
    from eva_core.schema import prompt_id

    assert read_answers(path) == {prompt_id("12+34="): "64", prompt_id("r:ab="): "ba"}
    rows = [("1+1=", "2"), ("1+1 =", "2"), ("1+1=", "3")]  # "1+1 =" is another prompt
    bad = _jsonl(tmp_path / "b.jsonl", [{"prompt": p, "answer": a} for p, a in rows])
    with pytest.raises(AnswersError, match=r"row 2 gives '3' for a prompt already answered '2'"):
        read_answers(bad)
    # CSV with numbers in the answer column: read as text.
    (tmp_path / "c.csv").write_text("question,solution\n2+2=,4\n")
    assert read_answers(str(tmp_path / "c.csv"), "question", "solution") == {prompt_id("2+2="): "4"}
    pq.write_table(pa.table({"prompt": ["3+4="], "answer": ["7"]}), tmp_path / "d.parquet")
    assert read_answers(str(tmp_path / "d.parquet")) == {prompt_id("3+4="): "7"}


def test_bad_answers_file_is_one_line_with_field_and_hint(tmp_path: Path) -> None:
    (tmp_path / "c.csv").write_text("q,a\n1,2\n")
    with pytest.raises(AnswersError) as e:
        read_answers(str(tmp_path / "c.csv"))
    assert e.value.field == "annotate.reward.prompt_column" and e.value.hint
    assert str(e.value) == (
        "annotate.reward.prompt_column: answers: '" + str(tmp_path / "c.csv") + "' has no "
        "column 'prompt' (it has ['q', 'a']) (set prompt_column to the column that holds it)"
    )
    with pytest.raises(AnswersError, match="cannot read") as e:
        read_answers(str(tmp_path / "missing.jsonl"))
    assert e.value.field == "annotate.reward.answers"
    with pytest.raises(AnswersError, match=r"'a\.txt' is not one of \.jsonl"):
        read_answers("a.txt")


def test_run_config_names_the_bad_field_in_one_line(tmp_path: Path) -> None:
    from flows.config import load_config, validate_config
    from flows.config_layers import deep_merge
    from flows.inputs import check_inputs

    world = load_config(None).model_dump(mode="json")
    answers = _jsonl(tmp_path / "a.jsonl", [{"prompt": "1+2=", "answer": "3"}])

    def config(**reward: Any) -> Any:
        merged = deep_merge(world, {"annotate": {"reward": {"kind": "verifiable", **reward}}})
        merged["annotate"]["reward"] = {"kind": "verifiable", **reward}
        return validate_config(merged)

    with pytest.raises(ConfigError) as e:
        config(function=MATCH, answers=answers, answer_column="solution")
    line = e.value.line()
    assert line.startswith("annotate.reward: answers: ") and "'solution'" in line, line
    assert "(set answer_column to the column that holds it)" in line and "\n" not in line
    with pytest.raises(ConfigError, match=r"annotate\.reward\.function: .*no attribute"):
        config(function="eva_world.components:nope")
    # Valid: the file's hash keys annotate (tasks.keys), whatever a recorded config said.
    ok = config(function=MATCH, answers=answers, answers_sha256="stale")
    first = keyed_config(ok.annotate)["reward"]["answers_sha256"]
    assert first is not None and first != "stale" and len(first) == 64
    _jsonl(tmp_path / "a.jsonl", [{"prompt": "1+2=", "answer": "4"}])
    assert keyed_config(ok.annotate)["reward"]["answers_sha256"] != first
    # It needs a prompt's N responses: evaluation does not inherit it and asks for its own.
    assert ok.evaluation.reward is None
    with pytest.raises(ConfigError, match=r"annotate\.reward is verifiable and cannot score"):
        check_inputs(ok)


def test_known_answers_majority_labels_and_dropped_prompts(tmp_path: Path) -> None:
    answers = _jsonl(
        tmp_path / "a.jsonl",
        [{"prompt": "12+34=", "answer": "64"}, {"prompt": "R:AB=", "answer": "ba"}],
    )
    prompts = ["12+34=", "5+5=", "r:cd=", "r:ab="]
    responses = [
        ["64", "6", "46"],  # known "64": 1, 0.5, 0
        ["01", "01", "0", "", "10", "01"],  # majority "01", 3 of 6 = 0.5
        ["dc", "cd", "x", "y"],  # a four-way tie: no label
        ["ba", "bb"],  # known via a differently cased prompt: 1, 0.5
    ]
    scorer = VerifiableReward(function=MATCH, answers=answers).load()
    _same(
        scorer.score(prompts, responses),
        [
            [1.0, 0.5, 0.0],
            [1.0, 1.0, 0.5, 0.0, 0.0, 1.0],  # "0" vs "01": 1 of 2 positions; "10": none
            [math.nan] * 4,
            [1.0, 0.5],
        ],
    )
    assert scorer.stats() == {
        "known": 2, "majority": 1, "dropped": 1,
        "dropped_uncertain": 0, "dropped_tied": 1, "dropped_unanswered": 0,
        "verifier_failures": 0,
    }  # fmt: skip
    # A higher agreement: 3 of 6 no longer labels "5+5=".
    strict = VerifiableReward(function=MATCH, answers=answers, agreement=0.6).load()
    assert all(math.isnan(r) for r in strict.score(prompts, responses)[1])
    assert strict.stats()["dropped_uncertain"] == 1 and strict.stats()["dropped"] == 2
    # unknown: drop scores the known prompts only.
    drop = VerifiableReward(function=MATCH, answers=answers, unknown="drop").load()
    got = drop.score(prompts, responses)
    assert got[0] == [1.0, 0.5, 0.0] and got[3] == [1.0, 0.5]
    assert all(math.isnan(r) for r in got[1] + got[2])
    assert drop.stats() == {"known": 2, "majority": 0, "dropped": 2, "verifier_failures": 0}
    drop.score(prompts[:2], responses[:2])  # a second call adds to the counts since load
    assert drop.stats() == {"known": 3, "majority": 0, "dropped": 3, "verifier_failures": 0}


def test_a_failing_verifier_is_nan_for_that_response_and_fatal_only_on_all() -> None:
    flaky_reward = VerifiableReward(function="tests.test_verifiable_reward:flaky").load()
    # Majority "7" (2 of 3); the "?" response raises: NaN, counted.
    got = flaky_reward.score(["3+4="], [["7", "?", "7"]])[0]
    assert got[0] == 1.0 and math.isnan(got[1]) and got[2] == 1.0
    assert flaky_reward.stats()["verifier_failures"] == 1
    # "?x" is the majority itself: every call raises.
    with pytest.raises(
        EvaError, match=r"verifier tests\.test_verifiable_reward:flaky raised on all 3"
    ):
        flaky_reward.score(["3+4="], [["?x", "?x", "?x"]])


def test_through_the_annotate_stage(tmp_path: Path) -> None:
    from eva_core.schema import seed_records
    from tasks.annotate import AnnotateConfig, annotate
    from tasks.context import RunContext, StageContext

    answers = _jsonl(tmp_path / "a.jsonl", [{"prompt": "1+2=", "answer": "3"}])
    run = RunContext(root=str(tmp_path), run="t", seed=0)
    ctx = StageContext(run, 1, "annotate", 0, {}, str(tmp_path), run.store(), lambda _: None)
    rollouts = seed_records(["1+2=", "3+4=", "5+6="]).append_column(
        "responses",
        pa.array([["3", "4"], ["7", "7", "1"], ["11", "21"]], pa.list_(pa.string())),
    )
    finished = [[True, False], [True, True, True], [True, True]]  # "4" was cut at the cap
    rollouts = rollouts.append_column("finished", pa.array(finished, pa.list_(pa.bool_())))
    reward = {"kind": "verifiable", "function": MATCH, "answers": answers}
    out = annotate.fn(ctx, AnnotateConfig.model_validate({"reward": reward}), rollouts)
    rewards = out.table.column("rewards").to_pylist()
    assert rewards[0] == [1.0, 0.0] and rewards[1] == [1.0, 1.0, 0.0]
    assert all(math.isnan(r) for r in rewards[2])  # "11" and "21" tie: unscored
    assert out.stats["unscored_prompts"] == 1 and out.stats["tied_prompts"] == 0
    # 1 of 7 responses truncated; finished ones scored 1, 1, 1, 0 (the tie's two are NaN).
    assert (out.stats["truncated"], out.stats["truncated_share"]) == (1, 0.1429)
    assert out.stats["mean_reward_finished"] == 0.75
    assert out.stats["mean_reward_truncated"] == 0.0
    assert out.stats["backend"] == {
        "known": 1, "majority": 1, "dropped": 1,
        "dropped_uncertain": 0, "dropped_tied": 1, "dropped_unanswered": 0,
        "verifier_failures": 0,
    }  # fmt: skip


def test_the_vote_counts_extracted_answers() -> None:
    verifier = "tests.test_verifiable_reward:flaky"  # exact match of the whole response
    responses = [["so it is 7", "thus 7", "7", "8", "? 7", ""]]
    # Whole responses: six different ones (one empty), no majority.
    whole = VerifiableReward(function=verifier).load()
    assert all(math.isnan(r) for r in whole.score(["3+4="], responses)[0])
    # Last words: "7" three times of six (the unreadable "? 7" counts as no answer): label
    # "7", and the verifier compares each whole response with it.
    voted = VerifiableReward(function=verifier, extract="tests.test_verifiable_reward:last_word")
    scorer = voted.load()
    got = scorer.score(["3+4="], responses)[0]
    assert got[:4] == [0.0, 0.0, 1.0, 0.0] and math.isnan(got[4]) and got[5] == 0.0
    assert scorer.stats()["majority"] == 1 and scorer.stats()["verifier_failures"] == 1


def test_the_extractor_keys_the_stages_that_use_the_reward() -> None:
    """The extractor decides what the vote counts: editing it must rerun annotate, as editing
    the verifier does (both are named code in the cache key)."""
    from tasks.keys import components

    extracting = VerifiableReward(function=MATCH, extract="tests.test_verifiable_reward:last_word")
    named = dict(components(extracting))
    assert MATCH in named and "tests.test_verifiable_reward:last_word" in named
    assert "tests.test_verifiable_reward:last_word" not in dict(
        components(VerifiableReward(function=MATCH))
    )


def test_evaluation_takes_a_verifiable_reward_on_known_answers_only(tmp_path: Path) -> None:
    from flows.config import validate_config
    from tasks.evaluate import EvaluateConfig
    from tests.conftest import tiny_run_config

    answers = _jsonl(tmp_path / "h.jsonl", [{"prompt": "1+2=", "answer": "3"}])
    known = {"kind": "verifiable", "function": MATCH, "answers": answers, "unknown": "drop"}
    scorer = EvaluateConfig.model_validate({"reward": known}).reward
    assert scorer is not None
    # One greedy answer per prompt: scored against its known answer; no answer, unscored.
    _same(scorer.load().score(["1+2=", "4+4="], [["3"], ["8"]]), [[1.0], [math.nan]])
    cfg = tiny_run_config(str(tmp_path))
    cfg["evaluate"] = {**cfg["evaluate"], "reward": {**known, "unknown": "majority"}}
    with pytest.raises(ConfigError) as refused:
        validate_config(cfg)
    line = str(refused.value)
    assert "\n" not in line and "evaluate.reward" in line
    assert "set unknown: drop" in line

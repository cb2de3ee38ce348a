"""Verifiable instruction following: IFEval's checkers (if-verifiable) as a reward on the
instructions a prompt carries as data, and the evolver that adds or tightens one."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.backends.evolve.instructions import InstructionEvolver
from tasks.backends.ifeval import (
    NEEDS_NLTK,
    as_columns,
    consistent,
    describe,
    draw,
    parse,
    unusable,
)
from tasks.backends.reward.instruction_following import InstructionFollowingReward

pytest.importorskip("if_verifiable")

LOWER_NO_COMMA = ["change_case:english_lowercase", "punctuation:no_comma"]


def _score(responses: list[str], **config: object) -> tuple[list[float], dict[str, int]]:
    scorer = InstructionFollowingReward(**config).load()
    ids, kwargs = [LOWER_NO_COMMA], [json.dumps([{}, {}])]
    (rewards,) = scorer.score(
        ["Describe rain."], [responses], instruction_id_list=ids, kwargs=kwargs
    )
    return rewards, scorer.stats()


def test_the_reward_is_the_share_of_instructions_followed() -> None:
    responses = [
        "rain falls softly on the quiet town and the streets shine",  # both
        "rain falls, softly, on the quiet town",  # lowercase only
        "Rain Falls Softly On The Quiet Town And The Streets Shine",  # no comma only
        "Rain falls, softly",  # neither
        "",  # an empty answer follows nothing
    ]
    rewards, stats = _score(responses)
    assert rewards == [1.0, 0.5, 0.5, 0.0, 0.0]
    # Strict and loose agree on these answers (no first or last line, no asterisks to drop).
    assert stats == {"responses": 5, "instructions": 10, "followed": 4, "all_followed": 1,
                     "instructions_given": 10, "followed_strict": 4, "all_followed_strict": 1,
                     "followed_loose": 4, "all_followed_loose": 1}  # fmt: skip
    assert _score(responses, score="all")[0] == [1.0, 0.0, 0.0, 0.0, 0.0]


def test_loose_accepts_what_a_first_line_or_asterisks_broke() -> None:
    # Strict fails the capitalised first line; loose drops it and passes (IFEval's loose).
    response = "Sure Thing\nrain falls softly on the quiet town"
    assert _score([response])[0] == [0.5]
    assert _score([response], loose=True)[0] == [1.0]


def test_a_prompt_without_instructions_is_unscored_never_guessed() -> None:
    scorer = InstructionFollowingReward().load()
    english = "the rain falls softly on the quiet town"
    rewards = scorer.score(
        ["Write in lowercase.", "Describe rain."],
        [[english], [english, english.upper()]],
        instruction_id_list=[None, ["change_case:english_lowercase"]],
        kwargs=[None, None],
    )
    assert math.isnan(rewards[0][0]) and rewards[1] == [1.0, 0.0]
    assert scorer.stats()["no_instructions"] == 1
    with pytest.raises(ValueError, match="reads the prompts' instruction_id_list"):
        scorer.score(["x"], [["y"]])


def test_instructions_are_read_as_ifeval_writes_them_and_refused_with_the_reason() -> None:
    # IFEval's rows name every argument, null for the unused ones.
    ifeval_row = [{"num_words": 50, "relation": "less than", "keywords": None}]
    assert parse(["length_constraints:number_words"], ifeval_row) == [
        ("length_constraints:number_words", {"num_words": 50, "relation": "less than"})
    ]
    assert parse(["punctuation:no_comma"], None) == [("punctuation:no_comma", {})]
    assert parse(["punctuation:no_comma"], "[{}]") == [("punctuation:no_comma", {})]
    with pytest.raises(ValueError, match="unknown instruction 'punctuation:no_dash'"):
        parse(["punctuation:no_dash"], None)
    with pytest.raises(ValueError, match="kwargs must be a list of 2 mappings"):
        parse(LOWER_NO_COMMA, [{}])
    with pytest.raises(ValueError, match="not a list of ids"):
        parse("punctuation:no_comma", None)
    with pytest.raises(ValueError, match="kwargs is not JSON"):
        parse(["punctuation:no_comma"], "[{")


def test_the_checkers_that_need_nltk_data_are_refused_without_it(monkeypatch) -> None:
    import nltk

    def missing(resource: str) -> None:
        raise LookupError(resource)

    monkeypatch.setattr(nltk.data, "find", missing)
    for iid, resource in NEEDS_NLTK.items():
        assert f"needs NLTK's {resource} data" in (unusable(iid) or "")
    assert unusable("punctuation:no_comma") is None


def test_the_checkers_that_read_nltk_data_score_from_the_wheels_punkt_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("punkt")
    from tasks.backends import nltk_punkt

    monkeypatch.setenv("EVA_CACHE_DIR", str(tmp_path))
    nltk_punkt.install.cache_clear()
    folder = nltk_punkt.install()
    assert folder is not None and folder.startswith(str(tmp_path))
    assert all(unusable(iid) is None for iid in NEEDS_NLTK)
    reward = InstructionFollowingReward().load()
    # "Dr." and "p.m." are abbreviations to Punkt, not sentence ends: 3 sentences, not 5.
    answer = "Dr. Smith came at 5 p.m. today. He was late! Was he sorry?"
    fewer = [{"num_sentences": 4, "relation": "less than"}]
    more = [{"num_sentences": 4, "relation": "at least"}]
    # Three capitalized words of the nine word tokens NLTK's tokenizer finds: THE, SUN, RISES.
    shouting = "THE SUN RISES over hills, and birds sing."
    capitals = [{"capital_frequency": 3, "capital_relation": "at least"}]
    got = reward.score(
        ["p", "p", "p", "p"], [[answer], [answer], [shouting], ["The sun RISES."]],
        instruction_id_list=[["length_constraints:number_sentences"]] * 2
        + [["change_case:capital_word_frequency"]] * 2,
        kwargs=[fewer, more, capitals, capitals],
    )  # fmt: skip
    assert got == [[1.0], [0.0], [1.0], [0.0]]


def test_a_row_the_edge_would_refuse_still_scores_the_same_every_time() -> None:
    # num_highlights -3 makes the checker draw a count at random whenever it is built; the
    # reward seeds that draw, so the same answers score the same at every call (issue 49: 2, 5
    # and 7 of 10 copies of one answer were rewarded in three scorings).
    reward = InstructionFollowingReward().load()
    answer = "*one* and *two* and *three*"
    ids, kwargs = ["detectable_format:number_highlighted_sections"], [{"num_highlights": -3}]
    scores = [
        reward.score(
            ["p"] * 10, [[answer]] * 10, instruction_id_list=[ids] * 10, kwargs=[kwargs] * 10
        )
        for _ in range(3)
    ]
    assert scores[0] == scores[1] == scores[2] and len({s[0] for s in scores[0]}) == 1


def test_importing_the_checkers_asks_the_network_for_nothing() -> None:
    code = (
        "import socket\n"
        "def no(*a, **k): raise SystemExit('network: ' + repr(a))\n"
        "socket.socket.connect = no\nsocket.create_connection = no\n"
        "from tasks.backends.ifeval import registry\n"
        "from tasks.backends.reward.instruction_following import InstructionFollowingReward\n"
        "s = InstructionFollowingReward().load()\n"
        "print(len(registry()), s.score(['x'], [['the rain falls softly on the town']], "
        "instruction_id_list=[['change_case:english_lowercase']], kwargs=[None]))\n"
    )
    root = Path(__file__).parents[1]
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["25", "[[1.0]]"]


def test_conflicting_instructions_are_never_combined() -> None:
    lower, upper = ("change_case:english_lowercase", {}), ("change_case:english_capital", {})
    assert not consistent([lower, upper]) and not consistent([upper, lower])  # made symmetric
    assert not consistent([("startend:quotation", {}), ("detectable_format:title", {})])
    keep = ("keywords:existence", {"keywords": ["river", "stone"]})
    avoid = ("keywords:forbidden_words", {"forbidden_words": ["Stone"]})
    assert not consistent([keep, avoid])  # a word both required and forbidden
    never = ("keywords:frequency", {"keyword": "river", "frequency": 1, "relation": "less than"})
    assert not consistent([keep, never])
    assert consistent([keep, ("punctuation:no_comma", {}), lower])


def test_draw_and_describe_use_the_checkers_own_arguments_and_words() -> None:
    iid, args = draw("keywords:frequency", seed=3)
    assert iid == "keywords:frequency" and set(args) == {"keyword", "frequency", "relation"}
    assert draw("keywords:frequency", seed=3) == (iid, args)  # seeded
    text = describe((iid, args))
    assert args["keyword"] in text and str(args["frequency"]) in text and args["relation"] in text
    assert as_columns([(iid, args)]) == ([iid], json.dumps([args], sort_keys=True))


def _children(text: str, ids: list[str], kwargs: list[dict], n: int = 4, **config: object):
    evolver = InstructionEvolver(**config).load()
    (children,) = evolver.evolve(
        [text], [None], n, seed=7, instruction_id_list=[ids], kwargs=[json.dumps(kwargs)]
    )
    return children


def test_each_child_adds_or_tightens_one_instruction_and_says_so_in_its_text() -> None:
    words = ("length_constraints:number_words", {"num_words": 120, "relation": "less than"})
    parent = " ".join(["Describe a river.", describe(words)])
    adds = ("punctuation:no_comma", "startend:quotation", "detectable_format:title")
    children = _children(parent, [words[0]], [words[1]], n=4, instructions=adds)
    # What is open: each of the three adds, and the bound lowered once.
    assert len(children) == 4 and len({t for t, _, _ in children}) == 4
    for text, method, columns in children:
        have = parse(columns["instruction_id_list"], columns["kwargs"])
        assert consistent(have) and text.startswith("Describe a river.")
        step, iid = method.split(":", 1)
        if step == "add":
            assert have[0] == words and have[1][0] == iid and len(have) == 2
            assert text == f"{parent} {describe(have[1])}"
        else:  # the bound lowered, the old words replaced by the new
            assert have == [(words[0], {"num_words": 90, "relation": "less than"})]
            assert text == f"Describe a river. {describe(have[0])}"
    assert {m.split(":")[0] for _, m, _ in children} == {"add", "tighten"}
    assert (
        _children(
            parent,
            [words[0]],
            [words[1]],
            n=6,
            tighten=True,
            instructions=("punctuation:no_comma", "startend:quotation", "detectable_format:title"),
        )
        == children
    )


def test_a_full_prompt_whose_text_does_not_hold_the_words_gets_no_child() -> None:
    # At max_instructions only tightening is open, and the text (written by hand) does not
    # hold the checker's description to replace: nothing can be made verifiably harder.
    words = {"num_words": 120, "relation": "less than"}
    hand = "Describe a river in fewer than 120 words."
    assert _children(hand, ["length_constraints:number_words"], [words], max_instructions=1) == []
    # Below the cap it is added to.
    kids = _children(hand, ["length_constraints:number_words"], [words], max_instructions=2)
    assert kids and all(m.startswith("add:") for _, m, _ in kids)


def test_the_evolver_refuses_an_instruction_it_cannot_check() -> None:
    with pytest.raises(ValueError, match="unknown instruction 'nope'"):
        InstructionEvolver(instructions=("nope",))

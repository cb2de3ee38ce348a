"""Tests for the verifiable world: answers, reward, distributions and evolution operators."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from eva_world import world
from eva_world.world import (
    ALPHABET,
    EVOLVE_METHODS,
    HELDOUT_DISTRIBUTION,
    MAX_ANSWER_LEN,
    MAX_PROMPT_LEN,
    SEED_DISTRIBUTION,
    SFT_DISTRIBUTION,
    Distribution,
    Problem,
    category_of,
    constraint_count,
    difficulty,
    evolve,
    evolve_many,
    parse,
    render,
    reward,
    sample_prompts,
    sft_examples,
    solve,
)


@pytest.mark.parametrize(
    ("prompt", "answer"),
    [
        ("12+34=", "64"),
        ("95+7=", "201"),
        ("999+1=", "0001"),
        ("53-17=", "63"),
        ("50-48=", "2"),
        ("10-10=", "0"),
        ("r:abc=", "cba"),
        ("1+2+3=", "6"),
        ("9999+9999+9999+9999=", "69993"),
    ],
)
def test_solve(prompt: str, answer: str) -> None:
    assert solve(prompt) == answer


@pytest.mark.parametrize(
    "prompt",
    ["", "12+34", "12+=", "01+2=", "1+2+3+4+5=", "12345+1=", "17-53=", "1-2-3=", "1-2+3=",
     "r:a=", "r:abcdefghi=", "r:xyz=", "r:ABC=", "12*3=", " 1+2=", "1+2= ", "²+1="],
)  # fmt: skip
def test_invalid_prompts_are_rejected(prompt: str) -> None:
    assert parse(prompt) is None
    assert category_of(prompt) is None
    with pytest.raises(ValueError, match=re.escape(repr(prompt))):
        solve(prompt)
    assert math.isnan(reward(prompt, "1"))


def test_parse_render_round_trip() -> None:
    assert parse("12+345+6=") == Problem("add", ("12", "345", "6"))
    assert parse("r:abcd=") == Problem("rev", ("abcd",))
    assert category_of("53-17=") == "sub"
    for p in sample_prompts(HELDOUT_DISTRIBUTION, 300, seed=3):
        assert render(parse(p)) == p
    with pytest.raises(ValueError):
        render(Problem("sub", ("1", "2")))


def test_difficulty_and_constraints() -> None:
    assert difficulty("12+34=") == 4
    assert difficulty("1+2+3=") == 5  # 3 digits + 2 for the third operand
    assert difficulty("12+345+6+7=") == 11
    assert difficulty("53-17=") == 4
    assert difficulty("r:abcde=") == 5
    assert constraint_count("12+34=") == 0
    assert constraint_count("999+1=") == 3
    assert constraint_count("100-1=") == 2  # borrows ripple through both zeros
    assert constraint_count("r:abca=") == 1
    assert constraint_count("r:aaaa=") == 3


def test_reward() -> None:
    assert reward("12+34=", "64") == 1.0
    assert reward("12+34=", " 64\n") == 1.0  # surrounding whitespace is not scored
    assert reward("12+34=", "6") == 0.5
    assert reward("12+34=", "65") == 0.5
    assert reward("12+34=", "640") == pytest.approx(2 / 3)
    assert reward("12+34=", "46") == 0.0  # the unreversed sum is wrong in every position
    assert reward("12+34=", "") == 0.0
    assert reward("r:abcd=", "dcbx") == 0.75
    assert math.isnan(reward("hello", "64"))
    rng = np.random.default_rng(0)
    prompts = sample_prompts(HELDOUT_DISTRIBUTION, 200, seed=0)
    for prompt in prompts:
        response = "".join(rng.choice(list(ALPHABET + " "), size=int(rng.integers(0, 12))))
        assert 0.0 <= reward(prompt, response) <= 1.0


def test_distribution_sizes() -> None:
    assert SEED_DISTRIBUTION.size() == 100**2 + 100 * 101 // 2 + (10**2 + 10**3 + 10**4)
    assert SFT_DISTRIBUTION.size() == 1000**2 + 1000 * 1001 // 2 + sum(10**n for n in range(2, 7))
    assert HELDOUT_DISTRIBUTION.size() == SFT_DISTRIBUTION.size()
    tiny = Distribution((("add", 1.0),), digits=(1, 1))
    assert tiny.size() == 100
    # Asking for the whole support works; one more is impossible.
    assert sorted(sample_prompts(tiny, 100, seed=0)) == sorted(
        f"{a}+{b}=" for a in range(10) for b in range(10)
    )
    with pytest.raises(ValueError):
        sample_prompts(tiny, 101, seed=0)
    with pytest.raises(ValueError):
        sample_prompts(tiny, 100, seed=0, exclude=["3+4="])
    with pytest.raises(ValueError):
        Distribution((("mul", 1.0),))
    with pytest.raises(ValueError):
        Distribution((("add", 1.0),), digits=(1, 5))


def test_sample_prompts() -> None:
    a = sample_prompts(SEED_DISTRIBUTION, 500, seed=7)
    assert a == sample_prompts(SEED_DISTRIBUTION, 500, seed=7)
    assert a != sample_prompts(SEED_DISTRIBUTION, 500, seed=8)
    assert len(set(a)) == 500
    assert {category_of(p) for p in a} == {"add", "sub", "rev"}
    assert all(SEED_DISTRIBUTION.contains(p) for p in a)
    held = sample_prompts(HELDOUT_DISTRIBUTION, 2000, seed=1, exclude=a)
    assert not set(held) & set(a)
    assert {category_of(p) for p in held} == {"add", "sub", "rev"}
    harder = [p for p in held if difficulty(p) > max(difficulty(q) for q in a)]
    assert len(harder) > len(held) / 3  # the target is mostly beyond the seed range
    assert all(HELDOUT_DISTRIBUTION.contains(p) for p in held)
    assert not SEED_DISTRIBUTION.contains("123+4=") and HELDOUT_DISTRIBUTION.contains("123+4=")
    assert not HELDOUT_DISTRIBUTION.contains("1+2+3=")  # add_step goes beyond the target


def test_sft_examples() -> None:
    pairs = sft_examples(SFT_DISTRIBUTION, 300, seed=0)
    assert pairs == sft_examples(SFT_DISTRIBUTION, 300, seed=0)
    assert {category_of(p) for p, _ in pairs} == {"add", "sub", "rev"}
    assert all(solve(p) == ans and SFT_DISTRIBUTION.contains(p) for p, ans in pairs)


@pytest.mark.parametrize(
    ("prompt", "careless"),
    [
        ("12+34=", "64"),  # no carry: the slip changes nothing
        ("95+7=", "29"),  # 5+7=12 -> 2, carry dropped; 9 -> 9; sum written reversed
        ("999+1=", "099"),  # every carry dropped: 990, written reversed
        ("905-5=", "009"),  # no borrow: 900, written reversed
        ("50-48=", "21"),  # 0-8 -> 2 (borrow dropped), 5-4 -> 1
        ("53-17=", "64"),  # 3-7 -> 6, 5-1 -> 4
        ("10-10=", "0"),
        ("r:abc=", "abc"),  # copied instead of reversed
        ("r:aba=", "aba"),  # a palindrome: careless and correct agree
    ],
)
def test_careless_answer(prompt: str, careless: str) -> None:
    assert world.careless_answer(prompt) == careless


def test_careless_demonstrations_mix_at_the_given_share_and_skip_excluded() -> None:
    prompts = sample_prompts(SFT_DISTRIBUTION, 50, seed=9)
    pairs = sft_examples(SFT_DISTRIBUTION, 4000, seed=3, careless=0.6, exclude=prompts)
    assert not {p for p, _ in pairs} & set(prompts)
    differs = [p for p, _ in pairs if world.careless_answer(p) != solve(p)]
    slipped = sum(ans == world.careless_answer(p) for p, ans in pairs if p in set(differs))
    assert 0.56 < slipped / len(differs) < 0.64  # 0.6 of those where a slip shows
    assert all(ans in (solve(p), world.careless_answer(p)) for p, ans in pairs)
    assert sft_examples(SFT_DISTRIBUTION, 300, seed=0, careless=0.0) == sft_examples(
        SFT_DISTRIBUTION, 300, seed=0
    )
    with pytest.raises(ValueError, match="careless"):
        sft_examples(SFT_DISTRIBUTION, 1, seed=0, careless=1.5)


def _all_prompts() -> list[str]:
    return sample_prompts(SEED_DISTRIBUTION, 150, seed=11) + sample_prompts(
        HELDOUT_DISTRIBUTION, 150, seed=12
    ) + ["9999+9999+9999+9999=", "r:abcdefgh=", "0+0=", "0-0=", "9999-9999=", "r:aa="]  # fmt: skip


def test_evolve_produces_valid_prompts_within_caps() -> None:
    rng = np.random.default_rng(0)
    applied = dict.fromkeys(EVOLVE_METHODS, 0)
    for prompt in _all_prompts():
        for method in EVOLVE_METHODS:
            child = evolve(prompt, method, rng)
            if child is None:
                continue
            applied[method] += 1
            assert parse(child) is not None, (prompt, method, child)
            assert child != prompt
            before, after = difficulty(prompt), difficulty(child)
            if method in ("deepen_digits", "add_step"):
                assert after > before, (prompt, method, child)
            if method == "add_constraint":
                assert after == before
                assert constraint_count(child) > constraint_count(prompt), (prompt, child)
            if method == "breadth_category":
                assert category_of(child) != category_of(prompt)
    assert all(n > 0 for n in applied.values()), applied


def test_evolve_specific_cases() -> None:
    rng = np.random.default_rng(0)
    assert evolve("9999+9999+9999+9999=", "deepen_digits", rng) is None
    assert evolve("1+2+3+4=", "add_step", rng) is None
    assert evolve("53-17=", "add_step", rng) is None
    assert evolve("r:abcdefgh=", "deepen_digits", rng) is None
    assert evolve("r:aaaa=", "add_constraint", rng) is None  # already all repeats
    assert evolve("53-17=", "breadth_category", rng) in {"53+17=", "r:fdbh="}
    assert evolve("17+53=", "breadth_category", rng) in {"53-17=", "r:bhfd="}
    # "r:aab=" is "001": no two-operand split without leading zeros, and no other move.
    assert evolve("r:aab=", "breadth_category", rng) is None
    with pytest.raises(ValueError):
        evolve("12+34=", "paraphrase", rng)
    with pytest.raises(ValueError):
        evolve("nope", "deepen_digits", rng)
    # add_step keeps the parent's operands and adds a non-zero one no wider than the widest.
    for _ in range(30):
        child = evolve("12+34=", "add_step", rng)
        assert child is not None
        ops = child[:-1].split("+")
        ops.remove("12")
        ops.remove("34")
        assert len(ops) == 1 and 1 <= int(ops[0]) <= 99
    # Evolution transforms the parent: deleting one character of a deepened prompt gives it back.
    for _ in range(20):
        child = evolve("12+34=", "deepen_digits", rng)
        assert child is not None
        assert any(child[:i] + child[i + 1 :] == "12+34=" for i in range(len(child)))


def test_evolve_many() -> None:
    for prompt in _all_prompts()[:60]:
        a = evolve_many(prompt, 4, np.random.default_rng(5))
        assert a == evolve_many(prompt, 4, np.random.default_rng(5))
        assert len(a) <= 4
        assert len({c for c, _ in a}) == len(a)
        assert all(m in EVOLVE_METHODS and parse(c) is not None and c != prompt for c, m in a)
    assert len(evolve_many("12+34=", 4, np.random.default_rng(0))) == 4
    assert evolve_many("12+34=", 0, np.random.default_rng(0)) == []


def test_alphabet_covers_everything() -> None:
    rng = np.random.default_rng(1)
    prompts = _all_prompts()
    prompts += [c for p in prompts for c, _ in evolve_many(p, 4, rng)]
    prompts += [p for p, _ in sft_examples(SFT_DISTRIBUTION, 300, seed=2)]
    chars = set(ALPHABET)
    for p in prompts:
        assert set(p) <= chars and set(solve(p)) <= chars
        assert len(p) <= MAX_PROMPT_LEN and len(solve(p)) <= MAX_ANSWER_LEN
    assert world.CATEGORIES == ("add", "sub", "rev")
    assert len(set(ALPHABET)) == len(ALPHABET)

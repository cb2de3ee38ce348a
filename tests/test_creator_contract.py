"""The creator's contract with a trainer, tried as a trainer may misuse it: options and saved
states are checked when the creator is built or loaded, ``observe`` is all or nothing (a bad
group or a failing rewriter leaves the creator exactly as it was, and the error names the group
or the rewriter), the rewriter's answer is checked, and ``state()`` is strict JSON whatever
``observe`` accepted. The last tests run random sequences of draw / observe / release / state,
bad calls among them, and check the creator's books and an exact resume after every one."""

from __future__ import annotations

import json
import math
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eva_core.creator import Creator
from eva_core.creator_checks import OptionError

SEEDS = [f"How much is {i} times {i + 1}?" for i in range(12)]


class Rewriter:
    """Deterministic children '<parent> /<seed>.<j>'; raises while ``fail`` is set, or answers
    ``answer`` instead when one is given."""

    def __init__(self) -> None:
        self.fail = False
        self.answer: Any = None
        self.calls = 0

    def __call__(self, parents: list[dict[str, Any]], n: int, seed: int) -> Any:
        self.calls += 1
        if self.fail:
            raise ConnectionError("the rewriting API is down")
        if self.answer is not None:
            return self.answer
        return [[f"{p['prompt']} /{seed % 1000}.{j}" for j in range(n)] for p in parents]


def snapshot(creator: Creator) -> str:
    """The creator's whole state as strict JSON (no NaN), the form it is compared in."""
    return json.dumps(creator.state(), allow_nan=False, sort_keys=True)


def groups(batch: list[dict[str, Any]], rewards: list[float] | None = None) -> list[Any]:
    return [(r["prompt_id"], rewards or [0.0, 1.0, float(i % 2)]) for i, r in enumerate(batch)]


# --- options and saved states, refused when built or loaded ---------------------------------


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("size", -5, "size must be an integer >= 1, got -5"),
        ("size", 2.5, "size must be an integer >= 1, got 2.5"),
        ("ratio_evol", 7, "ratio_evol must be a number in [0, 1], got 7"),
        ("ratio_evol", 2.0, "ratio_evol must be a number in [0, 1], got 2.0"),
        ("ratio_evol", -1, "ratio_evol must be a number in [0, 1], got -1"),
        ("top_fraction", 0.0, "top_fraction must be a number in (0, 1], got 0.0"),
        ("n_new", -1, "n_new must be an integer >= 0, got -1"),
        ("metric", "a_maxx", "metric must be one of a_min, a_avg, a_dis, var, avg, inv_avg"),
        ("seed", -3, "seed must be an integer >= 0, got -3"),
        ("max_chars", 0, "max_chars must be an integer >= 1, got 0"),
        ("inherit", "answer", "inherit must be a list of column names, got 'answer'"),
        ("duplicates", "keep", "duplicates must be one of refuse, drop, got 'keep'"),
        ("rewriter", "my_pkg:rewrite", "rewriter must be a callable rewriter(parents, n, seed)"),
    ],
)
def test_options_are_refused_when_the_creator_is_built(option: str, value: Any, says: str):
    with pytest.raises(OptionError) as refused:
        Creator(SEEDS, **{option: value})
    assert str(refused.value).startswith(says) and refused.value.option == option
    # an adapter names its own key: data.eva.<option>
    assert str(refused.value.under("data.eva")).startswith(f"data.eva.{says}")


def test_a_saved_state_is_checked_when_it_is_loaded() -> None:
    rewriter = Rewriter()
    creator = Creator(SEEDS, rewriter=rewriter, size=4, n_new=2)
    creator.observe(groups(creator.draw(4)))
    saved = json.loads(snapshot(creator))

    def refused(state: dict[str, Any], seeds: list[str] = SEEDS) -> str:
        with pytest.raises(ValueError) as error:
            Creator.from_state(seeds, state, rewriter=rewriter)
        return str(error.value)

    assert refused({**saved, "observations": "three"}) == (
        "saved creator state: observations must be an integer >= 0, got 'three'"
    )
    entries = [{**e, "priority": math.nan} for e in saved["buffer"]["entries"]]
    assert refused({**saved, "buffer": {**saved["buffer"], "entries": entries}}).startswith(
        "saved creator state: buffer.entries[0].priority must be a finite number >= 0, got nan"
    )
    settings_ = {**saved["buffer"]["settings"], "ratio_evol": 3}
    assert refused({**saved, "buffer": {**saved["buffer"], "settings": settings_}}) == (
        "saved creator state: buffer.settings.ratio_evol must be a number in [0, 1], got 3"
    )
    assert refused({k: v for k, v in saved.items() if k != "outstanding"}).startswith(
        "saved creator state: outstanding is missing"
    )
    # saved over 12 seeds, resumed over 5 of them (or the same 12 in another order): refused.
    assert "saved creator state: seeds were other seed prompts: these are 5" in refused(
        saved, SEEDS[:5]
    )
    assert "in the same order" in refused(saved, SEEDS[::-1])
    old = {k: v for k, v in saved.items() if k != "seeds"}  # a state from before the digest
    assert "buffer.cursor is past the end of these 2 seed prompts" in refused(old, SEEDS[:2])
    assert snapshot(Creator.from_state(SEEDS, saved, rewriter=rewriter)) == snapshot(creator)


# --- observe: all or nothing ----------------------------------------------------------------


def test_a_failing_rewriter_leaves_the_creator_as_it_was_and_a_retry_works() -> None:
    rewriter, control = Rewriter(), Rewriter()
    creator = Creator(SEEDS, rewriter=rewriter, size=4, n_new=2)
    twin = Creator(SEEDS, rewriter=control, size=4, n_new=2)
    batch, _ = creator.draw(8), twin.draw(8)
    before = snapshot(creator)
    rewriter.fail = True
    with pytest.raises(ConnectionError, match="the rewriting API is down") as error:
        creator.observe(groups(batch))  # its own error, which a caller may handle by type
    assert error.value.__notes__ == [
        "raised by the creator's rewriter tests.test_creator_contract:Rewriter"
    ]
    assert snapshot(creator) == before  # nothing consumed: observed 0, the 8 still out
    assert creator.stats.observed == 0 and len(creator.outstanding.records()) == 8
    rewriter.fail = False
    creator.observe(groups(batch))  # the trainer retries the same groups
    twin.observe(groups(batch))
    assert snapshot(creator) == snapshot(twin) and creator.stats.children == 8


def test_a_lagged_evolution_that_fails_is_run_again_on_retry() -> None:
    rewriter, control = Rewriter(), Rewriter()
    with ThreadPoolExecutor(1) as pool:
        creator = Creator(SEEDS, rewriter=rewriter, size=20, executor=pool, evolve_lag=1)
        twin = Creator(SEEDS, rewriter=control, size=20, executor=pool, evolve_lag=1)
        rewriter.fail = True  # fails in the executor, while the trainer goes on
        for c in (creator, twin):
            c.observe(groups(c.draw(4)))
        second = creator.draw(4)
        twin_second = twin.draw(4)
        before = snapshot(creator)
        with pytest.raises(ConnectionError, match="the rewriting API is down"):
            creator.observe(groups(second))  # observation 0's children are due now
        assert snapshot(creator) == before
        rewriter.fail = False
        creator.observe(groups(second))
        twin.observe(groups(twin_second))
        assert snapshot(creator) == snapshot(twin) and creator.stats.children == 8


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        (lambda ids: [(ids[0], [1.0, 0.0]), ("no-such-id", [1.0])],
         "group 1: prompt 'no-such-id' was not drawn (or was already observed)"),
        (lambda ids: [(ids[0], [1.0]), (ids[0], [0.0])],
         "group 1: prompt '{0}' was not drawn (or was already observed) as often as this call"),
        (lambda ids: [(ids[0], [1.0]), (ids[1], [])],
         "group 1 ({1}): no rewards (a group has one per response)"),
        (lambda ids: [(ids[0], ["1", "0"])],
         "group 0 ({0}): rewards must be numbers (NaN for an unscored response), got '1'"),
        (lambda ids: [(ids[0], "10")], "group 0 ({0}): rewards must be a list, got '10'"),
        (lambda ids: [(ids[0], None)], "group 0 ({0}): rewards must be a list, got None"),
        (lambda ids: [ids[0]], "group 0: expected (prompt_id, rewards), got '{0}'"),
        (lambda ids: [(7, [1.0])], "group 0: the prompt id must be a string, got 7"),
    ],
)  # fmt: skip
def test_a_bad_group_is_refused_naming_it_and_nothing_is_consumed(bad, says) -> None:
    creator = Creator(SEEDS, rewriter=Rewriter(), size=4)
    ids = [r["prompt_id"] for r in creator.draw(4)]
    before = snapshot(creator)
    with pytest.raises(ValueError) as error:
        creator.observe(bad(ids))
    assert str(error.value).startswith(says.format(*ids))
    assert snapshot(creator) == before
    creator.observe([(pid, [0.0, 1.0]) for pid in ids])  # the good groups still observe
    assert creator.stats.observed == 4


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        ([["a b c"] * 9] * 4, "parent 0 ({0}): 9 rewrites, at most n=4 were asked for"),
        ([["a b c"]] * 3, "returned 3 for 4 parents; expected one list of rewrites per parent"),
        ([1, 2, 3, 4], "parent 0 ({0}): expected a list of rewrites, got 1"),
        ([None] * 4, "parent 0 ({0}): expected a list of rewrites, got None"),
        ([[("a new question", 7)]] * 4,
         "parent 0 ({0}): a rewrite must be a text, a (text, method) pair of texts or (text, "
         "method, instruction columns), got"),
        ("rewrites", "returned str for 4 parents"),
    ],
)  # fmt: skip
def test_the_rewriters_answer_is_checked_naming_it(answer: Any, says: str) -> None:
    rewriter = Rewriter()
    creator = Creator(SEEDS, rewriter=rewriter, size=4, top_fraction=1.0)
    batch = creator.draw(4)
    before = snapshot(creator)
    rewriter.answer = answer
    with pytest.raises(ValueError) as error:
        creator.observe(groups(batch))
    message = str(error.value)
    assert message.startswith("rewriter tests.test_creator_contract:Rewriter")
    # the first parent handed over is the most informative group, the first (2/3 against 1/3)
    assert says.format(batch[0]["prompt_id"]) in message
    assert snapshot(creator) == before


def test_none_rewrites_are_failed_ones_and_state_is_strict_json() -> None:
    rewriter = Rewriter()
    creator = Creator(SEEDS, rewriter=rewriter, size=4, top_fraction=1.0)
    batch = creator.draw(2)
    rewriter.answer = [[None, "a rewrite of it"], [None]]
    # a group with no finite reward is unscored (informativeness NaN) and may still be a parent
    seen = creator.observe([(batch[0]["prompt_id"], [math.nan, math.nan]),
                            (batch[1]["prompt_id"], [1.0, 0.0])])  # fmt: skip
    assert math.isnan(seen.informativeness[0]) and sorted(seen.parents) == [0, 1]
    assert creator.stats.failed_parents == 1 and creator.stats.dropped["empty"] == 2
    assert creator.stats.children == 1
    json.loads(snapshot(creator))  # no NaN anywhere: children of an unscored parent start at 0


def test_calls_with_the_wrong_shape_are_refused() -> None:
    creator = Creator(SEEDS)
    before = snapshot(creator)
    assert creator.observe([]).prompt_ids == [] and snapshot(creator) == before  # nothing
    with pytest.raises(ValueError, match="draw takes a number of prompts >= 1, got 0"):
        creator.draw(0)
    batch = creator.draw(1)
    with pytest.raises(ValueError, match="release takes a list of prompt ids, got the text"):
        creator.release(batch[0]["prompt_id"])
    assert creator.release([batch[0]["prompt_id"]]) == 1


# --- random sequences -----------------------------------------------------------------------

# One step of a trainer: draw k; observe some outstanding prompts (a fraction, a rewards seed,
# and a kind of mistake or none); release some; save and load (the state round trip); or turn
# the rewriter's failure on or off.
STEP = st.one_of(
    st.tuples(st.just("draw"), st.integers(1, 6)),
    st.tuples(
        st.just("observe"),
        st.floats(0.0, 1.0),
        st.integers(0, 2**16),
        st.sampled_from(["none", "none", "none", "unknown", "twice", "empty", "text"]),
    ),
    st.tuples(st.just("release"), st.floats(0.0, 1.0)),
    st.tuples(
        st.just("state"),
    ),
    st.tuples(st.just("fail"), st.booleans()),
)


def apply(creator: Creator, rewriter: Rewriter, step: tuple[Any, ...]) -> Creator:
    """Run one step; a refused call must leave the creator exactly as it was. The rewriter fails
    on demand only when it runs inside ``observe`` (lag 0): in an executor, a state loaded while
    it is down would run a lagged evolution the other creator ran while it was up."""
    kind = step[0]
    if kind == "fail":
        rewriter.fail = step[1] and not creator.evolve_lag
        return creator
    if kind == "state":
        restored = Creator.from_state(
            SEEDS, json.loads(snapshot(creator)), rewriter=rewriter, executor=creator.executor
        )
        assert snapshot(restored) == snapshot(creator)
        return restored
    out = creator.outstanding.records()
    if kind == "draw":
        creator.draw(step[1])
        return creator
    if kind == "release":
        creator.release([r["prompt_id"] for r in out[: round(step[1] * len(out))]])
        return creator
    _, share, seed, mistake = step
    chosen = out[: round(share * len(out))]
    batch: list[Any] = [
        (r["prompt_id"], [float((seed >> i) % 3) for i in range(1 + (seed + j) % 4)])
        for j, r in enumerate(chosen)
    ]
    if mistake == "unknown":
        batch.append(("never-drawn", [1.0]))
    elif mistake == "twice" and batch:
        batch.append(batch[0])
    elif mistake == "empty" and batch:
        batch[-1] = (batch[-1][0], [])
    elif mistake == "text" and batch:
        batch[-1] = (batch[-1][0], ["high"])
    before = snapshot(creator)
    try:
        creator.observe(batch)
    except ConnectionError:  # the rewriter raised
        assert rewriter.fail and snapshot(creator) == before
    except ValueError:  # a bad group
        assert mistake != "none" and snapshot(creator) == before
    return creator


def books_balance(creator: Creator) -> None:
    s = creator.stats
    assert s.drawn == s.observed + s.released + len(creator.outstanding.records())
    assert 0 <= s.failed_parents <= s.parents
    # every drawn prompt is a seed or was a child in B
    assert all(r["depth"] == 0 or r["source"] == "evolved" for r in creator.outstanding.records())
    json.loads(snapshot(creator))  # strict JSON


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(STEP, max_size=40), cut=st.integers(0, 40), lag=st.sampled_from([0, 1]))
def test_any_sequence_keeps_the_books_and_resumes_exactly(steps, cut, lag) -> None:
    """Run the steps on one creator; at ``cut``, save it and go on from the saved state as well:
    after every step the books balance, and the resumed creator ends where the other does."""
    with ThreadPoolExecutor(1) as pool:
        rewriter = Rewriter()
        options: dict[str, Any] = dict(rewriter=rewriter, size=6, n_new=2, n_new_bootstrap=1)
        if lag:
            options |= dict(evolve_lag=1, executor=pool)
        creator = Creator(SEEDS, **options)
        resumed: Creator | None = None
        for i, step in enumerate(steps):
            if i == cut:
                saved = json.loads(snapshot(creator))
                resumed = Creator.from_state(SEEDS, saved, rewriter=rewriter, executor=pool)
            creator = apply(creator, rewriter, step)
            if resumed is not None:
                resumed = apply(resumed, rewriter, step)
                assert snapshot(resumed) == snapshot(creator)
            books_balance(creator)
        creator.flush()
        books_balance(creator)


def test_a_rewrite_may_carry_its_own_instruction_columns() -> None:
    rewriter = Rewriter()
    creator = Creator(SEEDS, rewriter=rewriter, size=4, top_fraction=0.5)
    batch = creator.draw(2)
    columns = {"instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]}
    rewriter.answer = [[("Answer without any comma: how much is 2 times 3?", "if", columns)]]
    creator.observe([(batch[0]["prompt_id"], [1.0, 0.0]), (batch[1]["prompt_id"], [1.0, 1.0])])
    (child,) = [e.record for e in creator.buffer.entries]
    assert child["instruction_id_list"] == ["punctuation:no_comma"] and child["kwargs"] == "[{}]"
    # cells that are not instructions are refused before anything changes
    batch = creator.draw(2)
    before = snapshot(creator)
    rewriter.answer = [[("Another question here?", "if", {"kwargs": "[]"})]]
    with pytest.raises(ValueError, match="where a mapping with instruction_id_list"):
        creator.observe([(r["prompt_id"], [1.0, 0.0]) for r in batch])
    assert snapshot(creator) == before

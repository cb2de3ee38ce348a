"""``mix_prompt_sets`` against the obvious Python version of its documented rule.

The rule: drop evolved prompts whose id is an id of X_{t-1}; draw ``round(ratio * size)`` of the
remaining evolved prompts and fill the rest from X_{t-1}, each draw a permutation of the
candidates from one seeded generator, then shuffle the union with the same generator. These
tests pin that rule bit for bit (same rows, same order, same schema) on hand-made tables and on
random ones, with ids that collide, repeat, are empty, long, non-ASCII, or differ only by
trailing NUL bytes, in chunked, sliced and ``large_string`` columns.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pytest

import eva_core.idset as idset
from eva_core.mixing import mix_prompt_sets
from eva_core.schema import PROMPT_SCHEMA, seed_records


def reference_mix(
    current: pa.Table, evolved: pa.Table, ratio: float, seed: int, size: int | None = None
) -> tuple[pa.Table, dict[str, int]]:
    rng = np.random.default_rng(seed)
    size = current.num_rows if size is None else size
    cur_rows = current.select(PROMPT_SCHEMA.names).to_pylist()
    evo_rows = evolved.select(PROMPT_SCHEMA.names).to_pylist()
    cur_ids = {r["prompt_id"] for r in cur_rows}
    fresh = [i for i, r in enumerate(evo_rows) if r["prompt_id"] not in cur_ids]
    want = round(ratio * size)
    n_evolved = min(want, len(fresh))
    n_original = min(size - n_evolved, len(cur_rows))
    assert n_evolved + n_original == size, "the reference only covers feasible mixes"
    picked = [evo_rows[i] for i in rng.permutation(np.array(fresh, dtype=np.int64))[:n_evolved]]
    picked += [cur_rows[i] for i in rng.permutation(len(cur_rows))[:n_original]]
    rows = [picked[i] for i in rng.permutation(len(picked))]
    stats = {
        "size": size,
        "evolved": n_evolved,
        "original": n_original,
        "evolved_available": len(fresh),
        "dropped_duplicate_of_existing": len(evo_rows) - len(fresh),
        "evolved_shortfall": want - n_evolved,
    }
    return pa.Table.from_pylist(rows, schema=PROMPT_SCHEMA), stats


def _table(
    ids: Sequence[str | None], source: str, tag: str, id_type: pa.DataType | None = None
) -> pa.Table:
    n = len(ids)
    return pa.table(
        {
            "prompt_id": pa.array(ids, id_type or pa.string()),
            "prompt": [f"{tag}{i}" for i in range(n)],
            "source": [source] * n,
            "parent_id": [None if i % 3 else f"par{i}" for i in range(n)],
            "root_id": [f"root{i % 4}" for i in range(n)],
            "depth": pa.array([i % 3 for i in range(n)], pa.int32()),
            "iteration": pa.array([1] * n, pa.int32()),
            "evolve_method": [None if i % 2 else "deepen" for i in range(n)],
            "category": [None if i % 5 == 0 else f"cat{i % 2}" for i in range(n)],
            "instruction_id_list": pa.array(
                [None if i % 2 else ["punctuation:no_comma"] * (i % 3 + 1) for i in range(n)],
                pa.list_(pa.string()),
            ),
            "kwargs": [None if i % 2 else json.dumps([{}] * (i % 3 + 1)) for i in range(n)],
        }
    )


def _check(
    current: pa.Table, evolved: pa.Table, ratio: float, seed: int, size: int | None = None
) -> pa.Table:
    mixed, stats = mix_prompt_sets(current, evolved, ratio, seed, size)
    expected, expected_stats = reference_mix(current, evolved, ratio, seed, size)
    assert mixed.schema == PROMPT_SCHEMA
    assert mixed.equals(expected)
    assert stats.as_dict() == expected_stats
    return mixed


def test_pinned_output_on_a_hand_made_table() -> None:
    current = seed_records([f"q{i}" for i in range(6)])
    evolved = seed_records(["Q1", "q2 ", "new a", "new b", "new c", "new d"])  # two repeat X_t-1
    mixed, stats = mix_prompt_sets(current, evolved, ratio_evolved=0.5, seed=7)
    # Recorded from the implementation this rule was first written as (pc.is_in, one take).
    assert mixed.column("prompt").to_pylist() == ["q1", "new b", "q0", "new a", "new c", "q5"]
    assert stats.as_dict() == {
        "size": 6,
        "evolved": 3,
        "original": 3,
        "evolved_available": 4,
        "dropped_duplicate_of_existing": 2,
        "evolved_shortfall": 0,
    }
    _check(current, evolved, 0.5, 7)


def test_edge_tables() -> None:
    cur = _table(["a", "b", "b", "", "\u00e9t\u00e9", "x" * 40], "seed", "c")
    # Repeats within evolved are both kept; "a\x00" is not "a", nor "b\x00\x00" "b".
    evo = _table(["a", "a\x00", "b\x00\x00", "", "z", "z", "x" * 40, "x" * 39], "evolved", "e")
    for ratio, size in [(0.8, None), (0.0, None), (1.0, 3), (0.5, 1), (1.0, 1)]:
        _check(cur, evo, ratio, seed=3, size=size)
    # A null id is refused (prompt_id is not nullable), in either table.
    for c, e in [(_table(["a", None], "seed", "c"), evo), (cur, _table([None], "evolved", "e"))]:
        with pytest.raises(ValueError, match="null values to non-nullable"):
            mix_prompt_sets(c, e, 0.8, seed=0, size=2)
    # An empty evolved set, and evolved prompts that all repeat X_t-1: originals only.
    _check(cur, evo.slice(0, 0), 0.8, seed=1)
    # Short evolved ids against a set with long ones (and the reverse) still meet.
    mixed = _check(cur, _table(["a", "b"], "evolved", "e"), 0.8, seed=1)
    assert mixed.column("source").to_pylist() == ["seed"] * 6
    _check(_table(["", "a"], "seed", "c"), _table(["", "", "x" * 30], "evolved", "e"), 0.5, 0)
    _check(_table(["", "y" * 20], "seed", "c"), _table(["", ""], "evolved", "e"), 0.5, 0)
    with pytest.raises(ValueError, match="lower the mix size"):
        mix_prompt_sets(cur, evo, 0.8, seed=0, size=20)


def test_chunked_sliced_and_large_string_ids() -> None:
    cur = _table([f"id{i % 7}" for i in range(20)], "seed", "c")
    evo = _table([f"id{i}" for i in range(30)], "evolved", "e", pa.large_string())
    chunked = pa.concat_tables([evo.slice(0, 11), evo.slice(11, 5), evo.slice(16)])
    assert chunked.column("prompt_id").num_chunks == 3
    _check(cur.slice(3, 15), chunked, 0.8, seed=5)
    _check(pa.concat_tables([cur.slice(0, 2), cur.slice(2)]), evo.slice(4, 20), 0.6, seed=9)


def test_columns_with_one_value_per_table() -> None:
    # source and iteration hold one value per table here; chunks may hold different ones.
    seeds = _table([f"s{i}" for i in range(100)], "seed", "c")
    olds = _table([f"o{i}" for i in range(100)], "evolved", "o").set_column(
        6, "iteration", pa.array([0] * 100, pa.int32())
    )
    current = pa.concat_tables([seeds, olds])  # two chunks, each constant, different values
    evolved = _table([f"e{i}" for i in range(150)], "evolved", "e")
    for ratio in (0.0, 0.3, 0.8, 1.0):
        _check(current, evolved, ratio, seed=4)
    originals = _check(current, evolved, 0.0, seed=4)  # both chunks of X_t-1 in one column
    assert set(originals.column("source").to_pylist()) == {"seed", "evolved"}
    assert set(originals.column("iteration").to_pylist()) == {0, 1}
    _check(seeds, evolved, 0.5, seed=1)  # one value per table, different tables
    _check(seeds, _table([f"e{i}" for i in range(150)], "seed", "e"), 0.5, seed=1)  # same one
    _check(seeds, evolved.slice(0, 0), 0.5, seed=1)  # an empty part
    # One value in the first rows, another (of the same length) further down.
    late = seeds.set_column(8, "category", pa.array(["k1"] * 99 + ["k2"]))
    late = late.set_column(5, "depth", pa.array([0] * 99 + [1], pa.int32()))
    same = evolved.set_column(8, "category", pa.array(["k1"] * 150))
    same = same.set_column(5, "depth", pa.array([0] * 150, pa.int32()))
    mixed = _check(late, same, 0.0, seed=3)
    assert set(mixed.column("category").to_pylist()) == {"k1", "k2"}
    blank = _table(["x", "y", "z"], "", "b")  # a constant empty string
    _check(blank, _table(["u", "v"], "", "e", pa.large_string()), 0.5, seed=2)


def test_colliding_hashes_stay_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every id of a length hashes alike: membership must still compare the ids themselves.
    degenerate = idset._MULTIPLIERS.copy()
    degenerate[1:] = 0  # the words no longer count, only the length
    monkeypatch.setattr(idset, "_MULTIPLIERS", degenerate)
    cur = _table([f"k{i}" for i in range(10)], "seed", "c")
    evo = _table([f"k{i}" for i in range(5, 25)] + ["", "k1\x00"], "evolved", "e")
    _check(cur, evo, 0.8, seed=2)


def test_random_tables_match_the_reference() -> None:
    rnd = random.Random(0)
    alphabet = ["", "a", "b", "ab", "a\x00", "\u00e9", "0123456789abcdef", "x" * 17, "y" * 9]
    for case in range(300):
        pool = alphabet + [f"p{j}" for j in range(rnd.randint(0, 12))]
        n_cur, n_evo = rnd.randint(1, 25), rnd.randint(0, 40)
        cur = _table([rnd.choice(pool) for _ in range(n_cur)], "seed", "c")
        evo = _table([rnd.choice(pool) for _ in range(n_evo)], "evolved", "e")
        ratio = rnd.choice([0.0, 0.25, 0.8, 1.0, rnd.random()])
        size = rnd.choice([None, rnd.randint(1, n_cur)])
        if case % 4 == 0 and n_evo > 2:
            evo = pa.concat_tables([evo.slice(0, 2), evo.slice(2)])
        _check(cur, evo, ratio, seed=case, size=size)

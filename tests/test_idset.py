"""``ids_in`` is exactly ``pc.is_in``: across blocks, chunks, slices and buffer ends."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import eva_core.idset as idset
from eva_core.idset import ids_in


def _expected(ids: pa.ChunkedArray, value_set: pa.ChunkedArray) -> list[bool]:
    return pc.is_in(ids, value_set=value_set.combine_chunks()).to_pylist()


def _chunked(values: list[str], cuts: list[int], type_: pa.DataType) -> pa.ChunkedArray:
    whole = pa.array(values, type_)
    bounds = [0, *sorted(cuts), len(values)]
    return pa.chunked_array([whole.slice(a, b - a) for a, b in itertools.pairwise(bounds)], type_)


def test_many_ids_over_several_blocks() -> None:
    rng = np.random.default_rng(0)
    n = 3 * (1 << 15) + 17
    value_set = [f"{x:x}" * int(rng.integers(1, 4)) for x in rng.integers(0, 1 << 40, n)]
    ids = [f"{x:x}" for x in rng.integers(0, 1 << 40, n)]
    for i in range(0, n, 10):  # every tenth id is in the set
        ids[i] = value_set[(i * 7) % n]
    for type_ in (pa.string(), pa.large_string()):
        got = ids_in(_chunked(ids, [1000, 70000], type_), _chunked(value_set, [5], type_))
        want = _expected(pa.chunked_array([ids], type_), pa.chunked_array([value_set], type_))
        assert got.tolist() == want and sum(want) >= n // 10


def test_small_blocks_and_random_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(idset, "_BLOCK", 3)  # many block edges, and blocks at the buffer's end
    rnd = random.Random(1)
    pool = ["", "a", "b", "ab", "a\x00", "\u00e9", "x" * 8, "x" * 9, "y" * 16, "z" * 64, "0" * 7]
    for _ in range(300):
        ids = [rnd.choice(pool) for _ in range(rnd.randint(0, 20))]
        value_set = [rnd.choice(pool) for _ in range(rnd.randint(0, 20))]
        cuts = [rnd.randint(0, len(ids)) for _ in range(rnd.randint(0, 2))]
        got = ids_in(_chunked(ids, cuts, pa.string()), _chunked(value_set, [], pa.string()))
        assert got.tolist() == [s in set(value_set) for s in ids]


def test_what_it_cannot_hash_goes_to_arrow() -> None:
    long_id = "q" * (idset.MAX_HASHED_BYTES + 1)
    for ids, value_set in [
        (["a", long_id, "b"], [long_id, "b"]),
        (["a", None, "c"], [None, "c"]),  # null is a member where the set holds null
    ]:
        got = ids_in(
            pa.chunked_array([ids], pa.string()), pa.chunked_array([value_set], pa.string())
        )
        want = _expected(
            pa.chunked_array([ids], pa.string()), pa.chunked_array([value_set], pa.string())
        )
        assert got.tolist() == want
    assert ids_in(pa.chunked_array([[b"a"]]), pa.chunked_array([[b"a"]])).tolist() == [True]
    empty = pa.chunked_array([], pa.string())
    assert ids_in(empty, pa.chunked_array([["a"]])).tolist() == []
    assert ids_in(pa.chunked_array([["a"]]), empty).tolist() == [False]


def test_a_hash_depends_on_the_string_alone() -> None:
    out = np.empty(4, dtype=np.uint64)
    assert idset.hash_ids(pa.chunked_array([["a", "", "a", "b" * 40]]), out, tag=0)
    alone = np.empty(2, dtype=np.uint64)
    assert idset.hash_ids(pa.chunked_array([["", "a"]]), alone, tag=0)
    assert out[0] == out[2] == alone[1] and out[1] == alone[0] and len(set(out.tolist())) == 3

"""Building the next prompt set X_t from evolved and original prompts (paper section 3.2).

The paper keeps a share of the previous prompts so the policy does not forget them while it
chases the frontier: X_t = ``ratio_evolved`` (0.8) evolved + the rest drawn from X_{t-1}.
Evolved prompts that repeat a prompt of X_{t-1} (after normalization) are dropped first, and if
too few evolved prompts remain the shortfall is filled with more originals and reported.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa

from eva_core.idset import ids_in, string_buffers
from eva_core.schema import PROMPT_SCHEMA, prompt_records


@dataclass(frozen=True)
class MixStats:
    size: int
    evolved: int
    original: int
    evolved_available: int
    dropped_duplicate_of_existing: int
    evolved_shortfall: int  # evolved slots filled with originals because too few evolved

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def mix_prompt_sets(
    current: pa.Table,
    evolved: pa.Table,
    ratio_evolved: float,
    seed: int,
    size: int | None = None,
) -> tuple[pa.Table, MixStats]:
    """Mix ``evolved`` into ``current``; deterministic for a given ``seed``.

    ``size`` defaults to ``len(current)``. The result is shuffled so a solver that reads it in
    order does not see all evolved prompts first.
    """
    if not 0.0 <= ratio_evolved <= 1.0:
        raise ValueError(f"ratio_evolved must be in [0, 1], got {ratio_evolved}")
    size = current.num_rows if size is None else size
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    rng = np.random.default_rng(seed)

    fresh = ~ids_in(evolved.column("prompt_id"), current.column("prompt_id"))
    n_fresh = int(fresh.sum())

    want_evolved = round(ratio_evolved * size)
    n_evolved = min(want_evolved, n_fresh)
    n_original = min(size - n_evolved, current.num_rows)
    if n_evolved + n_original < size:
        raise ValueError(
            f"cannot build {size} prompts from {current.num_rows} originals and {n_fresh} "
            "new evolved prompts; lower the mix size"
        )

    evolved_pick = rng.permutation(np.flatnonzero(fresh))[:n_evolved]
    original_pick = rng.permutation(current.num_rows)[:n_original]
    # One shuffled take over both tables: gathering string columns dominates at scale.
    both = pa.concat_tables([prompt_records(evolved), prompt_records(current)])
    rows = np.concatenate([evolved_pick, evolved.num_rows + original_pick])
    # rng.permutation(rows) is rows[rng.permutation(len(rows))] (one shuffle, the same swaps)
    # without a gather.
    mixed = _take(both, rng.permutation(rows), evolved.num_rows).cast(PROMPT_SCHEMA)
    stats = MixStats(
        size=mixed.num_rows,
        evolved=n_evolved,
        original=n_original,
        evolved_available=n_fresh,
        dropped_duplicate_of_existing=evolved.num_rows - n_fresh,
        evolved_shortfall=want_evolved - n_evolved,
    )
    return mixed, stats


def _take(table: pa.Table, indices: np.ndarray, split: int) -> pa.Table:
    """``table.take(indices)`` for a table whose rows below ``split`` come from one table and
    the rest from another. Gathering strings dominates, so a column that is null in every row
    stays nulls, and one that holds a single value in each part (``source``, ``iteration``) is
    rebuilt from which part each index falls in; every other column is gathered."""
    index = pa.array(indices)
    part: pa.Array | None = None  # per row of the result: 0 from the first table, 1 the second
    columns = []
    for col in table.columns:
        if col.null_count == len(col):
            columns.append(pa.nulls(len(index), col.type))
            continue
        values = _part_values(col, split)
        if values is None:
            columns.append(col.take(index))
            continue
        if part is None:
            part = pa.array((indices >= split).astype(np.int8))
        dictionary = pa.array(values, col.type)
        columns.append(pa.DictionaryArray.from_arrays(part, dictionary).cast(col.type))
    return pa.Table.from_arrays(columns, schema=table.schema)


def _part_values(col: pa.ChunkedArray, split: int) -> list[object] | None:
    """The one value of each part of ``col`` (rows below ``split``, the rest), or None if a
    part holds more than one value, or nulls, or values this does not compare exactly."""
    values = []
    for piece in (col.slice(0, split), col.slice(split)):
        if len(piece) == 0:
            continue
        value = _single_value(piece)
        if value is None:
            return None
        values.append(value[0])
    return values * 2 if len(values) == 1 else values


def _single_value(piece: pa.ChunkedArray) -> tuple[object] | None:
    if piece.null_count:
        return None
    head = piece.slice(0, 64).to_pylist()  # most columns differ within their first rows
    if any(v != head[0] for v in head):
        return None
    for chunk in piece.chunks:  # each chunk equal to the first row of the piece, bytewise
        if len(chunk) and (chunk[0].as_py() != head[0] or not _all_equal(chunk)):
            return None
    return (head[0],)


def _all_equal(chunk: pa.Array) -> bool:
    """Whether every value of a null-free chunk is bytewise its first value; False for types
    other than integers and strings (floats: -0.0 equals 0.0, NaN never equals)."""
    if pa.types.is_integer(chunk.type):
        values = chunk.to_numpy()
        return bool((values == values[0]).all())
    if not (pa.types.is_string(chunk.type) or pa.types.is_large_string(chunk.type)):
        return False
    offsets, data_buf = string_buffers(chunk)
    size = int(offsets[1] - offsets[0])
    if not (np.diff(offsets) == size).all():
        return False
    if size == 0:
        return True
    assert data_buf is not None  # values of size > 0 have bytes
    data = np.frombuffer(data_buf, dtype=np.uint8, count=size * len(chunk), offset=int(offsets[0]))
    return np.array_equal(data[size:], data[:-size])  # each byte equals the one a value before

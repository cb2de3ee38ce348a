"""Building the next prompt set X_t from evolved and original prompts (paper section 3.2).

The paper keeps a share of the previous prompts so the policy does not forget them while it
chases the frontier: X_t = ``ratio_evolved`` (0.8) evolved + the rest drawn from X_{t-1}.
Evolved prompts that repeat a prompt of X_{t-1} (after normalization) are dropped first, and if
too few evolved prompts remain the shortfall is filled with more originals and reported.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from eva_core.schema import PROMPT_SCHEMA, prompt_records

# Odd 64-bit multipliers (splitmix64 / xxhash / murmur3 constants) for the id hash.
_MULTIPLIERS = np.array(
    [0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93,
     0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53, 0x94D049BB133111EB, 0xBF58476D1CE4E5B9,
     0x2545F4914F6CDD1D],
    dtype=np.uint64,
)  # fmt: skip
_MAX_WORDS = len(_MULTIPLIERS) - 1  # ids up to 64 bytes are hashed; longer ones use pc.is_in
# _LOW_BYTES[r] keeps the first r bytes of a little-endian word (0 <= r <= 8).
_LOW_BYTES = np.array([(1 << (8 * r)) - 1 for r in range(9)], dtype=np.uint64)


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

    fresh = ~_ids_in(evolved.column("prompt_id"), current.column("prompt_id"))
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
    mixed = _take(both, rows[rng.permutation(len(rows))]).cast(PROMPT_SCHEMA)
    stats = MixStats(
        size=mixed.num_rows,
        evolved=n_evolved,
        original=n_original,
        evolved_available=n_fresh,
        dropped_duplicate_of_existing=evolved.num_rows - n_fresh,
        evolved_shortfall=want_evolved - n_evolved,
    )
    return mixed, stats


def _ids_in(ids: pa.ChunkedArray, value_set: pa.ChunkedArray) -> np.ndarray:
    """``pc.is_in(ids, value_set)`` as a boolean array, exactly, without hashing strings twice.

    Arrow's ``is_in`` builds a hash table of a million strings (~0.15 s). Instead each id is
    hashed to 64 bits with numpy over the raw string buffers, the two hash sets are intersected
    by one sort, and only ids whose hash occurs on both sides are compared as strings, with
    ``pc.is_in`` over just those: a hash collision costs a comparison, never a wrong answer.
    """
    hashes = [_id_hashes_or_none(c) for c in (ids, value_set)]
    if hashes[0] is None or hashes[1] is None:  # nulls, long ids or another type: Arrow's way
        seen = pc.is_in(ids, value_set=value_set.combine_chunks())
        return np.asarray(seen.to_numpy(zero_copy_only=False), dtype=bool)
    # Tag each hash with its side in the low bit (its top bit makes way); after sorting, a
    # value-set key (even) is directly followed by an id key (odd) exactly when that hash
    # occurs on both sides.
    one = np.uint64(1)
    key_ids, key_set = (hashes[0] << one) | one, hashes[1] << one
    keys = np.concatenate([key_set, key_ids])
    keys.sort()
    both = keys[1:][((keys[1:] - keys[:-1]) == one) & ((keys[:-1] & one) == 0)]
    seen = np.zeros(len(key_ids), dtype=bool)
    if len(both) == 0:
        return seen
    candidates = np.flatnonzero(_is_in_array(key_ids, pa.array(both)))
    matches = value_set.take(np.flatnonzero(_is_in_array(key_set | one, pa.array(both))))
    exact = pc.is_in(ids.take(candidates), value_set=matches.combine_chunks())
    seen[candidates] = np.asarray(exact.to_numpy(zero_copy_only=False), dtype=bool)
    return seen


def _is_in_array(values: np.ndarray, value_set: pa.Array) -> np.ndarray:
    return np.asarray(pc.is_in(values, value_set=value_set).to_numpy(zero_copy_only=False))


def _id_hashes_or_none(ids: pa.ChunkedArray) -> np.ndarray | None:
    if ids.null_count or not (pa.types.is_string(ids.type) or pa.types.is_large_string(ids.type)):
        return None
    parts = []
    for chunk in ids.chunks:
        hashes = _id_hashes(chunk)
        if hashes is None:
            return None
        parts.append(hashes)
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)


def _id_hashes(ids: pa.Array) -> np.ndarray | None:
    """A 64-bit hash per string (its bytes and its length), or None for ids over 64 bytes.

    Each string is read as little-endian 8-byte words through an unaligned view of the data
    buffer, the bytes past its end masked off; each word is mixed (xorshift, then an odd
    multiplier of its own position) and the words and the length summed.
    """
    n = len(ids)
    offsets_buf, data_buf = ids.buffers()[1:3]
    if n == 0:
        return np.zeros(0, dtype=np.uint64)
    dtype = np.int64 if pa.types.is_large_string(ids.type) else np.int32
    offsets = np.frombuffer(
        offsets_buf, dtype=dtype, count=n + 1, offset=ids.offset * dtype(0).itemsize
    )
    first, size = int(offsets[0]), int(offsets[-1] - offsets[0])
    lengths = np.diff(offsets)
    n_words = (int(lengths.max()) + 7) // 8
    if n_words > _MAX_WORDS:
        return None
    padded = np.zeros(size + 8, dtype=np.uint8)  # 8 spare bytes: the last word read stays inside
    if size:
        padded[:size] = np.frombuffer(data_buf, dtype=np.uint8, count=size, offset=first)
    words = np.ndarray((size + 1,), dtype=np.uint64, buffer=padded, strides=(1,))
    starts = offsets[:-1] - first
    with np.errstate(over="ignore"):
        # A sum of per-word terms that are 0 for a word past the string's end, so the hash does
        # not depend on the longest id of the column it came from.
        acc = lengths.astype(np.uint64) * _MULTIPLIERS[0]
        for k in range(n_words):
            rest = lengths - 8 * k
            word = words[starts if k == 0 else np.minimum(starts + 8 * k, size)]
            word &= _LOW_BYTES[np.clip(rest, 0, 8) if k else np.minimum(rest, 8)]
            word ^= word >> np.uint64(31)
            word *= _MULTIPLIERS[k + 1]
            acc += word
        acc ^= acc >> np.uint64(32)
    return acc


def _take(table: pa.Table, indices: np.ndarray) -> pa.Table:
    """``table.take(indices)``, a column per thread (Arrow's take releases the GIL and the
    string columns dominate); a column that is null in every row stays nulls without a gather."""
    index = pa.array(indices)

    def column(col: pa.ChunkedArray) -> pa.ChunkedArray | pa.Array:
        if col.null_count == len(col):
            return pa.nulls(len(index), col.type)
        return col.take(index)

    workers = max(1, min(pa.cpu_count(), table.num_columns))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        columns = list(pool.map(column, table.columns))
    return pa.Table.from_arrays(columns, schema=table.schema)

"""Exact membership of string ids in another set of string ids, fast on millions of ids.

Arrow's ``pc.is_in`` builds a hash table of every string of the value set, which at a million
prompt ids is most of the mix stage's time. ``ids_in`` instead hashes each id to 64 bits with
numpy straight from the Arrow string buffers, intersects the two sets of hashes with one sort,
and compares as strings (``pc.is_in`` again) only the ids whose hash occurs on both sides. A
hash collision therefore costs a string comparison, never a wrong answer; the result is
exactly ``pc.is_in(ids, value_set=value_set)``.

The work runs in blocks of rows so that its temporaries stay in cache and are not fresh memory
each time (page faults were a large share of the first, whole-column version).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# Odd 64-bit multipliers (splitmix64 / xxhash / murmur3 constants), one per 8-byte word.
_MULTIPLIERS = np.array(
    [0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93,
     0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53, 0x94D049BB133111EB, 0xBF58476D1CE4E5B9,
     0x2545F4914F6CDD1D],
    dtype=np.uint64,
)  # fmt: skip
MAX_HASHED_BYTES = 8 * (len(_MULTIPLIERS) - 1)  # longer ids go to pc.is_in whole
# _LOW_BYTES[r] keeps the first r bytes of a little-endian word (0 <= r <= 8).
_LOW_BYTES = np.array([(1 << (8 * r)) - 1 for r in range(9)], dtype=np.uint64)
_BLOCK = 1 << 15  # rows per block: a block's temporaries are 256 KiB
_ONE = np.uint64(1)


def ids_in(ids: pa.ChunkedArray, value_set: pa.ChunkedArray) -> np.ndarray:
    """``pc.is_in(ids, value_set=value_set)`` as a numpy boolean array, exactly."""
    n_set = len(value_set)
    # One array of tagged keys: a hash shifted left by one, the low bit 0 for the value set
    # and 1 for the ids. Sorted, a value-set key is directly followed by the same key + 1
    # exactly when its hash also belongs to an id.
    keys = np.empty(n_set + len(ids), dtype=np.uint64)
    if not (hash_ids(value_set, keys[:n_set], tag=0) and hash_ids(ids, keys[n_set:], tag=1)):
        seen = pc.is_in(ids, value_set=value_set.combine_chunks())  # nulls, long ids, binary
        return np.asarray(seen.to_numpy(zero_copy_only=False), dtype=bool)
    keys.sort()
    shared = keys[_adjacent_pairs(keys) + 1]  # the id-tagged keys of hashes on both sides
    del keys
    seen = np.zeros(len(ids), dtype=bool)
    if len(shared) == 0:
        return seen
    # Rare (a repeat, or a collision): find the rows behind the shared hashes, compare strings.
    common = pa.array(shared)
    candidates = _rows_with_keys(ids, common)
    matches = value_set.take(_rows_with_keys(value_set, common))
    exact = pc.is_in(ids.take(candidates), value_set=matches.combine_chunks())
    seen[candidates] = np.asarray(exact.to_numpy(zero_copy_only=False), dtype=bool)
    return seen


def _adjacent_pairs(keys: np.ndarray) -> np.ndarray:
    """Positions i with keys[i + 1] == keys[i] ^ 1 (sorted keys: an even key, then its odd)."""
    found = []
    step = np.empty(_BLOCK, dtype=np.uint64)
    for start in range(0, len(keys) - 1, _BLOCK):
        stop = min(start + _BLOCK, len(keys) - 1)
        xor = np.bitwise_xor(keys[start + 1 : stop + 1], keys[start:stop], out=step[: stop - start])
        hits = np.flatnonzero(xor == _ONE)
        if len(hits):
            found.append(hits + start)
    return np.concatenate(found) if found else np.zeros(0, dtype=np.intp)


def _rows_with_keys(ids: pa.ChunkedArray, keys: pa.Array) -> np.ndarray:
    tagged = np.empty(len(ids), dtype=np.uint64)
    hash_ids(ids, tagged, tag=1)
    return np.flatnonzero(pc.is_in(tagged, value_set=keys).to_numpy(zero_copy_only=False))


def hash_ids(ids: pa.ChunkedArray, out: np.ndarray, tag: int) -> bool:
    """Write each id's 64-bit hash, shifted left by one with ``tag`` in the low bit, to ``out``.

    False (``out`` unspecified) for ids this cannot hash: nulls, ids over
    ``MAX_HASHED_BYTES``, or a type other than string / large_string.
    """
    if ids.null_count or not (pa.types.is_string(ids.type) or pa.types.is_large_string(ids.type)):
        return False
    position = 0
    for chunk in ids.chunks:
        if not _hash_chunk(chunk, out[position : position + len(chunk)], np.uint64(tag)):
            return False
        position += len(chunk)
    return True


def string_buffers(strings: pa.Array) -> tuple[np.ndarray, pa.Buffer | None]:
    """A string or large_string array's value offsets (``len + 1`` of them, the array's own
    slice of the buffer) and its data buffer, both without a copy."""
    offsets_buf, data_buf = strings.buffers()[1:3]
    width = 8 if pa.types.is_large_string(strings.type) else 4
    offsets = np.frombuffer(
        offsets_buf,
        dtype=np.int64 if width == 8 else np.int32,
        count=len(strings) + 1,
        offset=strings.offset * width,
    )
    return offsets, data_buf


def _hash_chunk(ids: pa.Array, out: np.ndarray, tag: np.uint64) -> bool:
    """Each string is read as little-endian 8-byte words through an unaligned view of the data
    buffer, the bytes past its end masked off; each word is mixed (xorshift, then an odd
    multiplier of its own position) and the words and the length are summed, so a string's
    hash does not depend on the other strings of its column."""
    n = len(ids)
    if n == 0:
        return True
    offsets, data_buf = string_buffers(ids)
    lengths = np.diff(offsets)
    if int(lengths.max()) > MAX_HASHED_BYTES:
        return False
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf else np.zeros(0, dtype=np.uint8)
    for start in range(0, n, _BLOCK):
        stop = min(start + _BLOCK, n)
        low, high = int(offsets[start]), int(offsets[stop])
        if high + 8 <= len(data):  # every word read stays inside the buffer
            base, source = low, data
        else:  # the block reaches the buffer's end: read a copy with 8 spare bytes
            base, source = 0, np.zeros(high - low + 8, dtype=np.uint8)
            source[: high - low] = data[low:high]
        words = np.ndarray(
            (high - low + 1,), dtype=np.uint64, buffer=source, offset=base, strides=(1,)
        )
        _hash_block(words, offsets[start:stop] - low, lengths[start:stop], out[start:stop], tag)
    return True


def _hash_block(
    words: np.ndarray, starts: np.ndarray, lengths: np.ndarray, out: np.ndarray, tag: np.uint64
) -> None:
    last = len(words) - 1
    with np.errstate(over="ignore"):
        out[...] = lengths
        out *= _MULTIPLIERS[0]
        for k in range((int(lengths.max()) + 7) // 8):
            rest = lengths - 8 * k
            word = words[starts if k == 0 else np.minimum(starts + 8 * k, last)]
            word &= _LOW_BYTES[np.clip(rest, 0, 8) if k else np.minimum(rest, 8)]
            word ^= word >> np.uint64(31)
            word *= _MULTIPLIERS[k + 1]
            out += word
        out ^= out >> np.uint64(32)
        out <<= _ONE
        out |= tag

"""Spark's ``xxhash64(key, seqno)`` and the reconciliation checksum built from it, over whole
Arrow columns at once: the vectorized twin of :func:`pipelines.quality.small.sql.xxhash64`
and :func:`pipelines.quality.small.measures.checksum`, equal to them row for row.

The hash runs in numpy ``uint64`` arithmetic (which wraps modulo 2^64, as XXH64 wants). The
loops go over byte and lane positions within a key (up to the longest key), never over rows:
each step works on the rows long enough to have that position.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from pipelines.quality.measures import CHECKSUM_MODULUS
from pipelines.quality.small.sql import SPARK_HASH_SEED

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]
Mask = npt.NDArray[np.bool_]

_P1, _P2, _P3 = (
    np.uint64(0x9E3779B185EBCA87),
    np.uint64(0xC2B2AE3D27D4EB4F),
    np.uint64(0x165667B19E3779F9),
)
_P4, _P5 = np.uint64(0x85EBCA77C2B2AE63), np.uint64(0x27D4EB2F165667C5)
_PAD = 8  # zero bytes after the keys' data: an 8-byte read at any key's byte stays in bounds
_SUM_BLOCK = 1 << 30  # rows per partial sum: 2^30 halves of 32 bits cannot overflow 64 bits
_OFFSET_TYPES = {
    pa.binary(): np.int32,
    pa.string(): np.int32,
    pa.large_binary(): np.int64,
    pa.large_string(): np.int64,
}


class _Keys(NamedTuple):
    """A binary column's bytes, zero-padded, with each key's start and length in them."""

    data: npt.NDArray[np.uint8]
    starts: I64
    lengths: I64
    valid: Mask


def _valid(array: pa.Array) -> Mask:
    if array.null_count == 0:
        return np.ones(len(array), dtype=np.bool_)
    return np.asarray(array.is_valid().to_numpy(zero_copy_only=False), dtype=np.bool_)


def _combined(array: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(array, pa.ChunkedArray):
        return array.combine_chunks() if array.num_chunks else pa.array([], array.type)
    return array


def _key_parts(keys: pa.Array | pa.ChunkedArray) -> _Keys:
    """The keys' bytes read from the Arrow buffers (a slice's ``offset`` minded)."""
    keys = _combined(keys)
    offset_type = _OFFSET_TYPES.get(keys.type)
    if offset_type is None:
        raise TypeError(f"keys must be binary or string, not {keys.type}")
    n = len(keys)
    _, offsets_buffer, data_buffer = keys.buffers()
    if n == 0:
        offsets = np.zeros(1, dtype=np.int64)
    else:
        itemsize = np.dtype(offset_type).itemsize
        offsets = np.frombuffer(
            offsets_buffer, dtype=offset_type, count=n + 1, offset=keys.offset * itemsize
        ).astype(np.int64)
    first, last = int(offsets[0]), int(offsets[-1])
    data = np.zeros(last - first + _PAD, dtype=np.uint8)
    if last > first:
        data[: last - first] = np.frombuffer(data_buffer, dtype=np.uint8)[first:last]
    return _Keys(data, offsets[:-1] - first, np.diff(offsets), _valid(keys))


def _unaligned(data: npt.NDArray[np.uint8], dtype: str) -> npt.NDArray[np.unsignedinteger]:
    """A view of ``data`` as little-endian words starting at every byte (stride 1)."""
    size = np.dtype(dtype).itemsize
    return np.ndarray((len(data) - size + 1,), dtype=dtype, buffer=data, strides=(1,))


def _rotl(x: U64, r: int) -> U64:
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


def _round(acc: U64, lane: U64) -> U64:
    return _rotl(acc + lane * _P2, 31) * _P1


def _avalanche(h: U64) -> U64:
    h = (h ^ (h >> np.uint64(33))) * _P2
    h = (h ^ (h >> np.uint64(29))) * _P3
    return h ^ (h >> np.uint64(32))


def _stripes(keys: _Keys, seed: U64, words: npt.NDArray[np.unsignedinteger]) -> U64:
    """XXH64's start for every row: for a key of 32 bytes or more, its 32-byte stripes folded
    through four accumulators and merged; for a shorter one, ``seed + P5``."""
    h = seed + _P5
    long_rows = np.flatnonzero(keys.lengths >= 32)
    if len(long_rows) == 0:
        return h
    s = seed[long_rows]
    acc = [s + _P1 + _P2, s + _P2, s.copy(), s - _P1]
    starts, lengths = keys.starts[long_rows], keys.lengths[long_rows]
    active = np.arange(len(long_rows))
    stripe = 0
    while len(active):
        at = starts[active] + 32 * stripe
        for lane in range(4):
            lanes = words[at + 8 * lane].astype(np.uint64)
            acc[lane][active] = _round(acc[lane][active], lanes)
        stripe += 1
        active = active[lengths[active] >= 32 * (stripe + 1)]
    merged = _rotl(acc[0], 1) + _rotl(acc[1], 7) + _rotl(acc[2], 12) + _rotl(acc[3], 18)
    for v in acc:
        merged = (merged ^ _round(np.zeros_like(v), v)) * _P1 + _P4
    h[long_rows] = merged
    return h


def _xxh64_keys(keys: _Keys, seed: U64) -> U64:
    """XXH64 (unsigned) of every key's bytes, row ``i`` seeded with ``seed[i]``."""
    data, starts, lengths = keys.data, keys.starts, keys.lengths
    words = _unaligned(data, "<u8")
    h = _stripes(keys, seed, words) + lengths.astype(np.uint64)
    rest = lengths % 32
    at = starts + lengths - rest  # the first byte after the stripes
    for lane in range(3):
        rows = np.flatnonzero(rest >= 8 * (lane + 1))
        lanes = words[at[rows] + 8 * lane].astype(np.uint64)
        x = h[rows] ^ _round(np.zeros_like(lanes), lanes)
        h[rows] = _rotl(x, 27) * _P1 + _P4
    rows = np.flatnonzero(lengths % 8 >= 4)
    if len(rows):
        at = starts[rows] + lengths[rows] // 8 * 8
        x = h[rows] ^ (_unaligned(data, "<u4")[at].astype(np.uint64) * _P1)
        h[rows] = _rotl(x, 23) * _P2 + _P3
    for byte in range(3):
        rows = np.flatnonzero(lengths % 4 > byte)
        at = starts[rows] + lengths[rows] // 4 * 4 + byte
        x = h[rows] ^ (data[at].astype(np.uint64) * _P5)
        h[rows] = _rotl(x, 11) * _P1
    return _avalanche(h)


def _xxh64_longs(values: U64, seed: U64) -> U64:
    """XXH64 (unsigned) of every value's eight little-endian bytes, seeded per row."""
    h = seed + _P5 + np.uint64(8)
    h = h ^ _round(np.zeros_like(values), values)
    return _avalanche(_rotl(h, 27) * _P1 + _P4)


def _seqno_parts(seqnos: pa.Array | pa.ChunkedArray | npt.ArrayLike) -> tuple[U64, Mask]:
    """The seqnos as uint64 (two's complement) and which of them are not null."""
    if isinstance(seqnos, pa.Array | pa.ChunkedArray):
        array = _combined(seqnos).cast(pa.int64())
        values = np.asarray(array.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)
        return values.view(np.uint64), _valid(array)
    values = np.asarray(seqnos, dtype=np.int64)
    return values.view(np.uint64), np.ones(len(values), dtype=np.bool_)


def xxhash64_columns(
    keys: pa.Array | pa.ChunkedArray, seqnos: pa.Array | pa.ChunkedArray | npt.ArrayLike
) -> I64:
    """Spark's ``xxhash64(key, seqno)`` of every row, as signed 64-bit values: element ``i``
    is :func:`pipelines.quality.small.sql.xxhash64` of (``keys[i]``, ``seqnos[i]``).

    ``keys``: a binary, large_binary, string or large_string Arrow array (a string hashes as
    its UTF-8 bytes), sliced or chunked, nulls allowed. ``seqnos``: int64, an Arrow array
    (nulls allowed) or a numpy array. A null column is skipped: the hash of the columns
    before it seeds the next."""
    parts = _key_parts(keys)
    values, seqno_valid = _seqno_parts(seqnos)
    if len(values) != len(parts.lengths):
        raise ValueError(f"{len(parts.lengths)} keys but {len(values)} seqnos")
    with np.errstate(over="ignore"):
        seed = np.full(len(values), SPARK_HASH_SEED, dtype=np.uint64)
        h = np.where(parts.valid, _xxh64_keys(parts, seed), seed)
        h = np.where(seqno_valid, _xxh64_longs(values, h), h)
    return h.view(np.int64)


def exact_sum(values: I64) -> int:
    """The sum of signed 64-bit values as an exact Python int: each value split into its high
    (signed) and low (unsigned) 32 bits, each half summed in 64 bits over blocks of rows."""
    total = 0
    for start in range(0, len(values), _SUM_BLOCK):
        block = values[start : start + _SUM_BLOCK]
        high = int(np.sum(block >> np.int64(32), dtype=np.int64))
        low = int(np.sum(block.view(np.uint64) & np.uint64(0xFFFFFFFF), dtype=np.uint64))
        total += (high << 32) + low
    return total


def checksum_columns(
    keys: pa.Array | pa.ChunkedArray,
    seqnos: pa.Array | pa.ChunkedArray | npt.ArrayLike,
    where: Mask | None = None,
) -> int:
    """:func:`pipelines.quality.small.measures.checksum` of the (key, seqno) rows where
    ``where`` is True (every row when it is None): the signed ``xxhash64`` of each row, summed
    exactly and reduced modulo :data:`CHECKSUM_MODULUS`, in ``[0, CHECKSUM_MODULUS)``."""
    hashes = xxhash64_columns(keys, seqnos)
    if where is not None:
        mask = np.asarray(where, dtype=np.bool_)
        if mask.shape != hashes.shape:
            raise ValueError(f"where has shape {mask.shape}, the rows {hashes.shape}")
        hashes = hashes[mask]
    return exact_sum(hashes) % CHECKSUM_MODULUS

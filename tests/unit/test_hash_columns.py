"""The vectorized ``xxhash64`` and checksum (:mod:`pipelines.quality.small.hash_columns`) equal
the row-at-a-time reference (:func:`pipelines.quality.small.sql.xxhash64`, itself checked
against Spark in tests/spark, and :func:`pipelines.quality.small.measures.checksum`) row for
row: keys of every length through the 32-byte stripes, null keys and seqnos, extreme seqnos,
sliced and chunked arrays."""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pytest

from pipelines.quality.measures import CHECKSUM_MODULUS
from pipelines.quality.small.hash_columns import checksum_columns, exact_sum, xxhash64_columns
from pipelines.quality.small.measures import checksum
from pipelines.quality.small.sql import xxhash64

EXTREMES = [-(2**63), -(2**63) + 1, -1, 0, 1, 2**63 - 2, 2**63 - 1]
LETTERS = "aé€😀zß"  # one to four UTF-8 bytes each


def _random_bytes(rng: random.Random, count: int, nulls: bool = True) -> list[bytes | None]:
    keys: list[bytes | None] = [rng.randbytes(rng.randint(0, 100)) for _ in range(count)]
    keys += [bytes(range(n)) for n in range(101)]  # every length 0..100 at least once
    if nulls:
        keys = [None if rng.random() < 0.1 else k for k in keys]
    rng.shuffle(keys)
    return keys


def _random_texts(rng: random.Random, count: int) -> list[str | None]:
    texts: list[str | None] = [
        "".join(rng.choice(LETTERS) for _ in range(rng.randint(0, 40))) for _ in range(count)
    ]
    return [None if rng.random() < 0.1 else t for t in texts]


def _random_seqnos(rng: random.Random, count: int, nulls: bool = True) -> list[int | None]:
    choices: list[Callable[[], int | None]] = [
        lambda: rng.choice(EXTREMES),
        lambda: rng.randint(-(2**63), 2**63 - 1),
    ]
    if nulls:
        choices.append(lambda: None)
    return [rng.choice(choices)() for _ in range(count)]


def _utf8(key: bytes | str | None) -> bytes | None:
    return key.encode() if isinstance(key, str) else key


def _reference(keys: list[bytes | None] | list[str | None], seqnos: list[int | None]) -> list[int]:
    return [xxhash64(_utf8(k), s) for k, s in zip(keys, seqnos, strict=True)]


def test_abc_and_one_is_the_row_reference() -> None:
    """Spark's ``SELECT xxhash64('abc', CAST(1 AS BIGINT))``, as the (Spark-checked) row
    reference gives it."""
    got = xxhash64_columns(pa.array(["abc"]), pa.array([1], pa.int64()))
    assert got.dtype == np.int64
    assert got.tolist() == [xxhash64(b"abc", 1)]


@pytest.mark.parametrize("key_type", [pa.binary(), pa.large_binary()])
def test_binary_keys_equal_the_reference(key_type: pa.DataType) -> None:
    rng = random.Random(7)
    keys = _random_bytes(rng, 400)
    seqnos = _random_seqnos(rng, len(keys))
    got = xxhash64_columns(pa.array(keys, key_type), pa.array(seqnos, pa.int64()))
    assert got.tolist() == _reference(keys, seqnos)


@pytest.mark.parametrize("key_type", [pa.string(), pa.large_string()])
def test_string_keys_hash_as_utf8(key_type: pa.DataType) -> None:
    rng = random.Random(8)
    keys = _random_texts(rng, 300)
    seqnos = _random_seqnos(rng, len(keys))
    got = xxhash64_columns(pa.array(keys, key_type), pa.array(seqnos, pa.int64()))
    assert got.tolist() == _reference(keys, seqnos)


def test_null_columns_are_skipped() -> None:
    keys = [None, None, b"k", b"", b""]
    seqnos = [None, 5, None, None, 0]
    got = xxhash64_columns(pa.array(keys, pa.binary()), pa.array(seqnos, pa.int64()))
    assert got.tolist() == _reference(keys, seqnos)
    assert got[0] == 42  # both null: the seed itself


def test_numpy_seqnos() -> None:
    rng = random.Random(9)
    keys = _random_bytes(rng, 100)
    seqnos = _random_seqnos(rng, len(keys), nulls=False)
    got = xxhash64_columns(pa.array(keys, pa.binary()), np.array(seqnos, dtype=np.int64))
    assert got.tolist() == _reference(keys, seqnos)


def test_sliced_arrays() -> None:
    rng = random.Random(10)
    keys = _random_bytes(rng, 200)
    seqnos = _random_seqnos(rng, len(keys))
    key_array, seqno_array = pa.array(keys, pa.binary()), pa.array(seqnos, pa.int64())
    expected = _reference(keys, seqnos)
    got = xxhash64_columns(key_array.slice(3), seqno_array.slice(3))
    assert got.tolist() == expected[3:]
    got = xxhash64_columns(key_array.slice(5, 50), seqno_array.slice(5, 50))
    assert got.tolist() == expected[5:55]
    texts = _random_texts(rng, 60)
    got = xxhash64_columns(pa.array(texts).slice(3), np.arange(57, dtype=np.int64))
    assert got.tolist() == _reference(texts[3:], list(range(57)))


def test_chunked_arrays() -> None:
    rng = random.Random(11)
    keys = _random_texts(rng, 150)
    seqnos = _random_seqnos(rng, len(keys))
    key_chunks = pa.chunked_array([pa.array(keys[:40]), pa.array(keys[37:]).slice(3)])
    seqno_chunks = pa.chunked_array(
        [pa.array(seqnos[:70], pa.int64()), pa.array(seqnos[70:], pa.int64())]
    )
    got = xxhash64_columns(key_chunks, seqno_chunks)
    assert got.tolist() == _reference(keys, seqnos)
    empty = xxhash64_columns(pa.chunked_array([], pa.string()), np.array([], dtype=np.int64))
    assert empty.dtype == np.int64 and len(empty) == 0


def test_mismatched_lengths_and_key_types_are_refused() -> None:
    with pytest.raises(ValueError):
        xxhash64_columns(pa.array([b"a", b"b"]), np.array([1], dtype=np.int64))
    with pytest.raises(TypeError):
        xxhash64_columns(pa.array([1, 2]), np.array([1, 2], dtype=np.int64))


def test_checksum_equals_the_reference() -> None:
    rng = random.Random(12)
    keys = _random_bytes(rng, 300)
    seqnos = _random_seqnos(rng, len(keys))
    key_array, seqno_array = pa.array(keys, pa.binary()), pa.array(seqnos, pa.int64())
    got = checksum_columns(key_array, seqno_array)
    assert isinstance(got, int)
    assert got == checksum(zip(keys, seqnos, strict=True))
    where = np.array([rng.random() < 0.5 for _ in keys])
    picked = [(k, s) for k, s, w in zip(keys, seqnos, where, strict=True) if w]
    assert checksum_columns(key_array, seqno_array, where) == checksum(picked)
    none = np.zeros(len(keys), dtype=np.bool_)
    assert checksum_columns(key_array, seqno_array, none) == 0


def test_checksum_of_strings_and_slices() -> None:
    rng = random.Random(13)
    keys = _random_texts(rng, 200)
    seqnos = _random_seqnos(rng, len(keys))
    key_array, seqno_array = pa.array(keys), pa.array(seqnos, pa.int64())
    got = checksum_columns(key_array.slice(3), seqno_array.slice(3))
    assert got == checksum(zip(keys[3:], seqnos[3:], strict=True))


def test_exact_sum_does_not_overflow() -> None:
    """Sums far past 64 bits either way stay exact, and the checksum lands in [0, M)."""
    values = np.array([2**63 - 1] * 1000 + [-(2**63)] * 10 + [-1, 1, 12345], dtype=np.int64)
    assert exact_sum(values) == sum(int(v) for v in values)
    negative = np.full(1000, -(2**63), dtype=np.int64)
    assert exact_sum(negative) == -(2**63) * 1000
    assert 0 <= exact_sum(negative) % CHECKSUM_MODULUS < CHECKSUM_MODULUS
    assert exact_sum(np.array([], dtype=np.int64)) == 0

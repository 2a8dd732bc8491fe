"""Spark SQL's value rules, in Python, for the small check's metric frames: how Spark orders
values (a null first, a struct field by field), what its aggregates skip (nulls), how its
``concat`` and ``greatest`` treat a null, and its ``xxhash64``. The small check's frames
equal the Spark check's row for row only if each step keeps these rules.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

_T = TypeVar("_T")

_MASK = (1 << 64) - 1
_P1, _P2, _P3 = 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9
_P4, _P5 = 0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5
SPARK_HASH_SEED = 42
"""The seed of Spark's ``xxhash64`` (``XxHash64`` with its default seed)."""


def order_key(value: Any) -> Any:
    """A sort key ordering values as Spark does ascending: a null before any value, tuples
    (structs) field by field with the same rule."""
    if value is None:
        return (0,)
    if isinstance(value, tuple):
        return (1, tuple(order_key(v) for v in value))
    return (1, value)


def largest(values: Iterable[_T | None]) -> _T | None:
    """``max``: the largest non-null value, null when there is none (the values of one
    column: all structs or none)."""
    found = [v for v in values if v is not None]
    if not found:
        return None
    return max(found, key=order_key) if isinstance(found[0], tuple) else max(found)  # type: ignore[type-var]


def smallest(values: Iterable[_T | None]) -> _T | None:
    """``min``: the smallest non-null value, null when there is none (the values of one
    column: all structs or none)."""
    found = [v for v in values if v is not None]
    if not found:
        return None
    return min(found, key=order_key) if isinstance(found[0], tuple) else min(found)  # type: ignore[type-var]


def max_by(pairs: Iterable[tuple[Any, Any]]) -> Any:
    """``max_by(value, ordering)`` over (value, ordering) pairs: the value of the largest
    non-null ordering (the value may be null)."""
    found = [p for p in pairs if p[1] is not None]
    return max(found, key=lambda p: order_key(p[1]))[0] if found else None


def min_by(pairs: Iterable[tuple[Any, Any]]) -> Any:
    """``min_by(value, ordering)``: the value of the smallest non-null ordering."""
    found = [p for p in pairs if p[1] is not None]
    return min(found, key=lambda p: order_key(p[1]))[0] if found else None


def any_true(values: Iterable[bool | None]) -> bool | None:
    """``max`` of booleans: True if one is, False if all non-null ones are not, null if
    every value is null."""
    return largest(values)


def greatest(*values: Any) -> Any:
    """``greatest``: the largest non-null argument, null when all are."""
    return largest(values)


def text(value: Any) -> str:
    """A value cast to STRING as ``concat`` does it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def concat(*parts: Any) -> str | None:
    """``concat``: null when any part is null."""
    if any(p is None for p in parts):
        return None
    return "".join(text(p) for p in parts)


def coalesce(*values: Any) -> Any:
    for v in values:
        if v is not None:
            return v
    return None


def both(a: bool | None, b: bool | None) -> bool | None:
    """Three-valued AND."""
    if a is False or b is False:
        return False
    if a is None or b is None:
        return None
    return True


def negate(a: bool | None) -> bool | None:
    return None if a is None else not a


def lower_hex(value: int | None) -> str | None:
    """``lower(hex(n))`` of an integer: two's complement over 64 bits for a negative one."""
    return None if value is None else format(value & _MASK, "x")


def group(rows: Iterable[_T], key: Callable[[_T], Any]) -> dict[Any, list[_T]]:
    """Rows by a key, in first-seen order (``groupBy``: a null key is a group of its own)."""
    groups: dict[Any, list[_T]] = {}
    for row in rows:
        groups.setdefault(key(row), []).append(row)
    return groups


# --- xxhash64 ---------------------------------------------------------------------------------


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _MASK


def _round(acc: int, lane: int) -> int:
    acc = (acc + lane * _P2) & _MASK
    return (_rotl(acc, 31) * _P1) & _MASK


def _merge(acc: int, val: int) -> int:
    acc ^= _round(0, val)
    return (acc * _P1 + _P4) & _MASK


def xxh64(data: bytes, seed: int) -> int:
    """XXH64 of ``data`` (unsigned): the hash Spark's ``xxhash64`` applies to a value's bytes
    (a string's UTF-8, a long's eight little-endian bytes), its seed the previous column's
    hash."""
    n = len(data)
    i = 0
    seed &= _MASK
    if n >= 32:
        v1 = (seed + _P1 + _P2) & _MASK
        v2 = (seed + _P2) & _MASK
        v3 = seed
        v4 = (seed - _P1) & _MASK
        while i + 32 <= n:
            v1 = _round(v1, int.from_bytes(data[i : i + 8], "little"))
            v2 = _round(v2, int.from_bytes(data[i + 8 : i + 16], "little"))
            v3 = _round(v3, int.from_bytes(data[i + 16 : i + 24], "little"))
            v4 = _round(v4, int.from_bytes(data[i + 24 : i + 32], "little"))
            i += 32
        h = (_rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)) & _MASK
        for v in (v1, v2, v3, v4):
            h = _merge(h, v)
    else:
        h = (seed + _P5) & _MASK
    h = (h + n) & _MASK
    while i + 8 <= n:
        h ^= _round(0, int.from_bytes(data[i : i + 8], "little"))
        h = (_rotl(h, 27) * _P1 + _P4) & _MASK
        i += 8
    if i + 4 <= n:
        h ^= (int.from_bytes(data[i : i + 4], "little") * _P1) & _MASK
        h = (_rotl(h, 23) * _P2 + _P3) & _MASK
        i += 4
    while i < n:
        h ^= (data[i] * _P5) & _MASK
        h = (_rotl(h, 11) * _P1) & _MASK
        i += 1
    h ^= h >> 33
    h = (h * _P2) & _MASK
    h ^= h >> 29
    h = (h * _P3) & _MASK
    h ^= h >> 32
    return h


def xxhash64(key: bytes | None, seqno: int | None) -> int:
    """Spark's ``xxhash64(key, seqno)`` of a STRING (its UTF-8 bytes) and a BIGINT, as the
    signed BIGINT Spark returns: each column's hash seeds the next; a null column is
    skipped."""
    h = SPARK_HASH_SEED
    if key is not None:
        h = xxh64(key, h)
    if seqno is not None:
        h = xxh64((seqno & _MASK).to_bytes(8, "little"), h)
    return h - (1 << 64) if h >= 1 << 63 else h

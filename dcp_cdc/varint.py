"""Unsigned LEB128, the one varint rule of the wire: collection-id key prefixes (docs/protocol/dcp.md §3) and
the length preamble of a Snappy block (docs/protocol/dcp.md §2).

Seven bits a byte, low group first, the 0x80 bit set on every byte but the last. Both uses hold
a 32-bit value, so a varint is at most 5 bytes and at most ``0xffffffff``. A varint that breaks
the rule is a :class:`FieldError` worded for where it sits (:class:`Site`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from dcp_cdc.errors import FieldError

if TYPE_CHECKING:
    import numpy.typing as npt

MAX_BYTES = 5
"""A 32-bit value never needs more (docs/protocol/dcp.md §3)."""
MAX_VALUE = 0xFFFF_FFFF
CONTINUATION = 0x80
"""Set on every byte of a varint but its last: a byte below it is a whole one-byte varint."""


class Site(NamedTuple):
    """Where a varint sits, so that its errors say what was being read."""

    error: str
    """Head of every message, e.g. ``bad LEB128 collection id``."""
    part: str
    """The varint itself: ``prefix``, ``length preamble``."""
    container: str
    """What holds it: ``key``, ``block``."""
    value: str
    """What it encodes: ``collection id``."""
    truncated: str | None = None
    """Reason when the container ends inside the varint (default: says just that)."""


COLLECTION_ID = Site("bad LEB128 collection id", "prefix", "key", "collection id")


def read_uleb128(
    buf: bytes | memoryview,
    pos: int = 0,
    end: int | None = None,
    *,
    site: Site = COLLECTION_ID,
) -> tuple[int, int]:
    """``(value, index after the varint)`` for the varint at ``buf[pos:end]``.

    Raises :class:`FieldError` when the varint runs past ``end``, is longer than 5 bytes, or
    encodes a value above 2**32 - 1.
    """
    stop = len(buf) if end is None else end
    result = 0
    shift = 0
    for i in range(MAX_BYTES):
        if pos + i >= stop:
            truncated = site.truncated or f"the {site.container} ends inside the {site.part}"
            raise FieldError(
                f"{site.error}: {truncated}",
                expected="a byte without the 0x80 continuation bit",
                got=f"{i} byte(s) all with it" if i else f"an empty {site.container}",
            )
        b = buf[pos + i]
        result |= (b & 0x7F) << shift
        if not b & CONTINUATION:
            if result > MAX_VALUE:
                raise FieldError(
                    f"{site.error}: value exceeds 32 bits",
                    expected=f"a {site.value} <= 0xffffffff",
                    got=hex(result),
                )
            return result, pos + i + 1
        shift += 7
    raise FieldError(
        f"{site.error}: {site.part} longer than {MAX_BYTES} bytes",
        expected=f"at most {MAX_BYTES} bytes",
        got="more",
    )


def read_uleb128_many(data: Any, start: Any, length: Any) -> tuple[Any, Any, Any]:
    """:func:`read_uleb128` for many varints of one buffer at once.

    Varint ``i`` starts at ``data[start[i]]`` in a container of ``length[i]`` bytes. Returns
    numpy arrays ``(value, size, ok)``: ``ok`` is False where :func:`read_uleb128` would raise
    (``value`` and ``size`` are then meaningless).
    """
    import numpy as np  # only the columnar face needs numpy; the event iterator does not

    u8: npt.NDArray[np.uint8] = np.frombuffer(data, dtype=np.uint8)
    n = len(start)
    value = np.zeros(n, dtype=np.int64)
    size = np.zeros(n, dtype=np.int64)
    done = np.zeros(n, dtype=np.bool_)
    bad = np.zeros(n, dtype=np.bool_)
    if not len(u8):
        return value, size, done
    for i in range(MAX_BYTES):
        present = i < length
        b = u8[np.minimum(start + i, len(u8) - 1)].astype(np.int64)
        open_ = ~done & ~bad
        bad |= open_ & ~present
        take = open_ & present
        value[take] |= (b[take] & 0x7F) << (7 * i)
        last = take & (b < CONTINUATION)
        size[last] = i + 1
        done |= last
    return value, size, done & ~bad & (value <= MAX_VALUE)


def encode_uleb128(value: int) -> bytes:
    """The shortest (canonical) encoding, as KV writes it (docs/protocol/dcp.md §3)."""
    if not 0 <= value <= MAX_VALUE:
        raise ValueError(f"collection id out of range: {value}")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | CONTINUATION)
        else:
            out.append(byte)
            return bytes(out)

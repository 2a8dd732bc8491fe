"""Unsigned LEB128 collection-id prefix of document keys (spec §3)."""

from __future__ import annotations

from dcp_cdc.errors import FieldError

MAX_LEB128_BYTES = 5  # a 32-bit collection id never needs more (spec §3)


def read_uleb128(buf: bytes | memoryview, pos: int = 0, end: int | None = None) -> tuple[int, int]:
    """``(collection_id, index after the prefix)`` for the prefix at ``buf[pos:end]``.

    Raises :class:`FieldError` when the prefix runs past ``end``, is longer than 5 bytes, or
    encodes a value above 2**32 - 1.
    """
    stop = len(buf) if end is None else end
    result = 0
    shift = 0
    for i in range(MAX_LEB128_BYTES):
        if pos + i >= stop:
            raise FieldError(
                "bad LEB128 collection id: the key ends inside the prefix",
                expected="a byte without the 0x80 continuation bit",
                got=f"{i} byte(s) all with it" if i else "an empty key",
            )
        b = buf[pos + i]
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            if result > 0xFFFF_FFFF:
                raise FieldError(
                    "bad LEB128 collection id: value exceeds 32 bits",
                    expected="a collection id <= 0xffffffff",
                    got=hex(result),
                )
            return result, pos + i + 1
        shift += 7
    raise FieldError(
        "bad LEB128 collection id: prefix longer than 5 bytes",
        expected="at most 5 bytes",
        got="more",
    )


def encode_uleb128(value: int) -> bytes:
    """The shortest (canonical) encoding, as KV writes it (spec §3)."""
    if not 0 <= value <= 0xFFFF_FFFF:
        raise ValueError(f"collection id out of range: {value}")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)

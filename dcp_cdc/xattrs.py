"""The XATTR section at the start of a value (docs/protocol/dcp.md §2, Document.md)."""

from __future__ import annotations

import struct

from dcp_cdc.errors import FieldError

_U32 = struct.Struct(">I")


def split_xattrs(value: bytes | memoryview) -> tuple[dict[str, str], bytes]:
    """``(xattrs, body)`` of a (decompressed) value whose datatype has the XATTR bit.

    Layout: u32 total length of the pairs; pairs of u32 pair length, key, NUL, value, NUL.
    """
    data = bytes(value)
    if len(data) < 4:
        raise FieldError(
            "bad XATTR block: value too short for the length word",
            expected="at least 4 bytes",
            got=f"{len(data)} bytes",
        )
    (total,) = _U32.unpack_from(data, 0)
    end = 4 + total
    if end > len(data):
        raise FieldError(
            "bad XATTR block: section longer than the value",
            expected=f"at most {len(data) - 4} bytes",
            got=f"{total} bytes",
        )
    xattrs: dict[str, str] = {}
    pos = 4
    while pos < end:
        if pos + 4 > end:
            raise FieldError("bad XATTR block: truncated pair length")
        (pair_len,) = _U32.unpack_from(data, pos)
        pos += 4
        pair_end = pos + pair_len
        if pair_end > end or pair_len < 2:
            raise FieldError(
                "bad XATTR block: pair runs past the section",
                expected=f"2..{end - pos} bytes",
                got=f"{pair_len} bytes",
            )
        sep = data.find(b"\x00", pos, pair_end)
        raw_key = data[pos:sep]
        raw_val = data[sep + 1 : pair_end - 1]
        if sep < 0 or sep >= pair_end - 1 or data[pair_end - 1] != 0 or b"\x00" in raw_val:
            raise FieldError("bad XATTR block: pair is not key NUL value NUL")
        if not raw_key:
            raise FieldError("bad XATTR block: empty key")
        try:
            key = raw_key.decode("utf-8")
            val = raw_val.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise FieldError("bad XATTR block: key or value is not UTF-8", got=str(exc)) from None
        if key in xattrs:
            raise FieldError(f"bad XATTR block: duplicate key {key!r}")
        xattrs[key] = val
        pos = pair_end
    return xattrs, data[end:]


def join_xattrs(xattrs: dict[str, str], body: bytes) -> bytes:
    """The inverse of :func:`split_xattrs`."""
    pairs = bytearray()
    for key, val in xattrs.items():
        pair = key.encode() + b"\x00" + val.encode() + b"\x00"
        pairs += _U32.pack(len(pair)) + pair
    return _U32.pack(len(pairs)) + bytes(pairs) + body

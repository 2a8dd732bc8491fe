"""A pure-Python Snappy block reader and a literal-only writer: a test oracle for cramjam.

The product decompresses with cramjam only (:mod:`dcp_cdc.snappy`); this reader follows
format_description.txt of google/snappy step by step, so that tests can cross-check cramjam
and the preamble checks both readers share (:func:`dcp_cdc.snappy.preamble`).
"""

from __future__ import annotations

from dcp_cdc.errors import FieldError
from dcp_cdc.snappy import preamble
from dcp_cdc.varint import encode_uleb128


def decompress_pure(block: bytes | memoryview) -> bytes:
    """The pure-Python reader (format_description.txt of google/snappy)."""
    declared, pos = preamble(block)
    data = bytes(block)
    out = bytearray()
    end = len(data)
    while pos < end:
        tag = data[pos]
        pos += 1
        kind = tag & 0x03
        if kind == 0:  # literal
            length = tag >> 2
            if length >= 60:
                extra = length - 59
                if pos + extra > end:
                    raise FieldError("bad Snappy block: truncated literal length")
                length = int.from_bytes(data[pos : pos + extra], "little")
                pos += extra
            length += 1
            if pos + length > end:
                raise FieldError("bad Snappy block: literal runs past the block")
            out += data[pos : pos + length]
            pos += length
            continue
        if kind == 1:
            if pos + 1 > end:
                raise FieldError("bad Snappy block: truncated copy")
            length = 4 + ((tag >> 2) & 0x07)
            offset = ((tag >> 5) << 8) | data[pos]
            pos += 1
        else:
            width = 2 if kind == 2 else 4
            if pos + width > end:
                raise FieldError("bad Snappy block: truncated copy")
            length = (tag >> 2) + 1
            offset = int.from_bytes(data[pos : pos + width], "little")
            pos += width
        if offset == 0 or offset > len(out):
            raise FieldError(
                "bad Snappy block: copy offset outside the output",
                expected=f"1..{len(out)}",
                got=str(offset),
            )
        if len(out) + length > declared:
            raise FieldError("bad Snappy block: output longer than its preamble")
        start = len(out) - offset
        for i in range(length):  # copies may overlap their own output
            out.append(out[start + i])
    if len(out) != declared:
        raise FieldError(
            "bad Snappy block: length differs from preamble",
            expected=f"{declared} bytes",
            got=f"{len(out)} bytes",
        )
    return bytes(out)


def compress_literal(data: bytes) -> bytes:
    """A valid block made only of literals: correct, not small."""
    out = bytearray(encode_uleb128(len(data)))
    pos = 0
    while pos < len(data):
        chunk = data[pos : pos + 65536]
        length = len(chunk) - 1
        if length < 60:
            out.append(length << 2)
        elif length < 256:
            out += bytes([60 << 2, length])
        else:
            out += bytes([61 << 2]) + length.to_bytes(2, "little")
        out += chunk
        pos += len(chunk)
    return bytes(out)

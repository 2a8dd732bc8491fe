"""Snappy raw block format (spec §2: the *block* format, not the framing format).

Decompression uses cramjam when it is installed and a small pure-Python reader otherwise, so
the decoder core imports with the standard library alone. Both report a bad block as
:class:`FieldError`; tests check that they agree.
"""

from __future__ import annotations

from types import ModuleType

from dcp_cdc.errors import FieldError

_cramjam: ModuleType | None
try:  # pragma: no cover - exercised by whichever environment runs the tests
    import cramjam as _cramjam
except ImportError:  # pragma: no cover
    _cramjam = None

MAX_UNCOMPRESSED = 64 * 1024 * 1024
MAX_RATIO = 22
"""One 3-byte copy element yields at most 64 bytes, so a block never expands beyond this."""


def uncompressed_length(block: bytes | memoryview) -> tuple[int, int]:
    """``(declared length, preamble size)`` from the varint preamble."""
    result = shift = 0
    for i in range(5):
        if i >= len(block):
            raise FieldError("bad Snappy block: truncated length preamble")
        b = block[i]
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i + 1
        shift += 7
    raise FieldError("bad Snappy block: length preamble longer than 5 bytes")


def _check_preamble(block: bytes | memoryview) -> int:
    declared, _ = uncompressed_length(block)
    if declared > MAX_UNCOMPRESSED or declared > MAX_RATIO * len(block) + 64:
        raise FieldError(
            "bad Snappy block: impossible uncompressed length",
            expected=f"at most {min(MAX_UNCOMPRESSED, MAX_RATIO * len(block) + 64)} bytes",
            got=f"{declared} bytes",
        )
    return declared


def decompress(block: bytes | memoryview) -> bytes:
    """Decompress one raw Snappy block; :class:`FieldError` when it is not one."""
    declared = _check_preamble(block)
    if _cramjam is not None:
        try:
            out = bytes(_cramjam.snappy.decompress_raw(bytes(block)))
        except Exception as exc:  # cramjam raises its own DecompressionError types
            raise FieldError(f"bad Snappy block: {exc}") from None
        if len(out) != declared:
            raise FieldError(
                "bad Snappy block: length differs from preamble",
                expected=f"{declared} bytes",
                got=f"{len(out)} bytes",
            )
        return out
    return decompress_pure(block)


def decompress_many(
    src: bytes, starts: list[int], lengths: list[int], at: list[int], sizes: list[int], total: int
) -> tuple[bytearray, list[int]]:
    """Blocks ``src[starts[i]:][:lengths[i]]`` decompressed into one buffer of ``total`` bytes,
    block i at ``at[i]`` in ``sizes[i]`` bytes (its declared length, judged plausible by the
    caller). ``written[i]`` is what block i produced, -1 when it is not a valid block: unless
    it equals ``sizes[i]``, :func:`decompress` says what is wrong when that frame is decoded
    on its own.
    """
    out = bytearray(total)
    blocks = list(zip(starts, lengths, at, sizes, strict=True))
    with memoryview(src) as source, memoryview(out) as target:
        if _cramjam is None:
            written = [_pure_into(source, target, *block) for block in blocks]
        else:
            into = _cramjam.snappy.decompress_raw_into
            try:  # bad blocks are rare: one comprehension, and per block only if one fails
                written = [into(source[s : s + n], target[a : a + z]) for s, n, a, z in blocks]
            except _cramjam.DecompressionError:
                written = [_cramjam_into(source, target, *block) for block in blocks]
    return out, written


def _cramjam_into(
    source: memoryview, target: memoryview, start: int, length: int, at: int, size: int
) -> int:
    assert _cramjam is not None
    try:
        return int(
            _cramjam.snappy.decompress_raw_into(
                source[start : start + length], target[at : at + size]
            )
        )
    except _cramjam.DecompressionError:
        return -1


def _pure_into(
    source: memoryview, target: memoryview, start: int, length: int, at: int, size: int
) -> int:
    try:
        block = decompress_pure(source[start : start + length])
    except FieldError:
        return -1
    if len(block) != size:
        return len(block)
    target[at : at + size] = block
    return size


def decompress_pure(block: bytes | memoryview) -> bytes:
    """The pure-Python reader (format_description.txt of google/snappy)."""
    declared = _check_preamble(block)
    _, pos = uncompressed_length(block)
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


def compress(data: bytes) -> bytes:
    """A raw Snappy block of ``data`` (cramjam; literal-only blocks without it)."""
    if _cramjam is not None:
        return bytes(_cramjam.snappy.compress_raw(data))
    return compress_literal(data)


def compress_literal(data: bytes) -> bytes:
    """A valid block made only of literals: correct, not small. Used without cramjam."""
    out = bytearray()
    n = len(data)
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            break
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

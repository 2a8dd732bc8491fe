"""Snappy raw block format (docs/protocol/dcp.md §2: the *block* format, not the framing format).

cramjam decompresses. Before it allocates anything, the block's varint preamble (its declared
uncompressed length, :mod:`dcp_cdc.varint`) must be plausible for the block's size; a bad
block, whatever is wrong with it, is a :class:`FieldError`.
"""

from __future__ import annotations

from typing import Any

import cramjam

from dcp_cdc.errors import FieldError
from dcp_cdc.varint import Site, read_uleb128

MAX_UNCOMPRESSED = 64 * 1024 * 1024
MAX_RATIO = 22
RATIO_SLACK = 64
"""One 3-byte copy element yields at most 64 bytes, so a block never expands beyond
``MAX_RATIO`` times its size plus this."""

_PREAMBLE = Site(
    "bad Snappy block", "length preamble", "block", "length", "truncated length preamble"
)


def plausible(declared: Any, block_len: Any) -> Any:
    """Whether a block of ``block_len`` bytes can decompress to ``declared`` bytes (ints, or
    numpy arrays of them for many blocks at once)."""
    return (declared <= MAX_UNCOMPRESSED) & (declared <= MAX_RATIO * block_len + RATIO_SLACK)


def preamble(block: bytes | memoryview) -> tuple[int, int]:
    """``(declared length, preamble size)``, the length judged plausible for the block."""
    declared, size = read_uleb128(block, site=_PREAMBLE)
    if not plausible(declared, len(block)):
        raise FieldError(
            "bad Snappy block: impossible uncompressed length",
            expected=f"at most {min(MAX_UNCOMPRESSED, MAX_RATIO * len(block) + RATIO_SLACK)} bytes",
            got=f"{declared} bytes",
        )
    return declared, size


def decompress(block: bytes | memoryview) -> bytes:
    """Decompress one raw Snappy block; :class:`FieldError` when it is not one."""
    declared, _ = preamble(block)
    try:
        out = bytes(cramjam.snappy.decompress_raw(bytes(block)))
    except Exception as exc:  # cramjam raises its own DecompressionError types
        raise FieldError(f"bad Snappy block: {exc}") from None
    if len(out) != declared:
        raise FieldError(
            "bad Snappy block: length differs from preamble",
            expected=f"{declared} bytes",
            got=f"{len(out)} bytes",
        )
    return out


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
    into = cramjam.snappy.decompress_raw_into
    with memoryview(src) as source, memoryview(out) as target:
        try:  # bad blocks are rare: one comprehension, and per block only if one fails
            written = [into(source[s : s + n], target[a : a + z]) for s, n, a, z in blocks]
        except cramjam.DecompressionError:
            written = [_into(source, target, *block) for block in blocks]
    return out, written


def _into(
    source: memoryview, target: memoryview, start: int, length: int, at: int, size: int
) -> int:
    try:
        return int(
            cramjam.snappy.decompress_raw_into(
                source[start : start + length], target[at : at + size]
            )
        )
    except cramjam.DecompressionError:
        return -1


def compress(data: bytes) -> bytes:
    """A raw Snappy block of ``data``."""
    return bytes(cramjam.snappy.compress_raw(data))

"""Framing a buffer (docs/protocol/dcp.md §1): the start of every whole frame, and the error that stopped it.

Lengths chain, so framing is serial by nature: the compiled pass walks frame by frame; numpy
walks many segments of the buffer at once from guessed starts, and a guess counts only once the
walk before it lands on it (:func:`frame_starts`).
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import numpy.typing as npt

from dcp_cdc import layouts
from dcp_cdc.columnar.native import native_module, use_native
from dcp_cdc.errors import MalformedFrameError, TruncatedFrameError
from dcp_cdc.header import parse_header
from dcp_cdc.protocol import (
    HEADER_LEN,
    KNOWN_MAGICS,
    MAX_BODY_LEN,
)

SEGMENT_BYTES = 1 << 15
"""Framing walks a buffer as segments of about this many bytes, all at once (see
:func:`frame_starts`)."""
_SEED_WINDOW = 512  # where a segment's first frame is looked for, from its nominal start
_MIN_LOCKSTEP = 32  # below this many segments still walking, the rest walk one by one
_KNOWN_MAGIC = np.zeros(256, dtype=np.bool_)
_KNOWN_MAGIC[sorted(KNOWN_MAGICS)] = True
_BODY_LEN_AT = layouts.BODY_LEN_OFFSET
_BODY_LEN = struct.Struct(">I").unpack_from  # the u32 at _BODY_LEN_AT


def _body_len(buf: bytes, pos: int) -> int:
    """The body length in the header at ``buf[pos:]`` (docs/protocol/dcp.md §1.1)."""
    return int(_BODY_LEN(buf, pos + _BODY_LEN_AT)[0])


def byte_view(buf: Any, fmt: str) -> Any:
    """A no-copy view holding, at index ``p``, the ``fmt`` value that starts at byte ``p``.

    Fields of frames sit at arbitrary byte offsets; indexing this view with an array of
    offsets reads them all in one gather (unaligned reads are numpy's business).
    """
    dtype = np.dtype(fmt)
    count = max(len(buf) - dtype.itemsize + 1, 0)
    return np.ndarray((count,), dtype=dtype, buffer=buf, strides=(1,))


def _walk(buf: bytes, pos: int, stop: int) -> tuple[list[int], int, bool]:
    """Frames one by one from ``pos`` while they start before ``stop``.

    Returns the starts, where the walk ended (the first start at or after ``stop``, or the
    frame that could not be framed) and whether it halted there (unknown magic, impossible
    length, or a frame that does not fit in ``buf``).
    """
    found: list[int] = []
    append = found.append
    n = len(buf)
    known = KNOWN_MAGICS
    body_len, at = _BODY_LEN, _BODY_LEN_AT
    while pos < stop:
        if pos + HEADER_LEN > n:
            return found, pos, True
        end = pos + HEADER_LEN + body_len(buf, pos + at)[0]
        if buf[pos] not in known or end - pos - HEADER_LEN > MAX_BODY_LEN or end > n:
            return found, pos, True
        append(pos)
        pos = end
    return found, pos, False


def frame_starts(
    buf: bytes,
    *,
    final: bool,
    base_offset: int = 0,
    segment: int = SEGMENT_BYTES,
    native: bool | None = None,
) -> tuple[npt.NDArray[np.int64], int, MalformedFrameError | None]:
    """Start of every whole frame, the bytes they span, and the error that stopped framing.

    Lengths chain, so framing is serial by nature: the compiled pass walks the buffer frame
    by frame. Without it (``native=False``, or not built), a long buffer is cut into segments
    of ``segment`` bytes; each segment's first frame is guessed and all segments are walked at
    once with numpy. A guess is kept only when the walk of the segment before it lands on it
    exactly; a segment whose guess was wrong is walked again, one frame at a time, from where
    the previous walk landed. So the starts are always those of one walk from byte 0.
    """
    n = len(buf)
    if use_native(native):
        walked, pos, halted = native_module().walk(buf, 0, n)
        starts = np.frombuffer(walked, dtype=np.int64)
    elif n >= 4 * segment:
        starts, pos, halted = _walk_segments(buf, segment)
    else:
        found, pos, halted = _walk(buf, 0, n)
        starts = np.array(found, dtype=np.int64)
    fatal: MalformedFrameError | None = None
    unframeable = (
        halted
        and pos + HEADER_LEN <= n
        and (buf[pos] not in KNOWN_MAGICS or _body_len(buf, pos) > MAX_BODY_LEN)
    )
    if unframeable:
        try:
            parse_header(buf, pos, base_offset=base_offset)
        except MalformedFrameError as exc:
            fatal = exc
    if fatal is None and final and pos < n:
        opcode = buf[pos + 1] if n - pos > 1 else None
        needed = HEADER_LEN + _body_len(buf, pos) if n - pos >= HEADER_LEN else None
        fatal = TruncatedFrameError(
            offset=base_offset + pos, available=n - pos, needed=needed, opcode=opcode
        )
    return starts, pos, fatal


def _is_magic(values: Any) -> Any:
    return _KNOWN_MAGIC[values]


def _segment_seeds(buf: bytes, segment: int) -> Any:
    """A guess of the first frame start in each segment after the first (sorted, unique).

    The guess is the first byte of the segment's window with a known magic whose length
    leads to another known magic (or exactly to the end of the buffer).
    """
    n = len(buf)
    window = min(_SEED_WINDOW, segment)
    bounds = np.arange(segment, n - window - HEADER_LEN + 1, segment, dtype=np.int64)
    u8 = np.frombuffer(buf, dtype=np.uint8)
    flat = np.flatnonzero(_is_magic(u8[bounds[:, None] + np.arange(window, dtype=np.int64)]))
    seg = flat // window
    cand = bounds[seg] + flat % window
    body = byte_view(buf, ">u4")[cand + _BODY_LEN_AT].astype(np.int64)
    nxt = cand + HEADER_LEN + body
    ok = (body <= MAX_BODY_LEN) & ((nxt == n) | (nxt + HEADER_LEN <= n))
    inner = np.flatnonzero(ok & (nxt < n))
    ok[inner] = _is_magic(u8[nxt[inner]])
    _, first = np.unique(seg[ok], return_index=True)
    return cand[ok][first]


def _walk_segments(buf: bytes, segment: int) -> tuple[npt.NDArray[np.int64], int, bool]:
    n = len(buf)
    u8 = np.frombuffer(buf, dtype=np.uint8)
    be32 = byte_view(buf, ">u4")
    seeds = _segment_seeds(buf, segment)
    seg_start = np.concatenate([np.zeros(1, dtype=np.int64), seeds])
    seg_end = np.concatenate([seeds, np.array([n], dtype=np.int64)])
    k = len(seg_start)
    # Walk every segment at once; a segment stops where it crosses its end or halts.
    ids, pos, end = np.arange(k), seg_start.copy(), seg_end.copy()
    landed = np.zeros(k, dtype=np.int64)
    halted = np.zeros(k, dtype=np.bool_)
    resume = np.full(k, -1, dtype=np.int64)  # where a segment's walk goes on one by one
    steps: list[tuple[Any, Any]] = []
    while len(ids):
        if len(ids) < min(_MIN_LOCKSTEP, k // 2):  # a step costs as much for few as for many
            resume[ids] = pos
            break
        fits = pos + HEADER_LEN <= n
        at = pos if fits.all() else np.where(fits, pos, 0)
        frame_end = at + HEADER_LEN + be32[at + _BODY_LEN_AT].astype(np.int64)
        ok = fits & _is_magic(u8[at]) & (frame_end - at - HEADER_LEN <= MAX_BODY_LEN)
        ok &= frame_end <= n
        if not ok.all():
            landed[ids[~ok]] = pos[~ok]
            halted[ids[~ok]] = True
            ids, pos, end, frame_end = ids[ok], pos[ok], end[ok], frame_end[ok]
        steps.append((ids, pos))
        crossed = frame_end >= end
        if crossed.any():
            landed[ids[crossed]] = frame_end[crossed]
            ids, pos, end = ids[~crossed], frame_end[~crossed], end[~crossed]
        else:
            pos = frame_end
    # Segment i's j-th frame goes to first[i] + j: the frames in walk order, no sort.
    counts = np.zeros(k, dtype=np.int64)
    for step_ids, _ in steps:
        counts[step_ids] += 1
    first = np.zeros(k + 1, dtype=np.int64)
    np.cumsum(counts, out=first[1:])
    walked = np.empty(int(first[-1]), dtype=np.int64)
    for j, (step_ids, step_pos) in enumerate(steps):
        walked[first[step_ids] + j] = step_pos
    # Keep the segments whose guess the previous walk landed on; re-walk the others.
    parts: list[Any] = []
    expected = 0
    for i in range(k):
        if int(seg_start[i]) == expected:
            parts.append(walked[first[i] : first[i + 1]])
            stop, halt = int(landed[i]), bool(halted[i])
            if resume[i] >= 0:
                found, stop, halt = _walk(buf, int(resume[i]), int(seg_end[i]))
                parts.append(np.array(found, dtype=np.int64))
        elif expected >= seg_end[i]:
            continue  # a frame spans the whole segment
        else:
            found, stop, halt = _walk(buf, expected, int(seg_end[i]))
            parts.append(np.array(found, dtype=np.int64))
        if halt:
            return np.concatenate(parts), stop, True
        expected = stop
    return np.concatenate(parts), expected, False

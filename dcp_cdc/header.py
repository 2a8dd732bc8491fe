"""The frame header (docs/protocol/dcp.md §1): the 24 bytes that frame a stream, then the checks that need the
body (lengths consistent, the stream-id FrameInfo read).

Both faces of the decoder frame with it: the event iterator (:mod:`dcp_cdc.decoder`) and the
columnar face, for the frames it decodes one at a time and for the error that stops framing.
"""

from __future__ import annotations

from dcp_cdc import layouts
from dcp_cdc.errors import FieldError, MalformedFrameError, TruncatedFrameError
from dcp_cdc.events import FrameHeader
from dcp_cdc.protocol import (
    ALT_MAGICS,
    HEADER_LEN,
    KNOWN_MAGICS,
    MAX_BODY_LEN,
    STREAM_ID_FRAME_INFO,
    STREAM_ID_LEN,
)

_ALT_MAGICS = frozenset(int(m) for m in ALT_MAGICS)

Buffer = bytes | bytearray | memoryview


def parse_header(buf: Buffer, pos: int = 0, *, base_offset: int = 0) -> FrameHeader:
    """The header of the whole frame at ``buf[pos:]``, checked against its body (§1).

    ``base_offset`` is added to ``pos`` to give the frame's offset in its stream. Raises
    :class:`MalformedFrameError`; ``frame_length`` is set when the boundary is still known;
    :class:`TruncatedFrameError` when ``buf`` ends inside the frame.
    """
    h = read_header(buf, pos, base_offset=base_offset)
    available = len(buf) - pos
    if available < h.frame_len:
        raise TruncatedFrameError(
            offset=h.offset, available=available, needed=h.frame_len, opcode=h.opcode
        )
    return check_body(h, buf, pos)


def read_header(buf: Buffer, pos: int = 0, *, base_offset: int = 0) -> FrameHeader:
    """The 24 header bytes alone (§1.1): enough to learn the frame length.

    Only magic and body length are judged here; the other lengths and the stream-id need the
    body, see :func:`check_body`. Both failures here leave the stream unframeable, and so
    does a buffer that ends inside the header (:class:`TruncatedFrameError`).
    """
    available = len(buf) - pos
    if available < HEADER_LEN:
        raise TruncatedFrameError(
            offset=base_offset + pos,
            available=max(available, 0),
            needed=None,
            opcode=buf[pos + 1] if available > 1 else None,
        )
    magic = buf[pos]
    if magic not in KNOWN_MAGICS:
        raise MalformedFrameError(
            "unknown magic byte: the stream cannot be framed from here",
            offset=base_offset + pos,
            expected="one of 0x80 0x81 0x82 0x83 0x08 0x18",
            got=f"0x{magic:02x}",
        )
    _, opcode, key_len, ext_len, datatype, vb_or_status, body_len, opaque, cas = (
        layouts.HEADER.unpack(buf, pos)
    )
    fe_len = 0
    if magic in _ALT_MAGICS:
        fe_len, key_len = key_len >> 8, key_len & 0xFF
    if body_len > MAX_BODY_LEN:
        raise MalformedFrameError(
            "impossible body length",
            offset=base_offset + pos,
            opcode=opcode,
            expected=f"at most {MAX_BODY_LEN} bytes",
            got=f"{body_len} bytes",
        )
    return FrameHeader(
        base_offset + pos,
        magic,
        opcode,
        fe_len,
        key_len,
        ext_len,
        datatype,
        vb_or_status,
        body_len,
        opaque,
        cas,
        None,
    )


def check_body(h: FrameHeader, buf: Buffer, pos: int) -> FrameHeader:
    """``h`` once its body is all in ``buf``: lengths consistent, stream-id read (§1.2–1.3)."""
    if h.framing_extras_len + h.ext_len + h.key_len > h.body_len:
        raise MalformedFrameError(
            "framing extras, extras and key are longer than the body",
            offset=h.offset,
            opcode=h.opcode,
            expected=f"fe {h.framing_extras_len} + extras {h.ext_len} + key {h.key_len} <= body",
            got=f"body {h.body_len}",
            frame_length=h.frame_len,
        )
    if not h.framing_extras_len:
        return h
    try:
        stream_id = _stream_id(buf, pos + HEADER_LEN, h.framing_extras_len)
    except FieldError as exc:
        raise located(exc, h) from None
    return h._replace(stream_id=stream_id)


def located(exc: FieldError, h: FrameHeader) -> MalformedFrameError:
    """A part's error, placed at its frame (whose boundary is known, so it is skippable)."""
    return MalformedFrameError(
        exc.reason,
        offset=h.offset,
        opcode=h.opcode,
        expected=exc.expected,
        got=exc.got,
        frame_length=h.frame_len,
    )


def _stream_id(buf: Buffer, start: int, length: int) -> int | None:
    """Walk the FrameInfo objects (§1.3); return the DCP stream-id if one is present."""
    pos, end = start, start + length
    stream_id = None
    while pos < end:
        first = buf[pos]
        pos += 1
        obj_id, obj_len = first >> 4, first & 0x0F
        if obj_id == 15:
            if pos >= end:
                raise FieldError("bad framing extras: truncated FrameInfo id escape")
            obj_id = 15 + buf[pos]
            pos += 1
        if obj_len == 15:
            if pos >= end:
                raise FieldError("bad framing extras: truncated FrameInfo length escape")
            obj_len = 15 + buf[pos]
            pos += 1
        if pos + obj_len > end:
            raise FieldError(
                "bad framing extras: FrameInfo runs past the framing extras",
                expected=f"at most {end - pos} bytes",
                got=f"{obj_len} bytes",
            )
        if obj_id == STREAM_ID_FRAME_INFO:
            if obj_len != STREAM_ID_LEN:
                raise FieldError(
                    "bad framing extras: stream-id FrameInfo length",
                    expected="2 bytes",
                    got=f"{obj_len} bytes",
                )
            stream_id = (buf[pos] << 8) | buf[pos + 1]
        pos += obj_len
    return stream_id

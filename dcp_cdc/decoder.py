"""The DCP decoder, event-iterator face: bytes in, typed events out (sans-I/O, h11 style).

``DcpDecoder.receive_data(bytes)`` only buffers; ``next_event()`` returns an event,
:data:`NEED_DATA` or :data:`END_OF_STREAM`, or raises :class:`MalformedFrameError`. Frames are
parsed through :data:`READERS`, a table from (direction, opcode) to a reader function; every
reader reads its fixed sections through the layouts of :mod:`dcp_cdc.layouts`. The frame
header is read and checked by :mod:`dcp_cdc.header`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Generator, Iterator
from itertools import accumulate
from typing import Final

from dcp_cdc import flatbuf, layouts
from dcp_cdc.errors import DecoderUsageError, FieldError, MalformedFrameError, TruncatedFrameError
from dcp_cdc.events import (
    Abort,
    AddStream,
    AddStreamResponse,
    BufferAck,
    Commit,
    Deletion,
    Event,
    Expiration,
    FailoverLog,
    FailoverLogRequest,
    FailoverLogResponse,
    FrameHeader,
    Mutation,
    Noop,
    OsoSnapshot,
    Prepare,
    SeqnoAdvanced,
    SetVbucketState,
    SnapshotMarker,
    StreamEnd,
    StreamRequest,
    StreamRequestResponse,
    SystemEvent,
    UnknownFrame,
    VbSeqnosRequest,
    VbSeqnosResponse,
)
from dcp_cdc.header import Buffer, check_body, located, parse_header, read_header
from dcp_cdc.layouts import Layout
from dcp_cdc.protocol import (
    DATATYPE_MASK,
    HEADER_LEN,
    RESPONSE_MAGICS,
    ClientOpcode,
    Datatype,
    Opcode,
    Status,
    SystemEventId,
    VbucketState,
    status_name,
    stream_end_reason_name,
    system_event_name,
)
from dcp_cdc.snappy import decompress
from dcp_cdc.varint import read_uleb128
from dcp_cdc.xattrs import split_xattrs

# Plain ints for the hot path: IntFlag arithmetic builds enum objects on every operation.
_SNAPPY = int(Datatype.SNAPPY)
_XATTR = int(Datatype.XATTR)
_UNKNOWN_DATATYPE_BITS = 0xFF & ~DATATYPE_MASK
_RESPONSE_MAGICS = frozenset(int(m) for m in RESPONSE_MAGICS)


# --- sections shared by readers ------------------------------------------------------------


def _extras(ext: bytes, choices: dict[int, Layout]) -> tuple[Layout, tuple[int, ...]]:
    layout = choices.get(len(ext))
    if layout is None:
        raise FieldError(
            "extras length does not fit the opcode",
            expected=" or ".join(f"{n} bytes" for n in sorted(choices)),
            got=f"{len(ext)} bytes",
        )
    return layout, layout.unpack(ext)


def _require_empty(what: str, data: bytes) -> None:
    if data:
        raise FieldError(f"unexpected {what}", expected=f"no {what}", got=f"{len(data)} bytes")


def split_key(key: bytes, collections: bool) -> tuple[int | None, bytes]:
    """``(collection_id, document key)``; the LEB128 prefix is there iff collections (§3)."""
    if not collections:
        return None, key
    cid, start = read_uleb128(key)
    return cid, key[start:]


def decode_value(datatype: int, value: bytes) -> tuple[bytes, dict[str, str] | None]:
    """``(body, xattrs)`` of a document value, in the order of docs/protocol/dcp.md §2."""
    if datatype & _UNKNOWN_DATATYPE_BITS:
        raise FieldError(
            "unknown datatype bits", expected="bits within 0x07", got=f"0x{datatype:02x}"
        )
    if not value:  # step 1: an empty value is never decompressed (MB-40493)
        return b"", None
    if datatype & _SNAPPY:
        value = decompress(value)
    if datatype & _XATTR:
        xattrs, body = split_xattrs(value)
        return body, xattrs
    return value, None


def parse_failover_log(value: bytes) -> FailoverLog:
    """N × (u64 vb_uuid, u64 seqno), newest first (docs/protocol/dcp.md §6.1, §6.2; errata E17)."""
    return _pairs(value, layouts.FAILOVER_ENTRY, "failover log", empty_ok=False)


def _pairs(
    value: bytes, entry: Layout, what: str, *, empty_ok: bool
) -> tuple[tuple[int, int], ...]:
    """``value`` as back-to-back ``entry`` sections of two fields each."""
    size = entry.length
    if (not value and not empty_ok) or len(value) % size:
        raise FieldError(
            f"bad {what}",
            expected=f"a {'' if empty_ok else 'non-empty '}multiple of {size} bytes",
            got=f"{len(value)} bytes",
        )
    return tuple(
        entry.unpack(value, i)  # type: ignore[misc]
        for i in range(0, len(value), size)
    )


MAX_JSON_DEPTH = 64
"""Deepest nesting of arrays and objects accepted in a JSON text the decoder parses (a stream
request's value is a flat object, docs/protocol/dcp.md §4.4). A fixed limit, not Python's recursion limit,
so both faces (and every executor) judge a value alike."""
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_JSON_NESTING = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[{]}")


def _json_depth_beyond_limit(text: str) -> int | None:
    """How deep arrays and objects nest in ``text`` (brackets inside strings do not count),
    when that is deeper than :data:`MAX_JSON_DEPTH`; else None. Linear, no recursion."""
    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH:
        return None  # cannot be deeper: no need to look closer
    brackets = _JSON_STRING.sub("", text).encode().translate(_JSON_NESTING, _NOT_BRACKETS)
    depth = max(accumulate(b - 1 for b in brackets), default=0)
    return depth if depth > MAX_JSON_DEPTH else None


def check_json(text: str, what: str) -> None:
    """:class:`FieldError` unless ``text`` is JSON nested at most :data:`MAX_JSON_DEPTH` deep."""
    depth = _json_depth_beyond_limit(text)
    if depth is not None:
        raise FieldError(
            f"{what} nests too deep",
            expected=f"at most {MAX_JSON_DEPTH} levels of arrays and objects",
            got=f"{depth} levels",
        )
    try:
        json.loads(text)
    except ValueError:
        raise FieldError(f"{what} is not JSON", got=text[:60]) from None


def _text(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise FieldError(f"{what} is not UTF-8", got=data[:32].hex()) from None


# --- readers, one per message (docs/protocol/dcp.md §6) ----------------------------------------------------

Reader = Callable[[FrameHeader, bytes, bytes, bytes, bool], Event]


def read_mutation(h: FrameHeader, ext: bytes, key: bytes, value: bytes, coll: bool) -> Event:
    _, (by_seqno, rev_seqno, flags, expiration, lock_time, nmeta, nru) = _extras(
        ext, {31: layouts.MUTATION}
    )
    if nmeta > len(value):
        raise FieldError("nmeta longer than the value", expected=f"<= {len(value)}", got=str(nmeta))
    cid, doc_key = split_key(key, coll)
    body, xattrs = decode_value(h.datatype, value[: len(value) - nmeta])
    return Mutation(
        h,
        by_seqno,
        rev_seqno,
        flags,
        expiration,
        lock_time,
        nmeta,
        nru,
        cid,
        doc_key,
        body,
        xattrs,
    )


def read_deletion(h: FrameHeader, ext: bytes, key: bytes, value: bytes, coll: bool) -> Event:
    layout, fields = _extras(ext, {18: layouts.DELETION_V1, 21: layouts.DELETION_V2})
    delete_time = fields[2] if layout is layouts.DELETION_V2 else None
    if layout is layouts.DELETION_V1 and fields[2] > len(value):
        raise FieldError(
            "nmeta longer than the value", expected=f"<= {len(value)}", got=str(fields[2])
        )
    if layout is layouts.DELETION_V1 and fields[2]:
        value = value[: len(value) - fields[2]]
    cid, doc_key = split_key(key, coll)
    body, xattrs = decode_value(h.datatype, value)  # tombstones may carry xattrs (errata E3)
    return Deletion(h, fields[0], fields[1], delete_time, cid, doc_key, body, xattrs)


def read_expiration(h: FrameHeader, ext: bytes, key: bytes, value: bytes, coll: bool) -> Event:
    _, (by_seqno, rev_seqno, delete_time) = _extras(ext, {20: layouts.EXPIRATION})
    cid, doc_key = split_key(key, coll)
    body, xattrs = decode_value(h.datatype, value)
    return Expiration(h, by_seqno, rev_seqno, delete_time, cid, doc_key, body, xattrs)


def read_prepare(h: FrameHeader, ext: bytes, key: bytes, value: bytes, coll: bool) -> Event:
    _, (by_seqno, rev_seqno, flags, expiration, lock_time, nru, deleted, level) = _extras(
        ext, {31: layouts.PREPARE}
    )
    cid, doc_key = split_key(key, coll)
    body, xattrs = decode_value(h.datatype, value)
    return Prepare(
        h,
        by_seqno,
        rev_seqno,
        flags,
        expiration,
        lock_time,
        nru,
        deleted,
        level,
        cid,
        doc_key,
        body,
        xattrs,
    )


def read_commit(h: FrameHeader, ext: bytes, key: bytes, value: bytes, coll: bool) -> Event:
    _, (prepared, committed) = _extras(ext, {16: layouts.COMMIT})
    _require_empty("value", value)
    cid, doc_key = split_key(key, coll)
    return Commit(h, prepared, committed, cid, doc_key)


def read_abort(h: FrameHeader, ext: bytes, key: bytes, value: bytes, coll: bool) -> Event:
    _, (prepared, aborted) = _extras(ext, {16: layouts.ABORT})
    _require_empty("value", value)
    cid, doc_key = split_key(key, coll)
    return Abort(h, prepared, aborted, cid, doc_key)


_MARKER_VALUES = {
    0: (layouts.SNAPSHOT_MARKER_V2_0, "2.0"),
    2: (layouts.SNAPSHOT_MARKER_V2_2, "2.2"),
}


def read_snapshot_marker(h: FrameHeader, ext: bytes, key: bytes, value: bytes, coll: bool) -> Event:
    _require_empty("key", key)
    layout, fields = _extras(
        ext, {20: layouts.SNAPSHOT_MARKER_V1, 1: layouts.SNAPSHOT_MARKER_V2_EXTRAS}
    )
    if layout is layouts.SNAPSHOT_MARKER_V1:
        _require_empty("value", value)
        return SnapshotMarker(h, "1", *fields)
    version = fields[0]
    if version not in _MARKER_VALUES:
        raise FieldError(
            "unsupported snapshot marker version (V2.1 was removed; kv_engine rejects it)",
            expected="0x00 (V2.0) or 0x02 (V2.2)",
            got=f"0x{version:02x}",
        )
    value_layout, name = _MARKER_VALUES[version]
    if len(value) != value_layout.length:
        raise FieldError(
            f"snapshot marker V{name} value length",
            expected=f"{value_layout.length} bytes",
            got=f"{len(value)} bytes",
        )
    return SnapshotMarker(h, name, *value_layout.unpack(value))


_FLAT_SCHEMAS = {
    SystemEventId.BEGIN_COLLECTION: flatbuf.COLLECTION,
    SystemEventId.MODIFY_COLLECTION: flatbuf.COLLECTION,
    SystemEventId.END_COLLECTION: flatbuf.DROPPED_COLLECTION,
    SystemEventId.CREATE_SCOPE: flatbuf.SCOPE,
    SystemEventId.DROP_SCOPE: flatbuf.DROPPED_SCOPE,
}
_FIXED_VALUES: dict[tuple[int, int], Layout] = {
    (SystemEventId.BEGIN_COLLECTION, 0): layouts.COLLECTION_EVENT_V0,
    (SystemEventId.BEGIN_COLLECTION, 1): layouts.COLLECTION_EVENT_V1,
    (SystemEventId.END_COLLECTION, 0): layouts.COLLECTION_EVENT_V0,
    (SystemEventId.CREATE_SCOPE, 0): layouts.SCOPE_EVENT_V0,
    (SystemEventId.DROP_SCOPE, 0): layouts.SCOPE_EVENT_V0,
}
_NAMED_EVENTS = frozenset(
    {SystemEventId.BEGIN_COLLECTION, SystemEventId.CREATE_SCOPE, SystemEventId.MODIFY_COLLECTION}
)


def read_system_event(h: FrameHeader, ext: bytes, key: bytes, value: bytes, coll: bool) -> Event:
    _, (by_seqno, event_id, version) = _extras(ext, {13: layouts.SYSTEM_EVENT})
    event = system_event_name(event_id)
    name: str | None = None
    if event_id not in _FLAT_SCHEMAS:  # an id this decoder does not know: keep it, raw
        name = _text(key, "system event key") if key else None
        return SystemEvent(
            h, by_seqno, event_id, version, event, None, None, None, name, None, value
        )
    if event_id in _NAMED_EVENTS:
        if not key:
            raise FieldError(f"{event} without a name", expected="a key", got="key length 0")
        name = _text(key, "collection or scope name")
    else:
        _require_empty("key", key)  # drop events have no key (§6.7)
    fields: dict[str, int | bool | str | None]
    if version == 2:
        fields = flatbuf.read_table(value, _FLAT_SCHEMAS[SystemEventId(event_id)])
        if fields.get("name") is not None:
            name = str(fields["name"])
        max_ttl = fields.get("max_ttl") if fields.get("ttl_valid") else None
        return SystemEvent(
            h,
            by_seqno,
            event_id,
            version,
            event,
            _int(fields.get("uid")),
            _int(fields.get("scope_id")),
            _int(fields.get("collection_id")),
            name,
            _int(max_ttl),
            value,
            _int(fields.get("flush_uid")),
            bool(fields["history"]) if "history" in fields else None,
        )
    layout = _FIXED_VALUES.get((event_id, version))
    if layout is None:
        raise FieldError(
            f"unsupported {event} version",
            expected="version 2" if event_id == SystemEventId.MODIFY_COLLECTION else "0, 1 or 2",
            got=str(version),
        )
    if len(value) != layout.length:
        raise FieldError(
            f"{event} v{version} value length",
            expected=f"{layout.length} bytes",
            got=f"{len(value)} bytes",
        )
    f = layout.unpack_dict(value)
    return SystemEvent(
        h,
        by_seqno,
        event_id,
        version,
        event,
        f["manifest_uid"],
        f["scope_id"],
        f.get("collection_id"),
        name,
        f.get("max_ttl"),
        value,
    )


def _int(value: int | bool | str | None) -> int | None:
    return None if value is None else int(value)


def read_seqno_advanced(h: FrameHeader, ext: bytes, key: bytes, value: bytes, coll: bool) -> Event:
    _, (seqno,) = _extras(ext, {8: layouts.SEQNO_ADVANCED})
    _require_empty("key", key)
    _require_empty("value", value)
    return SeqnoAdvanced(h, seqno)


def read_oso_snapshot(h: FrameHeader, ext: bytes, key: bytes, value: bytes, coll: bool) -> Event:
    _, (flags,) = _extras(ext, {4: layouts.OSO_SNAPSHOT})
    _require_empty("key", key)
    _require_empty("value", value)
    return OsoSnapshot(h, flags)


def read_stream_end(h: FrameHeader, ext: bytes, key: bytes, value: bytes, coll: bool) -> Event:
    _, (reason,) = _extras(ext, {4: layouts.STREAM_END})
    _require_empty("key", key)
    _require_empty("value", value)
    return StreamEnd(h, reason, stream_end_reason_name(reason))


def read_noop(h: FrameHeader, ext: bytes, key: bytes, value: bytes, coll: bool) -> Event:
    for what, data in (("extras", ext), ("key", key), ("value", value)):
        _require_empty(what, data)
    return Noop(h)


def read_set_vbucket_state(
    h: FrameHeader, ext: bytes, key: bytes, value: bytes, coll: bool
) -> Event:
    _, (state,) = _extras(ext, {1: layouts.SET_VBUCKET_STATE})
    return SetVbucketState(h, state)


def read_stream_request(h: FrameHeader, ext: bytes, key: bytes, value: bytes, coll: bool) -> Event:
    _, (flags, start, end, vb_uuid, snap_start, snap_end) = _extras(
        ext, {48: layouts.STREAM_REQUEST}
    )
    _require_empty("key", key)
    text = _text(value, "stream request value")
    if text:
        check_json(text, "stream request value")
    return StreamRequest(h, flags, start, end, vb_uuid, snap_start, snap_end, text)


def read_stream_request_response(
    h: FrameHeader, ext: bytes, key: bytes, value: bytes, coll: bool
) -> Event:
    status = h.vbucket_or_status
    if status == Status.SUCCESS:
        return StreamRequestResponse(h, "success", parse_failover_log(value), None, b"")
    if status == Status.ROLLBACK:
        if len(value) != layouts.ROLLBACK.length:  # errata E10: the seqno only
            raise FieldError(
                "rollback response value", expected="8 bytes", got=f"{len(value)} bytes"
            )
        (seqno,) = layouts.ROLLBACK.unpack(value)
        return StreamRequestResponse(h, "rollback", None, seqno, b"")
    return StreamRequestResponse(h, status_name(status), None, None, value)


def read_add_stream(h: FrameHeader, ext: bytes, key: bytes, value: bytes, coll: bool) -> Event:
    """4-byte extras of stream flags, no key, no value (add-stream.md)."""
    _, (flags,) = _extras(ext, {4: layouts.ADD_STREAM})
    _require_empty("key", key)
    _require_empty("value", value)
    return AddStream(h, flags)


def read_add_stream_response(
    h: FrameHeader, ext: bytes, key: bytes, value: bytes, coll: bool
) -> Event:
    """Success: 4-byte extras holding the new stream's opaque, nothing else (add-stream.md).
    An error status may come without extras, and with a value (kept as it came)."""
    status = h.vbucket_or_status
    _require_empty("key", key)
    if status == Status.SUCCESS:
        _require_empty("value", value)
    elif not ext:
        return AddStreamResponse(h, status_name(status), None, value)
    _, (stream_opaque,) = _extras(ext, {4: layouts.ADD_STREAM_RESPONSE})
    return AddStreamResponse(h, status_name(status), stream_opaque, value)


def read_failover_log_request(
    h: FrameHeader, ext: bytes, key: bytes, value: bytes, coll: bool
) -> Event:
    return FailoverLogRequest(h)


def read_failover_log_response(
    h: FrameHeader, ext: bytes, key: bytes, value: bytes, coll: bool
) -> Event:
    status = h.vbucket_or_status
    if status == Status.SUCCESS:
        return FailoverLogResponse(h, "success", parse_failover_log(value), b"")
    return FailoverLogResponse(h, status_name(status), None, value)


def parse_vb_seqnos(value: bytes) -> tuple[tuple[int, int], ...]:
    """N × (u16 vbucket, u64 high seqno): a GET_ALL_VB_SEQNOS reply (possibly none)."""
    return _pairs(value, layouts.VB_SEQNO_ENTRY, "GET_ALL_VB_SEQNOS reply", empty_ok=True)


def read_vb_seqnos_request(
    h: FrameHeader, ext: bytes, key: bytes, value: bytes, coll: bool
) -> Event:
    """Extras: none (every state), the vbucket state, or the state and a collection id.

    The state is a u32 on the wire that names one of five filters (0, or a
    :class:`VbucketState`): a larger one is no state (and would not fit bronze's column).
    """
    _require_empty("key", key)
    _require_empty("value", value)
    if not ext:
        return VbSeqnosRequest(h, None, None)
    _, fields = _extras(
        ext, {4: layouts.VB_SEQNOS_REQUEST, 8: layouts.VB_SEQNOS_COLLECTION_REQUEST}
    )
    if fields[0] > max(VbucketState):
        raise FieldError(
            "unknown vbucket state", expected=f"0 to {max(VbucketState)}", got=f"{fields[0]}"
        )
    return VbSeqnosRequest(h, fields[0], fields[1] if len(fields) > 1 else None)


def read_vb_seqnos_response(
    h: FrameHeader, ext: bytes, key: bytes, value: bytes, coll: bool
) -> Event:
    status = h.vbucket_or_status
    if status == Status.SUCCESS:
        return VbSeqnosResponse(h, "success", parse_vb_seqnos(value), b"")
    return VbSeqnosResponse(h, status_name(status), None, value)


def read_buffer_ack(h: FrameHeader, ext: bytes, key: bytes, value: bytes, coll: bool) -> Event:
    _, (count,) = _extras(ext, {4: layouts.BUFFER_ACK})
    return BufferAck(h, count)


READERS: Final[dict[tuple[bool, int], Reader]] = {
    (False, Opcode.DCP_MUTATION): read_mutation,
    (False, Opcode.DCP_DELETION): read_deletion,
    (False, Opcode.DCP_EXPIRATION): read_expiration,
    (False, Opcode.DCP_PREPARE): read_prepare,
    (False, Opcode.DCP_COMMIT): read_commit,
    (False, Opcode.DCP_ABORT): read_abort,
    (False, Opcode.DCP_SNAPSHOT_MARKER): read_snapshot_marker,
    (False, Opcode.DCP_SYSTEM_EVENT): read_system_event,
    (False, Opcode.DCP_SEQNO_ADVANCED): read_seqno_advanced,
    (False, Opcode.DCP_OSO_SNAPSHOT): read_oso_snapshot,
    (False, Opcode.DCP_STREAM_END): read_stream_end,
    (False, Opcode.DCP_NOOP): read_noop,
    (True, Opcode.DCP_NOOP): read_noop,
    (False, Opcode.DCP_SET_VBUCKET_STATE): read_set_vbucket_state,
    (False, Opcode.DCP_STREAM_REQ): read_stream_request,
    (True, Opcode.DCP_STREAM_REQ): read_stream_request_response,
    (False, Opcode.DCP_ADD_STREAM): read_add_stream,
    (True, Opcode.DCP_ADD_STREAM): read_add_stream_response,
    (False, Opcode.DCP_GET_FAILOVER_LOG): read_failover_log_request,
    (True, Opcode.DCP_GET_FAILOVER_LOG): read_failover_log_response,
    (False, Opcode.DCP_BUFFER_ACKNOWLEDGEMENT): read_buffer_ack,
    (False, ClientOpcode.GET_ALL_VB_SEQNOS): read_vb_seqnos_request,
    (True, ClientOpcode.GET_ALL_VB_SEQNOS): read_vb_seqnos_response,
}
"""(is_response, opcode) → reader. Server-initiated duplex magics (0x82/0x83) have none."""

_CLIENT_MAGICS = frozenset({0x80, 0x81, 0x08, 0x18})


def decode_frame(buf: Buffer, pos: int = 0, *, collections: bool, base_offset: int = 0) -> Event:
    """Decode the whole frame at ``buf[pos:]`` (the caller checked it is all there)."""
    return _read(parse_header(buf, pos, base_offset=base_offset), buf, pos, collections)


def _read(h: FrameHeader, buf: Buffer, pos: int, collections: bool) -> Event:
    reader = (
        READERS.get((h.magic in _RESPONSE_MAGICS, h.opcode)) if h.magic in _CLIENT_MAGICS else None
    )
    start = pos + HEADER_LEN + h.framing_extras_len
    if reader is None:
        return UnknownFrame(h, bytes(buf[pos : pos + h.frame_len]))
    ext = bytes(buf[start : start + h.ext_len])
    key_start = start + h.ext_len
    key = bytes(buf[key_start : key_start + h.key_len])
    value = bytes(buf[key_start + h.key_len : pos + h.frame_len])
    try:
        return reader(h, ext, key, value, collections)
    except FieldError as exc:
        raise located(exc, h) from None


# --- the streaming face --------------------------------------------------------------------


class Sentinel:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


NEED_DATA: Final = Sentinel("NEED_DATA")
"""``next_event()`` needs more bytes before it can return the next event."""
END_OF_STREAM: Final = Sentinel("END_OF_STREAM")
"""The stream was closed (``receive_data(b"")``) and every frame has been returned."""


class DcpDecoder:
    """Incremental decoder of a stream of frames.

    ``collections`` says whether HELLO Collections was negotiated (capture header), so that
    document keys carry a LEB128 collection-id prefix (§3). ``base_offset`` is the stream
    offset of the first byte fed (a capture file's header length), so reported offsets are
    file offsets. After a recoverable :class:`MalformedFrameError` the bad frame is skipped and
    decoding goes on; after an unrecoverable one every later call raises it again.
    """

    def __init__(self, *, collections: bool, base_offset: int = 0, file: str | None = None):
        self.collections = collections
        self.file = file
        self._buf = bytearray()
        self._pos = 0
        self._consumed = base_offset  # stream offset of _buf[0]
        self._closed = False
        self._fatal: MalformedFrameError | None = None

    def receive_data(self, data: bytes) -> None:
        """Buffer ``data``; ``b""`` marks the end of the stream."""
        if self._closed:
            raise DecoderUsageError("receive_data() after the end of the stream")
        if not data:
            self._closed = True
            return
        if self._pos > 1 << 20 and self._pos > len(self._buf) // 2:
            del self._buf[: self._pos]
            self._consumed += self._pos
            self._pos = 0
        self._buf += data

    @property
    def offset(self) -> int:
        """Stream offset of the next frame."""
        return self._consumed + self._pos

    @property
    def trailing_data(self) -> bytes:
        """Bytes buffered but not yet returned as an event."""
        return bytes(self._buf[self._pos :])

    def next_event(self) -> Event | Sentinel:
        if self._fatal is not None:
            raise self._fatal
        available = len(self._buf) - self._pos
        if available < HEADER_LEN:
            return self._short(available, None)
        try:
            h = read_header(self._buf, self._pos, base_offset=self._consumed)
            if available < h.frame_len:
                return self._short(available, h)
            h = check_body(h, self._buf, self._pos)
            event = _read(h, self._buf, self._pos, self.collections)
        except MalformedFrameError as exc:
            return self._fail(exc)
        self._pos += h.frame_len
        return event

    def _short(self, available: int, h: FrameHeader | None) -> Sentinel:
        if not self._closed:
            return NEED_DATA
        if available == 0:
            return END_OF_STREAM
        self._fatal = TruncatedFrameError(
            offset=self.offset,
            available=available,
            needed=h.frame_len if h else None,
            opcode=h.opcode if h else None,
            file=self.file,
        )
        raise self._fatal

    def _fail(self, exc: MalformedFrameError) -> Sentinel:
        if self.file:
            exc = exc.with_file(self.file)
        if exc.frame_length is None:
            self._fatal = exc
        else:
            self._pos += exc.frame_length
        raise exc

    def __iter__(self) -> Iterator[Event]:
        """Events until NEED_DATA or END_OF_STREAM (errors propagate)."""
        while True:
            event = self.next_event()
            if isinstance(event, Sentinel):
                return
            yield event


def iter_decode(
    data: Buffer, *, collections: bool, base_offset: int = 0, file: str | None = None
) -> Iterator[Event | MalformedFrameError]:
    """Every frame of a complete stream, malformed ones yielded as errors in place.

    Stops after an unrecoverable error (unknown magic, impossible length, truncated tail).
    """
    decoder = DcpDecoder(collections=collections, base_offset=base_offset, file=file)
    if data:
        decoder.receive_data(bytes(data))
    decoder.receive_data(b"")
    yield from drain(decoder)


def drain(decoder: DcpDecoder) -> Generator[Event | MalformedFrameError, None, bool]:
    """The frames ``decoder`` holds whole, malformed ones yielded as errors in place.

    Returns True when an unrecoverable error ended the stream (nothing after it can be
    framed), False when the decoder needs more data.
    """
    while True:
        try:
            event = decoder.next_event()
        except MalformedFrameError as exc:
            yield exc
            if not exc.recoverable:
                return True
            continue
        if isinstance(event, Sentinel):
            return False
        yield event

"""Events back to wire bytes, through the same layouts the decoder reads.

The simulator writes captures with it and tests round-trip every reader through it. Lengths in
the given header are ignored and recomputed; ``stream_id`` selects the alt magic (§1.3).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from dcp_cdc import flatbuf, layouts
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
from dcp_cdc.protocol import (
    STREAM_ID_LEN,
    STREAM_ID_TAG,
    Datatype,
    Magic,
    SystemEventId,
)
from dcp_cdc.snappy import compress
from dcp_cdc.varint import encode_uleb128
from dcp_cdc.xattrs import join_xattrs

Sections = tuple[bytes, bytes, bytes]  # extras, key, value


def make_header(
    opcode: int,
    *,
    vbucket: int = 0,
    status: int | None = None,
    opaque: int = 0,
    cas: int = 0,
    datatype: int = 0,
    stream_id: int | None = None,
) -> FrameHeader:
    """A header to encode with; a ``status`` makes it a response."""
    if status is None:
        magic = Magic.CLIENT_REQUEST if stream_id is None else Magic.ALT_CLIENT_REQUEST
        word = vbucket
    else:
        magic = Magic.CLIENT_RESPONSE if stream_id is None else Magic.ALT_CLIENT_RESPONSE
        word = status
    return FrameHeader(0, magic, opcode, 0, 0, 0, datatype, word, 0, opaque, cas, stream_id)


def frame(h: FrameHeader, extras: bytes, key: bytes, value: bytes) -> bytes:
    """Header + framing extras + sections; the magic follows ``h.stream_id``."""
    framing = b""
    magic = h.magic
    if h.stream_id is not None:
        framing = bytes([STREAM_ID_TAG]) + h.stream_id.to_bytes(STREAM_ID_LEN, "big")
        magic = Magic.ALT_CLIENT_RESPONSE if h.is_response else Magic.ALT_CLIENT_REQUEST
    elif magic in (Magic.ALT_CLIENT_REQUEST, Magic.ALT_CLIENT_RESPONSE):
        magic = Magic.CLIENT_RESPONSE if h.is_response else Magic.CLIENT_REQUEST
    body_len = len(framing) + len(extras) + len(key) + len(value)
    if framing:
        if len(key) > 0xFF:
            raise ValueError(
                "alt framing allows keys of at most 255 bytes (docs/protocol/dcp.md §1.1)"
            )
        length_word = (len(framing) << 8) | len(key)
    else:
        length_word = len(key)
    head = layouts.HEADER.pack(
        magic=magic,
        opcode=h.opcode,
        key_len=length_word,
        ext_len=len(extras),
        datatype=h.datatype,
        vbucket_or_status=h.vbucket_or_status,
        body_len=body_len,
        opaque=h.opaque,
        cas=h.cas,
    )
    return head + framing + extras + key + value


def doc_key(collection_id: int | None, key: bytes) -> bytes:
    return key if collection_id is None else encode_uleb128(collection_id) + key


_SNAPPY = int(Datatype.SNAPPY)  # a plain int: ``int & IntFlag`` goes through enum, slowly


def doc_value(datatype: int, body: bytes, xattrs: dict[str, str] | None) -> bytes:
    value = join_xattrs(xattrs, body) if xattrs is not None else body
    if value and datatype & _SNAPPY:
        value = compress(value)
    return value


_FAILOVER_ENTRY = layouts.joined(layouts.FAILOVER_ENTRY)


def failover_log_bytes(log: FailoverLog) -> bytes:
    return b"".join([_FAILOVER_ENTRY.pack(u, s) for u, s in log])


def vb_seqnos_bytes(highs: tuple[tuple[int, int], ...]) -> bytes:
    """A GET_ALL_VB_SEQNOS reply's value."""
    return b"".join(layouts.VB_SEQNO_ENTRY.pack(vbucket=vb, seqno=s) for vb, s in highs)


def _vb_seqnos_request(e: VbSeqnosRequest) -> Sections:
    if e.vbucket_state is None:
        return b"", b"", b""
    if e.collection_id is None:
        return layouts.VB_SEQNOS_REQUEST.pack(vbucket_state=e.vbucket_state), b"", b""
    ext = layouts.VB_SEQNOS_COLLECTION_REQUEST.pack(
        vbucket_state=e.vbucket_state, collection_id=e.collection_id
    )
    return ext, b"", b""


def _vb_seqnos_response(e: VbSeqnosResponse) -> Sections:
    if e.high_seqnos is not None:
        return b"", b"", vb_seqnos_bytes(e.high_seqnos)
    return b"", b"", e.value


def _mutation(e: Mutation) -> Sections:
    ext = layouts.MUTATION.pack(
        by_seqno=e.by_seqno,
        rev_seqno=e.rev_seqno,
        flags=e.flags,
        expiration=e.expiration,
        lock_time=e.lock_time,
        nmeta=0,
        nru=e.nru,
    )
    return ext, doc_key(e.collection_id, e.key), doc_value(e.header.datatype, e.value, e.xattrs)


def _deletion(e: Deletion) -> Sections:
    if e.delete_time is None:
        ext = layouts.DELETION_V1.pack(by_seqno=e.by_seqno, rev_seqno=e.rev_seqno)
    else:
        ext = layouts.DELETION_V2.pack(
            by_seqno=e.by_seqno, rev_seqno=e.rev_seqno, delete_time=e.delete_time
        )
    return ext, doc_key(e.collection_id, e.key), doc_value(e.header.datatype, e.value, e.xattrs)


def _expiration(e: Expiration) -> Sections:
    ext = layouts.EXPIRATION.pack(
        by_seqno=e.by_seqno, rev_seqno=e.rev_seqno, delete_time=e.delete_time
    )
    return ext, doc_key(e.collection_id, e.key), doc_value(e.header.datatype, e.value, e.xattrs)


def _prepare(e: Prepare) -> Sections:
    ext = layouts.PREPARE.pack(
        by_seqno=e.by_seqno,
        rev_seqno=e.rev_seqno,
        flags=e.flags,
        expiration=e.expiration,
        lock_time=e.lock_time,
        nru=e.nru,
        deleted=e.deleted,
        durability_level=e.durability_level,
    )
    return ext, doc_key(e.collection_id, e.key), doc_value(e.header.datatype, e.value, e.xattrs)


def _commit(e: Commit) -> Sections:
    ext = layouts.COMMIT.pack(prepared_seqno=e.prepared_seqno, commit_seqno=e.commit_seqno)
    return ext, doc_key(e.collection_id, e.key), b""


def _abort(e: Abort) -> Sections:
    ext = layouts.ABORT.pack(prepared_seqno=e.prepared_seqno, abort_seqno=e.abort_seqno)
    return ext, doc_key(e.collection_id, e.key), b""


def _snapshot_marker(e: SnapshotMarker) -> Sections:
    common = {
        "start_seqno": e.start_seqno,
        "end_seqno": e.end_seqno,
        "snapshot_flags": e.snapshot_flags,
    }
    if e.marker_version == "1":
        return layouts.SNAPSHOT_MARKER_V1.pack(**common), b"", b""
    v2 = {
        **common,
        "max_visible_seqno": e.max_visible_seqno or 0,
        "high_completed_seqno": e.high_completed_seqno or 0,
    }
    if e.marker_version == "2.0":
        return bytes([0]), b"", layouts.SNAPSHOT_MARKER_V2_0.pack(**v2)
    if e.marker_version == "2.2":
        value = layouts.SNAPSHOT_MARKER_V2_2.pack(
            **v2, purge_seqno=e.purge_seqno or 0, high_prepared_seqno=e.high_prepared_seqno or 0
        )
        return bytes([2]), b"", value
    raise ValueError(f"unknown marker version {e.marker_version!r}")


def system_event_value(e: SystemEvent) -> bytes:
    """The value of a system event for its id and version (docs/protocol/dcp.md §6.7). The
    same event is sent in every vbucket: the last values built are remembered."""
    fields = (e.manifest_uid, e.scope_id, e.collection_id, e.name, e.max_ttl, e.value)
    return _system_event_value(e.event_id, e.version, *fields, e.flush_uid, e.history)


@functools.lru_cache(maxsize=256)
def _system_event_value(
    eid: int,
    version: int,
    manifest_uid: int | None,
    scope_id: int | None,
    collection_id: int | None,
    name: str | None,
    max_ttl: int | None,
    value: bytes,
    flush_uid: int | None,
    history: bool | None,
) -> bytes:
    uid, sid, cid = manifest_uid or 0, scope_id or 0, collection_id or 0
    if version == 2:
        if eid in (SystemEventId.BEGIN_COLLECTION, SystemEventId.MODIFY_COLLECTION):
            return flatbuf.build_table(
                flatbuf.COLLECTION,
                {
                    "uid": uid,
                    "scope_id": sid,
                    "collection_id": cid,
                    "ttl_valid": max_ttl is not None,
                    "max_ttl": max_ttl,
                    "name": name,
                    "history": history,
                    "flush_uid": flush_uid,
                },
            )
        if eid == SystemEventId.END_COLLECTION:
            return flatbuf.build_table(
                flatbuf.DROPPED_COLLECTION, {"uid": uid, "scope_id": sid, "collection_id": cid}
            )
        if eid == SystemEventId.CREATE_SCOPE:
            return flatbuf.build_table(flatbuf.SCOPE, {"uid": uid, "scope_id": sid, "name": name})
        if eid == SystemEventId.DROP_SCOPE:
            return flatbuf.build_table(flatbuf.DROPPED_SCOPE, {"uid": uid, "scope_id": sid})
        return value
    if eid in (SystemEventId.BEGIN_COLLECTION, SystemEventId.END_COLLECTION):
        if version == 1:
            return layouts.COLLECTION_EVENT_V1.pack(
                manifest_uid=uid, scope_id=sid, collection_id=cid, max_ttl=max_ttl or 0
            )
        return layouts.COLLECTION_EVENT_V0.pack(manifest_uid=uid, scope_id=sid, collection_id=cid)
    if eid in (SystemEventId.CREATE_SCOPE, SystemEventId.DROP_SCOPE):
        return layouts.SCOPE_EVENT_V0.pack(manifest_uid=uid, scope_id=sid)
    return value


def _system_event(e: SystemEvent) -> Sections:
    ext = layouts.SYSTEM_EVENT.pack(by_seqno=e.by_seqno, event_id=e.event_id, version=e.version)
    named = e.event_id in (
        SystemEventId.BEGIN_COLLECTION,
        SystemEventId.CREATE_SCOPE,
        SystemEventId.MODIFY_COLLECTION,
    )
    key = (e.name or "").encode() if named else b""
    return ext, key, system_event_value(e)


def _stream_request(e: StreamRequest) -> Sections:
    ext = layouts.STREAM_REQUEST.pack(
        flags=e.flags,
        start_seqno=e.start_seqno,
        end_seqno=e.end_seqno,
        vb_uuid=e.vb_uuid,
        snap_start_seqno=e.snap_start_seqno,
        snap_end_seqno=e.snap_end_seqno,
    )
    return ext, b"", e.value.encode()


def _stream_request_response(e: StreamRequestResponse) -> Sections:
    if e.failover_log is not None:
        return b"", b"", failover_log_bytes(e.failover_log)
    if e.rollback_seqno is not None:
        return b"", b"", layouts.ROLLBACK.pack(rollback_seqno=e.rollback_seqno)
    return b"", b"", e.value


def _add_stream_response(e: AddStreamResponse) -> Sections:
    if e.stream_opaque is None:
        return b"", b"", e.value
    return layouts.ADD_STREAM_RESPONSE.pack(stream_opaque=e.stream_opaque), b"", e.value


def _failover_log_response(e: FailoverLogResponse) -> Sections:
    if e.failover_log is not None:
        return b"", b"", failover_log_bytes(e.failover_log)
    return b"", b"", e.value


_SECTIONS: dict[type, Callable[..., Sections]] = {
    Mutation: _mutation,
    Deletion: _deletion,
    Expiration: _expiration,
    Prepare: _prepare,
    Commit: _commit,
    Abort: _abort,
    SnapshotMarker: _snapshot_marker,
    SystemEvent: _system_event,
    SeqnoAdvanced: lambda e: (layouts.SEQNO_ADVANCED.pack(by_seqno=e.by_seqno), b"", b""),
    OsoSnapshot: lambda e: (layouts.OSO_SNAPSHOT.pack(oso_flags=e.oso_flags), b"", b""),
    StreamEnd: lambda e: (layouts.STREAM_END.pack(reason_code=e.reason_code), b"", b""),
    Noop: lambda e: (b"", b"", b""),
    SetVbucketState: lambda e: (
        layouts.SET_VBUCKET_STATE.pack(vbucket_state=e.vbucket_state),
        b"",
        b"",
    ),
    StreamRequest: _stream_request,
    StreamRequestResponse: _stream_request_response,
    AddStream: lambda e: (layouts.ADD_STREAM.pack(flags=e.flags), b"", b""),
    AddStreamResponse: _add_stream_response,
    FailoverLogRequest: lambda e: (b"", b"", b""),
    FailoverLogResponse: _failover_log_response,
    BufferAck: lambda e: (layouts.BUFFER_ACK.pack(buffer_bytes=e.buffer_bytes), b"", b""),
    VbSeqnosRequest: _vb_seqnos_request,
    VbSeqnosResponse: _vb_seqnos_response,
}


def encode(event: Event) -> bytes:
    """The frame of ``event``."""
    if isinstance(event, UnknownFrame):
        return event.raw
    ext, key, value = _SECTIONS[type(event)](event)
    return frame(event.header, ext, key, value)

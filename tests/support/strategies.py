"""Hypothesis strategies: well-formed DCP events of every kind, and streams of their frames."""

from __future__ import annotations

import json

from hypothesis import strategies as st

from dcp_cdc.encoder import encode, make_header
from dcp_cdc.events import (
    Abort,
    AddStream,
    AddStreamResponse,
    BufferAck,
    Commit,
    Deletion,
    Event,
    Expiration,
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
    VbSeqnosRequest,
    VbSeqnosResponse,
)
from dcp_cdc.protocol import ClientOpcode, Opcode, Status, stream_end_reason_name

u8 = st.integers(0, 0xFF)
u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFF_FFFF)
u64 = st.integers(0, 0xFFFF_FFFF_FFFF_FFFF)
seqno = st.one_of(st.integers(0, 1 << 20), u64)
names = st.text("abcdefghijklmnopqrstuvwxyz0123456789_-%", min_size=1, max_size=30)
xattr_text = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20
)
xattrs = st.dictionaries(
    st.text(
        st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
        min_size=1,
        max_size=10,
    ),
    xattr_text,
    max_size=4,
)
json_docs = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=10,
)


def header(
    opcode: int, *, response: bool = False, doc: bool = False
) -> st.SearchStrategy[FrameHeader]:
    datatype = st.sampled_from([0, 1]) if doc else st.just(0)
    return st.builds(
        lambda vb, opaque, cas, sid, dt, status: make_header(
            opcode,
            vbucket=vb,
            status=status if response else None,
            opaque=opaque,
            cas=cas,
            datatype=dt,
            stream_id=sid,
        ),
        u16,
        u32,
        u64 if doc else st.just(0),
        st.none() | u16,
        datatype,
        st.just(Status.SUCCESS),
    )


@st.composite
def doc_parts(draw: st.DrawFn, collections: bool) -> dict[str, object]:
    """Key, value and datatype of a document message (§2, §3)."""
    cid = draw(u32) if collections else None
    key = draw(st.binary(min_size=1, max_size=40))
    use_xattrs = draw(st.booleans())
    body_json = draw(st.booleans())
    body = json.dumps(draw(json_docs)).encode() if body_json else draw(st.binary(max_size=200))
    snappy = draw(st.booleans())
    xa = draw(xattrs) if use_xattrs else None
    datatype = (1 if body_json else 0) | (2 if snappy else 0) | (4 if use_xattrs else 0)
    return {"cid": cid, "key": key, "body": body, "xattrs": xa, "datatype": datatype}


def _doc_header(h: FrameHeader, datatype: int) -> FrameHeader:
    return FrameHeader(
        h.offset,
        h.magic,
        h.opcode,
        0,
        0,
        0,
        datatype,
        h.vbucket_or_status,
        0,
        h.opaque,
        h.cas,
        h.stream_id,
    )


@st.composite
def mutations(draw: st.DrawFn, collections: bool) -> Mutation:
    p = draw(doc_parts(collections))
    h = _doc_header(draw(header(Opcode.DCP_MUTATION, doc=True)), p["datatype"])  # type: ignore[arg-type]
    return Mutation(
        h,
        draw(seqno),
        draw(seqno),
        draw(u32),
        draw(u32),
        draw(u32),
        0,
        draw(u8),
        p["cid"],
        p["key"],
        p["body"],
        p["xattrs"],  # type: ignore[arg-type]
    )


@st.composite
def deletions(draw: st.DrawFn, collections: bool) -> Deletion:
    p = draw(doc_parts(collections))
    dt = p["datatype"] & 0x06  # type: ignore[operator]
    h = _doc_header(draw(header(Opcode.DCP_DELETION, doc=True)), dt)
    return Deletion(  # a tombstone's value is at most its xattrs (errata E3)
        h,
        draw(seqno),
        draw(seqno),
        draw(st.none() | u32),
        p["cid"],
        p["key"],
        b"",  # type: ignore[arg-type]
        p["xattrs"],  # type: ignore[arg-type]
    )


@st.composite
def expirations(draw: st.DrawFn, collections: bool) -> Expiration:
    cid = draw(u32) if collections else None
    h = draw(header(Opcode.DCP_EXPIRATION, doc=True))
    h = _doc_header(h, 0)
    return Expiration(
        h,
        draw(seqno),
        draw(seqno),
        draw(u32),
        cid,
        draw(st.binary(min_size=1, max_size=30)),
        b"",
        None,
    )


@st.composite
def prepares(draw: st.DrawFn, collections: bool) -> Prepare:
    p = draw(doc_parts(collections))
    h = _doc_header(draw(header(Opcode.DCP_PREPARE, doc=True)), p["datatype"])  # type: ignore[arg-type]
    return Prepare(
        h,
        draw(seqno),
        draw(seqno),
        draw(u32),
        draw(u32),
        draw(u32),
        draw(u8),
        draw(st.integers(0, 1)),
        draw(st.integers(0, 3)),
        p["cid"],
        p["key"],
        p["body"],
        p["xattrs"],  # type: ignore[arg-type]
    )


def commits(collections: bool) -> st.SearchStrategy[Commit]:
    return st.builds(
        Commit,
        header(Opcode.DCP_COMMIT),
        seqno,
        seqno,
        u32 if collections else st.none(),
        st.binary(min_size=1, max_size=30),
    )


def aborts(collections: bool) -> st.SearchStrategy[Abort]:
    return st.builds(
        Abort,
        header(Opcode.DCP_ABORT),
        seqno,
        seqno,
        u32 if collections else st.none(),
        st.binary(min_size=1, max_size=30),
    )


@st.composite
def snapshot_markers(draw: st.DrawFn) -> SnapshotMarker:
    h = draw(header(Opcode.DCP_SNAPSHOT_MARKER))
    version = draw(st.sampled_from(["1", "2.0", "2.2"]))
    start, end, flags = draw(seqno), draw(seqno), draw(st.integers(0, 0x3F))
    if version == "1":
        return SnapshotMarker(h, "1", start, end, flags)
    if version == "2.0":
        return SnapshotMarker(h, "2.0", start, end, flags, draw(seqno), draw(seqno))
    return SnapshotMarker(
        h, "2.2", start, end, flags, draw(seqno), draw(seqno), draw(seqno), draw(seqno)
    )


@st.composite
def system_events(draw: st.DrawFn) -> SystemEvent:
    h = draw(header(Opcode.DCP_SYSTEM_EVENT))
    kind = draw(st.sampled_from(["create_v0", "create_v1", "drop", "scope", "drop_scope", "flat"]))
    uid, sid, cid, by_seqno = draw(u64), draw(u32), draw(u32), draw(seqno)
    if kind == "create_v0":
        return SystemEvent(
            h, by_seqno, 0, 0, "create_collection", uid, sid, cid, draw(names), None, b""
        )
    if kind == "create_v1":
        return SystemEvent(
            h, by_seqno, 0, 1, "create_collection", uid, sid, cid, draw(names), draw(u32), b""
        )
    if kind == "drop":
        return SystemEvent(h, by_seqno, 1, 0, "drop_collection", uid, sid, cid, None, None, b"")
    if kind == "scope":
        return SystemEvent(
            h, by_seqno, 3, 0, "create_scope", uid, sid, None, draw(names), None, b""
        )
    if kind == "drop_scope":
        return SystemEvent(h, by_seqno, 4, 0, "drop_scope", uid, sid, None, None, None, b"")
    event_id = draw(st.sampled_from([0, 5]))
    event = "create_collection" if event_id == 0 else "modify_collection"
    return SystemEvent(
        h,
        by_seqno,
        event_id,
        2,
        event,
        uid,
        sid,
        cid,
        draw(names),
        draw(st.none() | u32),
        b"",
        draw(u64),
        draw(st.booleans()),
    )


def failover_logs() -> st.SearchStrategy[tuple[tuple[int, int], ...]]:
    return st.lists(st.tuples(u64, seqno), min_size=1, max_size=5).map(tuple)


@st.composite
def stream_requests(draw: st.DrawFn) -> StreamRequest:
    value = draw(st.sampled_from(["", '{"uid":"1"}', '{"collections":["8"],"sid":3}']))
    return StreamRequest(
        draw(header(Opcode.DCP_STREAM_REQ)),
        draw(u32),
        draw(seqno),
        draw(seqno),
        draw(u64),
        draw(seqno),
        draw(seqno),
        value,
    )


@st.composite
def stream_request_responses(draw: st.DrawFn) -> StreamRequestResponse:
    kind = draw(st.sampled_from(["success", "rollback", "error"]))
    opaque = draw(u32)
    if kind == "success":
        h = make_header(Opcode.DCP_STREAM_REQ, status=Status.SUCCESS, opaque=opaque)
        return StreamRequestResponse(h, "success", draw(failover_logs()), None, b"")
    if kind == "rollback":
        h = make_header(Opcode.DCP_STREAM_REQ, status=Status.ROLLBACK, opaque=opaque)
        return StreamRequestResponse(h, "rollback", None, draw(seqno), b"")
    h = make_header(Opcode.DCP_STREAM_REQ, status=Status.NOT_MY_VBUCKET, opaque=opaque)
    return StreamRequestResponse(h, "not_my_vbucket", None, None, draw(st.binary(max_size=20)))


@st.composite
def add_stream_responses(draw: st.DrawFn) -> AddStreamResponse:
    """Success with the stream's opaque; an error with or without it, and maybe a value."""
    opaque = draw(u32)
    if draw(st.booleans()):
        h = make_header(Opcode.DCP_ADD_STREAM, status=Status.SUCCESS, opaque=opaque)
        return AddStreamResponse(h, "success", draw(u32), b"")
    status = draw(st.sampled_from([Status.KEY_EEXISTS, Status.EINVAL, Status.NOT_MY_VBUCKET]))
    h = make_header(Opcode.DCP_ADD_STREAM, status=status, opaque=opaque)
    return AddStreamResponse(
        h, status.name.lower(), draw(st.none() | u32), draw(st.binary(max_size=20))
    )


@st.composite
def vb_seqnos_requests(draw: st.DrawFn) -> VbSeqnosRequest:
    """Every state (no extras), a vbucket state, or a state and a collection."""
    h = draw(header(ClientOpcode.GET_ALL_VB_SEQNOS))
    state = draw(st.none() | st.integers(0, 4))
    return VbSeqnosRequest(h, state, None if state is None else draw(st.none() | u32))


@st.composite
def vb_seqnos_responses(draw: st.DrawFn) -> VbSeqnosResponse:
    """Success with (vbucket, high seqno) pairs, none included; or an error and its value."""
    opaque = draw(u32)
    if draw(st.booleans()):
        h = make_header(ClientOpcode.GET_ALL_VB_SEQNOS, status=Status.SUCCESS, opaque=opaque)
        highs = draw(st.lists(st.tuples(u16, seqno), max_size=5).map(tuple))
        return VbSeqnosResponse(h, "success", highs, b"")
    status = draw(st.sampled_from([Status.EINVAL, Status.NOT_SUPPORTED, Status.ETMPFAIL]))
    h = make_header(ClientOpcode.GET_ALL_VB_SEQNOS, status=status, opaque=opaque)
    return VbSeqnosResponse(h, status.name.lower(), None, draw(st.binary(max_size=20)))


def any_event(collections: bool) -> st.SearchStrategy[Event]:
    return st.one_of(
        mutations(collections),
        deletions(collections),
        expirations(collections),
        prepares(collections),
        commits(collections),
        aborts(collections),
        snapshot_markers(),
        system_events(),
        st.builds(SeqnoAdvanced, header(Opcode.DCP_SEQNO_ADVANCED), seqno),
        st.builds(OsoSnapshot, header(Opcode.DCP_OSO_SNAPSHOT), st.sampled_from([1, 2])),
        st.integers(0, 9).flatmap(
            lambda r: st.builds(
                StreamEnd,
                header(Opcode.DCP_STREAM_END),
                st.just(r),
                st.just(stream_end_reason_name(r)),
            )
        ),
        st.builds(Noop, header(Opcode.DCP_NOOP)),
        st.builds(SetVbucketState, header(Opcode.DCP_SET_VBUCKET_STATE), st.integers(1, 4)),
        stream_requests(),
        stream_request_responses(),
        st.builds(AddStream, header(Opcode.DCP_ADD_STREAM), u32),
        add_stream_responses(),
        st.builds(FailoverLogRequest, header(Opcode.DCP_GET_FAILOVER_LOG)),
        failover_logs().map(
            lambda log: FailoverLogResponse(
                make_header(Opcode.DCP_GET_FAILOVER_LOG, status=0), "success", log, b""
            )
        ),
        st.builds(BufferAck, header(Opcode.DCP_BUFFER_ACKNOWLEDGEMENT), u32),
        vb_seqnos_requests(),
        vb_seqnos_responses(),
    )


def frames(collections: bool, max_size: int = 30) -> st.SearchStrategy[list[bytes]]:
    """Encoded frames of random events."""
    return st.lists(any_event(collections).map(encode), min_size=1, max_size=max_size)

"""Decoded DCP frames: small immutable values, one class per message (docs/protocol/dcp.md §5–§6).

Every event carries its :class:`FrameHeader`; ``op`` is the snake-case name used in decode
output and bronze tables. Field names follow the spec.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, NamedTuple, get_args

from dcp_cdc.protocol import HEADER_LEN, RESPONSE_MAGICS, Datatype, OsoFlag, stream_flag_names

_RESPONSE_MAGICS = frozenset(int(m) for m in RESPONSE_MAGICS)
_JSON = int(Datatype.JSON)


class FrameHeader(NamedTuple):
    """The 24-byte header (docs/protocol/dcp.md §1.1) plus where the frame starts and its stream-id (§1.3).

    A named tuple rather than a frozen dataclass: it is built for every frame, and a frozen
    dataclass's ``__init__`` costs 2 µs for these twelve fields against 0.4 µs here.
    """

    offset: int
    magic: int
    opcode: int
    framing_extras_len: int
    key_len: int
    ext_len: int
    datatype: int
    vbucket_or_status: int
    body_len: int
    opaque: int
    cas: int
    stream_id: int | None = None

    @property
    def frame_len(self) -> int:
        return HEADER_LEN + self.body_len

    @property
    def is_response(self) -> bool:
        return self.magic in _RESPONSE_MAGICS

    @property
    def vbucket(self) -> int | None:
        """Header bytes 6–7 of a request; ``None`` on a response, where they hold a status."""
        return None if self.is_response else self.vbucket_or_status

    @property
    def status(self) -> int | None:
        return self.vbucket_or_status if self.is_response else None

    @property
    def is_json(self) -> bool:
        return bool(self.datatype & _JSON)


@dataclass(frozen=True, slots=True)
class Mutation:
    """DCP_MUTATION 0x57 (docs/protocol/dcp.md §6.4)."""

    op: ClassVar[str] = "mutation"
    header: FrameHeader
    by_seqno: int
    rev_seqno: int
    flags: int
    expiration: int
    lock_time: int
    nmeta: int
    nru: int
    collection_id: int | None
    key: bytes
    value: bytes
    xattrs: dict[str, str] | None


@dataclass(frozen=True, slots=True)
class Deletion:
    """DCP_DELETION 0x58, V1 (18-byte extras) or V2 (21, with delete_time) (docs/protocol/dcp.md §6.5)."""

    op: ClassVar[str] = "deletion"
    header: FrameHeader
    by_seqno: int
    rev_seqno: int
    delete_time: int | None
    collection_id: int | None
    key: bytes
    value: bytes
    xattrs: dict[str, str] | None

    @property
    def version(self) -> int:
        return 1 if self.delete_time is None else 2


@dataclass(frozen=True, slots=True)
class Expiration:
    """DCP_EXPIRATION 0x59 (docs/protocol/dcp.md §6.6)."""

    op: ClassVar[str] = "expiration"
    header: FrameHeader
    by_seqno: int
    rev_seqno: int
    delete_time: int
    collection_id: int | None
    key: bytes
    value: bytes
    xattrs: dict[str, str] | None


@dataclass(frozen=True, slots=True)
class Prepare:
    """DCP_PREPARE 0x60 (docs/protocol/dcp.md §6.12)."""

    op: ClassVar[str] = "prepare"
    header: FrameHeader
    by_seqno: int
    rev_seqno: int
    flags: int
    expiration: int
    lock_time: int
    nru: int
    deleted: int
    durability_level: int
    collection_id: int | None
    key: bytes
    value: bytes
    xattrs: dict[str, str] | None


@dataclass(frozen=True, slots=True)
class Commit:
    """DCP_COMMIT 0x62 (docs/protocol/dcp.md §6.12)."""

    op: ClassVar[str] = "commit"
    header: FrameHeader
    prepared_seqno: int
    commit_seqno: int
    collection_id: int | None
    key: bytes


@dataclass(frozen=True, slots=True)
class Abort:
    """DCP_ABORT 0x63 (docs/protocol/dcp.md §6.12)."""

    op: ClassVar[str] = "abort"
    header: FrameHeader
    prepared_seqno: int
    abort_seqno: int
    collection_id: int | None
    key: bytes


@dataclass(frozen=True, slots=True)
class SnapshotMarker:
    """DCP_SNAPSHOT_MARKER 0x56 in its three encodings V1, V2.0, V2.2 (docs/protocol/dcp.md §6.3)."""

    op: ClassVar[str] = "snapshot_marker"
    header: FrameHeader
    marker_version: str
    start_seqno: int
    end_seqno: int
    snapshot_flags: int
    max_visible_seqno: int | None = None
    high_completed_seqno: int | None = None
    purge_seqno: int | None = None
    high_prepared_seqno: int | None = None


@dataclass(frozen=True, slots=True)
class SystemEvent:
    """DCP_SYSTEM_EVENT 0x5f: collection and scope lifecycle (docs/protocol/dcp.md §6.7)."""

    op: ClassVar[str] = "system_event"
    header: FrameHeader
    by_seqno: int
    event_id: int
    version: int
    event: str
    manifest_uid: int | None
    scope_id: int | None
    collection_id: int | None
    name: str | None
    max_ttl: int | None
    value: bytes
    flush_uid: int | None = None
    history: bool | None = None


@dataclass(frozen=True, slots=True)
class SeqnoAdvanced:
    """DCP_SEQNO_ADVANCED 0x64 (docs/protocol/dcp.md §6.8)."""

    op: ClassVar[str] = "seqno_advanced"
    header: FrameHeader
    by_seqno: int


@dataclass(frozen=True, slots=True)
class OsoSnapshot:
    """DCP_OSO_SNAPSHOT 0x65: start (0x01) or end (0x02) of an OSO backfill (docs/protocol/dcp.md §6.9)."""

    op: ClassVar[str] = "oso_snapshot"
    header: FrameHeader
    oso_flags: int

    @property
    def is_start(self) -> bool:
        return bool(self.oso_flags & OsoFlag.START)

    @property
    def is_end(self) -> bool:
        return bool(self.oso_flags & OsoFlag.END)


@dataclass(frozen=True, slots=True)
class StreamEnd:
    """DCP_STREAM_END 0x55 (docs/protocol/dcp.md §6.10)."""

    op: ClassVar[str] = "stream_end"
    header: FrameHeader
    reason_code: int
    reason: str


@dataclass(frozen=True, slots=True)
class Noop:
    """DCP_NOOP 0x5c from the server, or the consumer's reply (docs/protocol/dcp.md §6.11)."""

    op: ClassVar[str] = "noop"
    header: FrameHeader


@dataclass(frozen=True, slots=True)
class SetVbucketState:
    """DCP_SET_VBUCKET_STATE 0x5b, takeover streams only (docs/protocol/dcp.md §6.13)."""

    op: ClassVar[str] = "set_vbucket_state"
    header: FrameHeader
    vbucket_state: int


@dataclass(frozen=True, slots=True)
class StreamRequest:
    """The consumer's DCP_STREAM_REQ 0x53 (docs/protocol/dcp.md §4.4); ``value`` is its optional JSON text."""

    op: ClassVar[str] = "stream_request"
    header: FrameHeader
    flags: int
    start_seqno: int
    end_seqno: int
    vb_uuid: int
    snap_start_seqno: int
    snap_end_seqno: int
    value: str

    @property
    def flag_names(self) -> tuple[str, ...]:
        return stream_flag_names(self.flags)


@dataclass(frozen=True, slots=True)
class AddStream:
    """DCP_ADD_STREAM 0x51: tells a consumer to open a stream of the header's vbucket
    (add-stream.md; KV-internal replication, docs/protocol/dcp.md §5). ``flags`` are stream flags (§4.4)."""

    op: ClassVar[str] = "add_stream"
    header: FrameHeader
    flags: int

    @property
    def flag_names(self) -> tuple[str, ...]:
        return stream_flag_names(self.flags)


@dataclass(frozen=True, slots=True)
class AddStreamResponse:
    """Reply to DCP_ADD_STREAM (add-stream.md): on success ``stream_opaque``, the opaque the
    new stream's messages carry; on an error status the value the server sent, if any."""

    op: ClassVar[str] = "add_stream_response"
    header: FrameHeader
    status_name: str
    stream_opaque: int | None
    value: bytes


FailoverLog = tuple[tuple[int, int], ...]
"""``((vb_uuid, seqno), ...)``, newest entry first (docs/protocol/dcp.md §6.1)."""


@dataclass(frozen=True, slots=True)
class StreamRequestResponse:
    """Reply to DCP_STREAM_REQ (docs/protocol/dcp.md §6.1): a failover log, a rollback seqno, or an error.

    ``value`` holds the payload of an error status only (a parsed value is not kept twice).
    """

    op: ClassVar[str] = "stream_request_response"
    header: FrameHeader
    status_name: str
    failover_log: FailoverLog | None
    rollback_seqno: int | None
    value: bytes


@dataclass(frozen=True, slots=True)
class FailoverLogRequest:
    """The consumer's DCP_GET_FAILOVER_LOG 0x54 (docs/protocol/dcp.md §6.2)."""

    op: ClassVar[str] = "failover_log_request"
    header: FrameHeader


@dataclass(frozen=True, slots=True)
class FailoverLogResponse:
    """Reply to DCP_GET_FAILOVER_LOG (docs/protocol/dcp.md §6.2)."""

    op: ClassVar[str] = "failover_log_response"
    header: FrameHeader
    status_name: str
    failover_log: FailoverLog | None
    value: bytes


HighSeqnos = tuple[tuple[int, int], ...]
"""``((vbucket, high seqno), ...)`` in the order the node sent them."""


@dataclass(frozen=True, slots=True)
class VbSeqnosRequest:
    """The consumer's GET_ALL_VB_SEQNOS 0x48 (a memcached command, not DCP): the high seqno
    of every vbucket the node holds in ``vbucket_state`` (1 active, 0 any), of one collection
    when ``collection_id`` is set. The capture agent records one at the end of a session."""

    op: ClassVar[str] = "vb_seqnos_request"
    header: FrameHeader
    vbucket_state: int | None
    collection_id: int | None


@dataclass(frozen=True, slots=True)
class VbSeqnosResponse:
    """Reply to GET_ALL_VB_SEQNOS: ``high_seqnos`` on success, else ``value`` as it came."""

    op: ClassVar[str] = "vb_seqnos_response"
    header: FrameHeader
    status_name: str
    high_seqnos: HighSeqnos | None
    value: bytes


@dataclass(frozen=True, slots=True)
class BufferAck:
    """The consumer's DCP_BUFFER_ACKNOWLEDGEMENT 0x5d (docs/protocol/dcp.md §7.6)."""

    op: ClassVar[str] = "buffer_ack"
    header: FrameHeader
    buffer_bytes: int


@dataclass(frozen=True, slots=True)
class UnknownFrame:
    """A well-framed message this decoder has no reader for; ``raw`` is the whole frame."""

    op: ClassVar[str] = "unknown"
    header: FrameHeader
    raw: bytes


Event = (
    Mutation
    | Deletion
    | Expiration
    | Prepare
    | Commit
    | Abort
    | SnapshotMarker
    | SystemEvent
    | SeqnoAdvanced
    | OsoSnapshot
    | StreamEnd
    | Noop
    | SetVbucketState
    | StreamRequest
    | StreamRequestResponse
    | AddStream
    | AddStreamResponse
    | FailoverLogRequest
    | FailoverLogResponse
    | BufferAck
    | UnknownFrame
    | VbSeqnosRequest
    | VbSeqnosResponse
)

OPS: tuple[str, ...] = tuple(cls.op for cls in get_args(Event))
"""Every ``op`` of decode output and bronze rows, one per event class."""
DATA_OPS: tuple[str, ...] = (Mutation.op, Deletion.op, Expiration.op)
"""The ops that change a document (docs/protocol/dcp.md §6.4–§6.6): what silver applies."""

"""The capture agent's DCP consumer, sans-I/O (h11 style): bytes in, events and bytes out.

One :class:`ConsumerConnection` is one DCP connection to one data node. It holds every
protocol rule: the handshake (HELLO, SASL SCRAM, SELECT_BUCKET, GET_CLUSTER_CONFIG,
DCP_OPEN, DCP_CONTROL; research §1.3), stream requests with opaque = vbucket
(capture-format.md), rollback (spec §7.5: prune the failover log, re-request from the rollback
seqno), NOOP replies (§6.11), flow control (§7.6) and per-vbucket positions at snapshot
boundaries (§6.3, §6.9, §7.2). No sockets, files or clocks: the driver feeds
:meth:`~ConsumerConnection.receive_data`, sends :meth:`~ConsumerConnection.data_to_send`,
writes :meth:`~ConsumerConnection.take_capture` and reports :meth:`~ConsumerConnection.consumed`.

Recorded into the capture, in wire order: our STREAM_REQ, BUFFER_ACK and NOOP replies; the
server's STREAM_REQ responses, DCP_NOOPs and every DCP stream message (0x55–0x67); and the
cluster state a session ends with (:meth:`~ConsumerConnection.record_cluster_state`: one
GET_ALL_VB_SEQNOS and a DCP_GET_FAILOVER_LOG per vbucket, requests and replies). Never
recorded: HELLO, SASL (secrets), SELECT_BUCKET, DCP_OPEN, DCP_CONTROL, cluster configs,
CLOSE_STREAM, the GET_ALL_VB_SEQNOS that set ``until-now``'s ends, and their replies.

Speed: :meth:`~ConsumerConnection.receive_data` walks the frames with one ``struct`` unpack
each (header plus the first extras word, which is the seqno of every data frame), keeps
per-vbucket state in flat lists, and hands recorded runs of frames out as slices.
"""

from __future__ import annotations

import json
import struct
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dcp_cdc import flatbuf, layouts
from dcp_cdc.agent.positions import FailoverEntries, VbPosition, prune_log, uuid_at
from dcp_cdc.errors import (
    AgentUsageError,
    AuthenticationError,
    FieldError,
    ProtocolError,
    ScramError,
)
from dcp_cdc.protocol import (
    NO_END_SEQNO,
    ClientOpcode,
    DcpOpenFlag,
    HelloFeature,
    Opcode,
    ServerOpcode,
    Status,
    StreamEndReason,
    StreamRequestFlag,
    VbucketState,
    status_name,
    stream_end_reason_name,
)
from dcp_cdc.scram import MECHANISMS, ScramClient, new_nonce

# --- events ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ready:
    """The handshake is done: streams may be opened."""

    features: tuple[str, ...]
    cluster_config: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """A cluster map: a GET_CLUSTER_CONFIG reply, a change notification (0x82/0x01; an empty
    ``config`` when the server sent only the revision) or a NOT_MY_VBUCKET body."""

    config: dict[str, Any]
    rev: int


@dataclass(frozen=True, slots=True)
class HighSeqnos:
    """GET_ALL_VB_SEQNOS: the high seqno of every vbucket active on this node."""

    seqnos: dict[int, int]


@dataclass(frozen=True, slots=True)
class ClusterStateRecorded:
    """:meth:`ConsumerConnection.record_cluster_state` is done: the node's high seqnos and the
    failover logs of the vbuckets asked for are in the capture (as their reply frames)."""

    high_seqnos: dict[int, int]
    failover_logs: dict[int, FailoverEntries]


@dataclass(frozen=True, slots=True)
class CollectionsManifest:
    """GET_COLLECTIONS_MANIFEST: the bucket's scopes and collections (uids as hex strings)."""

    manifest: dict[str, Any]


@dataclass(frozen=True, slots=True)
class StreamOpened:
    vbucket: int
    failover_log: FailoverEntries


@dataclass(frozen=True, slots=True)
class StreamRolledBack:
    """The server asked for a rollback to ``seqno``; the core has re-requested from there."""

    vbucket: int
    seqno: int


@dataclass(frozen=True, slots=True)
class NotMyVbucket:
    """This node does not hold the vbucket active: refresh the map, open it on its owner."""

    vbucket: int


@dataclass(frozen=True, slots=True)
class StreamRefused:
    """A STREAM_REQ refused with another status (ETMPFAIL, ENOMEM, EACCESS, ...)."""

    vbucket: int
    status: int
    status_name: str


@dataclass(frozen=True, slots=True)
class StreamEnded:
    vbucket: int
    reason: int
    reason_name: str


@dataclass(frozen=True, slots=True)
class ControlRefused:
    """An optional DCP_CONTROL the server refused (EINVAL / NOT_SUPPORTED): recorded only."""

    key: str
    status: int


AgentEvent = (
    Ready
    | ClusterConfig
    | HighSeqnos
    | ClusterStateRecorded
    | CollectionsManifest
    | StreamOpened
    | StreamRolledBack
    | NotMyVbucket
    | StreamRefused
    | StreamEnded
    | ControlRefused
)


class NeedData:
    """:meth:`ConsumerConnection.next_event`'s answer when no event is queued."""

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA = NeedData()

# --- settings -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConsumerSettings:
    node: str
    """``host:port``: only a label for errors."""
    bucket: str
    username: str
    password: str = field(repr=False)
    tls: bool
    """PLAIN is used only over TLS; otherwise SCRAM-SHA512 > SHA256 > SHA1."""
    connection_name: str
    buffer_bytes: int = 16 << 20
    """connection_buffer_size. BUFFER_ACK once 20 % of it is consumed (kv_engine's
    recommended-apis.md suggests 20 %; gocbcore acks at 50 %, java-dcp-client at 80 %)."""
    noop_interval_s: int = 120
    collections: bool = True
    nonce: str | None = field(default=None, repr=False)
    """The SCRAM client nonce; tests fix it, None = random."""


# --- wire helpers ---------------------------------------------------------------------------

_HEAD = layouts.joined(layouts.HEADER)  # the 24-byte header (spec §1.1), from the one table
_HEAD_SEQNO = struct.Struct(">BBHBBHI12xQ")  # header up to body_len, then extras' first u64
_HEAD_SHORT = struct.Struct(">BBHBBHI")  # the same for a frame too short for the seqno
_U64 = struct.Struct(">Q")
_U64_PAIR = struct.Struct(">QQ")
_U32 = struct.Struct(">I")
_VB_SEQNO = struct.Struct(">HQ")
_FAILOVER_ENTRY = struct.Struct(">QQ")
_STREAM_REQ_EXTRAS = struct.Struct(">IIQQQQQ")
_UID_ONLY: flatbuf.Schema = (("uid", "u64"),)

_REQ = 0x80
_RES = 0x81
_SERVER_REQ = 0x82
_ALT_REQ = 0x08
_ALT_RES = 0x18

_COMMAND_OPAQUE_BASE = 0x0001_0000
"""Opaques of our non-stream commands start above every u16 vbucket (STREAM_REQ opaque)."""

NO_SNAPSHOT = -2
"""``pending_end`` of a vbucket with no open snapshot: its items take the checked path."""
IN_OSO = -1
"""``pending_end`` of a vbucket inside an OSO snapshot (spec §6.9)."""

_ITEM, _SYSEV, _MARKER, _END, _OSO, _NOOP, _OTHER = range(1, 8)
_KINDS = bytearray(256)
for _op in (Opcode.DCP_MUTATION, Opcode.DCP_DELETION, Opcode.DCP_EXPIRATION):
    _KINDS[_op] = _ITEM
_KINDS[Opcode.DCP_SEQNO_ADVANCED] = _ITEM
_KINDS[Opcode.DCP_SYSTEM_EVENT] = _SYSEV
_KINDS[Opcode.DCP_SNAPSHOT_MARKER] = _MARKER
_KINDS[Opcode.DCP_STREAM_END] = _END
_KINDS[Opcode.DCP_OSO_SNAPSHOT] = _OSO
_KINDS[Opcode.DCP_NOOP] = _NOOP
for _op in (
    Opcode.DCP_SET_VBUCKET_STATE,
    Opcode.DCP_PREPARE,
    Opcode.DCP_COMMIT,
    Opcode.DCP_ABORT,
    Opcode.DCP_CACHE_TRANSFER,
    Opcode.DCP_CACHE_TRANSFER_END,
):
    _KINDS[_op] = _OTHER
"""Server requests (magic 0x80) the fast path knows; 0 = the checked slow path."""

_HELLO_FEATURES = {
    HelloFeature.XATTR: "xattr",
    HelloFeature.XERROR: None,
    HelloFeature.SELECT_BUCKET: None,
    HelloFeature.SNAPPY: "snappy",
    HelloFeature.JSON: "json",
    HelloFeature.DUPLEX: None,
    HelloFeature.CLUSTERMAP_CHANGE_NOTIFICATION: None,
    HelloFeature.COLLECTIONS: None,
}
"""HELLO features we ask for → their capture-header feature name (None: not a feature of the
frames; collections has its own header field)."""


@dataclass(frozen=True, slots=True)
class _Control:
    key: str
    value: str
    required: bool
    feature: str | None = None


_REFUSALS = frozenset({Status.EINVAL, Status.NOT_SUPPORTED})


def _frame(
    magic: int,
    opcode: int,
    *,
    word: int = 0,
    opaque: int = 0,
    extras: bytes = b"",
    key: bytes = b"",
    value: bytes = b"",
) -> bytes:
    body = len(extras) + len(key) + len(value)
    head = _HEAD.pack(magic, opcode, len(key), len(extras), 0, word, body, opaque, 0)
    return head + extras + key + value


def _parse_failover_log(value: bytes, vbucket: int) -> FailoverEntries:
    if len(value) % 16:
        raise ProtocolError(
            f"vbucket {vbucket}: failover log of {len(value)} bytes is not a multiple of 16"
        )
    return tuple((uuid, seqno) for uuid, seqno in _FAILOVER_ENTRY.iter_unpack(value))


def _parse_config(value: bytes, what: str) -> dict[str, Any]:
    try:
        config = json.loads(value)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"{what}: the cluster config is not JSON ({exc})") from None
    if not isinstance(config, dict):
        raise ProtocolError(f"{what}: the cluster config is not a JSON object")
    return config


def _config_rev(config: dict[str, Any]) -> int:
    rev = config.get("rev", 0)
    return rev if isinstance(rev, int) else 0


class _Vb:
    """Slow-changing state of one vbucket (the hot seqnos live in the connection's lists)."""

    __slots__ = (
        "collections",
        "end_seqno",
        "failover_log",
        "goal_end",
        "manifest_uid",
        "purge_seqno",
        "rollbacks",
        "snap_end",
        "state",
    )

    def __init__(self) -> None:
        self.state = "idle"  # idle | requested | open | closing
        self.end_seqno = NO_END_SEQNO
        """The end seqno of the request on the wire."""
        self.goal_end = NO_END_SEQNO
        """Where the caller wants the stream to end (see :meth:`ConsumerConnection.open_stream`)."""
        self.collections: tuple[int, ...] | None = None
        self.failover_log: FailoverEntries = ()
        self.manifest_uid = 0
        self.purge_seqno = 0
        self.rollbacks = 0
        self.snap_end = 0


_MAX_ROLLBACKS = 16
"""Rollback answers to one open_stream before we call the server broken."""

_Handler = Callable[[int, bytes, bytes], None]  # (status, extras, value)


class ConsumerConnection:
    """One DCP connection's protocol state; see the module docstring."""

    def __init__(self, settings: ConsumerSettings) -> None:
        if settings.buffer_bytes < 1:
            raise AgentUsageError("buffer_bytes must be positive")
        self.settings = settings
        self.features: tuple[str, ...] = ()
        self.collections = False
        self.ready = False
        self._features: list[str] = []
        self._hello_accepted: set[int] = set()
        self._out: list[bytes] = []
        self._events: deque[AgentEvent] = deque()
        self._capture: list[bytes] = []
        self._rest = b""
        self._pending: dict[int, tuple[str, _Handler, bool]] = {}
        self._recording: frozenset[int] = frozenset()
        self._recorded: ClusterStateRecorded | None = None
        self._logs_due: set[int] = set()
        self._opaque = _COMMAND_OPAQUE_BASE
        self._scram: ScramClient | None = None
        self._mechanism = ""
        self._controls: list[_Control] = []
        self._cluster_config: dict[str, Any] = {}
        # per-vbucket hot state, indexed by vbucket (a u16)
        self._pending_end = [NO_SNAPSHOT] * 0x10000
        self._consistent = [0] * 0x10000
        self._oso_max: dict[int, int] = {}
        self._vbs: dict[int, _Vb] = {}
        self._positions: dict[int, VbPosition] = {}
        self._dirty: set[int] = set()
        # flow control (spec §7.6)
        self._fc_in_capture = 0  # flow-controlled bytes in self._capture, not yet taken
        self._takes: deque[list[int]] = deque()  # [bytes left to consume, fc bytes] per take
        self._ack_pending = 0
        self.ack_threshold = max(1, settings.buffer_bytes // 5)
        self._hello()

    # --- the driver's API -------------------------------------------------------------------

    def data_to_send(self) -> bytes:
        """Bytes to write to the socket, in order; emptied by the call."""
        out = b"".join(self._out)
        self._out.clear()
        return out

    def next_event(self) -> AgentEvent | NeedData:
        return self._events.popleft() if self._events else NEED_DATA

    def take_capture(self) -> bytes:
        """The frames to record since the last call, whole, in wire order, both directions."""
        out = b"".join(self._capture)
        self._capture.clear()
        if out:
            self._takes.append([len(out), self._fc_in_capture])
        self._fc_in_capture = 0
        return out

    def consumed(self, nbytes: int) -> None:
        """``nbytes`` of taken capture are safely in the writer's queue: their flow-controlled
        bytes may be acknowledged (a BUFFER_ACK once 20 % of the buffer is due)."""
        takes = self._takes
        while nbytes > 0:
            if not takes:
                raise AgentUsageError("consumed() reports more bytes than take_capture() gave")
            take = takes[0]
            if nbytes < take[0]:
                take[0] -= nbytes
                break
            nbytes -= take[0]
            self._ack_pending += take[1]
            takes.popleft()
        if self._ack_pending >= self.ack_threshold:
            ack = _frame(
                _REQ,
                Opcode.DCP_BUFFER_ACKNOWLEDGEMENT,
                extras=_U32.pack(self._ack_pending),
            )
            self._ack_pending = 0
            self._out.append(ack)
            self._capture.append(ack)

    def positions(self) -> dict[int, VbPosition]:
        """Every streamed vbucket's position as of all frames processed so far, i.e. as of
        the frames the last (or the next) :meth:`take_capture` hands out."""
        cons = self._consistent
        for vb in self._dirty:
            meta = self._vbs[vb]
            seqno = cons[vb]
            self._positions[vb] = VbPosition(
                vb,
                seqno,
                uuid_at(meta.failover_log, seqno),
                meta.failover_log,
                meta.manifest_uid,
                meta.purge_seqno,
            )
        self._dirty.clear()
        return dict(self._positions)

    def streaming(self) -> frozenset[int]:
        """vbuckets with a stream requested, open or closing on this connection."""
        return frozenset(vb for vb, meta in self._vbs.items() if meta.state != "idle")

    def open_stream(
        self,
        vbucket: int,
        position: VbPosition | None,
        *,
        end_seqno: int = NO_END_SEQNO,
        collections: tuple[int, ...] | None = None,
    ) -> None:
        """STREAM_REQ from ``position`` (None: from seqno 0, no history) to ``end_seqno``.

        A start past ``end_seqno`` (the node's high seqno is below our position: only a
        failover lowers it) is still asked for, as a stream from the start to the start: the
        node either ends it at once (reason OK: our branch is its branch) or answers ROLLBACK
        (docs/protocol: a stream request is where the node judges our history). The
        re-request after a rollback to R ends at ``max(R, end_seqno)``."""
        self._require_ready("open_stream")
        if not 0 <= vbucket < 0x10000:
            raise AgentUsageError(f"vbucket {vbucket} is not a u16")
        meta = self._vbs.setdefault(vbucket, _Vb())
        if meta.state != "idle":
            raise AgentUsageError(f"vbucket {vbucket} already has a stream ({meta.state})")
        if collections is not None and not self.collections:
            raise AgentUsageError("a collection filter needs a collection-aware connection")
        seqno = 0
        if position is not None:
            if position.vbucket != vbucket:
                raise AgentUsageError(f"position of vbucket {position.vbucket} for {vbucket}")
            seqno = position.seqno
            meta.failover_log = position.failover_log
            meta.manifest_uid = position.manifest_uid
            meta.purge_seqno = position.purge_seqno
            vb_uuid = position.vb_uuid
        else:
            meta.failover_log = ()
            vb_uuid = 0
        meta.goal_end = end_seqno
        meta.end_seqno = max(seqno, end_seqno)
        meta.collections = collections
        meta.rollbacks = 0
        self._consistent[vbucket] = seqno
        self._pending_end[vbucket] = NO_SNAPSHOT
        self._dirty.add(vbucket)
        self._stream_request(vbucket, meta, seqno, vb_uuid)

    def requested_end(self, vbucket: int) -> int | None:
        """The end seqno of ``vbucket``'s stream request on the wire; None without a stream."""
        meta = self._vbs.get(vbucket)
        return None if meta is None or meta.state == "idle" else meta.end_seqno

    def record_cluster_state(self, vbuckets: frozenset[int]) -> None:
        """Record what the node holds now, into the capture (requests and replies): its high
        seqnos (GET_ALL_VB_SEQNOS of the active vbuckets), then the failover log of each of
        ``vbuckets`` it holds active (DCP_GET_FAILOVER_LOG, opaque = the vbucket, as stream
        requests). :class:`ClusterStateRecorded` follows the last reply. Quality checks that
        silver lies on the cluster's current branch from these frames."""
        self._require_ready("record_cluster_state")
        self._recording = vbuckets
        self._command(
            "get_all_vb_seqnos",
            self._recorded_high_seqnos,
            ClientOpcode.GET_ALL_VB_SEQNOS,
            extras=_U32.pack(VbucketState.ACTIVE),
            recorded=True,
        )

    def _recorded_high_seqnos(self, status: int, extras: bytes, value: bytes) -> None:
        highs = self._vb_seqnos(status, value)
        self._recorded = ClusterStateRecorded(highs, {})
        self._logs_due = set(highs) & self._recording
        for vb in sorted(self._logs_due):
            req = _frame(_REQ, Opcode.DCP_GET_FAILOVER_LOG, word=vb, opaque=vb)
            self._out.append(req)
            self._capture.append(req)
        if not self._logs_due:
            self._events.append(self._recorded)

    def _failover_log_reply(self, vb: int, status: int, value: bytes) -> None:
        if self._recorded is None or vb not in self._logs_due:
            raise ProtocolError(f"a failover log for vbucket {vb}, which we did not ask for")
        self._logs_due.discard(vb)
        if status == Status.SUCCESS:
            self._recorded.failover_logs[vb] = _parse_failover_log(value, vb)
        if not self._logs_due:  # a vbucket that moved away meanwhile is recorded as refused
            self._events.append(self._recorded)

    def close_stream(self, vbucket: int) -> None:
        """CLOSE_STREAM; STREAM_END (closed) follows. A no-op when the stream has ended."""
        meta = self._vbs.get(vbucket)
        if meta is None or meta.state in ("idle", "closing"):
            return
        meta.state = "closing"
        self._command("close_stream", self._closed, Opcode.DCP_CLOSE_STREAM, word=vbucket)

    def request_cluster_config(self) -> None:
        self._require_ready("request_cluster_config")
        self._command("get_cluster_config", self._config_reply, ClientOpcode.GET_CLUSTER_CONFIG)

    def request_high_seqnos(self) -> None:
        """GET_ALL_VB_SEQNOS of the active vbuckets (→ :class:`HighSeqnos`)."""
        self._require_ready("request_high_seqnos")
        self._command(
            "get_all_vb_seqnos",
            self._high_seqnos,
            ClientOpcode.GET_ALL_VB_SEQNOS,
            extras=_U32.pack(VbucketState.ACTIVE),
        )

    def request_collections_manifest(self) -> None:
        """GET_COLLECTIONS_MANIFEST (→ :class:`CollectionsManifest`)."""
        self._require_ready("request_collections_manifest")
        self._command(
            "get_collections_manifest", self._manifest, ClientOpcode.GET_COLLECTIONS_MANIFEST
        )

    # --- receiving --------------------------------------------------------------------------

    def receive_data(self, data: bytes) -> None:
        """Process every whole frame in the data received so far (a partial frame waits)."""
        if self._rest:
            data = self._rest + data
        n = len(data)
        pos = run = fc = 0
        unpack = _HEAD_SEQNO.unpack_from
        kinds = _KINDS
        pend = self._pending_end
        cons = self._consistent
        dirty = self._dirty
        capture = self._capture
        try:
            while True:
                if pos + 32 <= n:
                    magic, op, _k, ext_len, _d, vb, blen, seqno = unpack(data, pos)
                elif pos + 24 <= n:
                    magic, op, _k, ext_len, _d, vb, blen = _HEAD_SHORT.unpack_from(data, pos)
                    seqno = 0
                else:
                    break
                end = pos + 24 + blen
                if end > n:
                    break
                kind = kinds[op] if magic == _REQ else 0
                if kind == _ITEM:
                    fc += end - pos
                    p = pend[vb]
                    if seqno >= p:  # checked only here: a low seqno changes nothing
                        if p >= 0 and 8 <= ext_len <= blen:
                            cons[vb] = p
                            pend[vb] = NO_SNAPSHOT
                            dirty.add(vb)
                        else:
                            self._odd_item(vb, seqno, op, ext_len, blen)
                elif kind == _MARKER:
                    fc += end - pos
                    self._marker(data, pos, vb, ext_len, end)
                elif kind == _NOOP:
                    capture.append(data[run:end])
                    run = end
                    reply = _frame(
                        _RES, Opcode.DCP_NOOP, opaque=_U32.unpack_from(data, pos + 12)[0]
                    )
                    capture.append(reply)
                    self._out.append(reply)
                elif kind == _SYSEV:
                    fc += end - pos
                    self._system_event(data, pos, vb, seqno, end)
                elif kind == _END:
                    fc += end - pos
                    self._sized(vb, op, ext_len, blen, 4)
                    self._stream_end(data, pos, vb)
                elif kind == _OSO:
                    fc += end - pos
                    self._sized(vb, op, ext_len, blen, 4)
                    self._oso(data, pos, vb)
                elif kind == _OTHER:
                    fc += end - pos
                else:
                    if run < pos:
                        capture.append(data[run:pos])
                    run = end
                    self._fc_in_capture += fc
                    fc = 0
                    self._slow(data[pos:end], magic, op)
                pos = end
        finally:
            if run < pos:
                capture.append(data[run:pos])
            self._fc_in_capture += fc
            self._rest = data[pos:] if pos < n else b""

    # --- the fast path's helpers (once per snapshot, stream end, ...) ----------------------

    def _stream_meta(self, vb: int, what: str) -> _Vb:
        meta = self._vbs.get(vb)
        if meta is None or meta.state not in ("open", "closing"):
            raise ProtocolError(f"{what} for vbucket {vb}, which has no open stream")
        return meta

    @staticmethod
    def _sized(vb: int, op: int, ext_len: int, body_len: int, want: int) -> None:
        if ext_len != want or body_len < ext_len:
            raise ProtocolError(
                f"vbucket {vb}: opcode 0x{op:02x} with {ext_len} bytes of extras in a "
                f"{body_len}-byte body (expected {want} bytes of extras)"
            )

    def _odd_item(self, vb: int, seqno: int, op: int, ext_len: int, body_len: int) -> None:
        if not 8 <= ext_len <= body_len:
            raise ProtocolError(
                f"vbucket {vb}: opcode 0x{op:02x} with {ext_len} bytes of extras in a "
                f"{body_len}-byte body: no seqno"
            )
        if vb in self._oso_max:
            if seqno > self._oso_max[vb]:
                self._oso_max[vb] = seqno
            return
        meta = self._stream_meta(vb, f"opcode 0x{op:02x}")
        if op == Opcode.DCP_SEQNO_ADVANCED:
            return  # outside a snapshot it moves nothing we can stand on
        raise ProtocolError(
            f"vbucket {vb}: opcode 0x{op:02x} at seqno {seqno} outside any snapshot "
            f"(state {meta.state})"
        )

    def _marker(self, data: bytes, pos: int, vb: int, ext_len: int, end: int) -> None:
        meta = self._stream_meta(vb, "snapshot marker")
        if ext_len == 20 and end - pos >= 24 + 20:
            _start, snap_end = _U64_PAIR.unpack_from(data, pos + 24)
        elif ext_len == 1 and end - pos >= 25 + 20:
            _start, snap_end = _U64_PAIR.unpack_from(data, pos + 25)
            if data[pos + 24] == 2 and end - pos >= 25 + 44:
                meta.purge_seqno = _U64.unpack_from(data, pos + 25 + 36)[0]
        else:
            raise ProtocolError(f"vbucket {vb}: snapshot marker with {ext_len} bytes of extras")
        pend = self._pending_end
        if pend[vb] >= 0:  # the next marker completes the previous snapshot (spec §6.3)
            self._consistent[vb] = pend[vb]
        elif pend[vb] == IN_OSO:
            raise ProtocolError(f"vbucket {vb}: snapshot marker inside an OSO snapshot")
        pend[vb] = snap_end
        meta.snap_end = snap_end
        self._dirty.add(vb)

    def _system_event(self, data: bytes, pos: int, vb: int, seqno: int, end: int) -> None:
        key_len = _U32.unpack_from(data, pos)[0] & 0xFFFF
        self._sized(vb, Opcode.DCP_SYSTEM_EVENT, data[pos + 4], end - pos - 24 - key_len, 13)
        value = data[pos + 24 + 13 + key_len : end]
        try:
            if data[pos + 24 + 12] == 2:
                uid = int(flatbuf.read_table(value, _UID_ONLY)["uid"] or 0)
            else:
                uid = _U64.unpack_from(value)[0] if len(value) >= 8 else 0
        except (FieldError, struct.error):
            raise ProtocolError(
                f"vbucket {vb}: system event at seqno {seqno} is malformed"
            ) from None
        meta = self._stream_meta(vb, "system event")
        if uid > meta.manifest_uid:
            meta.manifest_uid = uid
            self._dirty.add(vb)
        p = self._pending_end[vb]
        if seqno >= p:
            if p >= 0:
                self._consistent[vb] = p
                self._pending_end[vb] = NO_SNAPSHOT
                self._dirty.add(vb)
            else:
                self._odd_item(vb, seqno, Opcode.DCP_SYSTEM_EVENT, 13, end - pos - 24)

    def _oso(self, data: bytes, pos: int, vb: int) -> None:
        self._stream_meta(vb, "OSO snapshot")
        flags = _U32.unpack_from(data, pos + 24)[0]
        pend = self._pending_end
        if flags & 0x01:  # start: the marker of an unordered backfill (spec §6.9)
            if pend[vb] >= 0:
                self._consistent[vb] = pend[vb]
            pend[vb] = IN_OSO
            self._oso_max[vb] = self._consistent[vb]
        elif flags & 0x02:
            if vb not in self._oso_max:
                raise ProtocolError(f"vbucket {vb}: OSO end without an OSO start")
            self._consistent[vb] = max(self._consistent[vb], self._oso_max.pop(vb))
            pend[vb] = NO_SNAPSHOT
        self._dirty.add(vb)

    def _stream_end(self, data: bytes, pos: int, vb: int) -> None:
        meta = self._stream_meta(vb, "stream end")
        reason = _U32.unpack_from(data, pos + 24)[0]
        pend = self._pending_end
        if reason == StreamEndReason.OK and pend[vb] >= 0:
            self._consistent[vb] = pend[vb]
        pend[vb] = NO_SNAPSHOT
        self._oso_max.pop(vb, None)  # an unfinished OSO snapshot resumes from before it
        meta.state = "idle"
        self._dirty.add(vb)
        self._events.append(StreamEnded(vb, reason, stream_end_reason_name(reason)))

    # --- the slow path: responses and everything unusual ------------------------------------

    def _slow(self, frame: bytes, magic: int, opcode: int) -> None:
        _m, _o, key_len, ext_len, _dt, word, _bl, opaque, _cas = _HEAD.unpack_from(frame)
        fe_len = 0
        if magic in (_ALT_REQ, _ALT_RES):
            fe_len, key_len = key_len >> 8, key_len & 0xFF
        extras = frame[24 + fe_len : 24 + fe_len + ext_len]
        value = frame[24 + fe_len + ext_len + key_len :]
        if magic == _RES:
            if opcode == Opcode.DCP_STREAM_REQ and opaque < _COMMAND_OPAQUE_BASE:
                self._capture.append(frame)
                self._stream_reply(opaque, word, value)
                return
            if opcode == Opcode.DCP_GET_FAILOVER_LOG and opaque < _COMMAND_OPAQUE_BASE:
                self._capture.append(frame)
                self._failover_log_reply(opaque, word, value)
                return
            entry = self._pending.pop(opaque, None)
            if entry is None:
                raise ProtocolError(
                    f"a reply (opcode 0x{opcode:02x}, opaque 0x{opaque:08x}) to no request of ours"
                )
            if entry[2]:
                self._capture.append(frame)
            entry[1](word, extras, value)
            return
        if magic == _SERVER_REQ:
            if opcode == ServerOpcode.CLUSTERMAP_CHANGE_NOTIFICATION:
                self._notification(extras, value)
            return  # other duplex requests are not for a DCP connection: ignored
        raise ProtocolError(
            f"unexpected frame: magic 0x{magic:02x}, opcode 0x{opcode:02x}"
            + (" (stream ids were not negotiated)" if magic == _ALT_REQ else "")
        )

    def _notification(self, extras: bytes, value: bytes) -> None:
        if value:
            config = _parse_config(value, "cluster map notification")
            self._events.append(ClusterConfig(config, _config_rev(config)))
        else:  # brief form: only (epoch, rev) or rev in the extras
            rev = int.from_bytes(extras[-8:] if len(extras) >= 16 else extras, "big")
            self._events.append(ClusterConfig({}, rev))

    def _stream_request(self, vb: int, meta: _Vb, seqno: int, vb_uuid: int) -> None:
        value: dict[str, object] = {}
        if meta.collections is not None:
            value["collections"] = [format(cid, "x") for cid in meta.collections]
        if meta.purge_seqno and "max_marker_version_2.2" in self.features:
            value["purge_seqno"] = str(meta.purge_seqno)
        extras = _STREAM_REQ_EXTRAS.pack(
            StreamRequestFlag.ACTIVE_VB_ONLY, 0, seqno, meta.end_seqno, vb_uuid, seqno, seqno
        )
        body = json.dumps(value, separators=(",", ":")).encode() if value else b""
        req = _frame(_REQ, Opcode.DCP_STREAM_REQ, word=vb, opaque=vb, extras=extras, value=body)
        meta.state = "requested"
        self._out.append(req)
        self._capture.append(req)

    def _stream_reply(self, vb: int, status: int, value: bytes) -> None:
        meta = self._vbs.get(vb)
        if meta is None or meta.state not in ("requested", "closing"):
            raise ProtocolError(f"a STREAM_REQ reply for vbucket {vb}, which we did not request")
        if status == Status.SUCCESS:
            meta.failover_log = _parse_failover_log(value, vb)
            if meta.state == "requested":
                meta.state = "open"
            else:  # closed before it opened: the close is in flight
                pass
            self._dirty.add(vb)
            self._events.append(StreamOpened(vb, meta.failover_log))
            return
        if status == Status.ROLLBACK:
            if len(value) != 8:
                raise ProtocolError(f"vbucket {vb}: rollback reply of {len(value)} bytes, not 8")
            seqno = _U64.unpack(value)[0]
            meta.rollbacks += 1
            if meta.rollbacks > _MAX_ROLLBACKS or seqno > self._consistent[vb]:
                raise ProtocolError(
                    f"vbucket {vb}: rollback to {seqno} from {self._consistent[vb]} "
                    f"(answer {meta.rollbacks} to one stream request)"
                )
            meta.failover_log = prune_log(meta.failover_log, seqno)
            self._consistent[vb] = seqno
            self._dirty.add(vb)
            self._events.append(StreamRolledBack(vb, seqno))
            if meta.state == "closing":
                meta.state = "idle"
                self._events.append(StreamEnded(vb, StreamEndReason.CLOSED, "closed"))
                return
            if meta.goal_end != NO_END_SEQNO:
                meta.end_seqno = max(seqno, meta.goal_end)
            self._stream_request(vb, meta, seqno, uuid_at(meta.failover_log, seqno))
            return
        meta.state = "idle"
        if status == Status.NOT_MY_VBUCKET:
            if value:
                try:
                    config = _parse_config(value, f"NOT_MY_VBUCKET for vbucket {vb}")
                    self._events.append(ClusterConfig(config, _config_rev(config)))
                except ProtocolError:
                    pass  # the body is only a hint; the driver refreshes the map anyway
            self._events.append(NotMyVbucket(vb))
            return
        if status == Status.KEY_EEXISTS:
            raise ProtocolError(f"vbucket {vb}: the server says a stream is already open")
        self._events.append(StreamRefused(vb, status, status_name(status)))

    def _closed(self, status: int, extras: bytes, value: bytes) -> None:
        pass  # success, or the stream had ended already (DCP_STREAM_NOT_FOUND / KEY_ENOENT)

    def _config_reply(self, status: int, extras: bytes, value: bytes) -> None:
        self._check(status, "GET_CLUSTER_CONFIG")
        config = _parse_config(value, "GET_CLUSTER_CONFIG")
        self._events.append(ClusterConfig(config, _config_rev(config)))

    def _manifest(self, status: int, extras: bytes, value: bytes) -> None:
        self._check(status, "GET_COLLECTIONS_MANIFEST")
        try:
            manifest = json.loads(value)
        except (ValueError, UnicodeDecodeError):
            raise ProtocolError("GET_COLLECTIONS_MANIFEST: the manifest is not JSON") from None
        if not isinstance(manifest, dict):
            raise ProtocolError("GET_COLLECTIONS_MANIFEST: the manifest is not a JSON object")
        self._events.append(CollectionsManifest(manifest))

    def _high_seqnos(self, status: int, extras: bytes, value: bytes) -> None:
        self._events.append(HighSeqnos(self._vb_seqnos(status, value)))

    def _vb_seqnos(self, status: int, value: bytes) -> dict[int, int]:
        self._check(status, "GET_ALL_VB_SEQNOS")
        if len(value) % 10:
            raise ProtocolError(
                f"GET_ALL_VB_SEQNOS reply of {len(value)} bytes: not 10-byte entries"
            )
        return dict(_VB_SEQNO.iter_unpack(value))

    # --- the handshake ----------------------------------------------------------------------

    def _command(
        self,
        name: str,
        handler: _Handler,
        opcode: int,
        *,
        word: int = 0,
        extras: bytes = b"",
        key: bytes = b"",
        value: bytes = b"",
        recorded: bool = False,
    ) -> None:
        """Send a request whose reply goes to ``handler``; ``recorded`` keeps both in the
        capture."""
        self._opaque += 1
        self._pending[self._opaque] = (name, handler, recorded)
        req = _frame(
            _REQ, opcode, word=word, opaque=self._opaque, extras=extras, key=key, value=value
        )
        self._out.append(req)
        if recorded:
            self._capture.append(req)

    def _check(self, status: int, what: str) -> None:
        if status != Status.SUCCESS:
            raise ProtocolError(f"{what} failed on {self.settings.node}: {status_name(status)}")

    def _require_ready(self, what: str) -> None:
        if not self.ready:
            raise AgentUsageError(f"{what} before the handshake finished")

    def _hello(self) -> None:
        wanted: list[HelloFeature] = [f for f in _HELLO_FEATURES if f != HelloFeature.COLLECTIONS]
        if self.settings.collections:
            wanted.append(HelloFeature.COLLECTIONS)
        self._command(
            "hello",
            self._hello_reply,
            ClientOpcode.HELLO,
            key=self.settings.connection_name.encode(),
            value=b"".join(int(f).to_bytes(2, "big") for f in wanted),
        )
        self._command("sasl_list_mechs", self._mechs_reply, ClientOpcode.SASL_LIST_MECHS)

    def _hello_reply(self, status: int, extras: bytes, value: bytes) -> None:
        self._check(status, "HELLO")
        if len(value) % 2:
            raise ProtocolError(f"HELLO reply of {len(value)} bytes: not u16 features")
        accepted = {int.from_bytes(value[i : i + 2], "big") for i in range(0, len(value), 2)}
        self._hello_accepted = accepted
        self.collections = HelloFeature.COLLECTIONS in accepted
        for feature, name in _HELLO_FEATURES.items():
            if name and feature in accepted:
                self._features.append(name)

    def _mechs_reply(self, status: int, extras: bytes, value: bytes) -> None:
        self._check(status, "SASL_LIST_MECHS")
        offered = value.decode("ascii", "replace").split()
        s = self.settings
        choices = [m for m in MECHANISMS if m in offered]
        if s.tls and "PLAIN" in offered:
            choices.insert(0, "PLAIN")  # over TLS, as java-dcp-client (works with LDAP users)
        if not choices:
            raise AuthenticationError(
                s.node, f"no common SASL mechanism (the server offers {offered})"
            )
        self._mechanism = choices[0]
        if self._mechanism == "PLAIN":
            first = b"\x00" + s.username.encode() + b"\x00" + s.password.encode()
        else:
            self._scram = ScramClient(
                self._mechanism, s.username, s.password, s.nonce or new_nonce()
            )
            first = self._scram.first()
        self._command(
            "sasl_auth",
            self._auth_reply,
            ClientOpcode.SASL_AUTH,
            key=self._mechanism.encode(),
            value=first,
        )

    def _auth_failed(self, status: int) -> None:
        if status in (Status.AUTH_ERROR, Status.EACCESS):
            raise AuthenticationError(
                self.settings.node,
                f"authentication of user {self.settings.username!r} failed "
                f"({self._mechanism}, {status_name(status)})",
            )
        self._check(status, f"SASL ({self._mechanism})")

    def _auth_reply(self, status: int, extras: bytes, value: bytes) -> None:
        if status == Status.AUTH_CONTINUE and self._scram is not None:
            try:
                final = self._scram.final(value)
            except ScramError as exc:
                raise AuthenticationError(self.settings.node, str(exc)) from None
            self._command(
                "sasl_step",
                self._step_reply,
                ClientOpcode.SASL_STEP,
                key=self._mechanism.encode(),
                value=final,
            )
            return
        if status == Status.SUCCESS and self._scram is None:
            self._select_bucket()
            return
        self._auth_failed(status)
        raise ProtocolError(f"SASL_AUTH: unexpected {status_name(status)} on {self.settings.node}")

    def _step_reply(self, status: int, extras: bytes, value: bytes) -> None:
        if status != Status.SUCCESS:
            self._auth_failed(status)
        assert self._scram is not None
        try:
            self._scram.verify(value)
        except ScramError as exc:
            raise AuthenticationError(self.settings.node, str(exc)) from None
        self._scram = None
        self._select_bucket()

    def _select_bucket(self) -> None:
        bucket = self.settings.bucket.encode()
        self._command("select_bucket", self._bucket_reply, ClientOpcode.SELECT_BUCKET, key=bucket)
        self._command("get_cluster_config", self._first_config, ClientOpcode.GET_CLUSTER_CONFIG)
        flags = DcpOpenFlag.PRODUCER | DcpOpenFlag.INCLUDE_DELETE_TIMES
        if HelloFeature.XATTR in self._hello_accepted:
            flags |= DcpOpenFlag.INCLUDE_XATTRS
        self._command(
            "dcp_open",
            self._open_reply,
            Opcode.DCP_OPEN,
            extras=_U32.pack(0) + _U32.pack(flags),
            key=self.settings.connection_name.encode(),
        )

    def _bucket_reply(self, status: int, extras: bytes, value: bytes) -> None:
        if status == Status.EACCESS:
            raise AuthenticationError(
                self.settings.node,
                f"user {self.settings.username!r} may not access bucket {self.settings.bucket!r}",
            )
        if status != Status.SUCCESS:
            raise ProtocolError(
                f"SELECT_BUCKET {self.settings.bucket!r} failed on {self.settings.node}: "
                f"{status_name(status)}"
            )

    def _first_config(self, status: int, extras: bytes, value: bytes) -> None:
        self._check(status, "GET_CLUSTER_CONFIG")
        self._cluster_config = _parse_config(value, "GET_CLUSTER_CONFIG")

    def _open_reply(self, status: int, extras: bytes, value: bytes) -> None:
        self._check(status, "DCP_OPEN")
        self._features.append("include_delete_times")
        s = self.settings
        controls = [
            _Control("enable_noop", "true", True),
            _Control("set_noop_interval", str(s.noop_interval_s), True),
            _Control("connection_buffer_size", str(s.buffer_bytes), True),
            _Control("enable_expiry_opcode", "true", True, "expiry_opcode"),
            _Control("send_stream_end_on_client_close_stream", "true", True),
            _Control("v7_dcp_status_codes", "true", False),
            _Control("supports_cursor_dropping", "true", False),
        ]
        if self.collections:
            controls += [
                _Control("max_marker_version", "2.2", False, "max_marker_version_2.2"),
                _Control("enable_out_of_order_snapshots", "true_with_seqno_advanced", False, "oso"),
                _Control("change_streams", "true", False, "change_streams"),
                _Control("flatbuffers_system_events", "true", False, "flatbuffers_system_events"),
            ]
        self._controls = controls
        self._next_control()

    def _next_control(self) -> None:
        if not self._controls:
            self.ready = True
            self.features = tuple(self._features)
            self._events.append(Ready(self.features, self._cluster_config))
            return
        control = self._controls[0]
        self._command(
            "dcp_control",
            self._control_reply,
            Opcode.DCP_CONTROL,
            key=control.key.encode(),
            value=control.value.encode(),
        )

    def _control_reply(self, status: int, extras: bytes, value: bytes) -> None:
        control = self._controls.pop(0)
        if status == Status.SUCCESS:
            if control.feature:
                self._features.append(control.feature)
        elif not control.required and status in _REFUSALS:
            self._events.append(ControlRefused(control.key, status))
        else:
            raise ProtocolError(
                f"DCP_CONTROL {control.key}={control.value} refused by {self.settings.node}: "
                f"{status_name(status)}" + (" (a required control)" if control.required else "")
            )
        self._next_control()

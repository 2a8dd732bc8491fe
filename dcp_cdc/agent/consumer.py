"""The capture agent's DCP consumer, sans-I/O (h11 style): bytes in, events and bytes out.

One :class:`ConsumerConnection` is one DCP connection to one data node. It holds every
protocol rule: the handshake (HELLO, SASL SCRAM, SELECT_BUCKET, GET_CLUSTER_CONFIG,
DCP_OPEN, DCP_CONTROL; docs/protocol/dcp.md §4), which it inherits from
:class:`~dcp_cdc.agent.handshake.Handshake`, and, here, stream requests with opaque = vbucket
(docs/protocol/capture-format.md), rollback (docs/protocol/dcp.md §7.5: prune the failover log, re-request from the rollback
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

from dcp_cdc import flatbuf
from dcp_cdc.agent.consumer_events import (
    NEED_DATA,
    AgentEvent,
    ClusterConfig,
    ClusterStateRecorded,
    CollectionsManifest,
    HighSeqnos,
    NeedData,
    NotMyVbucket,
    StreamEnded,
    StreamOpened,
    StreamRefused,
    StreamRolledBack,
)
from dcp_cdc.agent.consumer_wire import (
    COMMAND_OPAQUE_BASE,
    HEAD,
    HEAD_SEQNO,
    HEAD_SHORT,
    IN_OSO,
    KIND_END,
    KIND_ITEM,
    KIND_MARKER,
    KIND_NOOP,
    KIND_OSO,
    KIND_OTHER,
    KIND_SYSEV,
    KINDS,
    MAGIC_ALT_REQ,
    MAGIC_ALT_RES,
    MAGIC_REQ,
    MAGIC_RES,
    MAGIC_SERVER_REQ,
    NO_SNAPSHOT,
    STREAM_REQ_EXTRAS,
    U32,
    U64,
    U64_PAIR,
    UID_ONLY,
    VB_SEQNO,
    config_rev,
    make_frame,
    parse_config,
    parse_failover_log,
)
from dcp_cdc.agent.handshake import ConsumerSettings, Handshake
from dcp_cdc.agent.positions import FailoverEntries, VbPosition, prune_log, uuid_at
from dcp_cdc.errors import AgentUsageError, FieldError, ProtocolError
from dcp_cdc.protocol import (
    NO_END_SEQNO,
    ClientOpcode,
    Opcode,
    ServerOpcode,
    Status,
    StreamEndReason,
    StreamRequestFlag,
    VbucketState,
    status_name,
    stream_end_reason_name,
)


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


class ConsumerConnection(Handshake):
    """One DCP connection's protocol state; see the module docstring. The handshake and the
    command plumbing are :class:`~dcp_cdc.agent.handshake.Handshake`'s."""

    def __init__(self, settings: ConsumerSettings) -> None:
        if settings.buffer_bytes < 1:
            raise AgentUsageError("buffer_bytes must be positive")
        super().__init__(settings)
        self._rest = b""
        self._recording: frozenset[int] = frozenset()
        self._recorded: ClusterStateRecorded | None = None
        self._logs_due: set[int] = set()
        self._high_seqnos_asked = 0  # GET_ALL_VB_SEQNOS requests not answered yet
        # per-vbucket hot state, indexed by vbucket (a u16)
        self._pending_end = [NO_SNAPSHOT] * 0x10000
        self._consistent = [0] * 0x10000
        self._oso_max: dict[int, int] = {}
        self._vbs: dict[int, _Vb] = {}
        self._positions: dict[int, VbPosition] = {}
        self._dirty: set[int] = set()
        self._cas = [0] * 0x10000
        """The CAS of the change that completed each vbucket's last snapshot (0: none yet)."""
        self.frames_received = 0
        """Whole frames processed by :meth:`receive_data` (every kind, replies included)."""
        # flow control (docs/protocol/dcp.md §7.6)
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
            ack = make_frame(
                MAGIC_REQ,
                Opcode.DCP_BUFFER_ACKNOWLEDGEMENT,
                extras=U32.pack(self._ack_pending),
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

    def newest_cas(self, vbucket: int) -> int:
        """The CAS of the change that completed ``vbucket``'s last snapshot on this connection
        (0 before one did): docs/protocol/dcp.md §1.5 reads it as the time the active node saw
        that change. Taken once a snapshot, from the item at its end; a snapshot that ends
        without one (its last seqno deduplicated, filtered out, or a seqno-advanced) keeps
        the CAS before it."""
        return self._cas[vbucket]

    @property
    def flow_control_unacked(self) -> int:
        """Flow-controlled bytes received and not acknowledged yet (docs/protocol/dcp.md
        §7.6): what the node counts against ``buffer_bytes``. Those not taken, taken but not
        yet consumed, and consumed but below the acknowledgement threshold."""
        return self._fc_in_capture + sum(take[1] for take in self._takes) + self._ack_pending

    def streaming(self) -> frozenset[int]:
        """vbuckets with a stream requested, open or closing on this connection."""
        return frozenset(vb for vb, meta in self._vbs.items() if meta.state != "idle")

    def is_streaming(self, vbucket: int) -> bool:
        """Whether ``vbucket`` has a stream requested, open or closing here (one lookup, where
        :meth:`streaming` builds the set of all of them)."""
        meta = self._vbs.get(vbucket)
        return meta is not None and meta.state != "idle"

    def any_streaming(self) -> bool:
        return any(meta.state != "idle" for meta in self._vbs.values())

    @property
    def asking_high_seqnos(self) -> bool:
        """Whether a GET_ALL_VB_SEQNOS of :meth:`request_high_seqnos` awaits its reply."""
        return self._high_seqnos_asked > 0

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
            extras=U32.pack(VbucketState.ACTIVE),
            recorded=True,
        )

    def _recorded_high_seqnos(self, status: int, extras: bytes, value: bytes) -> None:
        highs = self._vb_seqnos(status, value)
        self._recorded = ClusterStateRecorded(highs, {})
        self._logs_due = set(highs) & self._recording
        for vb in sorted(self._logs_due):
            req = make_frame(MAGIC_REQ, Opcode.DCP_GET_FAILOVER_LOG, word=vb, opaque=vb)
            self._out.append(req)
            self._capture.append(req)
        if not self._logs_due:
            self._events.append(self._recorded)

    def _failover_log_reply(self, vb: int, status: int, value: bytes) -> None:
        if self._recorded is None or vb not in self._logs_due:
            raise ProtocolError(f"a failover log for vbucket {vb}, which we did not ask for")
        self._logs_due.discard(vb)
        if status == Status.SUCCESS:
            self._recorded.failover_logs[vb] = parse_failover_log(value, vb)
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
        self._high_seqnos_asked += 1
        self._command(
            "get_all_vb_seqnos",
            self._high_seqnos,
            ClientOpcode.GET_ALL_VB_SEQNOS,
            extras=U32.pack(VbucketState.ACTIVE),
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
        pos = run = fc = frames = 0
        unpack = HEAD_SEQNO.unpack_from
        kinds = KINDS
        pend = self._pending_end
        cons = self._consistent
        cas_at = self._cas
        dirty = self._dirty
        capture = self._capture
        try:
            while True:
                if pos + 32 <= n:
                    magic, op, _k, ext_len, _d, vb, blen, seqno = unpack(data, pos)
                elif pos + 24 <= n:
                    magic, op, _k, ext_len, _d, vb, blen = HEAD_SHORT.unpack_from(data, pos)
                    seqno = 0
                else:
                    break
                end = pos + 24 + blen
                if end > n:
                    break
                kind = kinds[op] if magic == MAGIC_REQ else 0
                if kind == KIND_ITEM:
                    fc += end - pos
                    p = pend[vb]
                    if seqno >= p:  # checked only here: a low seqno changes nothing
                        if p >= 0 and 8 <= ext_len <= blen:
                            cons[vb] = p
                            pend[vb] = NO_SNAPSHOT
                            dirty.add(vb)
                            cas = U64.unpack_from(data, pos + 16)[0]
                            if cas:  # a seqno-advanced has none
                                cas_at[vb] = cas
                        else:
                            self._odd_item(vb, seqno, op, ext_len, blen)
                elif kind == KIND_MARKER:
                    fc += end - pos
                    self._marker(data, pos, vb, ext_len, end)
                elif kind == KIND_NOOP:
                    capture.append(data[run:end])
                    run = end
                    reply = make_frame(
                        MAGIC_RES, Opcode.DCP_NOOP, opaque=U32.unpack_from(data, pos + 12)[0]
                    )
                    capture.append(reply)
                    self._out.append(reply)
                elif kind == KIND_SYSEV:
                    fc += end - pos
                    self._system_event(data, pos, vb, seqno, end)
                elif kind == KIND_END:
                    fc += end - pos
                    self._sized(vb, op, ext_len, blen, 4)
                    self._stream_end(data, pos, vb)
                elif kind == KIND_OSO:
                    fc += end - pos
                    self._sized(vb, op, ext_len, blen, 4)
                    self._oso(data, pos, vb)
                elif kind == KIND_OTHER:
                    fc += end - pos
                else:
                    if run < pos:
                        capture.append(data[run:pos])
                    run = end
                    self._fc_in_capture += fc
                    fc = 0
                    self._slow(data[pos:end], magic, op)
                pos = end
                frames += 1
        finally:
            if run < pos:
                capture.append(data[run:pos])
            self._fc_in_capture += fc
            self.frames_received += frames
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
            _start, snap_end = U64_PAIR.unpack_from(data, pos + 24)
        elif ext_len == 1 and end - pos >= 25 + 20:
            _start, snap_end = U64_PAIR.unpack_from(data, pos + 25)
            if data[pos + 24] == 2 and end - pos >= 25 + 44:
                meta.purge_seqno = U64.unpack_from(data, pos + 25 + 36)[0]
        else:
            raise ProtocolError(f"vbucket {vb}: snapshot marker with {ext_len} bytes of extras")
        pend = self._pending_end
        # the next marker completes the previous snapshot (docs/protocol/dcp.md §6.3)
        if pend[vb] >= 0:
            self._consistent[vb] = pend[vb]
        elif pend[vb] == IN_OSO:
            raise ProtocolError(f"vbucket {vb}: snapshot marker inside an OSO snapshot")
        pend[vb] = snap_end
        meta.snap_end = snap_end
        self._dirty.add(vb)

    def _system_event(self, data: bytes, pos: int, vb: int, seqno: int, end: int) -> None:
        key_len = U32.unpack_from(data, pos)[0] & 0xFFFF
        self._sized(vb, Opcode.DCP_SYSTEM_EVENT, data[pos + 4], end - pos - 24 - key_len, 13)
        value = data[pos + 24 + 13 + key_len : end]
        try:
            if data[pos + 24 + 12] == 2:
                uid = int(flatbuf.read_table(value, UID_ONLY)["uid"] or 0)
            else:
                uid = U64.unpack_from(value)[0] if len(value) >= 8 else 0
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
        flags = U32.unpack_from(data, pos + 24)[0]
        pend = self._pending_end
        if flags & 0x01:  # start: the marker of an unordered backfill (docs/protocol/dcp.md §6.9)
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
        reason = U32.unpack_from(data, pos + 24)[0]
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
        _m, _o, key_len, ext_len, _dt, word, _bl, opaque, _cas = HEAD.unpack_from(frame)
        fe_len = 0
        if magic in (MAGIC_ALT_REQ, MAGIC_ALT_RES):
            fe_len, key_len = key_len >> 8, key_len & 0xFF
        extras = frame[24 + fe_len : 24 + fe_len + ext_len]
        value = frame[24 + fe_len + ext_len + key_len :]
        if magic == MAGIC_RES:
            if opcode == Opcode.DCP_STREAM_REQ and opaque < COMMAND_OPAQUE_BASE:
                self._capture.append(frame)
                self._stream_reply(opaque, word, value)
                return
            if opcode == Opcode.DCP_GET_FAILOVER_LOG and opaque < COMMAND_OPAQUE_BASE:
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
        if magic == MAGIC_SERVER_REQ:
            if opcode == ServerOpcode.CLUSTERMAP_CHANGE_NOTIFICATION:
                self._notification(extras, value)
            return  # other duplex requests are not for a DCP connection: ignored
        raise ProtocolError(
            f"unexpected frame: magic 0x{magic:02x}, opcode 0x{opcode:02x}"
            + (" (stream ids were not negotiated)" if magic == MAGIC_ALT_REQ else "")
        )

    def _notification(self, extras: bytes, value: bytes) -> None:
        if value:
            config = parse_config(value, "cluster map notification")
            self._events.append(ClusterConfig(config, config_rev(config)))
        else:  # brief form: only (epoch, rev) or rev in the extras
            rev = int.from_bytes(extras[-8:] if len(extras) >= 16 else extras, "big")
            self._events.append(ClusterConfig({}, rev))

    def _stream_request(self, vb: int, meta: _Vb, seqno: int, vb_uuid: int) -> None:
        value: dict[str, object] = {}
        if meta.collections is not None:
            value["collections"] = [format(cid, "x") for cid in meta.collections]
        if meta.purge_seqno and "max_marker_version_2.2" in self.features:
            value["purge_seqno"] = str(meta.purge_seqno)
        extras = STREAM_REQ_EXTRAS.pack(
            StreamRequestFlag.ACTIVE_VB_ONLY, 0, seqno, meta.end_seqno, vb_uuid, seqno, seqno
        )
        body = json.dumps(value, separators=(",", ":")).encode() if value else b""
        req = make_frame(
            MAGIC_REQ, Opcode.DCP_STREAM_REQ, word=vb, opaque=vb, extras=extras, value=body
        )
        meta.state = "requested"
        self._out.append(req)
        self._capture.append(req)

    def _stream_reply(self, vb: int, status: int, value: bytes) -> None:
        meta = self._vbs.get(vb)
        if meta is None or meta.state not in ("requested", "closing"):
            raise ProtocolError(f"a STREAM_REQ reply for vbucket {vb}, which we did not request")
        if status == Status.SUCCESS:
            meta.failover_log = parse_failover_log(value, vb)
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
            seqno = U64.unpack(value)[0]
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
                    config = parse_config(value, f"NOT_MY_VBUCKET for vbucket {vb}")
                    self._events.append(ClusterConfig(config, config_rev(config)))
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
        config = parse_config(value, "GET_CLUSTER_CONFIG")
        self._events.append(ClusterConfig(config, config_rev(config)))

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
        self._high_seqnos_asked -= 1
        self._events.append(HighSeqnos(self._vb_seqnos(status, value)))

    def _vb_seqnos(self, status: int, value: bytes) -> dict[int, int]:
        self._check(status, "GET_ALL_VB_SEQNOS")
        if len(value) % 10:
            raise ProtocolError(
                f"GET_ALL_VB_SEQNOS reply of {len(value)} bytes: not 10-byte entries"
            )
        return dict(VB_SEQNO.iter_unpack(value))

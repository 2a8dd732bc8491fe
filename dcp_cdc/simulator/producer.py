"""The test producer's connection (:class:`ProducerConnection`), sans-I/O: one client
connection to one node of the test DCP server (docs/protocol/dcp.md §4–§7). Bytes in
(:meth:`~ProducerConnection.receive_data`), bytes out (:meth:`~ProducerConnection.data_to_send`),
no sockets, no clocks (the driver passes ``now`` to :meth:`~ProducerConnection.on_timer`);
:mod:`dcp_cdc.simulator.server` drives them over asyncio TCP.

The requests and replies apart from streams (the handshake, the cluster map, the noop clock)
are :class:`~dcp_cdc.simulator.commands.ProducerCommands`'; this module holds the streams:
stream requests and their rollback decision, closes and ends, flow control (docs/protocol/dcp.md §7.6), and
the scheduling that encodes each stream's backfill and live changes a chunk at a time, streams
taking turns. What every node shares (the bucket, the vbucket map, the faults) is
:class:`~dcp_cdc.simulator.cluster.ProducerCluster`.

Documents and system events become DCP events through the simulator's
:class:`~dcp_cdc.simulator.stream.EventMaker`, and stream requests get the simulator's rollback
decision (:func:`~dcp_cdc.simulator.stream.rollback_point`): one copy of each rule.
"""

from __future__ import annotations

import json
import struct
from collections import deque
from collections.abc import Iterable

from dcp_cdc import layouts
from dcp_cdc.encoder import encode, failover_log_bytes
from dcp_cdc.events import SeqnoAdvanced
from dcp_cdc.protocol import (
    DcpOpenFlag,
    HelloFeature,
    Magic,
    Opcode,
    Status,
    StreamEndReason,
    StreamRequestFlag,
)
from dcp_cdc.simulator.bulk import Chunk
from dcp_cdc.simulator.cluster import ProducerCluster
from dcp_cdc.simulator.commands import ProducerCommands
from dcp_cdc.simulator.frames import DocFrames
from dcp_cdc.simulator.model import Item, VBucket
from dcp_cdc.simulator.producer_stream import ProducerStream, Run, frames_end
from dcp_cdc.simulator.stream import EventMaker, SessionOptions, rollback_point

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_STREAM_REQ = struct.Struct(">IIQQQQQ")
_STREAM_END_FRAME = layouts.joined(layouts.HEADER, layouts.STREAM_END)
"""A STREAM_END frame (docs/protocol/dcp.md §6.10) in one pack: one per stream."""
_REQUEST, _END_EXT = int(Magic.CLIENT_REQUEST), layouts.STREAM_END.length
_FROM_LATEST, _TO_LATEST = int(StreamRequestFlag.FROM_LATEST), int(StreamRequestFlag.TO_LATEST)
"""Plain ints: ``int & IntFlag`` goes through enum's Python code, once per stream request."""
KEY_ENOENT = 0x0001  # CLOSE_STREAM without v7 status codes (docs/protocol/dcp.md §6.15)
CHUNK_ITEMS = 4096
"""Items a stream encodes at a time: a backfill is encoded as flow control lets it out."""
MAX_WRITE = 4 << 20
"""Most stream bytes handed out per call (the flow-control window bounds them too)."""


class ProducerConnection(ProducerCommands):
    """One client connection to node ``node``: the server's half of the protocol."""

    def __init__(
        self, cluster: ProducerCluster, node: int, *, tls: bool = False, nonce: str | None = None
    ) -> None:
        super().__init__(cluster, node, tls=tls, nonce=nonce)
        self._data: deque[Run] = deque()
        self.streams: dict[int, ProducerStream] = {}
        self._rotation: deque[int] = deque()
        self._handlers.update(
            {
                Opcode.DCP_GET_FAILOVER_LOG: self._failover_log,
                Opcode.DCP_STREAM_REQ: self._stream_req,
                Opcode.DCP_CLOSE_STREAM: self._close_stream,
                Opcode.DCP_BUFFER_ACKNOWLEDGEMENT: self._buffer_ack,
            }
        )
        cluster.attach(self)

    # --- bytes out ---------------------------------------------------------------------------

    def data_to_send(self) -> bytes:
        """Replies and pushes, then stream messages while the consumer's buffer has room
        (docs/protocol/dcp.md §7.6: whole frames of every DCP message but NOOP count)."""
        out: list[bytes] = self._ctrl
        self._ctrl = []
        window = self.buffer_size - self.unacked if self.buffer_size else MAX_WRITE
        budget = min(MAX_WRITE, window)
        sent = 0
        data = self._data
        while sent < budget:
            if not data:
                if self._closing or not self._refill():
                    break
                continue
            run, count = data[0]
            if len(run) <= budget - sent:
                data.popleft()
                out.append(run)
                sent += len(run)
                self.frames_sent += count
                continue
            cut, n = frames_end(run, budget - sent, count)
            data[0] = (run[cut:], count - n)
            out.append(run[:cut])
            sent += cut
            self.frames_sent += n
        if self.buffer_size:
            self.unacked += sent
            if self.unacked > self.cluster.peak_unacked:
                self.cluster.peak_unacked = self.unacked
        if self._closing and not data:
            self.closed = True
        payload = b"".join(out)
        self.bytes_sent += len(payload)
        return payload

    @property
    def has_work(self) -> bool:
        """Whether :meth:`data_to_send` would return something now."""
        if self._ctrl or self.closed:
            return True
        if self.buffer_size and self.unacked >= self.buffer_size:
            return False
        # a stream out of the rotation ended with nothing left to send (_refill)
        streams = self.streams
        return bool(self._data) or any(self._stream_has_work(streams[v]) for v in self._rotation)

    def _stream_has_work(self, s: ProducerStream) -> bool:
        if s.vbid in self.cluster.stalled and not s.ended:
            return False
        return bool(s.frames or s.backfilling or (s.pending and not s.ended))

    # --- streams (docs/protocol/dcp.md §4.4, §6) ---------------------------------------------------------------

    def _options(self) -> SessionOptions:
        c = self.controls
        delete_times = bool(self.open_flags & DcpOpenFlag.INCLUDE_DELETE_TIMES)
        return SessionOptions(
            session_id=self.dcp_name or "",
            collections=HelloFeature.COLLECTIONS in self.features,
            xattrs=bool(self.open_flags & DcpOpenFlag.INCLUDE_XATTRS),
            snappy=HelloFeature.SNAPPY in self.features,
            delete_times=delete_times,
            expiry_opcode=c.get("enable_expiry_opcode") == "true" and delete_times,
            flatbuffers=c.get("flatbuffers_system_events") == "true",
            change_streams=c.get("change_streams") == "true",
            marker_v2_2=c.get("max_marker_version") == "2.2",
        )

    @property
    def maker(self) -> EventMaker:
        if self._maker is None:
            self._maker = EventMaker(self.cluster.bucket, self._options(), self.cluster.rng)
        return self._maker

    @property
    def frames(self) -> DocFrames:
        if self._frames is None:
            self._frames = DocFrames(self.maker, self.cluster.values)
        return self._frames

    def _failover_log(self, req: tuple[int, ...], extras: bytes, key: bytes, value: bytes) -> None:
        vbid = req[5]
        if not self._owns(vbid):
            self._not_my_vbucket(req)
            return
        log = tuple(self.cluster.bucket.vbuckets[vbid].failover_log)
        self._reply(req, Status.SUCCESS, value=failover_log_bytes(log))

    def _owns(self, vbid: int) -> bool:
        return vbid < len(self.cluster.vbmap) and self.cluster.owner(vbid) == self.node

    def _stream_req(self, req: tuple[int, ...], extras: bytes, key: bytes, value: bytes) -> None:
        vbid, opaque = req[5], req[7]
        left = self.cluster.cut_requests.get(self.node)
        if left is not None:
            if left <= 1:
                del self.cluster.cut_requests[self.node]
                self.closed = self.reset = True
                self.close_reason = "reset while stream requests were in flight"
                return
            self.cluster.cut_requests[self.node] = left - 1
        if self.dcp_name is None or len(extras) != _STREAM_REQ.size:
            self._reply(req, Status.EINVAL)
            return
        if not self._owns(vbid):
            self._not_my_vbucket(req)
            return
        existing = self.streams.get(vbid)
        if existing is not None and not existing.ended:
            self._reply(req, Status.KEY_EEXISTS)
            return
        flags, _reserved, start, end, vb_uuid, snap_start, snap_end = _STREAM_REQ.unpack(extras)
        vb = self.cluster.bucket.vbuckets[vbid]
        if flags & _FROM_LATEST:
            start = snap_start = snap_end = vb.high_seqno
            vb_uuid = vb.uuid
        if flags & _TO_LATEST:
            end = vb.high_seqno
        if start > end or not snap_start <= start <= snap_end:
            self._reply(req, Status.ERANGE)
            return
        known, wanted = self._filter(value)
        if not known:
            self._reply(req, Status.UNKNOWN_COLLECTION)
            return
        rollback = rollback_point(vb, start, vb_uuid, snap_start)
        if rollback is not None:
            self._reply(req, Status.ROLLBACK, value=_U64.pack(rollback))
            return
        self._reply(req, Status.SUCCESS, value=failover_log_bytes(tuple(vb.failover_log)))
        stream = ProducerStream(vbid, opaque, end, wanted, start)
        if vb.high_seqno > start:
            stream.backfill = self.maker.backfill_items(vb, start)
            stream.backfill_end = vb.high_seqno
            self._add_bulk(stream, start)
        self.streams[vbid] = stream
        self._rotation.append(vbid)
        if start >= end:
            self._queue_end(stream, StreamEndReason.OK)

    def _add_bulk(self, stream: ProducerStream, start: int) -> None:
        """The bulk documents above ``start`` join the backfill when the stream sees
        their collection."""
        bulk, vbid = self.cluster.bulk, stream.vbid
        if bulk is None or start >= bulk.last_seqno(vbid) or not self._bulk_visible(stream):
            return
        stream.bulk_next = max(0, start - bulk.base_seqno[vbid])
        stream.bulk_stop = bulk.in_vbucket(vbid)

    def _bulk_visible(self, stream: ProducerStream) -> frozenset[int]:
        """The bulk documents' collections the stream receives: live ones, in its filter,
        and only the default collection without the Collections feature (docs/protocol/dcp.md §3)."""
        bulk = self.cluster.bulk
        if bulk is None:
            return frozenset()
        colls, wanted = self.cluster.bucket.collections, stream.collection_filter
        aware = self.maker.options.collections
        return frozenset(
            c
            for c in bulk.collection_ids
            if colls[c].dropped_uid is None
            and (aware or c == 0)
            and (wanted is None or c in wanted)
        )

    def _filter(self, value: bytes) -> tuple[bool, tuple[int, ...] | None]:
        """The stream request's collection filter (docs/protocol/dcp.md §4.4): (known, collection ids)."""
        if not value:
            return True, None
        try:
            doc = json.loads(value)
        except ValueError:
            return False, None
        b = self.cluster.bucket
        if "collections" in doc:
            ids = tuple(int(c, 16) for c in doc["collections"])
            dead = [i for i in ids if i not in b.collections or b.collections[i].dropped_uid]
            return not dead, ids
        if "scope" in doc:
            sid = int(doc["scope"], 16)
            ids = tuple(c.collection_id for c in b.live_collections() if c.scope_id == sid)
            return sid in b.scopes, ids
        return True, None

    def _close_stream(self, req: tuple[int, ...], extras: bytes, key: bytes, value: bytes) -> None:
        vbid = req[5]
        stream = self.streams.get(vbid)
        if stream is None or stream.ended:
            v7 = self.controls.get("v7_dcp_status_codes") == "true"
            self._reply(req, Status.DCP_STREAM_NOT_FOUND if v7 else KEY_ENOENT)
            return
        self._reply(req, Status.SUCCESS)
        stream.drop_backfill()
        stream.pending = []
        stream.frames.clear()
        if self.controls.get("send_stream_end_on_client_close_stream") == "true":
            self._queue_end(stream, StreamEndReason.CLOSED)
        else:
            stream.ended = True

    def _buffer_ack(self, req: tuple[int, ...], extras: bytes, key: bytes, value: bytes) -> None:
        if len(extras) >= 4:
            self.unacked = max(0, self.unacked - _U32.unpack_from(extras)[0])

    def end_stream(self, vbid: int, reason: int, *, flush: bool = True) -> None:
        """End ``vbid``'s stream with ``reason``; with ``flush`` the changes queued so far
        are sent first (the consumer sees them, as a failover's lost changes)."""
        stream = self.streams.get(vbid)
        if stream is None or stream.ended:
            return
        if flush:
            while not stream.ended and (stream.backfilling or stream.pending):
                stream.frames.extend(self._next_chunk(stream))
            if stream.ended:
                return
        else:
            stream.drop_backfill()
        stream.pending = []
        self._queue_end(stream, reason)

    def _queue_end(self, stream: ProducerStream, reason: int) -> None:
        stream.frames.append((self._end_frame(stream, reason), 1))
        if stream.vbid not in self._rotation:
            self._rotation.append(stream.vbid)

    def _end_frame(self, stream: ProducerStream, reason: int) -> bytes:
        """The STREAM_END frame; nothing more is sent on this stream after it."""
        stream.ended = True
        stream.drop_backfill()
        stream.pending = []
        return _STREAM_END_FRAME.pack(
            _REQUEST, Opcode.DCP_STREAM_END, 0, _END_EXT, 0, stream.vbid, _END_EXT,
            stream.opaque, 0, reason,
        )  # fmt: skip

    # --- encoding snapshots ------------------------------------------------------------------

    def _refill(self) -> bool:
        """Move the next chunk of some stream's frames into the send queue, streams taking
        turns; False when no stream has anything to send."""
        rotation = self._rotation
        for _ in range(len(rotation)):
            vbid = rotation[0]
            rotation.rotate(-1)
            stream = self.streams.get(vbid)
            if stream is None or (stream.ended and not stream.frames):
                rotation.pop()  # nothing more to send: out of the turns (_queue_end adds it back)
                continue
            if vbid in self.cluster.stalled and not stream.ended:
                continue
            if not stream.frames and not stream.ended:
                stream.frames.extend(self._next_chunk(stream))
            if stream.frames:
                runs = stream.frames
                stream.frames = deque()
                if self.cut_armed and sum(count for _run, count in runs) >= 3:
                    joined = b"".join(run for run, _count in runs)
                    cut, _n = frames_end(joined, len(joined), 2)
                    self._data.append((joined[:cut], 2))  # a marker and one item
                    self.cut_armed = False
                    self._closing = True
                    self.close_reason = "cut mid-snapshot"
                    return True
                self._data.extend(runs)
                return True
        return False

    def _next_chunk(self, stream: ProducerStream) -> list[Run]:
        """Encode the next part of the stream: a slice of its backfill, else its queued live
        changes as one memory snapshot; an end seqno reached ends the stream (OK)."""
        maker = self.maker
        vb = self.cluster.bucket.vbuckets[stream.vbid]
        end = stream.end_seqno
        if stream.backfilling:
            return self._encode_backfill_chunk(stream, vb)
        if not stream.pending:
            return []
        items = [i for i in stream.pending if i.seqno <= end]
        stream.pending = []
        if not items:
            return []
        marker, items = maker.memory_snapshot(vb, items, opaque=stream.opaque)
        body = bytearray()
        count, last = self.frames.items(
            body,
            stream.vbid,
            items,
            disk=False,
            opaque=stream.opaque,
            collection_filter=stream.collection_filter,
        )
        stream.sent_upto = marker.end_seqno
        runs: list[Run] = []
        collections = maker.options.collections
        if count or collections:  # else a non-collection stream just sees a gap
            out = bytearray(encode(marker))
            out += body
            if last != marker.end_seqno and collections:
                h = maker.header(Opcode.DCP_SEQNO_ADVANCED, stream.vbid, opaque=stream.opaque)
                out += encode(SeqnoAdvanced(h, marker.end_seqno))
                count += 1
            runs.append((bytes(out), count + 1))
        return runs + self._after_snapshot(stream, items)

    def _encode_backfill_chunk(self, stream: ProducerStream, vb: VBucket) -> list[Run]:
        """A slice of the disk snapshot taken at the stream request (its marker first)."""
        maker = self.maker
        end = min(stream.backfill_end, stream.end_seqno)
        out = bytearray()
        count = 0
        if not stream.marker_sent:
            stream.marker_sent = True
            stream.backfill_last = -1
            self.frames.backfill_marker(out, vb, stream.sent_upto, end=end, opaque=stream.opaque)
            count += 1
        opaque = stream.opaque
        bulk = self.cluster.bulk
        next_bulk = None
        if bulk is not None and stream.bulk_next < stream.bulk_stop:
            next_bulk = bulk.seqno(stream.vbid, stream.bulk_next)
        items: list[Item] = []
        if (
            bulk is not None
            and next_bulk is not None
            and (not stream.backfill or stream.backfill[0].seqno > next_bulk)
        ):  # the bulk documents' turn, in seqno order
            lo = stream.bulk_next
            hi = min(stream.bulk_stop, lo + CHUNK_ITEMS, end - bulk.base_seqno[stream.vbid])
            last = -1
            if hi > lo:
                visible = self._bulk_visible(stream)
                data, n, last = bulk.frames(
                    Chunk(stream.vbid, lo, hi, opaque, maker.options, visible)
                )
                out += data
                count += n
            more = hi > lo and bulk.seqno(stream.vbid, hi - 1) < end
            stream.bulk_next = hi if more else stream.bulk_stop
        else:
            items = stream.backfill[:CHUNK_ITEMS]
            if next_bulk is not None:
                items = [i for i in items if i.seqno < next_bulk]
            del stream.backfill[: len(items)]
            if items and items[-1].seqno > end:
                items = [i for i in items if i.seqno <= end]
            n, last = self.frames.items(
                out, stream.vbid, items, disk=True, opaque=opaque,
                collection_filter=stream.collection_filter,
            )  # fmt: skip
            count += n
        if last >= 0:
            stream.backfill_last = last
        runs: list[Run] = []
        if not stream.backfilling:  # the backfill's last chunk
            # not ``last``: a last chunk that sends nothing (the items past ``end`` a live
            # workload added) follows one that may have reached ``end``
            if stream.backfill_last != end and maker.options.collections:
                h = maker.header(Opcode.DCP_SEQNO_ADVANCED, stream.vbid, opaque=opaque)
                out += encode(SeqnoAdvanced(h, end))
                count += 1
            stream.sent_upto = end
            runs = self._after_snapshot(stream, items)
        return [(bytes(out), count), *runs] if count else runs

    def _after_snapshot(self, stream: ProducerStream, items: Iterable[Item]) -> list[Run]:
        """STREAM_END once the end seqno is reached, or when every filtered collection was
        dropped (filter_empty)."""
        if stream.sent_upto >= stream.end_seqno:
            return [(self._end_frame(stream, StreamEndReason.OK), 1)]
        if stream.collection_filter and all(
            self.cluster.bucket.collections[c].dropped_uid is not None
            for c in stream.collection_filter
        ):
            return [(self._end_frame(stream, StreamEndReason.FILTER_EMPTY), 1)]
        return []

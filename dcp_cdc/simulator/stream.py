"""What a data node sends one DCP consumer, written as a capture (docs/protocol/dcp.md §4–§7).

:class:`Session` plays both ends of one connection: the consumer's stream requests and
acknowledgements, and the producer's responses, disk backfills, OSO backfills and memory
snapshots. It tracks, per vbucket, what the consumer has received and the end of the last
snapshot it received whole: the consistent point the ground truth is taken at.
"""

from __future__ import annotations

import datetime as dt
import json
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from dcp_cdc.capture import CaptureWriter
from dcp_cdc.encoder import encode, make_header
from dcp_cdc.events import (
    BufferAck,
    Deletion,
    Event,
    Expiration,
    FrameHeader,
    Mutation,
    Noop,
    OsoSnapshot,
    SeqnoAdvanced,
    SnapshotMarker,
    StreamEnd,
    StreamRequest,
    StreamRequestResponse,
    SystemEvent,
)
from dcp_cdc.protocol import (
    NO_END_SEQNO,
    Datatype,
    Opcode,
    OsoFlag,
    SnapshotFlag,
    Status,
    StreamEndReason,
    SystemEventId,
    stream_end_reason_name,
)
from dcp_cdc.simulator.model import Bucket, Doc, Item, SysEvent, VBucket

SNAPPY_MIN_BYTES = 96  # only values worth compressing are sent compressed
DISK_MARKER_FLAGS = SnapshotFlag.DISK | SnapshotFlag.CHECKPOINT
"""The flags of a backfill's snapshot marker."""


@dataclass(frozen=True)
class SessionOptions:
    """What the consumer negotiated (HELLO, DCP_OPEN, DCP_CONTROL; docs/protocol/dcp.md §4)."""

    session_id: str
    collections: bool = True
    xattrs: bool = True
    snappy: bool = True
    delete_times: bool = True
    expiry_opcode: bool = True
    flatbuffers: bool = False
    oso: bool = False
    change_streams: bool = False
    marker_v2_2: bool = True
    stream_ids: bool = False
    collection_filter: tuple[int, ...] | None = None
    noop_every: int = 2000
    buffer_ack_bytes: int = 4 * 1024 * 1024
    max_file_bytes: int = 64 * 1024 * 1024
    vbucket_offset: int = 0  # added to every vbucket on the wire (several buckets in one)

    def features(self) -> tuple[str, ...]:
        names = ["json"]
        for flag, name in (
            (self.xattrs, "xattr"),
            (self.snappy, "snappy"),
            (self.delete_times, "include_delete_times"),
            (self.expiry_opcode and self.delete_times, "expiry_opcode"),
            (self.flatbuffers, "flatbuffers_system_events"),
            (self.oso, "oso"),
            (self.change_streams, "change_streams"),
            (self.marker_v2_2, "max_marker_version_2.2"),
            (self.stream_ids, "stream_id"),
        ):
            if flag:
                names.append(name)
        return tuple(names)


def rollback_point(vb: VBucket, start: int, vb_uuid: int, snap_start: int) -> int | None:
    """The server's rollback decision for a stream request (rollback.md, docs/protocol/dcp.md §7.5): None to
    accept it, else the seqno the consumer must roll back to."""
    if start == 0:
        return None
    if 0 < snap_start < vb.purge_seqno or start < vb.purge_seqno:
        return 0  # tombstones the consumer never saw are purged
    for i, (uuid, _branch_start) in enumerate(vb.failover_log):
        if uuid != vb_uuid:
            continue
        branch_end = vb.failover_log[i - 1][1] if i > 0 else vb.high_seqno
        if start > branch_end:
            return branch_end
        return None
    return 0  # the consumer's history is unknown here


class EventMaker:
    """The encoding of bucket items into DCP events for one connection's options: shared by
    :class:`Session` (capture files) and the test producer (:mod:`dcp_cdc.simulator.producer`).

    ``opaque`` is the stream's opaque (the consumer's STREAM_REQ opaque); None means the wire
    vbucket, as the capture sessions use.
    """

    def __init__(self, bucket: Bucket, options: SessionOptions, rng: random.Random) -> None:
        self.bucket = bucket
        self.options = options
        self.rng = rng

    def header(
        self, opcode: int, vbid: int, *, cas: int = 0, datatype: int = 0, opaque: int | None = None
    ) -> FrameHeader:
        vbid += self.options.vbucket_offset  # the vbucket as the wire shows it
        sid = vbid + 1 if self.options.stream_ids else None
        return make_header(
            opcode,
            vbucket=vbid,
            opaque=vbid if opaque is None else opaque,
            cas=cas,
            datatype=datatype,
            stream_id=sid,
        )

    def visible(self, item: Item, collection_filter: tuple[int, ...] | None = None) -> bool:
        """Whether this connection receives the item (collections, filter, FlatBuffers)."""
        opts = self.options
        wanted = opts.collection_filter if collection_filter is None else collection_filter
        if item.doc is not None:
            cid = item.doc.collection_id
            if not opts.collections and cid != 0:
                return False
            return wanted is None or cid in wanted
        assert item.sys is not None
        if not opts.collections:
            return False
        if item.sys.kind == "modify_collection" and not opts.flatbuffers:
            return False  # a seqno-advanced stands in for it (docs/protocol/dcp.md §6.7)
        if wanted is not None:
            return item.sys.collection_id in wanted
        return True

    # --- snapshots (docs/protocol/dcp.md §6.3) -------------------------------------------------------------

    def backfill_items(self, vb: VBucket, start: int) -> list[Item]:
        """A disk backfill's items above ``start``: current documents (tombstones included,
        one per key) and system events, in seqno order."""
        items = [Item(d.seqno, doc=d) for d in vb.docs.values() if d.seqno > start]
        items += [Item(e.seqno, sys=e) for e in vb.sys_events if e.seqno > start]
        items.sort(key=lambda i: i.seqno)
        return items

    def backfill_marker(
        self, vb: VBucket, start: int, *, end: int | None = None, opaque: int | None = None
    ) -> SnapshotMarker:
        """The marker of a disk snapshot from ``start`` to ``end`` (default: the vbucket's
        high seqno; a stream's end seqno below it clamps it)."""
        end = vb.high_seqno if end is None else end
        flags = DISK_MARKER_FLAGS
        h = self.header(Opcode.DCP_SNAPSHOT_MARKER, vb.vbid, opaque=opaque)
        if self.backfill_marker_version(vb) == "2.2":
            return SnapshotMarker(h, "2.2", start, end, flags, end, 0, vb.purge_seqno, 0)
        return SnapshotMarker(h, "2.0", start, end, flags, end, 0)

    def backfill_marker_version(self, vb: VBucket) -> str:
        """A disk snapshot's marker is V2.2 when the connection allows it and the vbucket
        has purged tombstones (its purge seqno to tell), else V2.0 (docs/protocol/dcp.md §6.3)."""
        return "2.2" if self.options.marker_v2_2 and vb.purge_seqno else "2.0"

    def memory_snapshot(
        self, vb: VBucket, items: list[Item], *, opaque: int | None = None
    ) -> tuple[SnapshotMarker, list[Item]]:
        """Queued changes as one memory snapshot: deduplicated unless a history collection
        keeps every version (change streams: flags 0x10|0x20)."""
        start, end = items[0].seqno, items[-1].seqno
        history = self.options.change_streams and any(
            i.doc is not None and self.bucket.collections[i.doc.collection_id].history
            for i in items
        )
        flags = SnapshotFlag.MEMORY | SnapshotFlag.CHECKPOINT
        if history:
            flags |= SnapshotFlag.HISTORY | SnapshotFlag.MAY_CONTAIN_DUPLICATES
        else:
            items = _dedup(items)
        h = self.header(Opcode.DCP_SNAPSHOT_MARKER, vb.vbid, opaque=opaque)
        return SnapshotMarker(h, "1", start, end, flags), items

    def snapshot_events(
        self,
        vbid: int,
        marker: SnapshotMarker,
        items: list[Item],
        *,
        disk: bool,
        opaque: int | None = None,
        collection_filter: tuple[int, ...] | None = None,
    ) -> list[Event] | None:
        """The marker, the visible items and a seqno-advanced when the last visible item is
        below the marker's end; None when a non-collection stream just sees a gap."""
        visible = [i for i in items if self.visible(i, collection_filter)]
        if not visible and not self.options.collections:
            return None
        events: list[Event] = [marker]
        events += [self.item_event(vbid, i, disk=disk, opaque=opaque) for i in visible]
        last = visible[-1].seqno if visible else -1
        if last != marker.end_seqno and self.options.collections:
            h = self.header(Opcode.DCP_SEQNO_ADVANCED, vbid, opaque=opaque)
            events.append(SeqnoAdvanced(h, marker.end_seqno))
        return events

    # --- items -----------------------------------------------------------------------------

    def item_event(self, vbid: int, item: Item, *, disk: bool, opaque: int | None = None) -> Event:
        if item.doc is not None:
            return self.doc_event(vbid, item.doc, disk=disk, opaque=opaque)
        assert item.sys is not None
        return self.sys_event(vbid, item.sys, opaque=opaque)

    def doc_event(self, vbid: int, doc: Doc, *, disk: bool, opaque: int | None = None) -> Event:
        opts = self.options
        cid = doc.collection_id if opts.collections else None
        xattrs = doc.xattrs if opts.xattrs and doc.xattrs else None
        if not doc.deleted:
            datatype = (Datatype.JSON if doc.is_json else 0) | (Datatype.XATTR if xattrs else 0)
            if opts.snappy and len(doc.body) >= SNAPPY_MIN_BYTES:
                datatype |= Datatype.SNAPPY
            h = self.header(
                Opcode.DCP_MUTATION, vbid, cas=doc.cas, datatype=datatype, opaque=opaque
            )
            return Mutation(
                h,
                doc.seqno,
                doc.rev_seqno,
                doc.flags,
                doc.expiry,
                0,
                0,
                self.rng.randrange(3),
                cid,
                doc.key,
                doc.body,
                xattrs,
            )
        datatype = Datatype.XATTR if xattrs else 0  # a tombstone keeps system xattrs only
        delete_time = doc.delete_time if disk else 0
        if doc.change == "expire" and opts.expiry_opcode and opts.delete_times:
            h = self.header(
                Opcode.DCP_EXPIRATION, vbid, cas=doc.cas, datatype=datatype, opaque=opaque
            )
            return Expiration(h, doc.seqno, doc.rev_seqno, delete_time, cid, doc.key, b"", xattrs)
        h = self.header(Opcode.DCP_DELETION, vbid, cas=doc.cas, datatype=datatype, opaque=opaque)
        return Deletion(
            h,
            doc.seqno,
            doc.rev_seqno,
            delete_time if opts.delete_times else None,
            cid,
            doc.key,
            b"",
            xattrs,
        )

    def sys_event(self, vbid: int, ev: SysEvent, *, opaque: int | None = None) -> Event:
        h = self.header(Opcode.DCP_SYSTEM_EVENT, vbid, opaque=opaque)
        ids = {
            "create_collection": SystemEventId.BEGIN_COLLECTION,
            "flush_collection": SystemEventId.BEGIN_COLLECTION,
            "drop_collection": SystemEventId.END_COLLECTION,
            "create_scope": SystemEventId.CREATE_SCOPE,
            "drop_scope": SystemEventId.DROP_SCOPE,
            "modify_collection": SystemEventId.MODIFY_COLLECTION,
        }
        event_id = ids[ev.kind]
        name = "create_collection" if ev.kind == "flush_collection" else ev.kind
        if self.options.flatbuffers:
            version = 2
        elif event_id == SystemEventId.BEGIN_COLLECTION and ev.max_ttl:
            version = 1
        else:
            version = 0
        named = ev.kind in (
            "create_collection",
            "flush_collection",
            "create_scope",
            "modify_collection",
        )
        return SystemEvent(
            h,
            ev.seqno,
            event_id,
            version,
            name,
            ev.manifest_uid,
            ev.scope_id,
            ev.collection_id,
            ev.name if named else None,
            ev.max_ttl if version else None,
            b"",
            ev.flush_uid if version == 2 else None,
            ev.history if version == 2 else None,
        )


@dataclass
class StreamState:
    """The consumer's view of one vbucket stream."""

    vbid: int
    open: bool = False
    sent_upto: int = 0  # highest seqno sent (or covered by a marker's seqno-advanced)
    consistent: int = 0  # end of the last snapshot received whole
    snap_start: int = 0
    snap_end: int = 0
    failover_log: list[tuple[int, int]] = field(default_factory=list)
    pending: list[Item] = field(default_factory=list)  # changes not yet sent in a snapshot
    end_seqno: int = NO_END_SEQNO


@dataclass(frozen=True)
class Checkpoint:
    """What a consumer persists per vbucket to resume (docs/protocol/dcp.md §7.2)."""

    seqno: int
    vb_uuid: int
    failover_log: tuple[tuple[int, int], ...]


class Session:
    """One DCP connection, written to capture files as it happens."""

    def __init__(
        self,
        bucket: Bucket,
        directory: str | Path,
        options: SessionOptions,
        rng: random.Random,
        counts: Counter[str],
    ) -> None:
        self.bucket = bucket
        self.options = options
        self.rng = rng
        self.counts = counts
        self.writer = CaptureWriter(
            directory,
            bucket=bucket.name,
            session_id=options.session_id,
            collections=options.collections,
            features=options.features(),
            source="simulator",
            started_at=_rfc3339(bucket.clock_ns),
            max_file_bytes=options.max_file_bytes,
        )
        self.events = EventMaker(bucket, options, rng)
        self.streams = {vb.vbid: StreamState(vb.vbid) for vb in bucket.vbuckets}
        self.frames = 0
        self._unacked = 0

    # --- frames ------------------------------------------------------------------------

    def write(self, event: Event) -> tuple[Path, int]:
        data = encode(event)
        where = self.writer.write(data)
        self.counts[event.op] += 1
        self.frames += 1
        if event.header.is_response or event.op in ("stream_request", "buffer_ack", "noop"):
            return where
        self._unacked += len(data)
        if self._unacked >= self.options.buffer_ack_bytes:
            self._write_plain(
                BufferAck(make_header(Opcode.DCP_BUFFER_ACKNOWLEDGEMENT), self._unacked)
            )
            self._unacked = 0
        if self.frames % self.options.noop_every == 0:
            opaque = self.frames
            self._write_plain(Noop(make_header(Opcode.DCP_NOOP, opaque=opaque)))
            self._write_plain(
                Noop(make_header(Opcode.DCP_NOOP, status=Status.SUCCESS, opaque=opaque))
            )
        return where

    def _write_plain(self, event: Event) -> None:
        self.writer.write(encode(event))
        self.counts[event.op] += 1
        self.frames += 1

    def _hdr(self, opcode: int, vbid: int, *, cas: int = 0, datatype: int = 0) -> FrameHeader:
        return self.events.header(opcode, vbid, cas=cas, datatype=datatype)

    def _visible(self, item: Item) -> bool:
        return self.events.visible(item)

    def _item_event(self, vbid: int, item: Item, *, disk: bool) -> Event:
        return self.events.item_event(vbid, item, disk=disk)

    def doc_event(self, vbid: int, doc: Doc, *, disk: bool) -> Event:
        return self.events.doc_event(vbid, doc, disk=disk)

    def _sys_event(self, vbid: int, ev: SysEvent) -> Event:
        return self.events.sys_event(vbid, ev)

    # --- stream set-up (docs/protocol/dcp.md §4.4, §6.1, §7.5) -----------------------------------------

    def request(
        self,
        vb: VBucket,
        *,
        start: int = 0,
        vb_uuid: int = 0,
        snap_start: int | None = None,
        snap_end: int | None = None,
        end: int = NO_END_SEQNO,
    ) -> int | None:
        """Send a stream request and its response; returns a rollback seqno, or None if open."""
        wire = vb.vbid + self.options.vbucket_offset
        snap_start = start if snap_start is None else snap_start
        snap_end = start if snap_end is None else snap_end
        value: dict[str, object] = {"uid": format(vb.manifest_uid, "x")}
        if self.options.stream_ids:
            value["sid"] = wire + 1
        if self.options.collection_filter is not None:
            value["collections"] = [format(c, "x") for c in self.options.collection_filter]
        if not self.options.collections:
            value = {}
        self._write_plain(
            StreamRequest(
                make_header(Opcode.DCP_STREAM_REQ, vbucket=wire, opaque=wire),
                0,
                start,
                end,
                vb_uuid,
                snap_start,
                snap_end,
                json.dumps(value, sort_keys=True) if value else "",
            )
        )
        rollback = self._rollback_point(vb, start, vb_uuid, snap_start)
        if rollback is not None:
            self._write_plain(
                StreamRequestResponse(
                    make_header(Opcode.DCP_STREAM_REQ, status=Status.ROLLBACK, opaque=wire),
                    "rollback",
                    None,
                    rollback,
                    b"",
                )
            )
            self.bucket.forget_delivered(vb, rollback)  # the consumer retracts above it
            return rollback
        log = tuple(vb.failover_log)
        self._write_plain(
            StreamRequestResponse(
                make_header(Opcode.DCP_STREAM_REQ, status=Status.SUCCESS, opaque=wire),
                "success",
                log,
                None,
                b"",
            )
        )
        state = self.streams[vb.vbid]
        state.open = True
        state.sent_upto = state.consistent = start
        state.snap_start = state.snap_end = start
        state.failover_log = list(log)
        state.end_seqno = end
        state.pending = []
        return None

    @staticmethod
    def _rollback_point(vb: VBucket, start: int, vb_uuid: int, snap_start: int) -> int | None:
        return rollback_point(vb, start, vb_uuid, snap_start)

    def open_all(
        self, checkpoints: dict[int, Checkpoint] | None = None, *, end: int = NO_END_SEQNO
    ) -> None:
        """Open a stream per vbucket, following rollbacks until each succeeds."""
        for vb in self.bucket.vbuckets:
            self.resume(vb, (checkpoints or {}).get(vb.vbid), end=end)

    def resume(self, vb: VBucket, checkpoint: Checkpoint | None, *, end: int = NO_END_SEQNO) -> int:
        """Request the stream from ``checkpoint``, following rollbacks until it opens (§7.5);
        returns the seqno it opened at."""
        cp = checkpoint
        start, uuid, log = (cp.seqno, cp.vb_uuid, list(cp.failover_log)) if cp else (0, 0, [])
        while (rollback := self.request(vb, start=start, vb_uuid=uuid, end=end)) is not None:
            start = rollback  # prune entries above the rollback point (java client rule)
            log = [e for e in log if e[1] <= rollback]
            uuid = log[0][0] if log and rollback else 0
        return start

    # --- backfill (disk snapshots, docs/protocol/dcp.md §6.3) ------------------------------------------

    def backfill(self, vb: VBucket) -> None:
        """A disk snapshot from the stream's start to the vbucket's high seqno (deduplicated)."""
        start = self.streams[vb.vbid].sent_upto
        if vb.high_seqno <= start:
            return
        marker = self.events.backfill_marker(vb, start)
        self._snapshot(vb, marker, self.events.backfill_items(vb, start), disk=True)

    def oso_backfill(self, vb: VBucket) -> None:
        """An OSO backfill: the filtered collection in key order, then seqno-advanced (§6.9)."""
        state = self.streams[vb.vbid]
        items = [
            Item(d.seqno, doc=d) for d in vb.docs.values() if self._visible(Item(d.seqno, doc=d))
        ]
        items.sort(key=lambda i: i.doc.key if i.doc else b"")
        self.write(OsoSnapshot(self._hdr(Opcode.DCP_OSO_SNAPSHOT, vb.vbid), OsoFlag.START))
        for ev in vb.sys_events:  # the filtered collections' own events come with them
            if self._visible(Item(ev.seqno, sys=ev)):
                self.write(self._sys_event(vb.vbid, ev))
        for item in items:
            self.write(self.doc_event(vb.vbid, item.doc, disk=True))  # type: ignore[arg-type]
        vb.delivered.update(i.seqno for i in items)
        if vb.high_seqno:
            self.write(SeqnoAdvanced(self._hdr(Opcode.DCP_SEQNO_ADVANCED, vb.vbid), vb.high_seqno))
        self.write(OsoSnapshot(self._hdr(Opcode.DCP_OSO_SNAPSHOT, vb.vbid), OsoFlag.END))
        state.sent_upto = state.consistent = state.snap_start = state.snap_end = vb.high_seqno
        self.bucket.trim_undo(vb, vb.high_seqno)

    # --- memory snapshots ----------------------------------------------------------------

    def on_change(self, vb: VBucket, item: Item) -> None:
        """Queue a change made while the stream is open (the in-memory checkpoint)."""
        state = self.streams[vb.vbid]
        if state.open:
            state.pending.append(item)

    def pending(self, vbid: int) -> int:
        return len(self.streams[vbid].pending)

    def flush(self, vb: VBucket) -> None:
        """Send the queued changes as one memory snapshot."""
        state = self.streams[vb.vbid]
        if not state.pending:
            return
        marker, items = self.events.memory_snapshot(vb, state.pending)
        state.pending = []
        self._snapshot(vb, marker, items, disk=False)

    def _snapshot(
        self, vb: VBucket, marker: SnapshotMarker, items: list[Item], *, disk: bool
    ) -> None:
        state = self.streams[vb.vbid]
        events = self.events.snapshot_events(vb.vbid, marker, items, disk=disk)
        if events is None:
            state.sent_upto = state.consistent = marker.end_seqno
            self.bucket.trim_undo(vb, marker.end_seqno)
            return  # a non-collection stream just sees a gap
        state.snap_start, state.snap_end = marker.start_seqno, marker.end_seqno
        for event in events:
            self.write(event)
        vb.delivered.update(i.seqno for i in items if i.doc is not None and self._visible(i))
        state.sent_upto = state.consistent = marker.end_seqno
        self.bucket.trim_undo(vb, marker.end_seqno)
        if marker.end_seqno >= state.end_seqno:
            self.end_stream(vb.vbid, StreamEndReason.OK)

    def cut(self, vb: VBucket, *, whole_items: int, tail_bytes: int) -> tuple[int, int, Path, int]:
        """Send a snapshot's marker and first items, then part of one frame: the connection dies.

        Returns the (start, end) of the snapshot left open, and where the cut frame starts.
        """
        state = self.streams[vb.vbid]
        items = _dedup(state.pending)
        state.pending = []
        if len(items) <= whole_items:
            raise ValueError(f"vbucket {vb.vbid}: too few queued changes to cut a snapshot")
        start, end = items[0].seqno, items[-1].seqno
        marker = SnapshotMarker(
            self._hdr(Opcode.DCP_SNAPSHOT_MARKER, vb.vbid), "1", start, end, SnapshotFlag.MEMORY
        )
        self.write(marker)
        for item in items[:whole_items]:
            self.write(self._item_event(vb.vbid, item, disk=False))
            state.sent_upto = item.seqno
        partial = encode(self._item_event(vb.vbid, items[whole_items], disk=False))
        path, offset = self.writer.write_raw(partial[: min(tail_bytes, len(partial) - 1)])
        return start, end, path, offset

    def end_stream(self, vbid: int, reason: int) -> None:
        self.write(
            StreamEnd(
                self._hdr(Opcode.DCP_STREAM_END, vbid), reason, stream_end_reason_name(reason)
            )
        )
        self.streams[vbid].open = False

    def checkpoints(self) -> dict[int, Checkpoint]:
        out = {}
        for vbid, s in self.streams.items():
            log = tuple(s.failover_log)
            out[vbid] = Checkpoint(s.consistent, log[0][0] if log else 0, log)
        return out

    def close(self) -> None:
        self.writer.close()

    # --- events ----------------------------------------------------------------------------


def _dedup(items: list[Item]) -> list[Item]:
    """Keep the last change of each key (a snapshot without flag 0x20, docs/protocol/dcp.md §6.3)."""
    last: dict[tuple[int, bytes], int] = {}
    for i, item in enumerate(items):
        if item.doc is not None:
            last[(item.doc.collection_id, item.doc.key)] = i
    return [
        item
        for i, item in enumerate(items)
        if item.doc is None or last[(item.doc.collection_id, item.doc.key)] == i
    ]


def _rfc3339(ns: int) -> str:
    return dt.datetime.fromtimestamp(ns / 1e9, tz=dt.UTC).isoformat(timespec="seconds")

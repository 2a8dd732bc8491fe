"""A plain-Python DCP consumer used as a test oracle (docs/protocol/dcp.md §6–§7).

It reads decoded captures in session order and keeps, per vbucket, the document state at the
end of the last complete snapshot, following the rules a CDC sink must follow: snapshot-
consistent apply, highest seqno wins, tombstones, collection drops and flushes, OSO buffering,
and rollback (everything above the rollback seqno undone, older versions restored from the log).
Deliberately naive and slow: it is the reference the simulator's truth and, later, silver
tables are checked against.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from dcp_cdc.capture import iter_capture, read_capture_header
from dcp_cdc.errors import MalformedFrameError
from dcp_cdc.events import (
    Deletion,
    Event,
    Expiration,
    Mutation,
    OsoSnapshot,
    SeqnoAdvanced,
    SnapshotMarker,
    StreamEnd,
    StreamRequestResponse,
    SystemEvent,
)


@dataclass
class Version:
    seqno: int
    collection_id: int
    key: bytes
    deleted: bool
    rev_seqno: int
    cas: int
    flags: int
    expiry: int
    value: bytes
    xattrs: dict[str, str] | None


@dataclass
class Stream:
    log: list[Version | SystemEvent] = field(default_factory=list)  # applied, in order
    buffer: list[Event] = field(default_factory=list)  # the open snapshot
    snap_end: int | None = None
    oso: bool = False
    consistent: int = 0


def _seqno(item: Version | SystemEvent) -> int:
    return item.seqno if isinstance(item, Version) else item.by_seqno


def capture_files(landing: Path) -> list[Path]:
    """Capture files in session order, as bronze orders them: by the session's start time,
    session id, then file sequence."""
    paths = sorted(landing.glob("*.dcpcap"))
    keyed = []
    for p in paths:
        header, _ = read_capture_header(p)
        keyed.append((header.started_at or "", header.session_id, header.sequence, p))
    return [p for *_, p in sorted(keyed)]


class ReferenceConsumer:
    def __init__(self) -> None:
        self.streams: dict[int, Stream] = defaultdict(Stream)
        self.errors: list[MalformedFrameError] = []

    def consume(self, landing: Path) -> None:
        for path in capture_files(landing):
            for item in iter_capture(path):
                if isinstance(item, MalformedFrameError):
                    self.errors.append(item)
                    continue
                self.on_event(item)
            # a file's end is not a snapshot's end: open snapshots stay open across files

    def on_event(self, e: Event) -> None:
        if isinstance(e, StreamRequestResponse):
            vb = e.header.opaque  # the consumer sets opaque = vbucket (capture format)
            if e.rollback_seqno is not None:
                self.rollback(vb, e.rollback_seqno)
            elif e.failover_log is not None:
                self.streams[vb].buffer = []  # a new stream: an unfinished snapshot is dropped
                self.streams[vb].snap_end = None
            return
        vb = e.header.vbucket
        if vb is None:
            return
        s = self.streams[vb]
        if isinstance(e, SnapshotMarker):
            self.complete(vb)
            s.snap_end = e.end_seqno
            return
        if isinstance(e, OsoSnapshot):
            if e.is_start:
                s.oso = True
            else:
                s.oso = False
                self.complete(vb, oso=True)
            return
        if isinstance(e, StreamEnd):
            if not s.oso:
                self.complete(vb)
            return
        if isinstance(e, (Mutation, Deletion, Expiration, SystemEvent, SeqnoAdvanced)):
            s.buffer.append(e)
            if not s.oso and s.snap_end is not None and e.by_seqno == s.snap_end:
                self.complete(vb)

    def complete(self, vb: int, *, oso: bool = False) -> None:
        s = self.streams[vb]
        top = s.consistent
        for e in s.buffer:
            if isinstance(e, SeqnoAdvanced):
                top = max(top, e.by_seqno)
                continue
            top = max(top, e.by_seqno)  # type: ignore[union-attr]
            if isinstance(e, SystemEvent):
                s.log.append(e)
            else:
                assert isinstance(e, (Mutation, Deletion, Expiration))
                s.log.append(
                    Version(
                        e.by_seqno,
                        e.collection_id or 0,
                        e.key,
                        not isinstance(e, Mutation),
                        e.rev_seqno,
                        e.header.cas,
                        getattr(e, "flags", 0),
                        getattr(e, "expiration", 0),
                        e.value,
                        e.xattrs,
                    )
                )
        if s.buffer or s.snap_end is not None:
            s.consistent = max(top, s.snap_end or 0) if not oso else top
        s.buffer = []
        s.snap_end = None

    def rollback(self, vb: int, seqno: int) -> None:
        s = self.streams[vb]
        s.log = [v for v in s.log if _seqno(v) <= seqno]
        s.buffer = []
        s.snap_end = None
        s.consistent = min(s.consistent, seqno)

    def state(self) -> dict[tuple[int, bytes], Version]:
        """Live documents: per key the highest-seqno version, minus drops and flushes."""
        live: dict[tuple[int, bytes], Version] = {}
        for s in self.streams.values():
            docs: dict[tuple[int, bytes], Version] = {}
            dropped: set[int] = set()
            known: set[int] = set()
            for item in sorted(s.log, key=_seqno):
                if isinstance(item, SystemEvent):
                    cid = item.collection_id
                    if item.event == "drop_collection" and cid is not None:
                        dropped.add(cid)
                        docs = {k: v for k, v in docs.items() if k[0] != cid}
                    elif item.event == "create_collection" and cid is not None:
                        # a repeated BeginCollection: a flush (docs/protocol/dcp.md §6.7)
                        if cid in known:
                            docs = {k: v for k, v in docs.items() if k[0] != cid}
                        known.add(cid)
                        dropped.discard(cid)
                    continue
                if item.collection_id in dropped:
                    continue
                ident = (item.collection_id, item.key)
                if ident not in docs or docs[ident].seqno < item.seqno:
                    docs[ident] = item
            live.update({k: v for k, v in docs.items() if not v.deleted})
        return live

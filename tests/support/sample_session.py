"""A small, fixed DCP session written as a capture: a hand-written test fixture.

Two vbuckets stream a collection-aware session with every message a CDC consumer meets:
stream requests and their responses (one a rollback), V1/V2.0/V2.2 snapshot markers,
mutations with JSON, binary, Snappy and XATTR values, deletions, an expiration, system events,
seqno-advanced, OSO, noops, buffer acks and stream ends.
"""

from __future__ import annotations

import json
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
from dcp_cdc.protocol import NO_END_SEQNO, Datatype, Opcode, Status

CAS0 = 0x17A8_B0D8_E6F4_0000
BUCKET = "travel-sample"
SESSION_ID = "sample-0001"


def sample_events() -> list[Event]:
    """The frames of the sample session, in wire order."""
    ev: list[Event] = []
    cas = CAS0

    def next_cas() -> int:
        nonlocal cas
        cas += 0x10000
        return cas

    def hdr(op: int, vb: int, **kw: int) -> FrameHeader:
        return make_header(op, vbucket=vb, opaque=0x1000 + vb, **kw)

    for vb, uuid in ((0, 0x0000_1111_2222_3333), (1, 0xABCD_0000_1111_2222)):
        ev.append(
            StreamRequest(
                hdr(Opcode.DCP_STREAM_REQ, vb),
                0,
                0,
                NO_END_SEQNO,
                0,
                0,
                0,
                json.dumps({"uid": "0"}),
            )
        )
        ev.append(
            StreamRequestResponse(
                make_header(Opcode.DCP_STREAM_REQ, status=Status.SUCCESS, opaque=0x1000 + vb),
                "success",
                ((uuid, 0),),
                None,
                b"",
            )
        )

    # vbucket 0: a disk snapshot with collection set-up, then memory snapshots of changes
    ev.append(SnapshotMarker(hdr(Opcode.DCP_SNAPSHOT_MARKER, 0), "2.2", 0, 6, 0x02, 6, 0, 0, 0))
    ev.append(
        SystemEvent(
            hdr(Opcode.DCP_SYSTEM_EVENT, 0),
            1,
            3,
            0,
            "create_scope",
            1,
            8,
            None,
            "inventory",
            None,
            b"",
        )
    )
    ev.append(
        SystemEvent(
            hdr(Opcode.DCP_SYSTEM_EVENT, 0),
            2,
            0,
            1,
            "create_collection",
            2,
            8,
            8,
            "airline",
            72000,
            b"",
        )
    )
    docs = [
        (
            3,
            b"airline_10",
            {
                "id": 10,
                "name": "40-Mile Air",
                "country": "United States",
                "iata": "Q5",
                "callsign": "MILE-AIR",
                "tags": ["a", "b"],
            },
        ),
        (
            4,
            b"airline_137",
            {
                "id": 137,
                "name": "Air France",
                "country": "France",
                "nested": {"hub": "CDG", "fleet": [{"t": "A320", "n": 120}]},
            },
        ),
        (5, b"airline_\xc3\xa9t\xc3\xa9", {"id": 5, "name": "Été Air ✈", "country": "Québec"}),
    ]
    for seqno, key, doc in docs:
        ev.append(
            Mutation(
                hdr(Opcode.DCP_MUTATION, 0, cas=next_cas(), datatype=Datatype.JSON),
                seqno,
                1,
                0x02000006,
                0,
                0,
                0,
                0,
                8,
                key,
                json.dumps(doc, ensure_ascii=False).encode(),
                None,
            )
        )
    ev.append(SeqnoAdvanced(hdr(Opcode.DCP_SEQNO_ADVANCED, 0), 6))
    ev.append(Noop(make_header(Opcode.DCP_NOOP, opaque=7)))
    ev.append(Noop(make_header(Opcode.DCP_NOOP, status=0, opaque=7)))
    ev.append(SnapshotMarker(hdr(Opcode.DCP_SNAPSHOT_MARKER, 0), "1", 7, 9, 0x05))
    snappy_xattr = Datatype.JSON | Datatype.SNAPPY | Datatype.XATTR
    ev.append(
        Mutation(
            hdr(Opcode.DCP_MUTATION, 0, cas=next_cas(), datatype=snappy_xattr),
            7,
            2,
            0,
            0,
            0,
            0,
            0,
            8,
            b"airline_10",
            json.dumps({"id": 10, "name": "40-Mile Air", "v": 2}).encode(),
            {"_sync": '{"rev":"2-abc"}', "meta": '{"by":"app"}'},
        )
    )
    ev.append(
        Deletion(
            hdr(Opcode.DCP_DELETION, 0, cas=next_cas(), datatype=Datatype.XATTR),
            8,
            2,
            1_721_807_812,
            8,
            b"airline_137",
            b"",
            {"_sync": '{"rev":"2-del"}'},
        )
    )
    ev.append(
        Mutation(
            hdr(Opcode.DCP_MUTATION, 0, cas=next_cas(), datatype=Datatype.RAW),
            9,
            1,
            0,
            0,
            0,
            0,
            0,
            0,
            b"logo.png",
            bytes(range(256)),
            None,
        )
    )
    ev.append(BufferAck(make_header(Opcode.DCP_BUFFER_ACKNOWLEDGEMENT, opaque=0), 4096))

    # vbucket 1: an OSO backfill in key order, then an expiration and a drop
    ev.append(OsoSnapshot(hdr(Opcode.DCP_OSO_SNAPSHOT, 1), 0x01))
    for seqno, key in ((4, b"route_1"), (2, b"route_2"), (3, b"route_3")):
        ev.append(
            Mutation(
                hdr(Opcode.DCP_MUTATION, 1, cas=next_cas(), datatype=Datatype.JSON),
                seqno,
                1,
                0,
                1_900_000_000,
                0,
                0,
                0,
                0,
                key,
                json.dumps({"route": key.decode()}).encode(),
                None,
            )
        )
    ev.append(SeqnoAdvanced(hdr(Opcode.DCP_SEQNO_ADVANCED, 1), 4))
    ev.append(OsoSnapshot(hdr(Opcode.DCP_OSO_SNAPSHOT, 1), 0x02))
    ev.append(SnapshotMarker(hdr(Opcode.DCP_SNAPSHOT_MARKER, 1), "2.0", 5, 6, 0x01, 6, 0))
    ev.append(
        Expiration(
            hdr(Opcode.DCP_EXPIRATION, 1, cas=next_cas()),
            5,
            2,
            1_900_000_001,
            0,
            b"route_1",
            b"",
            None,
        )
    )
    ev.append(
        SystemEvent(
            hdr(Opcode.DCP_SYSTEM_EVENT, 1),
            6,
            1,
            0,
            "drop_collection",
            3,
            8,
            8,
            None,
            None,
            b"",
        )
    )
    ev.append(StreamEnd(hdr(Opcode.DCP_STREAM_END, 1), 0, "ok"))
    return ev


def write_sample_capture(directory: str | Path, *, max_file_bytes: int = 1024) -> list[Path]:
    """Write the sample session (rotating across a few small files); returns the paths."""
    with CaptureWriter(
        directory,
        bucket=BUCKET,
        session_id=SESSION_ID,
        collections=True,
        features=("xattr", "snappy", "json", "include_delete_times", "expiry_opcode"),
        source="sample",
        max_file_bytes=max_file_bytes,
    ) as writer:
        for event in sample_events():
            writer.write(encode(event))
    return writer.paths

"""The bronze decode tasks without Spark: chunked reading of a capture file, session order
across chunks and files, the scan, and the counts handed back."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from dcp_cdc.capture import CaptureWriter, iter_capture, read_capture_header
from dcp_cdc.columnar.schema import to_signed64
from dcp_cdc.encoder import encode, make_header
from dcp_cdc.errors import MalformedFrameError
from dcp_cdc.events import Mutation, OsoSnapshot, SnapshotMarker, StreamRequestResponse
from dcp_cdc.protocol import Datatype, Opcode
from dcp_cdc.simulator import simulate
from pipelines import schemas
from pipelines.bronze.decode import FileScan, StreamState, decode_file, scan_file
from pipelines.errors import LandingChangedError

SCHEMA = schemas.arrow_schema(schemas.DECODE_OUTPUT)


def _decode(path: Path, chunk: int) -> pa.Table:
    header, length = read_capture_header(path)
    file = {
        "path": str(path),
        "bucket": header.bucket,
        "session_id": header.session_id,
        "session_started_at": header.started_at,
        "file_sequence": header.sequence,
        "collections": header.collections,
        "header_length": length,
        "size": path.stat().st_size,
    }
    return pa.Table.from_batches(
        list(decode_file(file, SCHEMA, chunk_bytes=chunk, raw_limit=64)), schema=SCHEMA
    )


@pytest.mark.parametrize("chunk", [97, 4096])
def test_small_chunks_give_the_same_rows_as_one_read(tmp_path: Path, chunk: int) -> None:
    result = simulate(
        tmp_path, scenario="interrupted", seed=2, vbuckets=4, docs=40, ops=150, inject_malformed=2
    )
    (path,) = result.files
    whole = _decode(path, 1 << 30).sort_by([("offset", "ascending")])
    chunked = _decode(path, chunk).sort_by([("offset", "ascending")])
    assert chunked.to_pylist() == whole.to_pylist()
    errors = [r for r in whole.to_pylist() if r["op"] == "error"]
    assert [(e["offset"], e["error_truncated"]) for e in errors] == [
        (e["offset"], "truncated" in e["reason"]) for e in result.expected_errors
    ]
    assert all(len(e["raw"]) <= 64 for e in errors)
    framed = [r for r in whole.to_pylist() if r["op"] != "error" or r["error_frame_length"]]
    assert [r["frame_index"] for r in framed] == list(range(len(framed)))  # in offset order


def test_unframeable_rest_is_one_record(tmp_path: Path) -> None:
    result = simulate(tmp_path, scenario="basic", seed=3, vbuckets=4, docs=40, ops=100)
    path = result.files[0]
    data = bytearray(path.read_bytes())
    _, start = read_capture_header(path)
    cut = start + 5000
    while data[cut] != 0x80:  # find a frame start near there
        cut += 1
    # walk frames to find a real boundary after `cut`
    pos = start
    while pos < cut:
        pos += 24 + int.from_bytes(data[pos + 8 : pos + 12], "big")
    data[pos] = 0x42  # an unknown magic: nothing after it can be framed
    path.write_bytes(bytes(data))
    rows = _decode(path, 1000).to_pylist()
    (err,) = [r for r in rows if r["op"] == "error"]
    assert err["offset"] == pos and err["error_raw_length"] == len(data) - pos
    assert "unknown magic" in err["error_reason"]
    assert max(r["offset"] for r in rows if r["op"] != "error") < pos


EVENTS_SCHEMA = schemas.arrow_schema(schemas.DECODED_EVENTS)
STATE = ["in_snapshot_start", "in_snapshot_end", "in_snapshot_flags", "in_oso", "in_vb_uuid"]


def _file(path: Path, carry: str = "{}") -> dict[str, object]:
    header, length = read_capture_header(path)
    return {
        "path": str(path),
        "bucket": header.bucket,
        "session_id": header.session_id,
        "session_started_at": header.started_at,
        "file_sequence": header.sequence,
        "collections": header.collections,
        "header_length": length,
        "size": path.stat().st_size,
        "carry": carry,
    }


def _reference_states(files: list[Path]) -> dict[tuple[str, int], tuple[object, ...]]:
    """The state in force at each frame, by the definition, one event at a time."""
    snapshot: dict[tuple[str, int], tuple[object, ...]] = {}
    uuid: dict[tuple[str, int], int] = {}
    out = {}
    for path in files:
        session = read_capture_header(path)[0].session_id
        for event in iter_capture(path):
            if isinstance(event, MalformedFrameError):
                continue
            h = event.header
            # a response's stream is its opaque (a consumer sets it to the vbucket), as an int
            key = int(np.int64(h.opaque).astype(np.int32)) if h.is_response else h.vbucket_or_status
            stream = (session, key)
            if isinstance(event, SnapshotMarker):
                snapshot[stream] = (
                    to_signed64(event.start_seqno),
                    to_signed64(event.end_seqno),
                    event.snapshot_flags,
                    False,
                )
            elif isinstance(event, OsoSnapshot):
                snapshot[stream] = (None, None, None, bool(event.oso_flags & 1))
            elif isinstance(event, StreamRequestResponse) and h.vbucket_or_status == 0:
                snapshot[stream] = (None, None, None, False)
            if isinstance(event, StreamRequestResponse) and event.failover_log:
                uuid[stream] = to_signed64(event.failover_log[0][0])
            state = snapshot.get(stream, (None, None, None, False))
            out[(str(path), h.offset)] = (*state, uuid.get(stream))
    return out


@pytest.mark.parametrize("scenario", ["mixed", "rollback", "oso-backfill"])
def test_session_order_follows_the_definition_across_files(tmp_path: Path, scenario: str) -> None:
    """Files decoded one by one, each from the carry the scans of the ones before give (as
    the ingest does), hold the state the definition gives at every frame."""
    result = simulate(
        tmp_path, scenario=scenario, seed=4, vbuckets=4, docs=60, ops=400, max_file_bytes=12_000
    )
    files = sorted(
        result.files,
        key=lambda p: (read_capture_header(p)[0].session_id, read_capture_header(p)[0].sequence),
    )
    assert len(files) >= 3
    expected = _reference_states(files)
    states: dict[str, dict[int, StreamState]] = {}
    got = {}
    for path in files:
        session = read_capture_header(path)[0].session_id
        before = states.get(session, {})
        carry = json.dumps({str(k): list(v) for k, v in before.items()})
        rows = (
            pa.Table.from_batches(
                list(
                    decode_file(
                        _file(path, carry),
                        EVENTS_SCHEMA,
                        chunk_bytes=3000,
                        raw_limit=64,
                        errors=False,
                    )
                ),
                schema=EVENTS_SCHEMA,
            )
            .select(["offset", *STATE])
            .to_pylist()
        )
        got |= {(str(path), r["offset"]): tuple(r[c] for c in STATE) for r in rows}
        states[session] = scan_file(_file(path), chunk_bytes=3000).apply(before)
    assert got == expected


def test_counts_reach_the_caller(tmp_path: Path) -> None:
    result = simulate(
        tmp_path, scenario="interrupted", seed=2, vbuckets=4, docs=40, ops=150, inject_malformed=2
    )
    (path,) = result.files
    counted: list[tuple[str, int, int]] = []
    rows = list(
        decode_file(
            _file(path),
            SCHEMA,
            chunk_bytes=4096,
            raw_limit=64,
            frames=False,
            done=lambda *c: counted.append(c),
        )
    )
    errors = pa.Table.from_batches(rows, schema=SCHEMA).to_pylist()
    assert all(r["op"] == "error" for r in errors)
    assert len(errors) == len(result.expected_errors)
    frames = sum(1 for e in iter_capture(path) if not isinstance(e, MalformedFrameError))
    assert counted == [(str(path), frames, len(errors))]


# --- the bytes a run planned ---------------------------------------------------------------


@pytest.fixture
def capture(tmp_path: Path) -> Path:
    return simulate(tmp_path, scenario="basic", seed=8, vbuckets=2, docs=20, ops=60).files[0]


def _scan(file: dict[str, object], digest: str | None = None, growth: bool = True) -> FileScan:
    return scan_file(file, chunk_bytes=500, planned_digest=digest, growth=growth)


def test_a_scan_hashes_exactly_the_planned_bytes(capture: Path) -> None:
    data = capture.read_bytes()
    whole = _scan(_file(capture))
    assert whole.digest == hashlib.sha256(data).hexdigest() and whole.problem is None
    assert _scan(_file(capture), whole.digest).problem is None
    planned = _file(capture)
    planned["size"] = len(data) - 100  # listed before its last 100 bytes landed
    grown = _scan(planned)
    assert grown.digest == hashlib.sha256(data[:-100]).hexdigest()
    assert grown.problem == f"grew past the {len(data) - 100} bytes planned"
    assert _scan(planned, grown.digest, growth=False).problem is None  # the plan's bytes are intact


def test_a_scan_reports_a_file_that_changed_or_vanished(capture: Path) -> None:
    file = _file(capture)
    digest = _scan(file).digest
    data = capture.read_bytes()
    capture.write_bytes(data[:-7])
    assert _scan(file, digest).problem == f"has {len(data) - 7} bytes, not the {len(data)} planned"
    capture.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    changed = _scan(file, digest)
    assert changed.problem == f"its first {len(data)} bytes are not those planned (sha256 differs)"
    assert not changed.missing
    capture.unlink()
    gone = _scan(file, digest)
    assert (gone.problem, gone.missing) == ("vanished", True)
    capture.mkdir()
    assert _scan(file, digest).problem == "is no longer a file"


def test_a_decode_task_reads_the_planned_bytes_or_fails(capture: Path) -> None:
    data = capture.read_bytes()
    file = _file(capture)
    digest = _scan(file).digest
    before = list(decode_file(file, SCHEMA, chunk_bytes=500, raw_limit=64, planned_digest=digest))
    with open(capture, "ab") as fh:  # grew after it was planned: the planned bytes are read
        fh.write(data[file["header_length"] :])  # type: ignore[misc]
    after = list(decode_file(file, SCHEMA, chunk_bytes=500, raw_limit=64, planned_digest=digest))
    assert pa.Table.from_batches(after).equals(pa.Table.from_batches(before))
    capture.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(LandingChangedError, match="sha256 differs"):
        list(decode_file(file, SCHEMA, chunk_bytes=500, raw_limit=64, planned_digest=digest))
    capture.unlink()
    with pytest.raises(LandingChangedError, match="vanished"):
        list(decode_file(file, SCHEMA, chunk_bytes=500, raw_limit=64, planned_digest=digest))


def test_add_stream_frames_land_in_bronze_rows_by_name(tmp_path: Path) -> None:
    """Once: the seed's add-stream request and response (add-stream.md) were ``unknown``
    rows. In bronze's columns: the request's flags by name, the response's stream opaque."""
    request = bytes.fromhex("80510000040000050000000400000001000000000000000000000001")
    response = bytes.fromhex("81510000040000000000000400000001000000000000000000001000")
    with CaptureWriter(tmp_path, bucket="b", session_id="s", collections=True) as writer:
        for data in (request, response):
            writer.write(data)
    (path,) = writer.paths
    _, length = read_capture_header(path)
    file = {
        "path": str(path),
        "bucket": "b",
        "session_id": "s",
        "session_started_at": None,
        "file_sequence": 0,
        "collections": True,
        "header_length": length,
        "size": path.stat().st_size,
        "carry": None,
    }
    rows = pa.Table.from_batches(
        list(decode_file(file, EVENTS_SCHEMA, chunk_bytes=1 << 20, raw_limit=64)),
        schema=EVENTS_SCHEMA,
    ).to_pylist()
    assert [r["op"] for r in rows] == ["add_stream", "add_stream_response"]
    req, resp = rows
    assert (req["vbucket"], req["opaque"], req["flags"]) == (5, 1, 1)
    assert req["stream_flag_names"] == ["takeover"] and req["stream_opaque"] is None
    assert (resp["status"], resp["status_name"], resp["stream_opaque"]) == (0, "success", 0x1000)
    assert resp["stream_flag_names"] is None and resp["offset"] == length + len(request)


def test_a_bounded_expansion_gives_the_same_rows_as_one_read(tmp_path: Path) -> None:
    """Batches that stop at ``chunk_bytes`` of decompressed values, values
    larger than a chunk among them, and a cut tail: the rows of one unbounded read."""
    events = []
    for i, size in enumerate([100_000, 5, 3_000_000, 200_000, 7, 150_000] * 3):
        h = make_header(Opcode.DCP_MUTATION, vbucket=i % 3, datatype=Datatype.SNAPPY)
        body = bytes([97 + i % 26]) * size
        events.append(Mutation(h, i + 1, 1, 0, 0, 0, 0, 0, None, b"k%d" % i, body, None))
    with CaptureWriter(tmp_path, bucket="b", session_id="s", collections=False) as writer:
        for event in events:
            writer.write(encode(event))
        writer.write_raw(encode(events[0])[:40])
    (path,) = writer.paths
    whole = _decode(path, 1 << 30).to_pylist()
    bounded = _decode(path, 1 << 16).to_pylist()
    assert bounded == whole
    assert [r["op"] for r in whole] == ["mutation"] * len(events) + ["error"]
    assert [len(r["value"]) for r in whole[:-1]] == [len(e.value) for e in events]
    assert whole[-1]["error_truncated"]

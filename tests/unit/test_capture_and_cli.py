"""Capture files (docs/protocol/capture-format.md) and the ``dcp-cdc decode`` command."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from dcp_cdc.capture import (
    MAGIC,
    CaptureHeader,
    CaptureWriter,
    encode_header,
    iter_capture,
    parse_header,
    read_capture_header,
)
from dcp_cdc.encoder import frame, make_header
from dcp_cdc.errors import CaptureFormatError, MalformedFrameError, TruncatedFrameError
from dcp_cdc.events import Mutation
from dcp_cdc.protocol import Opcode
from pipelines.app.cli import main
from tests.support.sample_session import sample_events, write_sample_capture

MUTATION_8_2 = bytes.fromhex(
    "805700061f0102100000002c0000121017a8b0d8e6f40000000000000000000400000000000000010200000600"
    "000000000000000000000868656c6c6f7b2261223a317d"
)


def test_header_layout_and_round_trip() -> None:
    header = CaptureHeader(
        bucket="b", collections=True, session_id="s", sequence=2, features=("xattr",), extra_field=1
    )  # type: ignore[call-arg]
    data = encode_header(header)
    assert data[:8] == b"DCPCAP\x00\x01" == MAGIC
    length = int.from_bytes(data[8:12], "big")
    assert len(data) == 12 + length
    parsed, end = parse_header(data + MUTATION_8_2)
    assert end == len(data)
    assert parsed == header and parsed.model_extra == {"extra_field": 1}


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"DCPCAP", "too short"),
        (b"NOTACAPT" + bytes(4), "not a capture file"),
        (b"DCPCAP\x00\x02" + bytes(4), "version 2 is not supported"),
        (b"DCPCAP\x00\x01\x00\x00\x00\x10{}", "header truncated"),
        (b"DCPCAP\x00\x01\x00\x00\x00\x02[]", "not a JSON object"),
        (b"DCPCAP\x00\x01\x00\x00\x00\x02{}", "bucket"),
        (b"DCPCAP\x00\x01\x00\x00\x00\x01{", "not JSON"),
    ],
)
def test_bad_headers_name_the_problem(data: bytes, reason: str) -> None:
    with pytest.raises(CaptureFormatError, match=reason):
        parse_header(data, file="x.dcpcap")


def test_writer_rotates_by_size_and_reader_gives_file_offsets(tmp_path: Path) -> None:
    with CaptureWriter(
        tmp_path, bucket="b", session_id="s1", collections=True, max_file_bytes=300
    ) as writer:
        for _ in range(10):
            writer.write(MUTATION_8_2)
    assert len(writer.paths) > 1
    total = 0
    for seq, path in enumerate(writer.paths):
        header, start = read_capture_header(path)
        assert (header.session_id, header.sequence) == ("s1", seq)
        events = list(iter_capture(path))
        assert all(isinstance(e, Mutation) and e.key == b"hello" for e in events)
        assert [e.header.offset for e in events] == [  # type: ignore[union-attr]
            start + i * len(MUTATION_8_2) for i in range(len(events))
        ]
        total += len(events)
    assert total == 10


def test_cut_tail_is_reported_not_invented(tmp_path: Path) -> None:
    with CaptureWriter(tmp_path, bucket="b", session_id="s", collections=True) as writer:
        writer.write(MUTATION_8_2)
        writer.write_raw(MUTATION_8_2[:30])
    items = list(iter_capture(writer.paths[0], chunk_size=7))
    assert isinstance(items[0], Mutation)
    assert isinstance(items[1], TruncatedFrameError) and items[1].available == 30
    assert len(items) == 2


def test_sample_capture_decodes_without_errors(tmp_path: Path) -> None:
    paths = write_sample_capture(tmp_path)
    decoded = [e for p in paths for e in iter_capture(p)]
    assert not [e for e in decoded if isinstance(e, MalformedFrameError)]
    assert [e.op for e in decoded] == [e.op for e in sample_events()]  # type: ignore[union-attr]


def test_decode_command_prints_json_lines(tmp_path: Path) -> None:
    paths = write_sample_capture(tmp_path)
    out = io.StringIO()
    assert main(["decode", str(tmp_path)], out=out) == 0
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(records) == len(sample_events())
    first_mutation = next(r for r in records if r["op"] == "mutation")
    assert first_mutation["file"] == str(paths[0])
    assert first_mutation["key"] == "airline_10" and first_mutation["collection_id"] == 8
    assert json.loads(first_mutation["value"])["name"] == "40-Mile Air"
    for key in (
        "offset",
        "magic",
        "opcode",
        "vbucket",
        "opaque",
        "cas",
        "datatype",
        "stream_id",
        "by_seqno",
        "rev_seqno",
        "flags",
        "expiration",
        "lock_time",
        "nru",
    ):
        assert key in first_mutation
    binary = next(r for r in records if r.get("key") == "logo.png")
    assert "value_b64" in binary and "value" not in binary
    xattr_doc = next(r for r in records if r["op"] == "mutation" and r.get("xattrs"))
    assert xattr_doc["xattrs"]["_sync"] == '{"rev":"2-abc"}'
    marker = next(r for r in records if r["op"] == "snapshot_marker" and r["marker_version"] == "1")
    assert marker["snapshot_flag_names"] == ["memory", "checkpoint"]
    response = next(r for r in records if r["op"] == "stream_request_response")
    assert response["status"] == 0 and response["failover_log"] == [[0x0000111122223333, 0]]
    end = next(r for r in records if r["op"] == "stream_end")
    assert end["reason"] == "ok"


def test_decode_command_reports_errors_and_exits_non_zero(tmp_path: Path) -> None:
    raw = tmp_path / "stream.bin"
    bad = bytearray(MUTATION_8_2)
    bad[4] = 30  # extras 30: the key and value shift, the frame is malformed
    raw.write_bytes(MUTATION_8_2 + bytes(bad) + MUTATION_8_2[:10])
    out = io.StringIO()
    assert main(["decode", "--raw", "--collections", str(raw)], out=out) == 1
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["op"] for r in records] == ["mutation", "error", "error"]
    assert records[1]["offset"] == len(MUTATION_8_2) and "extras length" in records[1]["reason"]
    assert records[2]["truncated"] is True and records[2]["offset"] == 2 * len(MUTATION_8_2)


def test_decode_command_reports_a_deeply_nested_value_and_goes_on(tmp_path: Path) -> None:
    """Once: a stream request whose JSON value nests 1,000 deep printed a traceback and
    the frame after it was never printed."""
    deep = ("[" * 1000 + "]" * 1000).encode()
    request = frame(make_header(Opcode.DCP_STREAM_REQ), bytes(48), b"", deep)
    raw = tmp_path / "stream.bin"
    raw.write_bytes(request + MUTATION_8_2)
    out = io.StringIO()
    assert main(["decode", "--raw", "--collections", str(raw)], out=out) == 1
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["op"] for r in records] == ["error", "mutation"]
    assert records[0]["offset"] == 0 and "nests too deep" in records[0]["reason"]
    assert records[1]["offset"] == len(request) and records[1]["key"] == "hello"


def test_decode_command_names_the_add_stream_messages(tmp_path: Path) -> None:
    """Once: the seed's two add-stream frames printed ``"op": "unknown"``."""
    raw = tmp_path / "stream.bin"
    raw.write_bytes(
        bytes.fromhex("80510000040000050000000400000001000000000000000000000001")
        + bytes.fromhex("81510000040000000000000400000001000000000000000000001000")
    )
    out = io.StringIO()
    assert main(["decode", "--raw", "--no-collections", str(raw)], out=out) == 0
    request, response = [json.loads(line) for line in out.getvalue().splitlines()]
    assert request["op"] == "add_stream" and request["vbucket"] == 5
    assert request["flags"] == 1 and request["stream_flag_names"] == ["takeover"]
    assert response["op"] == "add_stream_response" and response["status"] == 0
    assert response["status_name"] == "success" and response["stream_opaque"] == 0x1000


def test_decode_command_raw_without_collections(tmp_path: Path) -> None:
    raw = tmp_path / "stream.bin"
    raw.write_bytes(MUTATION_8_2)
    out = io.StringIO()
    assert main(["decode", "--raw", "--no-collections", str(raw)], out=out) == 0
    (record,) = [json.loads(line) for line in out.getvalue().splitlines()]
    assert record["key"] == "\x08hello" and "collection_id" not in record  # prefix kept

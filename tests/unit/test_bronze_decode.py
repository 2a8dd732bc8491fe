"""The bronze decode task without Spark: chunked reading of one capture file."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from dcp_cdc.capture import read_capture_header
from dcp_cdc.simulator import simulate
from pipelines import schemas
from pipelines.bronze.decode import decode_file

SCHEMA = schemas.arrow_schema(schemas.DECODE_OUTPUT)


def _decode(path: Path, chunk: int) -> pa.Table:
    header, length = read_capture_header(path)
    file = {"path": str(path), "bucket": header.bucket, "session_id": header.session_id,
            "session_started_at": header.started_at,
            "file_sequence": header.sequence, "collections": header.collections,
            "header_length": length, "size": path.stat().st_size}  # fmt: skip
    return pa.Table.from_batches(list(decode_file(file, SCHEMA, chunk_bytes=chunk, raw_limit=64)),
                                 schema=SCHEMA)  # fmt: skip


@pytest.mark.parametrize("chunk", [97, 4096])
def test_small_chunks_give_the_same_rows_as_one_read(tmp_path: Path, chunk: int) -> None:
    result = simulate(tmp_path, scenario="interrupted", seed=2, vbuckets=4, docs=40, ops=150,
                      inject_malformed=2)  # fmt: skip
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

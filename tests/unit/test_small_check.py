"""The rules of a small bucket's check in the driver (pipelines/quality/small), on explicit
rows: Spark's ordering and hash, a stream's frames placed in streams and snapshots, and the
live layer's overlay of a collection table. That each step gives Spark's rows on whole
scenarios is tests/spark/test_quality_incremental.py's."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from pipelines.errors import NotOnDriver
from pipelines.quality.small.read import BASE_READ, base_frames, base_frames_of
from pipelines.quality.small.sql import concat, max_by, order_key, smallest, xxh64
from pipelines.quality.small.streams import snapshots, stream_frames
from pipelines.silver.rows_read import overlay, view_rows


def test_xxh64_gives_the_reference_vectors() -> None:
    # XXH64's published values (seed 0), one per code path: empty, a 1-3 byte tail, a
    # 32-byte stripe and every tail
    assert xxh64(b"", 0) == 0xEF46DB3751D8E999
    assert xxh64(b"abc", 0) == 0x44BC2CF5AD770999
    assert xxh64(b"Nobody inspects the spammish repetition", 0) == 0xFBCEA83C8A378BF1


def test_spark_orders_a_null_first_and_structs_field_by_field() -> None:
    assert sorted([3, None, 1], key=order_key) == [None, 1, 3]
    assert smallest([(2, "a"), (1, None), (1, "b")]) == (1, None)
    assert smallest([None, None]) is None
    # max_by skips a null ordering, and gives a null value of the largest one
    assert max_by([("x", 1), ("y", None), (None, 2)]) is None
    assert concat("seqno ", 5, " after ", None) is None
    assert concat("vb ", 3, ": ", True) == "vb 3: true"


def _event(**values: Any) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(BASE_READ)
    row.update(
        session_started_at="2026-11-29T10:00:00Z",
        session_id="s1",
        file="/landing/s1-0001.dcp",
        file_sequence=1,
        bucket="b",
        magic=0x80,
        frame_len=24,
        frame_index=0,
        ingest_run_id="r1",
        ingested_at=0,
        opcode=0x57,
    )
    row.update(values)
    return row


def _stream(*events: dict[str, Any]) -> list[dict[str, Any]]:
    rows = [_event(offset=i * 100, frame_index=i, **e) for i, e in enumerate(events)]
    return stream_frames(base_frames(rows))


def test_a_streams_frames_are_numbered_and_a_regression_is_found() -> None:
    frames = _stream(
        {"op": "stream_request", "vbucket": 7, "start_seqno": 0, "end_seqno": 100},
        {"op": "stream_request_response", "status": 0, "opaque": 7},
        {
            "op": "snapshot_marker",
            "vbucket": 7,
            "start_seqno": 1,
            "end_seqno": 3,
            "snapshot_flags": 1,
        },
        *[
            {
                "op": "mutation",
                "vbucket": 7,
                "by_seqno": s,
                "key": b"k",
                "in_snapshot_start": 1,
                "in_snapshot_end": 3,
            }
            for s in (1, 3, 2)
        ],
    )
    assert [f["stream_no"] for f in frames] == [1, 1, 1, 1, 1, 1]  # the request joins it
    assert [f["snapshot_no"] for f in frames] == [0, 1, 2, 2, 2, 2]
    assert [f["requested_end"] for f in frames] == [100] * 6
    assert [f["regression"] for f in frames] == [False] * 5 + [True]
    assert frames[-1]["seqno_floor"] == 3
    marker = next(s for s in snapshots(frames) if s["kind"] == "marker")
    assert (marker["items"], marker["last_seqno"], marker["reached_end"]) == (3, 3, True)
    assert (marker["complete"], marker["committed"], marker["is_last"]) == (True, True, True)


def test_a_response_whose_opaque_is_beyond_an_int_is_left_to_spark() -> None:
    with pytest.raises(NotOnDriver, match="opaque 4294967296"):
        base_frames([_event(op="stream_request_response", status=0, opaque=1 << 32, offset=0)])


def test_the_columnar_base_frames_are_the_rows_ones() -> None:
    events = [
        _event(op="stream_request", vbucket=7, start_seqno=0, end_seqno=100, opaque=7),
        _event(op="stream_request_response", status=0, opaque=7, vbucket=0),
        _event(op="mutation", vbucket=7, by_seqno=4, key=b"k", rev_seqno=1, cas=9),
        _event(op="commit", vbucket=7, commit_seqno=5, key=b"k"),
        _event(op="abort", vbucket=7, abort_seqno=6, key=None),
        _event(op="deletion", vbucket=7, by_seqno=7, key=None),  # required columns null
        _event(op="unknown", vbucket=None, opcode=0x99),
        _event(op="mutation", vbucket=7, opcode=None),
    ]
    rows = [{**e, "offset": i * 100, "frame_index": i} for i, e in enumerate(events)]
    expected = base_frames(rows)
    assert "key" in expected[5]["null_columns"]  # the case is there
    assert base_frames_of(pa.Table.from_pylist(rows)) == expected
    response = _event(op="stream_request_response", status=0, opaque=1 << 32, offset=0)
    with pytest.raises(NotOnDriver, match="opaque 4294967296"):
        base_frames_of(pa.Table.from_pylist([response, _event(op="noop", opaque=1, offset=1)]))


def _row(key: str, seqno: int, **values: Any) -> dict[str, Any]:
    return {
        "_collection_id": 8,
        "_vbucket": 1,
        "_vb_uuid": 5,
        "_seqno": seqno,
        "_rev_seqno": 1,
        "key": key,
        "_deleted": False,
        "_expiry": 0,
        **values,
    }


def test_the_overlay_shows_a_keys_newest_row_and_refuses_one_a_purge_covers() -> None:
    table = [_row("a", 10), _row("b", 20)]
    pending = [
        _row("a", 12),  # newer than the table's: replaces it
        _row("a", 11),  # an older pending row of the same key: not shown
        _row("b", 15),  # older than the table's: the table's stays
        _row("c", 30),  # a new key above the purge mark
        _row("d", 4),  # a new key at or below the mark: older than a purged deletion
        {**_row("e", 40), "_collection_id": 9},  # another collection
    ]
    purges = [{"table_name": "silver.t_all", "vbucket": 1, "purged_through_seqno": 5}]
    shown = overlay(table, "silver.t", 8, pending, purges, ["key", "_seqno"])
    assert sorted((r["key"], r["_seqno"], r["table"]) for r in shown) == [
        ("a", 12, "silver.t"),
        ("b", 20, "silver.t"),
        ("c", 30, "silver.t"),
    ]
    deleted = [_row("x", 1, _deleted=True), _row("y", 1, _expiry=1), _row("z", 1)]
    assert [r["key"] for r in view_rows(deleted, now=100)] == ["z"]

""":func:`pipelines.silver.walk_input.keyed_rows`'s rule on a few explicit frames (no Spark):
walked ops of the runs asked for only, each with its run's version, its stream (a response's
opaque, else its vbucket) and that stream's saved state."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipelines import schemas
from pipelines.silver.walk_input import KEYED, RunFiles, keyed_rows, row_count


def _frame(**values: Any) -> dict[str, Any]:
    return {f.name: values.get(f.name) for f in schemas.EVENTS.fields}


def _write(path: Path, frames: list[dict[str, Any]]) -> str:
    pq.write_table(pa.Table.from_pylist(frames, schema=schemas.arrow_schema(schemas.EVENTS)), path)
    return str(path)


def test_keyed_rows_follow_the_walks_input_rule(tmp_path: Path) -> None:
    paths = [
        _write(
            tmp_path / "a.parquet",
            [
                _frame(op="mutation", vbucket=3, by_seqno=7, ingest_run_id="r1", opaque=99),
                _frame(
                    op="stream_request_response",
                    vbucket=None,
                    status=0,
                    opaque=5,
                    ingest_run_id="r1",
                ),
                _frame(op="noop", vbucket=3, ingest_run_id="r1"),
                _frame(op="deletion", vbucket=None, by_seqno=8, ingest_run_id="r1"),
            ],
        ),
        _write(
            tmp_path / "b.parquet",
            [_frame(op="snapshot_marker", vbucket=4, start_seqno=1, ingest_run_id="r2")],
        ),
        _write(
            tmp_path / "c.parquet",
            [_frame(op="mutation", vbucket=4, by_seqno=2, ingest_run_id="r3")],
        ),
    ]
    files = RunFiles(paths, {"r1": 10, "r2": 11})  # r3's file is read, its rows are not kept
    assert row_count(files, {}) == 6

    table = keyed_rows(files, {5: ('{"s": 1}', 4)}, read_through=11, storage={})

    assert table is not None
    assert table.schema == schemas.arrow_schema(KEYED)
    got = sorted(
        (
            r["op"],
            r["vb_key"],
            r["run_version"],
            r["saved_state"],
            r["late_after"],
            r["read_through"],
        )
        for r in table.to_pylist()
    )
    assert got == [
        ("mutation", 3, 10, None, None, 11),  # a request's or a data frame's vbucket
        ("snapshot_marker", 4, 11, None, None, 11),
        ("stream_request_response", 5, 10, '{"s": 1}', 4, 11),  # a response's opaque
    ]  # no noop (not walked), no frame without a stream, nothing of run r3


def test_an_opaque_no_int_holds_leaves_the_read_to_spark(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "a.parquet",
        [
            _frame(op="mutation", vbucket=1, by_seqno=1, opaque=2**32 - 1, ingest_run_id="r"),
            _frame(op="stream_request_response", status=0, opaque=2**32 - 1, ingest_run_id="r"),
        ],
    )
    assert keyed_rows(RunFiles([path], {"r": 1}), {}, None, {}) is None
    # a data frame's opaque is not its stream: any value is fine there
    only_data = _write(
        tmp_path / "b.parquet",
        [_frame(op="mutation", vbucket=1, by_seqno=1, opaque=2**32 - 1, ingest_run_id="r")],
    )
    table = keyed_rows(RunFiles([only_data], {"r": 1}), {}, None, {})
    assert table is not None
    assert table.column("vb_key").to_pylist() == [1]
    assert table.column("read_through").to_pylist() == [None]

"""The columnar bronze writer's pure parts: Delta's string and timestamp statistics, and what a
task leaves behind when its input fails. (tests/spark/test_bronze.py checks the statistics of
whole runs against Spark's own writer.)"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.bronze.writer import Target, truncate_max, truncate_min, write_files

SCHEMA = pa.schema(
    [
        ("by_seqno", pa.int64()),
        ("op", pa.string()),
        ("key", pa.binary()),
        ("ingest_run_id", pa.string()),
        ("ingested_at", pa.timestamp("us", tz="UTC")),
    ]
)
AT = dt.datetime(2026, 11, 23, 1, 2, 3, 456789, tzinfo=dt.UTC)


def target(tmp_path: Path) -> Target:
    return Target(
        location=str(tmp_path),
        schema=SCHEMA,
        stats_columns=("by_seqno", "op", "key", "ingest_run_id", "ingested_at"),
        constants={"ingest_run_id": "r" * 36, "ingested_at": AT},
    )


def batch(seqnos: list[int | None], ops: list[str | None]) -> pa.RecordBatch:
    keys = [b"k%d" % i for i in range(len(seqnos))]
    return pa.RecordBatch.from_arrays(
        [pa.array(seqnos, pa.int64()), pa.array(ops, pa.string()), pa.array(keys)],
        names=["by_seqno", "op", "key"],
    )


@pytest.mark.parametrize(
    ("value", "low", "high"),
    [
        ("short", "short", "short"),
        ("a" * 32, "a" * 32, "a" * 32),
        # what Spark's writer gave for these (the first cut unit below U+007F or not)
        ("a" * 40, "a" * 32, "a" * 32 + "\x7f"),
        ("é" * 40, "é" * 32, "é" * 32 + "\U0010ffff"),
        # a surrogate pair across the cut stays whole
        ("a" * 31 + "😀" + "b", "a" * 31 + "😀", "a" * 31 + "😀" + "\x7f"),
        # U+10FFFF right after the prefix is kept and the next unit decides
        ("a" * 32 + "\U0010ffff" + "b", "a" * 32, "a" * 32 + "\U0010ffff" + "\x7f"),
    ],
)
def test_string_statistics_are_cut_as_delta_cuts_them(value: str, low: str, high: str) -> None:
    assert truncate_min(value) == low
    assert truncate_max(value) == high


def test_a_maximum_with_no_room_for_a_tie_breaker_is_none() -> None:
    assert truncate_max("a" * 32 + "\U0010ffff" * 17) is None


def test_a_file_and_its_statistics(tmp_path: Path) -> None:
    written = list(
        write_files(
            [batch([7, None, 3], ["mutation", None, "deletion"]), batch([9], ["z"])],
            target(tmp_path),
        )
    )
    assert len(written) == 1
    row = written[0]
    assert row["path"].startswith("part-") and row["num_records"] == 4
    assert row["size"] == (tmp_path / row["path"]).stat().st_size
    assert json.loads(row["stats"]) == {
        "numRecords": 4,
        "minValues": {
            "by_seqno": 3,
            "op": "deletion",
            "ingest_run_id": "r" * 32,
            "ingested_at": "2026-11-23T01:02:03.456Z",
        },
        "maxValues": {
            "by_seqno": 9,
            "op": "z",
            "ingest_run_id": "r" * 32 + "\x7f",
            "ingested_at": "2026-11-23T01:02:03.456Z",
        },
        "nullCount": {"by_seqno": 1, "op": 1, "key": 0, "ingest_run_id": 0, "ingested_at": 0},
    }
    table = pq.read_table(tmp_path / row["path"])
    assert table.schema == SCHEMA
    assert table.column("by_seqno").to_pylist() == [7, None, 3, 9]
    assert set(table.column("ingested_at").to_pylist()) == {AT}


def test_no_rows_no_file(tmp_path: Path) -> None:
    assert list(write_files([batch([], [])], target(tmp_path))) == []
    assert list(tmp_path.iterdir()) == []


def test_a_failing_input_leaves_no_file_and_raises(tmp_path: Path) -> None:
    class Changed(Exception):
        pass

    def batches() -> Iterator[pa.RecordBatch]:
        yield batch([1, 2], ["a", "b"])
        raise Changed("the file changed under the task")

    with pytest.raises(Changed):
        list(write_files(batches(), target(tmp_path), row_group_rows=1))
    assert list(tmp_path.iterdir()) == []

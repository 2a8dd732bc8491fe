"""What ``dcp-cdc status`` makes of its small tables' rows (pipelines/status/table_stages.py):
small Arrow tables written down in, stages and the last quality check out (no Spark, no I/O).
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pyarrow as pa
import pytest

from pipelines.status.lag import QualityResult, Stage
from pipelines.status.table_stages import (
    LOG_COLUMNS,
    RESULTS_COLUMNS,
    STATE_COLUMNS,
    bronze_stage,
    last_cas,
    last_quality,
    log_state,
    silver_stage,
)

UTC_US = pa.timestamp("us", tz="UTC")
T0 = dt.datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=dt.UTC)
CAS = 1767323045123456789
"""A CAS whose time, its low 16 bits masked and truncated to the microsecond, is
2026-01-02 03:04:05.123391 UTC."""


def _at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


STATE_SCHEMA = pa.schema(
    [
        ("vbucket", pa.int32()),
        ("consistent_seqno", pa.int64()),
        ("open_snapshot_start", pa.int64()),
        ("updated_at", UTC_US),
        ("state", pa.string()),
    ]
)
LOG_SCHEMA = pa.schema(
    [
        ("run_version", pa.int64()),
        ("ingest_run_id", pa.string()),
        ("status", pa.string()),
        ("file", pa.string()),
        ("size", pa.int64()),
        ("modified_ms", pa.int64()),
        ("session_id", pa.string()),
        ("file_sequence", pa.int32()),
        ("end_state", pa.string()),
        ("logged_at", UTC_US),
    ]
)
RESULTS_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("severity", pa.string()),
        ("success", pa.bool_()),
        ("checked_at", UTC_US),
    ]
)


def _table(schema: pa.Schema, rows: list[tuple[Any, ...]]) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(schema.names, r, strict=True)) for r in rows], schema)


@pytest.mark.parametrize(
    ("ours", "columns", "table"),
    [
        (STATE_SCHEMA, STATE_COLUMNS, "STATE"),
        (LOG_SCHEMA, LOG_COLUMNS, "INGEST_LOG"),
        (RESULTS_SCHEMA, RESULTS_COLUMNS, "QUALITY_RESULTS"),
    ],
)
def test_the_tables_here_have_the_columns_read_with_their_types(
    ours: pa.Schema, columns: tuple[str, ...], table: str
) -> None:
    from pipelines import schemas

    arrow = {"integer": pa.int32(), "long": pa.int64(), "string": pa.string()}
    arrow |= {"timestamp": UTC_US, "boolean": pa.bool_()}
    spark = getattr(schemas, table)
    assert tuple(ours.names) == columns
    assert [(f.name, f.type) for f in ours] == [
        (name, arrow[spark[name].dataType.typeName()]) for name in columns
    ]


# --- silver ----------------------------------------------------------------------------------


def test_no_stream_state_is_an_unknown_silver() -> None:
    assert silver_stage(None) == (
        Stage("silver", None, note="no silver stream state yet (dcp-cdc apply)"),
        None,
    )


def test_silver_positions_last_save_open_snapshots_and_newest_change() -> None:
    state = _table(
        STATE_SCHEMA,
        [
            (0, 10, None, _at(0), json.dumps({"last_cas": CAS, "vbucket": 0})),
            (1, None, 5, _at(7), json.dumps({"vbucket": 1})),  # no change applied yet
            (2, 7, 3, None, json.dumps({"last_cas": CAS - 5_000_000_000})),
        ],
    )
    stage, newest = silver_stage(state)
    assert stage == Stage(
        "silver",
        {0: 10, 1: 0, 2: 7},
        _at(7),
        "2 vbuckets inside a snapshot not yet complete in bronze (applied once it is)",
    )
    assert newest == dt.datetime(2026, 1, 2, 3, 4, 5, 123391, tzinfo=dt.UTC)


def test_silver_one_open_snapshot_and_no_cas_at_all() -> None:
    state = _table(
        STATE_SCHEMA, [(3, 4, 1, _at(1), '{"last_cas": null}'), (4, 9, None, None, None)]
    )
    stage, newest = silver_stage(state)
    assert (
        stage.note == "1 vbucket inside a snapshot not yet complete in bronze (applied once it is)"
    )
    assert (stage.positions, stage.moved_at, newest) == ({3: 4, 4: 9}, _at(1), None)


def test_an_empty_stream_state_is_a_known_silver_with_no_vbuckets() -> None:
    assert silver_stage(_table(STATE_SCHEMA, [])) == (Stage("silver", {}, None, None), None)


@pytest.mark.parametrize("unit", ["s", "ms", "us", "ns"])
def test_timestamps_come_out_in_utc_microseconds_whatever_their_arrow_unit(unit: str) -> None:
    moment = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    state = _table(STATE_SCHEMA, [(0, 1, None, moment, None)])
    recast = state.set_column(3, "updated_at", state.column(3).cast(pa.timestamp(unit, tz="UTC")))
    moved = silver_stage(recast)[0].moved_at
    assert moved == moment and moved is not None and moved.tzinfo is dt.UTC


@pytest.mark.parametrize(
    ("document", "cas"),
    [
        ('{"last_cas": 1795852708172922883}', 1795852708172922883),
        ('{"last_cas": "12"}', 12),
        ('{"last_cas": null}', None),
        ('{"vbucket": 0}', None),
        ("[1, 2]", None),
        ("not json", None),
        (None, None),
    ],
)
def test_last_cas_of_a_state_document(document: str | None, cas: int | None) -> None:
    assert last_cas(document) == cas


# --- bronze ----------------------------------------------------------------------------------


def _end(**ends: int | None) -> str:
    """An end state: vbucket -> [start, end, flags, oso, vb_uuid]."""
    return json.dumps({vb.removeprefix("vb"): [0, end, 1, 0, 99] for vb, end in ends.items()})


def _log_row(
    status: str, session: str, sequence: int, end: str | None, at: float
) -> tuple[Any, ...]:
    file = f"/landing/{session}-{sequence:05d}.dcpcap"
    return (1, "run-1", status, file, 100, 1000, session, sequence, end, _at(at))


def test_no_ingest_log_is_an_unknown_bronze() -> None:
    assert bronze_stage(None) == Stage("bronze", None, note="no bronze tables yet (dcp-cdc ingest)")


def test_bronze_is_each_sessions_last_file_the_highest_over_sessions() -> None:
    log = _table(
        LOG_SCHEMA,
        [
            _log_row("ingested", "a", 1, _end(vb0=20, vb1=5), 5),  # a's last file, listed first
            _log_row("ingested", "a", 0, _end(vb0=10, vb1=8), 4),
            _log_row("ingested", "b", 0, _end(vb1=30, vb2=None), 6),
            _log_row("planned", "a", 2, None, 9),  # planned only: neither its state nor its time
            _log_row("changed", "b", 0, _end(vb3=99), 9),
        ],
    )
    assert bronze_stage(log) == Stage("bronze", {0: 20, 1: 30}, _at(6), None)


def test_a_log_without_ingested_files_is_a_known_bronze_with_none() -> None:
    log = _table(LOG_SCHEMA, [_log_row("planned", "a", 0, None, 1)])
    assert bronze_stage(log) == Stage("bronze", {}, None, "no capture file ingested yet")
    assert bronze_stage(_table(LOG_SCHEMA, [])) == bronze_stage(log)


def test_the_log_state_of_the_rows() -> None:
    log = _table(
        LOG_SCHEMA,
        [
            _log_row("ingested", "a", 0, _end(vb0=1), 1),
            (3, "run-3", "lost", None, None, None, "a", 1, None, _at(2)),
        ],
    )
    state = log_state(log)
    assert list(state.ingested) == ["/landing/a-00000.dcpcap"]
    assert state.lost == {("a", 1)}
    assert state.last_version == 3
    assert state.next_sequences() == {"a": 2}


# --- quality ---------------------------------------------------------------------------------

REPORT = "/w/quality/travel_sample/summary.html"


def test_no_results_no_quality() -> None:
    assert last_quality(None, REPORT) is None
    assert last_quality(_table(RESULTS_SCHEMA, []), REPORT) is None


def test_the_newest_run_alone_counts_its_failures_by_severity() -> None:
    results = _table(
        RESULTS_SCHEMA,
        [
            ("r1", "error", False, _at(0)),  # an older run that failed
            ("r2", "error", True, _at(60)),
            ("r2", "error", False, _at(60)),
            ("r2", "warn", False, _at(60)),
            ("r2", "warn", True, _at(60)),
            ("r2", "error", None, _at(60)),  # no verdict: not a failure
            ("r2", None, False, _at(60)),  # no severity: neither
        ],
    )
    assert last_quality(results, REPORT) == QualityResult(
        run_id="r2",
        checked_at=_at(60),
        expectations=6,
        failed_errors=1,
        failed_warnings=1,
        report=REPORT,
    )


def test_runs_checked_at_once_the_greater_run_id_is_the_newest() -> None:
    results = _table(
        RESULTS_SCHEMA,
        [
            ("r9", "error", False, _at(0)),
            ("r10", "error", True, _at(0)),
            ("r1", "warn", True, None),
        ],
    )
    found = last_quality(results, REPORT)
    assert found is not None
    assert (found.run_id, found.checked_at, found.expectations, found.passed) == (
        "r9",
        _at(0),
        1,
        False,
    )

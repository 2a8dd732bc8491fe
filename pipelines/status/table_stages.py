"""What silver's stream state, bronze's ingest log and the quality results say for ``dcp-cdc
status``: the rows of each table as an Arrow table in, a stage (or the last quality check)
out. No I/O, no Spark: :mod:`pipelines.status.read` passes what it read, with delta-rs or
through the Spark catalog, and the tests pass small tables written down.

- silver (:func:`silver_stage`): the stream state, a row per vbucket: its consistent seqno,
  the last save (``updated_at``), whether a snapshot is open, and the CAS of the newest
  change applied (``state``'s ``last_cas``);
- bronze (:func:`bronze_stage`): the ingest log's ``ingested`` rows; per capture session the
  end state of its file of the highest sequence (a session's end state carries those of its
  earlier files), and the last ``logged_at``;
- quality (:func:`last_quality`): the rows of the newest run (by ``checked_at``, then
  ``run_id``).

Timestamps are taken as microseconds since the epoch, UTC, as Delta stores them.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from dcp_cdc.protocol import cas_time
from pipelines.bronze.plan import LogState
from pipelines.status.lag import QualityResult, Stage, snapshot_ends

STATE_COLUMNS = ("vbucket", "consistent_seqno", "open_snapshot_start", "updated_at", "state")
"""The stream state's columns silver's stage is read from."""

LOG_COLUMNS = (
    *("run_version", "ingest_run_id", "status", "file", "size", "modified_ms"),
    *("session_id", "file_sequence", "end_state", "logged_at"),
)
"""The ingest log's columns bronze's stage and its :class:`LogState` are read from."""

RESULTS_COLUMNS = ("run_id", "severity", "success", "checked_at")
"""The quality results' columns the last check is read from."""

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def micros(value: int | None) -> dt.datetime | None:
    """The UTC time ``value`` microseconds after the epoch (None stays None)."""
    if value is None:
        return None
    return _EPOCH + dt.timedelta(microseconds=value)


def _columns(table: pa.Table, *names: str) -> list[list[Any]]:
    """Each of ``names`` as a Python list; a timestamp column as microseconds since the
    epoch (whatever its unit and zone as read: Delta's are UTC microseconds)."""
    found = []
    for name in names:
        column = table.column(name)
        if pa.types.is_timestamp(column.type):
            column = pc.cast(pc.cast(column, pa.timestamp("us", tz="UTC")), pa.int64())
        found.append(column.to_pylist())
    return found


def last_cas(state: str | None) -> int | None:
    """The ``last_cas`` of a stream state document (its ``state`` column), or None when it
    has none (or the document is not a JSON object)."""
    try:
        document = json.loads(state) if state is not None else None
    except ValueError:
        return None
    value = document.get("last_cas") if isinstance(document, dict) else None
    return None if value is None else int(value)


def silver_stage(state: pa.Table | None) -> tuple[Stage, dt.datetime | None]:
    """Silver's consistent seqno per vbucket, its last apply, and the time of the newest
    change it applied (by CAS), from the stream state's rows (None: no table yet)."""
    if state is None:
        return Stage("silver", None, note="no silver stream state yet (dcp-cdc apply)"), None
    vbuckets, seqnos, opened, updated, documents = _columns(state, *STATE_COLUMNS)
    positions = {vb: seqno or 0 for vb, seqno in zip(vbuckets, seqnos, strict=True)}
    saved = max((us for us in updated if us is not None), default=None)
    newest = max((cas for cas in map(last_cas, documents) if cas is not None), default=0)
    open_snapshots = sum(1 for start in opened if start is not None)
    note = None
    if open_snapshots:
        note = (
            f"{open_snapshots} vbucket{'s' if open_snapshots > 1 else ''} inside a snapshot "
            "not yet complete in bronze (applied once it is)"
        )
    return Stage("silver", positions, micros(saved), note), cas_time(newest)


def bronze_stage(log: pa.Table | None) -> Stage:
    """Bronze's snapshot ends per vbucket and its last ingest, from the ingest log's rows
    (None: no table yet)."""
    if log is None:
        return Stage("bronze", None, note="no bronze tables yet (dcp-cdc ingest)")
    columns = _columns(log, "status", "session_id", "file_sequence", "end_state", "logged_at")
    ingested = [row for row in zip(*columns, strict=True) if row[0] == "ingested"]
    last: dict[str | None, tuple[int, str | None]] = {}  # session -> (sequence, end state)
    for _, session, sequence, end_state, _ in ingested:
        if sequence is not None and (session not in last or sequence > last[session][0]):
            last[session] = (sequence, end_state)
    positions = snapshot_ends([end_state for _, end_state in last.values()])
    newest = max((row[4] for row in ingested if row[4] is not None), default=None)
    note = None if ingested else "no capture file ingested yet"
    return Stage("bronze", positions, micros(newest), note)


def log_state(log: pa.Table) -> LogState:
    """The ingest log's state (:class:`LogState`) from its rows."""
    return LogState.of(log.to_pylist())


def _newest_run(run_ids: Sequence[str | None], checked: Sequence[int | None]) -> int:
    """The row index of the newest run: the latest ``checked_at``, then the greatest
    ``run_id`` (a row without either comes last)."""
    return max(
        range(len(run_ids)),
        key=lambda i: (
            checked[i] is not None,
            checked[i] or 0,
            run_ids[i] is not None,
            run_ids[i] or "",
        ),
    )


def last_quality(results: pa.Table | None, report: str) -> QualityResult | None:
    """The newest quality run's result (its rows only), or None before the first check or
    without a results table (None); ``report`` is where its summary page is."""
    if results is None or results.num_rows == 0:
        return None
    run_ids, severities, successes, checked = _columns(results, *RESULTS_COLUMNS)
    newest = _newest_run(run_ids, checked)
    run_id, checked_at = run_ids[newest], micros(checked[newest])
    if run_id is None or checked_at is None:
        return None  # no run has both: nothing written by dcp-cdc check
    rows = [i for i, r in enumerate(run_ids) if r == run_id]

    def failed(severity: str) -> int:
        return sum(1 for i in rows if successes[i] is False and severities[i] == severity)

    return QualityResult(
        run_id=run_id,
        checked_at=checked_at,
        expectations=len(rows),
        failed_errors=failed("error"),
        failed_warnings=failed("warn"),
        report=report,
    )

"""The bronze tables' Delta I/O: the tables made (:func:`ensure_tables`, the events table
clustered and with the statistics runs filter on), the ingest log read
(:func:`read_log`, folded by :class:`pipelines.bronze.plan.LogState`; follow mode keeps it
between micro-batches: :mod:`pipelines.bronze.memory`) and appended to
(:func:`log_rows`), and the transaction application id the bronze writes are idempotent under
(:data:`TXN_APP_ID`). Beside the log, a session's file declared lost (:func:`declare_lost`),
once :func:`pipelines.bronze.held_back.held_back_now` says it holds files back.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.types import StructType

from dcp_cdc.config import AppConfig, BucketConfig
from pipelines import schemas
from pipelines.bronze.held_back import held_back_now
from pipelines.bronze.plan import HeldBack, LogState, lost_row
from pipelines.bronze.writer import remove_written, write_rows
from pipelines.errors import LandingSkipError
from pipelines.lake import delta_io, delta_rs, file_commits
from pipelines.lake.object_storage import on_s3
from pipelines.tables import BucketTables

TXN_APP_ID = "dcp-cdc-bronze"
"""The ``txnAppId`` of bronze's appends: a run's writes are idempotent under its version."""

EVENTS_CLUSTERING = ("vbucket", "by_seqno")
"""Liquid clustering keys of the events table (applied by OPTIMIZE, not at ingest)."""

STATS_COLUMNS_PROPERTY = "delta.dataSkippingStatsColumns"
EVENTS_STATS = {
    STATS_COLUMNS_PROPERTY: ",".join(
        (
            *EVENTS_CLUSTERING,
            *("op", "opcode", "collection_id", "rev_seqno", "cas", "offset", "frame_len"),
            *("session_started_at", "session_id", "file", "file_sequence", "frame_index"),
            *("ingest_run_id", "ingested_at"),
        )
    )
}
"""The events columns Delta keeps file statistics of: those runs filter on, ``ingest_run_id``
above all (silver reads only the runs it has not consumed: files of other runs are skipped).
Not the default first 32 columns, which include document bodies and miss the run."""


def ensure_tables(spark: SparkSession, config: AppConfig, bucket: str) -> BucketTables:
    """The bronze tables of ``bucket`` exist (the events table clustered by
    :data:`EVENTS_CLUSTERING`), made or checked at once; returns the bucket's names."""
    names = BucketTables(bucket)
    delta_io.ensure_database(spark, names.events)

    def ensure(made: tuple[str, StructType]) -> None:
        table, schema = made
        events = table == names.events
        clustering = EVENTS_CLUSTERING if events else ()
        properties = {
            **delta_io.FREQUENT_COMMITS,
            **config.tables.properties,
            **(EVENTS_STATS if events else {}),
        }
        delta_io.create_table(spark, table, schema, properties, cluster_by=clustering)
        # a table made by an earlier version: an ingest log without ``digest``, events
        # without ``stream_flag_names``, ``stream_opaque`` or ``high_seqnos``
        delta_io.add_missing_columns(spark, table, schema)

    delta_io.each_at_once(
        ensure,
        [
            (names.events, schemas.EVENTS),
            (names.quarantine, schemas.QUARANTINE),
            (names.ingest_log, schemas.INGEST_LOG),
        ],
    )
    return names


def read_log(spark: SparkSession, table: str, version: int | None = None) -> LogState:
    """The ingest log's state, as it is now or at Delta ``version``."""
    return LogState.of(read_log_rows(spark, table, version))


def read_log_rows(
    spark: SparkSession, table: str, version: int | None = None
) -> list[dict[str, Any]]:
    """The ingest log's rows, as it is now or at Delta ``version``, read without Spark jobs
    while the log is small (:func:`pipelines.lake.delta_rs.small_rows`)."""
    return delta_rs.small_rows(spark, table, schemas.INGEST_LOG.fieldNames(), version)


def run_files(spark: SparkSession, table: str, versions: Mapping[str, int]) -> list[str] | None:
    """The data files (full paths) of the events table ``table`` holding the frames of the
    ingest runs ``versions`` (run id -> run version), as the runs' commits added them
    (:func:`file_commits.files_of_app_versions`: a look at the table's latest commits, no
    Spark job); None when those commits do not say (the table is read then)."""
    added = file_commits.files_of_app_versions(spark, table, TXN_APP_ID, versions.values())
    if added is None:
        return None
    location = delta_io.table_location(spark, table).rstrip("/")
    return [
        path if "://" in path or path.startswith("/") else f"{location}/{unquote(path)}"
        for version in sorted(added)
        for path in added[version]
    ]


def log_rows(
    spark: SparkSession, table: str, rows: list[dict[str, Any]], version: int, status: str
) -> list[dict[str, Any]]:
    """Append ``rows`` to the ingest log in one commit, under run ``version``, each with
    ``status`` unless it has its own; returns the rows appended, as a read of the log gives
    them but for ``logged_at`` (None: the commit's time is the table's)."""
    full = [
        {
            **{f.name: None for f in schemas.INGEST_LOG.fields},
            "status": status,  # unless the row has its own
            **r,
            "run_version": version,
            "logged_at": None,
        }
        for r in rows
    ]
    now = dt.datetime.now(dt.UTC)
    logged = [{**r, "logged_at": now} for r in full]
    if not append_from_driver(spark, table, logged, schemas.INGEST_LOG):
        df = spark.createDataFrame(full, schema=schemas.INGEST_LOG).withColumn(
            "logged_at", F.current_timestamp()
        )
        delta_io.append(df, table)
    return [{f.name: r[f.name] for f in schemas.INGEST_LOG.fields} for r in full]


def append_from_driver(
    spark: SparkSession, table: str, rows: list[dict[str, Any]], schema: T.StructType
) -> bool:
    """A small table's rows (of ``schema``: the ingest log, the quality results) written by
    this process into one Parquet file of the table and appended in one commit
    (:func:`file_commits.append_files`): no Spark job, where Spark's append runs one (and its
    commit more). False when the table's columns are not ``schema``'s (nothing committed,
    the file removed)."""
    location = delta_io.table_location(spark, table)
    storage = {}  # only S3's settings are used: they cross from the JVM only for S3
    if on_s3(location):
        storage = dict(spark.sparkContext.getConf().getAll())
    written = write_rows(rows, schemas.arrow_schema(schema), location, storage)
    if file_commits.append_files(spark, table, written, schema):
        return True
    remove_written(written, location, storage)
    return False


def declare_lost(
    spark: SparkSession, config: AppConfig, bucket: BucketConfig, session_id: str, sequence: int
) -> HeldBack | None:
    """Log sequence ``sequence`` of ``session_id`` lost (one row, one commit), so that ingest
    goes on from the next sequence; returns the files it held back, or None when it was
    declared lost already (nothing is logged again: a repeat, or a rerun after a kill, which
    finds the row or appends it whole). Only a sequence that holds files back now may be
    declared lost, else a :class:`LandingSkipError` says why not."""
    names = ensure_tables(spark, config, bucket.name)
    state = read_log(spark, names.ingest_log)
    if (session_id, sequence) in state.lost:
        return None
    where = f"bucket {bucket.name!r}: session {session_id} sequence {sequence}"
    if any(
        (r["session_id"], r["file_sequence"]) == (session_id, sequence)
        for r in state.ingested.values()
    ):
        raise LandingSkipError(f"{where} is ingested; there is nothing to skip")
    groups = {h.session_id: h for h in held_back_now(config, bucket, state)}
    group = groups.get(session_id)
    if group is None or sequence not in group.missing:
        waits = "; ".join(f"session {h.session_id}: {list(h.missing)}" for h in groups.values())
        raise LandingSkipError(
            f"{where} holds no file back (only a missing file that later files of its "
            f"session wait for can be skipped; missing now: {waits or 'none'})"
        )
    message = (
        f"declared lost by dcp-cdc landing skip; {len(group.files)} held-back files "
        f"ingested without it"
    )
    log_rows(
        spark,
        names.ingest_log,
        [lost_row(session_id, sequence, message)],
        state.last_version,
        "lost",
    )
    return group

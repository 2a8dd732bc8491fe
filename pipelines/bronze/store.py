"""The bronze tables' Delta I/O: the tables made (:func:`ensure_tables`, the events table
clustered and with the statistics runs filter on), the ingest log read
(:func:`read_log`, folded by :class:`pipelines.bronze.plan.LogState`) and appended to
(:func:`log_rows`), and the transaction application id the bronze writes are idempotent under
(:data:`TXN_APP_ID`).
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from dcp_cdc.config import AppConfig
from pipelines import delta_io, schemas
from pipelines.bronze.plan import LogState
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
    :data:`EVENTS_CLUSTERING`); returns the bucket's names."""
    names = BucketTables(bucket)
    delta_io.ensure_database(spark, names.events)
    for table, schema in (
        (names.events, schemas.EVENTS),
        (names.quarantine, schemas.QUARANTINE),
        (names.ingest_log, schemas.INGEST_LOG),
    ):
        events = table == names.events
        clustering = EVENTS_CLUSTERING if events else ()
        properties = {**config.tables.properties, **(EVENTS_STATS if events else {})}
        delta_io.create_table(spark, table, schema, properties, cluster_by=clustering)
        # a table made by an earlier version: an ingest log without ``digest``, events
        # without ``stream_flag_names``, ``stream_opaque`` or ``high_seqnos``
        delta_io.add_missing_columns(spark, table, schema)
    return names


def read_log(spark: SparkSession, table: str) -> LogState:
    return LogState.of([r.asDict() for r in spark.table(table).collect()])


def log_rows(
    spark: SparkSession, table: str, rows: list[dict[str, Any]], version: int, status: str
) -> None:
    """Append ``rows`` to the ingest log in one commit, under run ``version``, each with
    ``status`` unless it has its own."""
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
    df = spark.createDataFrame(full, schema=schemas.INGEST_LOG).withColumn(
        "logged_at", F.current_timestamp()
    )
    delta_io.append(df, table)

"""Silver's side of a check: the stream state, and every row of the collection tables as
their views show them (one query for the bucket, :func:`pipelines.silver.live.bucket_rows`),
read as they are now or at the Delta versions a check pinned (pure reads, no writes)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipelines import tables
from pipelines.lake import table_entries
from pipelines.schemas import REGISTRY, SILVER, STATE, projection
from pipelines.silver import live as live_layer
from pipelines.tables import BucketTables

log = logging.getLogger("dcp_cdc.quality")


ROWS_COLUMNS = ("_collection_id", "_vbucket", "_vb_uuid", "_seqno", "key", "_deleted", "_expiry")
VIEW_COLUMNS = ("_collection_id", "key", "_seqno", "_expiry")


@dataclass(frozen=True)
class SilverFrames:
    states: DataFrame  # vbucket, consistent_seqno, last_applied_seqno, vb_uuid, failover_log
    rows: DataFrame  # every row of the collection tables as the views see them, with ``table``
    names: DataFrame  # collection_id, name (scope.collection)

    @property
    def live(self) -> DataFrame:
        """The rows of the user views (:func:`view_rows`)."""
        return view_rows(self.rows)


def view_rows(rows: DataFrame) -> DataFrame:
    """The rows of :attr:`SilverFrames.rows` the user views show, by the views' own filter
    (:func:`pipelines.silver.registry.view_query`): live documents, not expired."""
    return rows.where(tables.LIVE_ROWS).select(*VIEW_COLUMNS, "table")


def read_at(spark: SparkSession, table: str, at: Mapping[str, int] | None) -> DataFrame:
    """``table`` as it is now, or at the Delta version ``at`` gives it: a check running beside
    follow mode's micro-batches reads every table as of one moment between two of them."""
    if at is not None and table in at:
        return spark.sql(f"SELECT * FROM {table} VERSION AS OF {at[table]}")
    return spark.table(table)


def silver_frames(
    spark: SparkSession,
    bucket: str,
    at: Mapping[str, int] | None = None,
    *,
    only_at: bool = False,
) -> SilverFrames:
    """Silver's side. Tables come from the registry (not retired); a table it names that is
    missing is left out, so reconciliation reports its collection as empty in silver.
    ``only_at``: silver as it was at ``at``, so a table ``at`` lacks did not exist then."""

    def empty(*fields: T.StructField) -> DataFrame:
        return spark.createDataFrame([], T.StructType(list(fields)))

    table_column = T.StructField("table", T.StringType())
    silver_tables = BucketTables(bucket)
    registry, state = silver_tables.registry, silver_tables.stream_state
    state_columns = ("vbucket", "consistent_seqno", "last_applied_seqno", "vb_uuid", "failover_log")
    if table_entries.exists(spark, state):
        states = read_at(spark, state, at).select(*state_columns)
    else:
        states = empty(*projection(STATE, *state_columns))
    rows = empty(*projection(SILVER, *ROWS_COLUMNS), table_column)
    names = empty(*projection(REGISTRY, "collection_id", "name"))
    if not table_entries.exists(spark, registry):
        return SilverFrames(states, rows, names)
    reg = read_at(spark, registry, at)
    names = reg.select("collection_id", F.concat_ws(".", "scope", "name").alias("name"))
    views = []
    for r in (
        reg.where(F.col("status").isin(*tables.WITH_TABLES))
        .select("table_name", "collection_id")
        .distinct()
        .collect()
    ):
        table = r["table_name"]
        all_rows = tables.all_rows(table)
        if only_at and (at is None or all_rows not in at):
            continue
        if not table_entries.exists(spark, all_rows) or not table_entries.exists(spark, table):
            log.warning("silver table %s (or its _all table) is missing", table)
            continue
        views.append((table, r["collection_id"]))
    if views:
        rows = live_layer.bucket_rows(spark, bucket, sorted(views), ROWS_COLUMNS, at)
    return SilverFrames(states, rows, names)

"""Silver's side of a check: the stream state, every row of the collection tables and the
rows their views show, read as they are now or at the Delta versions a check pinned (pure
reads, no writes)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipelines import tables
from pipelines.schemas import REGISTRY, SILVER, STATE, projection
from pipelines.silver import live as live_layer
from pipelines.tables import BucketTables

log = logging.getLogger("dcp_cdc.quality")


@dataclass(frozen=True)
class SilverFrames:
    states: DataFrame  # vbucket, consistent_seqno, last_applied_seqno, vb_uuid, failover_log
    rows: DataFrame  # every row of the collection tables (``_all``), with ``table``
    live: DataFrame  # the rows of the user views, with ``table``
    names: DataFrame  # collection_id, name (scope.collection)


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
    if spark.catalog.tableExists(state):
        states = read_at(spark, state, at).select(*state_columns)
    else:
        states = empty(*projection(STATE, *state_columns))
    rows_columns = ("_collection_id", "_vbucket", "_vb_uuid", "_seqno", "key")
    live_columns = ("_collection_id", "key", "_seqno", "_expiry")
    rows = empty(*projection(SILVER, *rows_columns), table_column)
    live = empty(*projection(SILVER, *live_columns), table_column)
    names = empty(*projection(REGISTRY, "collection_id", "name"))
    if not spark.catalog.tableExists(registry):
        return SilverFrames(states, rows, live, names)
    reg = read_at(spark, registry, at)
    names = reg.select("collection_id", F.concat_ws(".", "scope", "name").alias("name"))
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
        if not spark.catalog.tableExists(all_rows) or not spark.catalog.tableExists(table):
            log.warning("silver table %s (or its _all table) is missing", table)
            continue
        current = live_layer.current_rows(spark, bucket, table, r["collection_id"], at)
        rows = rows.unionByName(current.select(*rows_columns, F.lit(table).alias("table")))
        live = live.unionByName(
            live_rows(spark, table, current, at).select(*live_columns, F.lit(table).alias("table"))
        )
    return SilverFrames(states, rows, live, names)


def live_rows(
    spark: SparkSession, view: str, current: DataFrame, at: Mapping[str, int] | None
) -> DataFrame:
    """The rows of a collection's view: the view itself, or, read at the versions of ``at``,
    its ``current`` rows (:func:`live_layer.current_rows`) that the view shows."""
    if at is not None and tables.all_rows(view) in at:
        return current.where(tables.LIVE_ROWS)
    return spark.table(view)

"""What the catalog holds: the tables of each layer with row counts, and a bucket's overview;
and what a query that Spark could not analyse was missing.

``dcp-cdc tables``, ``dcp-cdc sql`` and the summary ``dcp-cdc run`` prints read the catalog
through here.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import pyarrow.compute as pc
from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pipelines.errors import QueryError, TableNotFoundError
from pipelines.lake import delta_rs
from pipelines.silver.live import bucket_rows
from pipelines.silver.rows_read import bucket_rows as read_bucket_rows
from pipelines.tables import (
    LAYERS,
    WITH_TABLES,
    BucketTables,
    missing_database,
    missing_table,
)


@dataclass(frozen=True)
class TableInfo:
    layer: str
    name: str
    kind: str  # "table" (Delta) or "view"
    rows: int


def list_tables(spark: SparkSession, layers: Sequence[str] = LAYERS) -> list[TableInfo]:
    """Every table and view of the layers' databases, with its row count (a view of live
    documents counts the live documents)."""
    found = []
    for layer in layers:
        if not spark.catalog.databaseExists(layer):
            continue
        for table in sorted(spark.catalog.listTables(layer), key=lambda t: t.name):
            name = f"{layer}.{table.name}"
            kind = "view" if table.tableType == "VIEW" else "table"
            found.append(TableInfo(layer, name, kind, spark.table(name).count()))
    return found


def table_names(spark: SparkSession, layers: Sequence[str] = LAYERS) -> list[str]:
    """The names (``layer.table``) of every table and view of the layers' databases."""
    return [
        f"{layer}.{table.name}"
        for layer in layers
        if spark.catalog.databaseExists(layer)
        for table in spark.catalog.listTables(layer)
    ]


def _unquoted(name: str) -> str:
    """``layer.table`` of a name as Spark's messages quote it (`` `spark_catalog`.`silver`.`t` ``)."""
    parts = [part.strip("`").lower() for part in name.split(".")]
    return ".".join(parts[1:] if len(parts) > 1 and parts[0] == "spark_catalog" else parts)


def query_error(spark: SparkSession, exc: AnalysisException, buckets: Sequence[str]) -> QueryError:
    """The typed one-line error of a statement Spark could not parse or analyse: a name the
    catalog lacks is a :class:`TableNotFoundError` that says why (``buckets``: the configured
    ones, whose names may not exist yet), anything else a :class:`QueryError` with Spark's
    reason."""
    condition, parameters = exc.getCondition(), exc.getMessageParameters() or {}
    if condition == "TABLE_OR_VIEW_NOT_FOUND" and "relationName" in parameters:
        name = _unquoted(parameters["relationName"])
        return TableNotFoundError(missing_table(name, buckets, table_names(spark)))
    if condition == "SCHEMA_NOT_FOUND" and "schemaName" in parameters:
        return TableNotFoundError(missing_database(_unquoted(parameters["schemaName"])))
    reason = next((line for line in str(exc).splitlines() if line.strip()), repr(exc))
    return QueryError(reason.strip())


@dataclass(frozen=True)
class CollectionCount:
    collection: str  # scope.name as in Couchbase
    table: str  # the view of live documents
    live: int
    tombstones: int
    expired: int  # past their expiry, no expiration event from the server yet


@dataclass
class BucketOverview:
    bucket: str
    events_by_op: dict[str, int] = field(default_factory=dict)
    quarantined: int = 0
    collections: list[CollectionCount] = field(default_factory=list)
    open_snapshots: list[int] = field(default_factory=list)  # vbuckets
    events_table: str = ""

    def render(self) -> str:
        lines = [f"Events in {self.events_table} by type:"]
        width = max((len(op) for op in self.events_by_op), default=0) + 2
        for op, n in sorted(self.events_by_op.items(), key=lambda kv: (-kv[1], kv[0])):
            lines.append(f"  {op:<{width}}{n:>9,}")
        lines.append(f"  {'total':<{width}}{sum(self.events_by_op.values()):>9,}")
        if self.quarantined:
            lines.append(f"  ({self.quarantined} malformed frames quarantined)")
        lines += ["", "Documents in silver by collection:"]
        if self.collections:
            name_w = max(len(c.collection) for c in self.collections) + 2
            table_w = max(len(c.table) for c in self.collections) + 2
            lines.append(
                f"  {'collection':<{name_w}}{'table (live documents)':<{table_w}}"
                f"{'live':>7}{'tombstones':>12}{'expired':>9}"
            )
            for c in self.collections:
                lines.append(
                    f"  {c.collection:<{name_w}}{c.table:<{table_w}}{c.live:>7,}"
                    f"{c.tombstones:>12,}{c.expired:>9,}"
                )
        else:
            lines.append("  (no collections yet)")
        lines.append("")
        if self.open_snapshots:
            vbuckets = ", ".join(map(str, self.open_snapshots))
            lines.append(
                f"Open snapshots: {len(self.open_snapshots)} vbuckets stopped inside a snapshot "
                f"(vbuckets {vbuckets}); their partial changes wait for the snapshot's end."
            )
        else:
            lines.append("Open snapshots: none, every vbucket stands at a consistent point.")
        return "\n".join(lines)


def bucket_overview(spark: SparkSession, bucket: str) -> BucketOverview:
    """Events by type, documents per collection and open snapshots of ``bucket``."""
    names = BucketTables(bucket)
    overview = BucketOverview(bucket, events_table=names.events)
    if spark.catalog.tableExists(names.events):
        counts = spark.table(names.events).groupBy("op").count().collect()
        overview.events_by_op = {r["op"]: r["count"] for r in counts}
    if spark.catalog.tableExists(names.quarantine):
        overview.quarantined = spark.table(names.quarantine).count()
    if spark.catalog.tableExists(names.registry):
        registry = spark.table(names.registry).where(F.col("status").isin(*WITH_TABLES)).collect()
        now = F.unix_timestamp()
        deleted, expiry = F.col("_deleted"), F.col("_expiry")
        tallies = [
            F.count_if(~deleted & ((expiry == 0) | (expiry > now))).alias("live"),
            F.count_if(deleted).alias("tombstones"),
            F.count_if(~deleted & (expiry != 0) & (expiry <= now)).alias("expired"),
        ]
        views = sorted({(r["table_name"], r["collection_id"]) for r in registry})
        counted = {}
        if views:
            rows = bucket_rows(spark, bucket, views, ("_deleted", "_expiry"))
            counted = {r["table"]: r for r in rows.groupBy("table").agg(*tallies).collect()}
        for reg in sorted(registry, key=lambda r: (r["scope"], r["name"])):
            row = counted.get(reg["table_name"])
            overview.collections.append(
                CollectionCount(
                    f"{reg['scope']}.{reg['name']}",
                    reg["table_name"],
                    row["live"] if row else 0,
                    row["tombstones"] if row else 0,
                    row["expired"] if row else 0,
                )
            )
    if spark.catalog.tableExists(names.stream_state):
        overview.open_snapshots = sorted(
            r["vbucket"]
            for r in spark.table(names.stream_state)
            .where(F.col("open_snapshot_start").isNotNull())
            .select("vbucket")
            .collect()
        )
    return overview


def bucket_overview_read(spark: SparkSession, bucket: str) -> BucketOverview:
    """:func:`bucket_overview` of a small bucket, read through delta-rs in the driver (the
    events' ``op`` column counted with Arrow, silver's rows by
    :func:`pipelines.silver.rows_read.bucket_rows`): no Spark job."""
    names = BucketTables(bucket)
    overview = BucketOverview(bucket, events_table=names.events)
    exists = spark.catalog.tableExists
    if exists(names.events):
        ops = delta_rs.read_table(spark, names.events, ["op"]).column("op")
        counted = pc.value_counts(ops).to_pylist()
        overview.events_by_op = {c["values"]: c["counts"] for c in counted}
    if exists(names.quarantine):
        overview.quarantined = delta_rs.read_table(spark, names.quarantine, ["offset"]).num_rows
    if exists(names.registry):
        columns = ("scope", "name", "table_name", "collection_id", "status")
        registry = [
            r
            for r in delta_rs.read_rows(spark, names.registry, columns)
            if r["status"] in WITH_TABLES
        ]
        views = sorted({(r["table_name"], r["collection_id"]) for r in registry})
        rows = read_bucket_rows(spark, bucket, views, ("_deleted", "_expiry")) if views else []
        now = int(time.time())
        tallies: dict[str, list[int]] = {}
        for r in rows:
            deleted, expiry = r["_deleted"], r["_expiry"]
            counts = tallies.setdefault(r["table"], [0, 0, 0])
            if deleted is False and expiry is not None:
                counts[0 if expiry == 0 or expiry > now else 2] += 1
            counts[1] += deleted is True
        for reg in sorted(registry, key=lambda r: (r["scope"], r["name"])):
            live, tombstones, expired = tallies.get(reg["table_name"], [0, 0, 0])
            overview.collections.append(
                CollectionCount(
                    f"{reg['scope']}.{reg['name']}", reg["table_name"], live, tombstones, expired
                )
            )
    if exists(names.stream_state):
        states = delta_rs.read_rows(spark, names.stream_state, ("vbucket", "open_snapshot_start"))
        overview.open_snapshots = sorted(
            r["vbucket"] for r in states if r["open_snapshot_start"] is not None
        )
    return overview

"""The live layer (``[silver] live_layer``): an apply appends its changes for every collection
of the bucket to one pending table (one commit, whatever the number of collections), and each
collection's view shows its table overlaid with them; a compaction MERGEs them into the
collection tables on its own cadence.

- :func:`append_pending`: the apply's newest row per key, for all collections, in one append
  to ``silver.<bucket>__pending`` (:data:`pipelines.schemas.PENDING`); no snapshot scan, no
  file matching.
- The views (:func:`pipelines.silver.transforms.overlay_query`): a key's newest pending row
  wins over the table's row when its seqno is higher, by the MERGE's own rule; the overlay is
  idempotent, so a read between a compaction's MERGEs and its removal of the rows is right.
- :func:`compact`: the pending rows as of one version MERGEd into their tables (the MERGE of
  :func:`pipelines.silver.store.merge_rows`), then exactly those rows removed from the pending
  table (the partitions of the appends it read: a DELETE that no append committed meanwhile
  conflicts with). A compaction killed anywhere is finished by the next one (a MERGE of rows
  the table holds changes nothing). :func:`compaction_due`: when the pending table holds
  ``[silver] compact_files`` files (an append writes one, a large one one per
  :data:`PENDING_FILE_ROWS` rows) or ``compact_bytes``.

What needs the collection tables complete runs after a compaction, in the same apply
(:mod:`pipelines.silver.job`): a rollback's rebuild from bronze, a drop's or flush's cut, a
retire, history tables, a backfill.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping, Sequence

import pyarrow as pa
from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from dcp_cdc.config import SilverConfig
from pipelines import schemas, tables
from pipelines.bronze.writer import remove_written, write_table
from pipelines.lake import delta_io, file_commits
from pipelines.lake.delta_io import with_retry
from pipelines.silver import store, transforms
from pipelines.silver.registry import Registry
from pipelines.tables import BucketTables

log = logging.getLogger("dcp_cdc.silver")


PENDING_FILE_ROWS = 250_000
"""Rows per file of a large append to the pending table (:func:`append_pending`), so that
Spark's tasks write its files side by side; a small one writes one file."""


def append_pending(spark: SparkSession, bucket: str, rows: DataFrame, count: int = 0) -> None:
    """Append ``rows`` (silver rows, the newest per collection and key of an apply:
    :func:`transforms.silver_rows`) to the pending table in one commit, in a partition of its
    own: the append's stamp (``_batch``), random, so that two applies at once never share
    one. ``count`` (the rows, when known): one file per :data:`PENDING_FILE_ROWS` of them, at
    least one (a single task writing a million rows is the apply's longest step)."""
    table = BucketTables(bucket).pending
    stamped = rows.withColumn("_batch", F.lit(secrets.randbits(63)))
    files = max(1, -(-count // PENDING_FILE_ROWS))
    with_retry(table, lambda: delta_io.append(stamped.coalesce(files), table))


def append_from_driver(spark: SparkSession, bucket: str, rows: pa.Table) -> bool:
    """:func:`append_pending` of ``rows`` (silver rows as an Arrow table:
    :func:`pipelines.silver.arrow_rows.silver_rows`) written by this process into one Parquet
    file of a partition of its own and committed by it: no Spark job, where Spark's append
    runs two. False when the pending table is not of :data:`schemas.PENDING`'s columns and
    partitions (nothing committed, the file removed): then :func:`append_pending` is the
    way."""
    table = BucketTables(bucket).pending
    stamp = secrets.randbits(63)
    folder = f"{schemas.PENDING_PARTITIONS[0]}={stamp}"
    location = f"{delta_io.table_location(spark, table).rstrip('/')}/{folder}"
    storage = dict(spark.sparkContext.getConf().getAll())
    written = write_table(rows, location, storage)
    files = [{**f, "path": f"{folder}/{f['path']}"} for f in written]
    partition = {schemas.PENDING_PARTITIONS[0]: str(stamp)}
    appended = file_commits.append_files(spark, table, files, schemas.PENDING, partition)
    if not appended:
        remove_written(written, location, storage)
    return appended


def compaction_due(spark: SparkSession, bucket: str, settings: SilverConfig) -> bool:
    """Whether the pending table holds ``compact_files`` files or ``compact_bytes`` bytes
    (read from its log: no Spark job)."""
    files, size = delta_io.table_size(spark, BucketTables(bucket).pending)
    return files >= settings.compact_files or size >= settings.compact_bytes


def has_pending(spark: SparkSession, bucket: str) -> bool:
    """Whether the bucket has a pending table holding rows (from its log: no Spark job)."""
    table = BucketTables(bucket).pending
    return spark.catalog.tableExists(table) and delta_io.table_size(spark, table)[0] > 0


def holds_nothing(spark: SparkSession, bucket: str, registry: Registry) -> bool:
    """Whether silver holds no row of the bucket yet: no pending rows and no collection
    table with a file (from their logs: no Spark job). A rollback then has nothing to
    retract, and its apply may append like any other (the first run of a bucket whose
    capture saw a failover)."""
    if has_pending(spark, bucket):
        return False
    made = [tables.all_rows(r["table_name"]) for r in registry if r["status"] in tables.WITH_TABLES]
    return not any(
        spark.catalog.tableExists(t) and delta_io.table_size(spark, t)[0] > 0 for t in made
    )


def bucket_rows(
    spark: SparkSession,
    bucket: str,
    views: Sequence[tuple[str, int]],
    columns: Sequence[str],
    at: Mapping[str, int] | None = None,
) -> DataFrame:
    """Every row (tombstones and expired ones too) of the collections whose views and ids
    are ``views`` as the views show them, in ``columns`` and ``table`` (the view's name):
    one query for the bucket (:func:`transforms.overlays_query`), which reads the pending
    table once whatever the number of collections. ``at`` as for :func:`current_rows`; a
    table it pins at a version with no file is not read at all."""
    names = BucketTables(bucket)

    def empty(table: str) -> bool:  # known empty at the version read (no Spark job)
        return (
            at is not None and table in at and delta_io.table_size(spark, table, at[table])[0] == 0
        )

    sources = [
        transforms.OverlaySource(
            _relation(at, tables.all_rows(v)), tables.all_rows(v), cid, v, empty(tables.all_rows(v))
        )
        for v, cid in views
    ]
    if not spark.catalog.tableExists(names.pending):
        label = f"`{transforms.TABLE_LABEL}`"
        parts = [
            f"SELECT {', '.join(columns)}, {transforms.sql_text(s.label)} AS {label} "
            f"FROM {s.relation}"
            for s in sources
        ]
        return spark.sql(" UNION ALL ".join(parts))
    query = transforms.overlays_query(
        sources, _relation(at, names.pending), _relation(at, names.purges), list(columns)
    )
    return spark.sql(query)


def compact(
    spark: SparkSession, bucket: str, registry: Registry, *, overlap: int = 1
) -> dict[str, int]:
    """MERGE the pending rows into their collections' tables, then remove those rows from
    the pending table; returns rows merged per view. The rows are those of one version of the
    pending table: an append committed meanwhile stays for the next compaction."""
    table = BucketTables(bucket).pending
    if not has_pending(spark, bucket):
        return {}
    version = delta_io.table_version(spark, table)
    log.info("silver: compacting the pending rows of version %d of %s", version, table)
    pinned = spark.sql(f"SELECT * FROM {table} VERSION AS OF {version}")
    newest = transforms.newest_rows(pinned).drop("_batch")
    parts = pinned.select("_collection_id", "_batch").distinct().collect()
    cids = sorted({r["_collection_id"] for r in parts})
    merged = store.merge_rows(spark, bucket, registry, newest, cids, overlap=overlap)
    # The appends of that version, by their partitions: whole files removed, and an append
    # committed meanwhile (a partition of its own) is not what the DELETE read.
    done = F.col("_batch").isin(sorted({r["_batch"] for r in parts}))
    with_retry(table, lambda: DeltaTable.forName(spark, table).delete(done))
    log.info("silver: compacted the pending rows of version %d of %s: %s", version, table, merged)
    return merged


def _relation(at: Mapping[str, int] | None, name: str) -> str:
    """``name``, at its Delta version in ``at`` when it has one."""
    return f"{name} VERSION AS OF {at[name]}" if at is not None and name in at else name


def current_rows(
    spark: SparkSession,
    bucket: str,
    view: str,
    collection_id: int,
    at: Mapping[str, int] | None = None,
) -> DataFrame:
    """Every row (tombstones and expired ones too) of the collection whose view is ``view``
    as its view shows them: its ``_all`` table overlaid with the bucket's pending rows when
    it has a pending table (:func:`transforms.overlay_query`). ``at``: Delta versions to read
    the tables at (a check beside follow mode's micro-batches); a table it lacks is read now."""
    names = BucketTables(bucket)
    table = tables.all_rows(view)

    if not spark.catalog.tableExists(names.pending):
        return spark.sql(f"SELECT * FROM {_relation(at, table)}")
    columns = spark.table(table).columns
    query = transforms.overlay_query(
        _relation(at, table),
        _relation(at, names.pending),
        _relation(at, names.purges),
        collection_id,
        columns,
        name=table,
    )
    return spark.sql(query)

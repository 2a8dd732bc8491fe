"""Silver's writes: the MERGEs and deletes that change the collection tables, their history
tables and the tombstone-purge marks (newest change per key, rollbacks rebuilt from bronze,
drops and flushes, SCD type 2 history, tombstone purges).

The DataFrames they run are built by the pure steps of :mod:`pipelines.silver.transforms`;
which tables exist is :mod:`pipelines.silver.registry`'s, what to walk
:mod:`pipelines.silver.state`'s. :mod:`pipelines.silver.job` says in which order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, wait
from functools import reduce
from typing import Any

from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines import schemas, tables
from pipelines.lake import delta_io
from pipelines.lake.delta_io import metric, with_retry
from pipelines.silver import transforms
from pipelines.silver.registry import Registry, archived_tables
from pipelines.silver.walk import RowKind
from pipelines.tables import BucketTables


def _table_of(registry: Registry, cid: int) -> str | None:
    for r in registry:
        if r["collection_id"] == cid and r["status"] in tables.WITH_TABLES:
            return tables.all_rows(r["table_name"])
    return None


def apply_drops(
    spark: SparkSession, bucket: str, registry: Registry, controls: list[dict[str, Any]]
) -> int:
    """Drops and flushes: a collection's rows in the vbucket below the event's seqno go."""
    cuts: dict[int, list[tuple[int, int]]] = {}
    for e in controls:
        if e["kind"] == RowKind.SYSTEM_EVENT and e["event"] in (
            "drop_collection",
            "flush_collection",
        ):
            cuts.setdefault(e["collection_id"], []).append((e["vbucket"], e["by_seqno"]))
    removed = 0
    for cid, pairs in cuts.items():
        table = _table_of(registry, cid)
        if table is None:
            continue
        source = spark.createDataFrame(pairs, "vb INT, cut LONG")
        metrics = with_retry(
            table,
            lambda t=table, s=source: (  # type: ignore[misc]
                DeltaTable.forName(spark, t)
                .alias("t")
                .merge(s.alias("s"), "t._vbucket = s.vb AND t._seqno < s.cut")
                .whenMatchedDelete()
                .execute()
            ),
        )
        removed += metric(metrics, "num_deleted_rows")
    return removed


MATERIALIZE_SOURCE = "spark.databricks.delta.merge.materializeSource"
_RUNTIME_FILTER = "spark.sql.optimizer.runtime.bloomFilter."
KEY_FILTER_ABOVE = "64MB"
"""The size of a MERGE's target files above which Spark filters them by a bloom filter of
the source's keys before the join (:data:`MERGE_CONF`)."""
MERGE_CONF = {
    MATERIALIZE_SOURCE: "none",
    _RUNTIME_FILTER + "enabled": "true",
    _RUNTIME_FILTER + "applicationSideScanSizeThreshold": KEY_FILTER_ABOVE,
    _RUNTIME_FILTER + "creationSideThreshold": "8GB",
}
"""The session settings of :func:`merge_rows`' MERGEs. Their source is a local checkpoint
(no copy by Delta). With deletion vectors, Delta's MERGE joins the source to every row of
the files it touches, and a batch of keys spread over every vbucket touches every file: the
join would shuffle and sort the whole table (1M changes into 10M keys: 3.6 GiB, 21 s of
sorting). Spark's runtime filter builds a bloom filter of the source's keys (one small job)
and drops the target's rows it cannot match before the shuffle, which its defaults do only
for a source below 10 MB and a target above 10 GB. Below :data:`KEY_FILTER_ABOVE` the whole
files cost about what the filter's job does (docs/sizing.md)."""


def merge_changes(
    spark: SparkSession,
    bucket: str,
    registry: Registry,
    changes: DataFrame,
    collection_ids: Iterable[int] | None = None,
    *,
    overlap: int = 1,
) -> dict[str, int]:
    """MERGE each collection's newest changes, only where newer than the row (§7.1).

    A key the table does not have is inserted unless its change is at or below the
    tombstone-purge mark of its vbucket (:data:`pipelines.schemas.PURGES`).
    ``collection_ids``: the collections ``changes`` holds, when the caller knows them
    already (else a job over ``changes`` finds them). ``overlap``: how many MERGEs (each into
    its own table, each its own commit, as one at a time) may run at once: a small batch's
    MERGE is mostly the driver planning and committing, which others can overlap.
    """
    if collection_ids is None:
        found = changes.select("collection_id").distinct().collect()
        collection_ids = [r["collection_id"] for r in found]
    rows = transforms.silver_rows(changes)
    return merge_rows(spark, bucket, registry, rows, collection_ids, overlap=overlap)


def merge_rows(
    spark: SparkSession,
    bucket: str,
    registry: Registry,
    rows: DataFrame,
    collection_ids: Iterable[int],
    *,
    overlap: int = 1,
) -> dict[str, int]:
    """MERGE ``rows`` (silver rows, one per collection and key: :func:`transforms.silver_rows`)
    of each of ``collection_ids`` into its collection's table, only where newer than the row
    (the rule of :func:`merge_changes`, which this runs); returns rows merged per view."""
    purges = spark.table(BucketTables(bucket).purges)
    targets = [
        (cid, table)
        for cid in sorted(collection_ids)
        if (table := _table_of(registry, cid)) is not None
    ]

    def merge(cid: int, table: str) -> int:
        source = transforms.merge_source(rows, cid, purges, table)

        def execute() -> DataFrame:
            target = DeltaTable.forName(spark, table)
            columns = transforms.merge_values(target.toDF().columns)
            return (
                target.alias("t")
                .merge(source.alias("s"), "t.key = s.key")
                .whenMatchedUpdate(condition="s._seqno > t._seqno", set=columns)
                .whenNotMatchedInsert(
                    condition="s._purged_through IS NULL OR s._seqno > s._purged_through",
                    values=columns,
                )
                .execute()
            )

        return metric(with_retry(table, execute), "num_affected_rows")

    if not targets:
        return {}
    # Every MERGE reads its source twice (the keys it touches, then the rows it writes), and
    # Delta copies a source that is not a plain Delta scan first, a job per MERGE, lest the
    # two reads differ. The newest rows of every collection are copied once instead (a local
    # checkpoint: fixed blocks, spilled to disk rather than dropped, freed by Spark's cleaner
    # once unreferenced; Delta refuses a cached source without its own copy), and the MERGEs
    # read that: a MERGE of a thousand rows took 3-5 s with its copy, 1.3-1.8 s without (2
    # cores). Over the copy, a collection's rows are a filter over a scan, the source Spark's
    # runtime filter takes its bloom filter from (MERGE_CONF).
    rows = rows.localCheckpoint(eager=True)
    with delta_io.session_conf(spark, MERGE_CONF):
        if overlap > 1 and len(targets) > 1:
            with ThreadPoolExecutor(min(overlap, len(targets)), "silver-merge") as pool:
                futures = [pool.submit(merge, cid, table) for cid, table in targets]
                wait(futures)  # every MERGE ends (commits or fails) before an error is raised
                counts = [f.result() for f in futures]
        else:
            counts = [merge(cid, table) for cid, table in targets]
    return {tables.view_of(table): n for (_, table), n in zip(targets, counts, strict=True)}


def rebuild_rolled_back(
    spark: SparkSession,
    bucket: str,
    bronze_events: str,
    registry: Registry,
    rollbacks: list[tuple[int, int]],
    states: dict[int, dict[str, Any]],
    changes: DataFrame,
) -> int:
    """Rows applied above a rollback point return to their last state at or before it,
    but those already at what this run's ``changes`` (walked change rows) will merge
    (:func:`transforms.rolled_back_keys`): a re-run after a kill does not rewind them first.

    The state is rebuilt from bronze: the newest data event of the key in the vbucket with
    ``by_seqno <= R`` whose vb uuid's branch covers that seqno in the vbucket's failover log
    (so changes of a branch that was itself lost earlier do not come back). A key with no such
    event did not exist at R: its row goes.
    """
    points: dict[int, int] = {}
    for vb, seqno in rollbacks:
        points[vb] = min(points.get(vb, seqno), seqno)
    branches = []
    for vb in points:
        log = states[vb]["failover_log"]
        for i, (uuid, start) in enumerate(log):
            end = log[i - 1][1] if i > 0 else None
            branches.append((vb, uuid, start, end))
    branch_df = spark.createDataFrame(branches, "b_vb INT, b_uuid LONG, b_start LONG, b_end LONG")
    point_df = spark.createDataFrame(list(points.items()), "p_vb INT, p_seqno LONG")
    rows = transforms.silver_rows(changes)
    candidates = {
        reg["collection_id"]: (
            table := tables.all_rows(reg["table_name"]),
            transforms.rolled_back_keys(
                spark.table(table),
                point_df,
                rows.where(F.col("_collection_id") == reg["collection_id"]),
            ),
        )
        for reg in registry
        if reg["status"] in tables.WITH_TABLES
    }
    if not candidates:
        return 0
    # which collections have a key to rebuild: one job for them all, not one per collection
    probes = [
        keys.limit(1).select(F.lit(cid).alias("cid")) for cid, (_, keys) in candidates.items()
    ]
    touched = {r["cid"] for r in reduce(DataFrame.unionAll, probes).collect()}
    rebuilt = 0
    for reg in registry:
        if reg["collection_id"] not in touched:
            continue
        table, affected = candidates[reg["collection_id"]]
        # copied once (the keys come from the run's cached walk: Delta refused such a source
        # as "cached during execution" when it had decided not to copy it)
        source = transforms.restored_rows(
            spark.table(bronze_events), reg["collection_id"], point_df, branch_df, affected
        ).localCheckpoint(eager=True)

        def restore(t: str = table, s: DataFrame = source) -> DataFrame:
            target = DeltaTable.forName(spark, t)
            columns = transforms.merge_values(target.toDF().columns)
            return _merge_copied(
                spark,
                target.alias("t")
                .merge(s.alias("s"), "t.key = s.key")
                .whenMatchedUpdate(condition="s._found", set=columns)
                .whenMatchedDelete(condition="s._found IS NULL"),
            )

        metrics = with_retry(table, restore)
        rebuilt += metric(metrics, "num_affected_rows")
    return rebuilt


_END_KINDS = {"drop_collection": "drop", "flush_collection": "flush"}
_END_COLUMNS: dict[str, str | Column] = {c: f"s.{c}" for c in schemas.HISTORY_CHAIN}
_END_CHANGED = " OR ".join(f"NOT (t.{c} <=> s.{c})" for c in schemas.HISTORY_CHAIN)


def apply_history(
    spark: SparkSession,
    registry: Registry,
    changes: DataFrame,
    change_cids: set[int],
    controls: list[dict[str, Any]],
    keeps: Callable[[str, str], bool],
    properties: dict[str, str],
) -> dict[str, int]:
    """The history table (SCD type 2) of each live collection that ``keeps`` one: the run's
    versions (``changes``: every walked change, not only the newest per key, and those a drop
    or flush in the run removed) are added, each version's end
    recomputed for the keys they touch; rollbacks remove the versions of the abandoned branch,
    drops and flushes end the versions open at them. Returns the versions added per history
    table. Every step is idempotent: a replay, or a run again after a kill, adds nothing.

    ``change_cids``: the collections ``changes`` has changes of. ``controls``: the run's
    committed control rows (rollbacks and system events; a drop's or
    flush's ``cas`` is its vbucket's last change before it, the nearest time DCP gives).
    """
    points: dict[int, int] = {}
    ends: dict[int, list[tuple[int, int, str, int]]] = {}
    for r in controls:
        if r["kind"] == RowKind.ROLLBACK:
            vb, seqno = r["vbucket"], r["rollback_seqno"]
            points[vb] = min(points.get(vb, seqno), seqno)
        elif r["kind"] == RowKind.SYSTEM_EVENT and r["event"] in _END_KINDS:
            ends.setdefault(r["collection_id"], []).append(
                (r["vbucket"], r["by_seqno"], _END_KINDS[r["event"]], r["cas"] or 0)
            )
    point_df = spark.createDataFrame(list(points.items()), "p_vb INT, p_seqno LONG")
    versions = transforms.version_rows(changes)
    added: dict[str, int] = {}
    for reg in registry:
        if not keeps(reg["scope"], reg["name"]):
            continue
        cid = reg["collection_id"]
        if reg["status"] in tables.WITH_TABLES:
            table = tables.history(reg["table_name"])
            delta_io.create_table(
                spark, table, schemas.HISTORY, properties, cluster_by=("_vbucket", "key")
            )
        elif cid in change_cids:  # older versions of a retired collection, arriving late
            found = archived_tables(spark, reg, history=True)
            if not found:
                continue  # retired by dropping its tables: no history is kept
            table = found[0]
        else:
            continue
        if cid not in change_cids and not points and cid not in ends:
            continue
        batch = versions.where(F.col("_collection_id") == cid)
        touched = [batch.select("key")]
        if points:
            touched.append(_history_rollback(spark, table, point_df, batch))
        end_df = spark.createDataFrame(ends.get(cid, []), transforms.ENDS)
        metrics = with_retry(
            table,
            lambda t=table, b=batch, k=touched, e=end_df: (  # type: ignore[misc]
                _history_merge(spark, t, b, k, e)
            ),
        )
        added[table] = metric(metrics, "num_inserted_rows")
    return added


def _history_rollback(
    spark: SparkSession, table: str, points: DataFrame, batch: DataFrame
) -> DataFrame:
    """Remove the abandoned versions of the history ``table`` and open again those a
    rolled-back drop or flush ended (:func:`transforms.history_fixes`); returns the keys
    touched, whose ends are recomputed next (kept: the table no longer says which they were)."""
    fixes = transforms.history_fixes(spark.table(table), points, batch).localCheckpoint(eager=True)
    changed = fixes.where("_abandoned OR _reopen")
    if changed.isEmpty():
        return fixes.select("key")
    with_retry(
        table,
        lambda: _merge_copied(
            spark,
            DeltaTable.forName(spark, table)
            .alias("t")
            .merge(
                changed.alias("s"),
                "t.key = s.key AND t._seqno = s._seqno",
            )
            .whenMatchedDelete(condition="s._abandoned")
            .whenMatchedUpdate(
                set={c: "NULL" for c in ("_valid_to_seqno", "_valid_to", "_ended_by")}
            ),
        ),
    )
    return fixes.select("key")


def _history_merge(
    spark: SparkSession,
    table: str,
    batch: DataFrame,
    touched: list[DataFrame],
    ends: DataFrame,
) -> Any:
    """One MERGE into the history ``table``: the versions of ``batch`` not stored yet, and
    the ends of the versions of the ``touched`` keys (and of those open at ``ends``) that
    changed (:func:`transforms.history_chain`), computed from the table as it is now (a
    retry after a conflict computes them again)."""
    rows = spark.table(table)
    keys = touched[0]
    for more in [*touched[1:], transforms.open_at_ends(rows, ends)]:
        keys = keys.unionByName(more)
    source = transforms.history_chain(
        rows.join(keys.distinct(), on="key", how="left_semi"), batch, ends
    ).localCheckpoint(eager=True)  # it reads the table the MERGE writes
    return _merge_copied(
        spark,
        DeltaTable.forName(spark, table)
        .alias("t")
        .merge(source.alias("s"), "t.key = s.key AND t._seqno = s._seqno")
        .whenMatchedUpdate(condition=_END_CHANGED, set=_END_COLUMNS)
        .whenNotMatchedInsert(values={c: f"s.{c}" for c in schemas.HISTORY.fieldNames()}),
    )


def _merge_copied(spark: SparkSession, merge: Any) -> DataFrame:
    """Execute a MERGE whose source is a local checkpoint already (no copy of it by Delta)."""
    with delta_io.session_conf(spark, {MATERIALIZE_SOURCE: "none"}):
        metrics: DataFrame = merge.execute()
    return metrics


def purge_tombstones(
    spark: SparkSession, bucket: str, registry: Registry, retention_hours: int
) -> dict[str, int]:
    """Remove tombstones applied more than ``retention_hours`` ago from every live table.

    The purge mark of each vbucket is raised first (:data:`pipelines.schemas.PURGES`), then
    the rows go, so an interrupted purge never leaves a gap a replayed older change could slip
    through.
    """
    marks_table = BucketTables(bucket).purges
    old = transforms.old_tombstone(retention_hours)
    purged: dict[str, int] = {}
    for reg in registry:
        if reg["status"] not in tables.WITH_TABLES:
            continue
        table = tables.all_rows(reg["table_name"])
        marks = transforms.purge_marks(spark.table(table), table, old).cache()
        try:
            if marks.isEmpty():
                continue
            with_retry(
                marks_table,
                lambda m=marks: (  # type: ignore[misc]
                    DeltaTable.forName(spark, marks_table)
                    .alias("t")
                    .merge(m.alias("s"), "t.table_name = s.table_name AND t.vbucket = s.vbucket")
                    .whenMatchedUpdate(
                        condition="s.purged_through_seqno > t.purged_through_seqno",
                        set={
                            "purged_through_seqno": "s.purged_through_seqno",
                            "purged_at": "s.purged_at",
                        },
                    )
                    .whenNotMatchedInsertAll()
                    .execute()
                ),
            )
            metrics = with_retry(
                table,
                lambda t=table: spark.sql(f"DELETE FROM {t} WHERE {old}"),  # type: ignore[misc]
            )
            purged[reg["table_name"]] = metric(metrics, "num_affected_rows")
        finally:
            marks.unpersist()
    return purged


def delete_rows(spark: SparkSession, bucket: str, tables_emptied: list[str]) -> None:
    """Every row of ``tables_emptied`` (``_all`` tables of ``bucket``) goes, and their
    tombstone-purge marks: the table holds no key now, so a mark would refuse every change at
    or below it, live documents too (the walk over bronze brings the purged tombstones back)."""
    marks = BucketTables(bucket).purges
    for table in tables_emptied:
        if spark.catalog.tableExists(table):
            spark.sql(f"DELETE FROM {table}")
        if spark.catalog.tableExists(marks):
            spark.sql(f"DELETE FROM {marks} WHERE table_name = '{table}'")

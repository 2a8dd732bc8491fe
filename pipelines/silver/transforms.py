"""The Spark steps of the silver apply (see :mod:`pipelines.silver.job` for the order)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dcp_cdc.config import AppConfig
from pipelines import schemas
from pipelines.bronze.transforms import vb_key
from pipelines.silver.walk import CHANGE_OF, DATA_OPS, VbState, position_of, walk

WALK_OPS = [*DATA_OPS, "snapshot_marker", "oso_snapshot", "seqno_advanced", "system_event",
            "stream_end", "stream_request_response"]  # fmt: skip

SILVER = T.StructType(
    [
        T.StructField("key", T.StringType(), False),
        T.StructField("doc", T.StringType()),
        T.StructField("doc_binary", T.BinaryType()),
        T.StructField("xattrs", T.MapType(T.StringType(), T.StringType())),
        T.StructField("_collection_id", T.LongType()),
        T.StructField("_vbucket", T.IntegerType()),
        T.StructField("_vb_uuid", T.LongType()),
        T.StructField("_seqno", T.LongType()),
        T.StructField("_rev_seqno", T.LongType()),
        T.StructField("_cas", T.LongType()),
        T.StructField("_flags", T.LongType()),
        T.StructField("_expiry", T.LongType()),
        T.StructField("_deleted", T.BooleanType()),
        T.StructField("_change", T.StringType()),
        T.StructField("_applied_at", T.TimestampType()),
        T.StructField("_ingest_run_id", T.StringType()),
    ]
)
"""A silver collection table (``..._all``); the user-facing view drops tombstones and expired."""

REGISTRY = T.StructType(
    [
        T.StructField("collection_id", T.LongType()),
        T.StructField("scope_id", T.LongType()),
        T.StructField("scope", T.StringType()),
        T.StructField("name", T.StringType()),
        T.StructField("table_name", T.StringType()),
        T.StructField("max_ttl", T.LongType()),
        T.StructField("history", T.BooleanType()),
        T.StructField("created_uid", T.LongType()),
        T.StructField("dropped_uid", T.LongType()),
        T.StructField("create_seqnos", T.MapType(T.IntegerType(), T.LongType())),
        T.StructField("drop_seqnos", T.MapType(T.IntegerType(), T.LongType())),
        T.StructField("flush_seqnos", T.MapType(T.IntegerType(), T.LongType())),
        T.StructField("status", T.StringType()),
        T.StructField("updated_at", T.TimestampType()),
    ]
)
"""``silver.<bucket>__collections``: ``status`` is live, dropped (not yet in every vbucket) or
retired (its table archived or dropped)."""

STATE = T.StructType(
    [
        T.StructField("vbucket", T.IntegerType()),
        T.StructField("vb_uuid", T.LongType()),
        T.StructField("failover_log", schemas.DECODED["failover_log"].dataType),
        T.StructField("last_applied_seqno", T.LongType()),
        T.StructField("consistent_seqno", T.LongType()),
        T.StructField("manifest_uid", T.LongType()),
        T.StructField("purge_seqno", T.LongType()),
        T.StructField("open_snapshot_start", T.LongType()),
        T.StructField("open_snapshot_end", T.LongType()),
        T.StructField("position_run_id", T.StringType()),
        T.StructField("state", T.StringType()),
        T.StructField("updated_at", T.TimestampType()),
    ]
)
"""``silver.<bucket>__stream_state``: per vbucket, where silver stands."""

WALKED = T.StructType(
    [
        T.StructField("kind", T.StringType()),  # change | system_event | rollback | state
        T.StructField("vbucket", T.IntegerType()),
        T.StructField("frames", T.LongType()),
        T.StructField("ignored", T.LongType()),
        T.StructField("state", T.StringType()),
        T.StructField("position_run_id", T.StringType()),
        T.StructField("rollback_seqno", T.LongType()),
        T.StructField("op", T.StringType()),
        T.StructField("event", T.StringType()),
        T.StructField("collection_id", T.LongType()),
        T.StructField("scope_id", T.LongType()),
        T.StructField("name", T.StringType()),
        T.StructField("manifest_uid", T.LongType()),
        T.StructField("max_ttl", T.LongType()),
        T.StructField("history", T.BooleanType()),
        T.StructField("key", T.BinaryType()),
        T.StructField("value", T.BinaryType()),
        T.StructField("is_json", T.BooleanType()),
        T.StructField("xattrs", T.MapType(T.StringType(), T.StringType())),
        T.StructField("by_seqno", T.LongType()),
        T.StructField("rev_seqno", T.LongType()),
        T.StructField("cas", T.LongType()),
        T.StructField("flags", T.LongType()),
        T.StructField("expiration", T.LongType()),
        T.StructField("in_vb_uuid", T.LongType()),
        T.StructField("ingest_run_id", T.StringType()),
    ]
)

PURGES = T.StructType(
    [
        T.StructField("table_name", T.StringType()),
        T.StructField("vbucket", T.IntegerType()),
        T.StructField("purged_through_seqno", T.LongType()),
        T.StructField("purged_at", T.TimestampType()),
    ]
)
"""``silver.<bucket>__tombstone_purges``: per table and vbucket, the highest seqno of a
tombstone the maintenance purge removed. A change at or below it for a key the table no
longer has is refused: it is older than a deletion that was purged (no resurrection)."""

_T = TypeVar("_T")


def with_retry(what: str, action: Callable[[], _T]) -> _T:
    """Run a Delta write, retrying when a concurrent writer won the commit (typed conflicts)."""
    from delta import exceptions as dx

    from pipelines.silver.job import MAX_COMMIT_ATTEMPTS, SilverConflictError

    conflicts = (
        dx.DeltaConcurrentModificationException, dx.ConcurrentWriteException,
        dx.MetadataChangedException, dx.ProtocolChangedException, dx.ConcurrentAppendException,
        dx.ConcurrentDeleteReadException, dx.ConcurrentDeleteDeleteException,
        dx.ConcurrentTransactionException,
    )  # fmt: skip
    for attempt in range(1, MAX_COMMIT_ATTEMPTS + 1):
        try:
            return action()
        except conflicts as exc:
            if attempt == MAX_COMMIT_ATTEMPTS:
                raise SilverConflictError(
                    f"{what}: a concurrent writer committed first {attempt} times in a row "
                    f"({type(exc).__name__}); nothing of this step was written, run again"
                ) from exc
            time.sleep(0.2 * attempt)
    raise AssertionError("unreachable")


# --- support tables ------------------------------------------------------------------------


def ensure_support_tables(spark: SparkSession, bucket: str, properties: dict[str, str]) -> None:
    from delta.tables import DeltaTable

    from pipelines.silver.job import purges_table, registry_table, state_table

    spark.sql("CREATE DATABASE IF NOT EXISTS silver")
    support = ((registry_table(bucket), REGISTRY), (state_table(bucket), STATE),
               (purges_table(bucket), PURGES))  # fmt: skip
    for table, schema in support:
        builder = DeltaTable.createIfNotExists(spark).tableName(table).addColumns(schema)
        for k, v in properties.items():
            builder = builder.property(k, v)
        _create(spark, table, builder)


def _create(spark: SparkSession, table: str, builder: Any) -> None:
    """``createIfNotExists`` that tolerates a concurrent run creating the same table. Delta
    reports that race as a protocol change (retried by :func:`with_retry`); the catalog as
    "already exists", or the location as "not empty" while the other commit is under way:
    wait, and ask again (the table exists by then and creating it is a no-op)."""
    from pyspark.errors import AnalysisException

    from pipelines.silver.job import MAX_COMMIT_ATTEMPTS, SilverConflictError

    races = ("TABLE_OR_VIEW_ALREADY_EXISTS", "DELTA_CREATE_TABLE_WITH_NON_EMPTY_LOCATION")
    for attempt in range(1, MAX_COMMIT_ATTEMPTS + 1):
        try:
            with_retry(table, builder.execute)
            return
        except AnalysisException as exc:
            if exc.getCondition() not in races:
                raise
            if attempt == MAX_COMMIT_ATTEMPTS:
                raise SilverConflictError(
                    f"{table}: a concurrent run was still creating it after {attempt} attempts "
                    f"({exc.getCondition()}); run again"
                ) from exc
            time.sleep(0.5 * attempt)


def ensure_collection_table(spark: SparkSession, name: str, properties: dict[str, str]) -> None:
    from delta.tables import DeltaTable

    builder = (
        DeltaTable.createIfNotExists(spark)
        .tableName(f"{name}_all")
        .addColumns(SILVER)
        .clusterBy("_vbucket", "key")
        .property("delta.enableChangeDataFeed", "true")
    )
    for k, v in properties.items():
        builder = builder.property(k, v)
    _create(spark, f"{name}_all", builder)
    view = (
        f"CREATE OR REPLACE VIEW {name} AS SELECT * FROM {name}_all "
        "WHERE NOT _deleted AND (_expiry = 0 OR _expiry > unix_timestamp())"
    )
    _catalog_step(spark, name, lambda: spark.sql(view), "TABLE_OR_VIEW_ALREADY_EXISTS")


def _catalog_step(spark: SparkSession, name: str, step: Callable[[], object], race: str) -> None:
    """A catalog change a concurrent run may make first: its ``race`` error (the other run's
    effect) means done; a second such error in a row fails with a clear message."""
    from pyspark.errors import AnalysisException

    from pipelines.silver.job import SilverConflictError

    for attempt in (1, 2):
        try:
            step()
            return
        except AnalysisException as exc:
            if exc.getCondition() != race:
                raise
            if attempt == 2:
                raise SilverConflictError(
                    f"{name}: a concurrent run kept changing it in the catalog ({race}); run again"
                ) from exc


# --- reading and walking -------------------------------------------------------------------


def read_states(spark: SparkSession, table: str) -> dict[int, dict[str, Any]]:
    return {
        r["vbucket"]: {"state": json.loads(r["state"]), "position_run_id": r["position_run_id"]}
        for r in spark.table(table).select("vbucket", "state", "position_run_id").collect()
    }


def run_versions(spark: SparkSession, bronze: dict[str, str]) -> DataFrame:
    """``ingest_run_id → run_version`` of the bronze runs that finished."""
    return (
        spark.table(bronze["ingest_log"])
        .where(F.col("status") == "ingested")
        .select("ingest_run_id", "run_version")
        .distinct()
    )


def unconsumed_frames(
    spark: SparkSession, bronze: dict[str, str], states: dict[int, dict[str, Any]]
) -> tuple[DataFrame, set[int]]:
    """Bronze frames that may hold frames no silver run has consumed yet (with the
    ``run_version`` of their ingest run), and the vbuckets to walk again from their start.

    A vbucket is walked again when a new run brought frames that sort before the position
    silver reached in it: files of an older session that arrived after a newer session was
    applied. Walking its whole history again in session order gives what one run over all
    of it would have given; the MERGE guard and the idempotent deletes make the replay safe.
    """
    versions_df = run_versions(spark, bronze)
    events = (
        spark.table(bronze["events"])
        .where(F.col("op").isin(WALK_OPS))
        .join(F.broadcast(versions_df), on="ingest_run_id", how="inner")
        .withColumn("vb_key", vb_key())
    )
    run_ids = [s["position_run_id"] for s in states.values()]
    if not states or any(r is None for r in run_ids):
        return events, set()
    seen = min(s["state"].get("seen_version", 0) for s in states.values())
    positions = [
        (vb, *s["state"]["position"]) for vb, s in states.items() if s["state"]["position"]
    ]
    saved = spark.createDataFrame(
        positions, "p_vb INT, p_started STRING, p_session STRING, p_seq INT, p_offset LONG"
    )
    position = F.struct("session_started_at", "session_id", "file_sequence", "offset")
    saved_position = F.struct("p_started", "p_session", "p_seq", "p_offset")
    late = {
        r["vb_key"]
        for r in events.where(F.col("run_version") > seen)
        .join(F.broadcast(saved), F.col("vb_key") == F.col("p_vb"))
        .where(position <= saved_position)
        .select("vb_key")
        .distinct()
        .collect()
    }
    versions = {r["ingest_run_id"]: r["run_version"] for r in versions_df.collect()}
    oldest = min(versions.get(r, 0) for r in run_ids)
    recent = F.col("run_version") >= oldest
    wanted = (recent | F.col("vb_key").isin(sorted(late))) if late else recent
    return events.where(wanted), late


_WALK_COLUMNS = [
    "op", "vbucket", "status", "opaque", "session_started_at", "session_id", "file_sequence",
    "offset", "by_seqno", "rev_seqno", "cas", "flags", "expiration", "collection_id", "key",
    "value", "xattrs", "is_json", "start_seqno", "end_seqno", "purge_seqno", "event",
    "scope_id", "name", "manifest_uid", "max_ttl", "history", "oso_flags", "rollback_seqno",
    "failover_log", "in_vb_uuid", "ingest_run_id", "run_version",
]  # fmt: skip


def walk_vbuckets(
    spark: SparkSession,
    frames: DataFrame,
    states: dict[int, dict[str, Any]],
    again: set[int] | frozenset[int] = frozenset(),
    *,
    eager: bool = False,
) -> DataFrame:
    """Each vbucket's frames through :func:`pipelines.silver.walk.walk` (``applyInArrow``);
    the vbuckets in ``again`` start over from a fresh state."""
    state_rows = [(vb, json.dumps(s["state"])) for vb, s in states.items() if vb not in again]
    state_df = spark.createDataFrame(state_rows, "vb_key INT, saved_state STRING")
    keyed = (
        frames.select(*_WALK_COLUMNS, "vb_key")
        .where(F.col("vb_key").isNotNull())
        .join(F.broadcast(state_df), on="vb_key", how="left")
    )
    out_schema = schemas.arrow_schema(WALKED)
    return keyed.groupBy("vb_key").applyInArrow(
        lambda table: _walk_group(table, out_schema, eager), WALKED
    )


def _walk_group(table: pa.Table, out_schema: pa.Schema, eager: bool) -> pa.Table:
    rows = table.to_pylist()
    vb = rows[0]["vb_key"]
    saved = json.loads(rows[0]["saved_state"]) if rows[0]["saved_state"] else None
    state = VbState.from_json(saved) if saved else VbState(vb)
    seen = saved.get("seen_version", 0) if saved else 0
    rows.sort(key=position_of)
    start = state.position
    fresh = [r for r in rows if start is None or position_of(r) > start]
    result = walk(fresh, state, eager=eager)
    out: list[dict[str, Any]] = []
    changes = list(result.changes)
    events = list(result.system_events)
    for c in changes:
        out.append({**{k: c.get(k) for k in out_schema.names}, "kind": "change", "vbucket": vb,
                    "state": None})  # fmt: skip
    for e in events:
        out.append({**{k: e.get(k) for k in out_schema.names}, "kind": "system_event",
                    "event": e["kind"], "vbucket": vb, "state": None})  # fmt: skip
    for seqno in result.rollbacks:
        out.append({"kind": "rollback", "vbucket": vb, "rollback_seqno": seqno})
    # the run holding the first frame not consumed (or the last one read): the next run reads
    # bronze from that run on
    after = [r for r in fresh if state.position is None or position_of(r) > state.position]
    position_run = (after[0] if after else fresh[-1])["ingest_run_id"] if fresh else None
    if position_run is None and saved:
        position_run = saved.get("run_id")
    seen = max([seen, *(r["run_version"] for r in rows)])
    out.append({
        "kind": "state", "vbucket": vb, "frames": len(fresh),
        "ignored": result.ignored,
        "state": json.dumps({**state.to_json(), "run_id": position_run, "seen_version": seen}),
        "position_run_id": position_run,
    })  # fmt: skip
    return pa.Table.from_pylist(out, schema=out_schema)


# --- registry, drops, rollbacks, merge -------------------------------------------------------


def update_registry(
    spark: SparkSession,
    bucket: str,
    controls: list[dict[str, Any]],
    properties: dict[str, str],
    change_cids: set[int],
) -> list[dict[str, Any]]:
    """Apply committed system events to the collection registry; create new tables.

    A collection whose changes arrive without its create event (a stream that started after
    it) is registered as ``_unknown.collection_<id hex>`` rather than losing its changes.
    """
    from pipelines.silver.job import registry_table

    table = registry_table(bucket)
    current = {r["collection_id"]: r.asDict(recursive=True) for r in spark.table(table).collect()}
    scopes = {0: "_default"}
    for r in current.values():
        scopes[r["scope_id"]] = r["scope"]
    if 0 not in current:
        current[0] = _registry_row(0, 0, "_default", "_default", bucket)
    events = sorted(
        (r for r in controls if r["kind"] == "system_event"),
        key=lambda r: (r["vbucket"], r["by_seqno"]),
    )
    for e in events:
        if e["event"] == "create_scope" and e["scope_id"] is not None:
            scopes[e["scope_id"]] = e["name"]
    changed = False
    for e in events:
        cid, vb, seqno = e["collection_id"], e["vbucket"], e["by_seqno"]
        if cid is None:
            continue
        row = current.get(cid)
        if row is None:
            scope = scopes.get(e["scope_id"], f"scope_{e['scope_id']}")
            row = current[cid] = _registry_row(cid, e["scope_id"], scope, e["name"], bucket)
        kind = e["event"]
        if kind in ("create_collection", "flush_collection"):
            row["create_seqnos"].setdefault(vb, seqno)
            row["created_uid"] = row["created_uid"] or e["manifest_uid"]
            if kind == "flush_collection":
                row["flush_seqnos"][vb] = seqno
            row["max_ttl"] = e["max_ttl"]
            if e["history"] is not None:
                row["history"] = e["history"]
        elif kind == "modify_collection":
            row["max_ttl"] = e["max_ttl"]
            if e["history"] is not None:
                row["history"] = e["history"]
        elif kind == "drop_collection":
            row["drop_seqnos"][vb] = seqno
            row["dropped_uid"] = e["manifest_uid"]
            if row["status"] == "live":
                row["status"] = "dropped"
        changed = True
    for cid in sorted(change_cids - set(current)):
        current[cid] = _registry_row(cid, -1, "_unknown", f"collection_{cid:x}", bucket)
        changed = True
    for row in current.values():
        if row["status"] != "retired":
            ensure_collection_table(spark, row["table_name"], properties)
    if changed or len(current) != spark.table(table).count():
        rows = list(current.values())
        df = spark.createDataFrame(
            [{**r, "updated_at": None} for r in rows], schema=REGISTRY
        ).withColumn("updated_at", F.current_timestamp())
        with_retry(table, lambda: _replace_rows(df, table))
    return list(current.values())


def _registry_row(cid: int, sid: int, scope: str, name: str, bucket: str) -> dict[str, Any]:
    from pipelines.silver.job import collection_table

    return {
        "collection_id": cid, "scope_id": sid, "scope": scope, "name": name,
        "table_name": collection_table(bucket, scope, name), "max_ttl": None, "history": False,
        "created_uid": None, "dropped_uid": None, "create_seqnos": {}, "drop_seqnos": {},
        "flush_seqnos": {}, "status": "live", "updated_at": None,
    }  # fmt: skip


def _table_of(registry: list[dict[str, Any]], cid: int) -> str | None:
    for r in registry:
        if r["collection_id"] == cid and r["status"] != "retired":
            return f"{r['table_name']}_all"
    return None


def apply_drops(
    spark: SparkSession, bucket: str, registry: list[dict[str, Any]], controls: list[dict[str, Any]]
) -> int:
    """Drops and flushes: a collection's rows in the vbucket below the event's seqno go."""
    from delta.tables import DeltaTable

    cuts: dict[int, list[tuple[int, int]]] = {}
    for e in controls:
        if e["kind"] == "system_event" and e["event"] in ("drop_collection", "flush_collection"):
            cuts.setdefault(e["collection_id"], []).append((e["vbucket"], e["by_seqno"]))
    removed = 0
    for cid, pairs in cuts.items():
        table = _table_of(registry, cid)
        if table is None:
            continue
        source = spark.createDataFrame(pairs, "vb INT, cut LONG")
        metrics = with_retry(table, lambda t=table, s=source: (  # type: ignore[misc]
            DeltaTable.forName(spark, t).alias("t")
            .merge(s.alias("s"), "t._vbucket = s.vb AND t._seqno < s.cut")
            .whenMatchedDelete()
            .execute()
        ))  # fmt: skip
        removed += _metric(metrics, "num_deleted_rows")
    return removed


def _metric(metrics: DataFrame | None, name: str) -> int:
    if metrics is None:
        return 0
    rows = metrics.collect()
    return int(rows[0][name]) if rows and name in rows[0].asDict() else 0


def silver_rows(changes: DataFrame, run_column: str = "ingest_run_id") -> DataFrame:
    """Walked change rows → the silver table's columns, newest change per key only."""
    newest = Window.partitionBy("collection_id", "key").orderBy(
        F.col("by_seqno").desc(), F.col("rev_seqno").desc()
    )
    deleted = F.col("op") != "mutation"
    change = F.create_map(*[F.lit(x) for kv in CHANGE_OF.items() for x in kv])[F.col("op")]
    user_xattrs = F.map_filter("xattrs", lambda k, _: ~k.startswith("_"))
    return (
        changes.withColumn("_rank", F.row_number().over(newest))
        .where(F.col("_rank") == 1)
        .select(
            F.col("key").cast("string").alias("key"),
            F.when(~deleted & F.col("is_json"), F.col("value").cast("string")).alias("doc"),
            F.when(~deleted & ~F.col("is_json"), F.col("value")).alias("doc_binary"),
            F.when(~deleted, user_xattrs).alias("xattrs"),
            F.col("collection_id").alias("_collection_id"),
            F.col("vbucket").alias("_vbucket"),
            F.col("in_vb_uuid").alias("_vb_uuid"),
            F.col("by_seqno").alias("_seqno"),
            F.col("rev_seqno").alias("_rev_seqno"),
            F.col("cas").alias("_cas"),
            F.coalesce(F.col("flags"), F.lit(0)).alias("_flags"),
            F.coalesce(F.col("expiration"), F.lit(0)).alias("_expiry"),
            deleted.alias("_deleted"),
            change.alias("_change"),
            F.current_timestamp().alias("_applied_at"),
            F.col(run_column).alias("_ingest_run_id"),
        )
    )


def merge_changes(
    spark: SparkSession, bucket: str, registry: list[dict[str, Any]], changes: DataFrame
) -> dict[str, int]:
    """MERGE each collection's newest changes, only where newer than the row (§7.1).

    A key the table does not have is inserted unless its change is at or below the
    tombstone-purge mark of its vbucket (:data:`PURGES`).
    """
    from delta.tables import DeltaTable

    from pipelines.silver.job import purges_table

    purged = spark.table(purges_table(bucket)).select(
        F.col("table_name").alias("_purged_table"),
        F.col("vbucket").alias("_vbucket"),
        F.col("purged_through_seqno").alias("_purged_through"),
    )
    columns: dict[str, str | Column] = {c: f"s.{c}" for c in SILVER.fieldNames()}
    # Not cached: the caller's changes are (the walk is), and the MERGE materializes its
    # source itself; a second copy here cost a tenth of a 1M-change MERGE.
    rows = silver_rows(changes)
    merged: dict[str, int] = {}
    for cid in [r["collection_id"] for r in changes.select("collection_id").distinct().collect()]:
        table = _table_of(registry, cid)
        if table is None:
            continue
        marks = purged.where(F.col("_purged_table") == table).drop("_purged_table")
        source = rows.where(F.col("_collection_id") == cid).join(
            F.broadcast(marks), on="_vbucket", how="left"
        )
        metrics = with_retry(table, lambda t=table, s=source: (  # type: ignore[misc]
            DeltaTable.forName(spark, t).alias("t")
            .merge(s.alias("s"), "t.key = s.key")
            .whenMatchedUpdate(condition="s._seqno > t._seqno", set=columns)
            .whenNotMatchedInsert(
                condition="s._purged_through IS NULL OR s._seqno > s._purged_through",
                values=columns,
            )
            .execute()
        ))  # fmt: skip
        merged[table.removesuffix("_all")] = _metric(metrics, "num_affected_rows")
    return merged


def rebuild_rolled_back(
    spark: SparkSession,
    bucket: str,
    bronze_events: str,
    registry: list[dict[str, Any]],
    rollbacks: list[tuple[int, int]],
    states: dict[int, dict[str, Any]],
) -> int:
    """Rows applied above a rollback point return to their last state at or before it.

    The state is rebuilt from bronze: the newest data event of the key in the vbucket with
    ``by_seqno <= R`` whose vb uuid's branch covers that seqno in the vbucket's failover log
    (so changes of a branch that was itself lost earlier do not come back). A key with no such
    event did not exist at R: its row goes.
    """
    from delta.tables import DeltaTable

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
    rebuilt = 0
    for reg in registry:
        if reg["status"] == "retired":
            continue
        table = f"{reg['table_name']}_all"
        affected = (
            spark.table(table)
            .join(F.broadcast(point_df), (F.col("_vbucket") == F.col("p_vb")) & (F.col("_seqno") > F.col("p_seqno")))
            .select("key", F.col("_vbucket").alias("vb"), "p_seqno")
        )  # fmt: skip
        if affected.isEmpty():
            continue
        history = (
            spark.table(bronze_events)
            .where(F.col("op").isin(*DATA_OPS) & (F.col("collection_id") == reg["collection_id"]))
            .withColumn("vbucket", F.col("vbucket").cast("int"))
            .join(F.broadcast(point_df), (F.col("vbucket") == F.col("p_vb")) & (F.col("by_seqno") <= F.col("p_seqno")))
            .join(F.broadcast(branch_df), (F.col("vbucket") == F.col("b_vb")) & (F.col("in_vb_uuid") == F.col("b_uuid"))
                  & (F.col("by_seqno") >= F.col("b_start")) & (F.col("b_end").isNull() | (F.col("by_seqno") <= F.col("b_end"))))
            .join(affected.select(F.col("key").alias("k"), F.col("vb").alias("a_vb")),
                  (F.col("key").cast("string") == F.col("k")) & (F.col("vbucket") == F.col("a_vb")))
        )  # fmt: skip
        restored = silver_rows(history).withColumn("_found", F.lit(True))
        source = (
            affected.select("key")
            .join(restored, on="key", how="left")
            .select("key", *[c for c in restored.columns if c != "key"])
        )
        metrics = with_retry(table, lambda t=table, s=source: (  # type: ignore[misc]
            DeltaTable.forName(spark, t).alias("t")
            .merge(s.alias("s"), "t.key = s.key")
            .whenMatchedUpdate(condition="s._found", set={c: f"s.{c}" for c in SILVER.fieldNames()})
            .whenMatchedDelete(condition="s._found IS NULL")
            .execute()
        ))  # fmt: skip
        rebuilt += _metric(metrics, "num_affected_rows")
    return rebuilt


def retire_dropped(
    spark: SparkSession,
    bucket: str,
    registry: list[dict[str, Any]],
    states: dict[int, dict[str, Any]],
    config: AppConfig,
) -> None:
    """A collection whose drop reached every vbucket is retired (archived or dropped)."""
    from pipelines.silver.job import registry_table

    vbuckets = set(states)
    changed = False
    for row in registry:
        if row["status"] != "dropped" or not vbuckets <= set(row["drop_seqnos"]):
            continue
        name = row["table_name"]
        if config.silver.retire == "archive":
            stamp = time.strftime("%Y%m%d", time.gmtime())
            archived = f"{name}__dropped_{row['collection_id']:x}_{stamp}"
            if not spark.catalog.tableExists(archived):  # or a concurrent run archived it
                rename = f"ALTER TABLE {name}_all RENAME TO {archived}"
                _catalog_step(spark, name, lambda q=rename: spark.sql(q), "TABLE_OR_VIEW_NOT_FOUND")  # type: ignore[misc]
        else:
            spark.sql(f"DROP TABLE IF EXISTS {name}_all")
        spark.sql(f"DROP VIEW IF EXISTS {name}")
        row["status"] = "retired"
        changed = True
    if changed:
        table = registry_table(bucket)
        df = spark.createDataFrame([{**r, "updated_at": None} for r in registry], schema=REGISTRY)
        df = df.withColumn("updated_at", F.current_timestamp())
        with_retry(table, lambda: _replace_rows(df, table))


def _replace_rows(df: DataFrame, table: str) -> None:
    """All of ``table``'s rows become ``df``'s, in one Delta commit. An overwrite by filter
    keeps the catalog entry as it is (``saveAsTable`` would alter it, which the Hive metastore
    refuses for Delta's placeholder schema and logs as an error)."""
    df.writeTo(table).overwrite(F.lit(True))


def save_states(
    spark: SparkSession,
    table: str,
    old: dict[int, dict[str, Any]],
    new: dict[int, dict[str, Any]],
) -> None:
    merged = {vb: s["state"] | {"run_id": s["position_run_id"]} for vb, s in old.items()}
    merged.update(new)
    rows = []
    for vb, s in sorted(merged.items()):
        snap = s.get("open_snapshot")
        rows.append({
            "vbucket": vb, "vb_uuid": s["vb_uuid"],
            "failover_log": [{"vb_uuid": u, "seqno": q} for u, q in s["failover_log"]],
            "last_applied_seqno": s["last_applied_seqno"],
            "consistent_seqno": s["consistent_seqno"], "manifest_uid": s["manifest_uid"],
            "purge_seqno": s["purge_seqno"], "open_snapshot_start": snap[0] if snap else None,
            "open_snapshot_end": snap[1] if snap else None, "position_run_id": s.get("run_id"),
            "state": json.dumps(s), "updated_at": None,
        })  # fmt: skip
    df = spark.createDataFrame(rows, schema=STATE).withColumn("updated_at", F.current_timestamp())
    with_retry(table, lambda: _replace_rows(df, table))


def purge_tombstones(
    spark: SparkSession, bucket: str, registry: list[dict[str, Any]], retention_hours: int
) -> dict[str, int]:
    """Remove tombstones applied more than ``retention_hours`` ago from every live table.

    The purge mark of each vbucket is raised first (:data:`PURGES`), then the rows go, so an
    interrupted purge never leaves a gap a replayed older change could slip through.
    """
    from delta.tables import DeltaTable

    from pipelines.silver.job import purges_table

    marks_table = purges_table(bucket)
    old_tombstone = (
        f"_deleted AND _applied_at < current_timestamp() - INTERVAL {retention_hours} HOURS"
    )
    purged: dict[str, int] = {}
    for reg in registry:
        if reg["status"] == "retired":
            continue
        table = f"{reg['table_name']}_all"
        marks = (
            spark.table(table)
            .where(old_tombstone)
            .groupBy(F.col("_vbucket").alias("vbucket"))
            .agg(F.max("_seqno").alias("purged_through_seqno"))
            .select(F.lit(table).alias("table_name"), "vbucket", "purged_through_seqno",
                    F.current_timestamp().alias("purged_at"))
        ).cache()  # fmt: skip
        try:
            if marks.isEmpty():
                continue
            with_retry(marks_table, lambda m=marks: (  # type: ignore[misc]
                DeltaTable.forName(spark, marks_table).alias("t")
                .merge(m.alias("s"), "t.table_name = s.table_name AND t.vbucket = s.vbucket")
                .whenMatchedUpdate(
                    condition="s.purged_through_seqno > t.purged_through_seqno",
                    set={"purged_through_seqno": "s.purged_through_seqno",
                         "purged_at": "s.purged_at"},
                )
                .whenNotMatchedInsertAll()
                .execute()
            ))  # fmt: skip
            metrics = with_retry(
                table,
                lambda t=table: spark.sql(f"DELETE FROM {t} WHERE {old_tombstone}"),  # type: ignore[misc]
            )
            purged[reg["table_name"]] = _metric(metrics, "num_affected_rows")
        finally:
            marks.unpersist()
    return purged

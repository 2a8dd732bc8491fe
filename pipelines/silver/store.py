"""What silver keeps in Delta: the collection tables and views, the registry, the stream state
and the tombstone-purge marks; and the MERGEs and deletes that change them.

Reads, collects and writes live here; the DataFrames they run are built by the pure steps of
:mod:`pipelines.silver.transforms`. :mod:`pipelines.silver.job` says in which order.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, wait
from functools import partial
from typing import Any

from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from dcp_cdc.config import AppConfig, ProjectionConfig
from pipelines import delta_io, schemas, tables
from pipelines.delta_io import metric, replace_rows, with_retry
from pipelines.errors import CollectionNameError
from pipelines.silver import transforms
from pipelines.tables import BucketTables

log = logging.getLogger(__name__)

Registry = list[dict[str, Any]]
"""The registry's rows (:data:`pipelines.schemas.REGISTRY`) as dictionaries."""

# --- tables and views ----------------------------------------------------------------------


def ensure_support_tables(spark: SparkSession, bucket: str, properties: dict[str, str]) -> None:
    """The registry, stream state and purge marks of ``bucket`` exist."""
    names = BucketTables(bucket)
    delta_io.ensure_database(spark, names.registry)
    support = (
        (names.registry, schemas.REGISTRY),
        (names.stream_state, schemas.STATE),
        (names.purges, schemas.PURGES),
    )
    for table, schema in support:
        delta_io.create_table(spark, table, schema, properties)
    # a registry of an earlier version: without ``renamed_from``
    delta_io.add_missing_columns(spark, names.registry, schemas.REGISTRY)


DELETION_VECTORS = "delta.enableDeletionVectors"


CHANGE_DATA_FEED = "delta.enableChangeDataFeed"


def collection_properties(config: AppConfig) -> dict[str, str]:
    """The properties a new ``_all`` table gets: ``[tables] properties`` with deletion vectors
    and the change data feed as ``[silver] deletion_vectors`` and ``change_data_feed`` say."""
    return config.tables.properties | {
        DELETION_VECTORS: str(config.silver.deletion_vectors).lower(),
        CHANGE_DATA_FEED: str(config.silver.change_data_feed).lower(),
    }


def history_properties(config: AppConfig) -> dict[str, str]:
    """The properties a new history table gets: ``[tables] properties`` and deletion vectors
    as ``[silver] deletion_vectors`` says; no change data feed (the table is the history)."""
    return config.tables.properties | {
        DELETION_VECTORS: str(config.silver.deletion_vectors).lower(),
        CHANGE_DATA_FEED: "false",
    }


def ensure_collection_table(
    spark: SparkSession, name: str, properties: dict[str, str], *, document_variant: bool = False
) -> None:
    """The ``_all`` table of the collection whose view is ``name``, and the view, exist, with
    every column of :data:`pipelines.schemas.SILVER` (a table of an earlier version gains
    those it lacks, and its view follows); the change data feed is on unless ``properties``
    say otherwise. With ``document_variant`` the table has
    :data:`pipelines.schemas.DOCUMENT_VARIANT` too: a table without it gains it, filled for
    the rows it holds (:func:`fill_document_variant`). Without, a table that has it keeps it
    (and the MERGEs keep it filled: :func:`transforms.merge_values`)."""
    table = tables.all_rows(name)
    schema = schemas.SILVER_VARIANT if document_variant else schemas.SILVER
    delta_io.create_table(
        spark,
        table,
        schema,
        {CHANGE_DATA_FEED: "true", **properties},
        cluster_by=("_vbucket", "key"),
    )
    query = f"SELECT * FROM {table} WHERE {tables.LIVE_ROWS}"
    # The view shows what the table had when it was made, and a table only gains columns: a
    # view with them all (a catalog lookup) says the table has them too, with no Delta read.
    # (A table that has the VARIANT keeps it when the setting is turned off: so does its view.)
    found = delta_io.view_metadata(spark, name)
    shown = set(found[1]) if found is not None and found[0] == query else set()
    if set(schema.fieldNames()) <= shown <= set(schemas.SILVER_VARIANT.fieldNames()):
        return
    delta_io.add_missing_columns(spark, table, schema)
    if document_variant and found is not None and schemas.DOCUMENT_VARIANT not in found[1]:
        # the view is made again after the fill: a run killed before it fills again
        fill_document_variant(spark, table)
    delta_io.ensure_view(spark, name, query, spark.table(table).columns)


def fill_document_variant(spark: SparkSession, table: str) -> int:
    """:data:`pipelines.schemas.DOCUMENT_VARIANT` of ``table``'s rows that have a ``doc`` and
    no VARIANT yet (a table that just gained the column): one UPDATE, which rewrites them
    (idempotent: a second one finds only documents that are not JSON). Returns rows updated."""
    column = schemas.DOCUMENT_VARIANT
    fill = (
        f"UPDATE {table} SET {column} = try_parse_json(doc) "
        f"WHERE {column} IS NULL AND doc IS NOT NULL"
    )
    return metric(with_retry(table, lambda: spark.sql(fill)), "num_affected_rows")


def ensure_projections(
    spark: SparkSession, registry: Registry, projections: Iterable[ProjectionConfig]
) -> list[str]:
    """The typed view of each projection whose collection is registered and not retired
    (made, or made again when its columns changed); returns their names. A projection of a
    collection not seen yet waits for it."""
    wanted = {p.scope_and_name: p for p in projections}
    made = []
    for row in registry:
        projection = wanted.get((row["scope"], row["name"]))
        if projection is None or row["status"] not in tables.WITH_TABLES:
            continue
        view = row["table_name"]
        # the collection's view has the VARIANT when its table has it (a catalog lookup)
        found = delta_io.view_metadata(spark, view)
        variant = found is not None and schemas.DOCUMENT_VARIANT in found[1]
        query = transforms.projection_query(view, projection.columns, document_variant=variant)
        delta_io.ensure_view(spark, tables.typed(view), query)
        made.append(tables.typed(view))
    return made


# --- stream state and what to walk ---------------------------------------------------------


def read_states(spark: SparkSession, table: str) -> dict[int, dict[str, Any]]:
    return {
        r["vbucket"]: {"state": json.loads(r["state"]), "position_run_id": r["position_run_id"]}
        for r in spark.table(table).select("vbucket", "state", "position_run_id").collect()
    }


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
        rows.append(
            {
                "vbucket": vb,
                "vb_uuid": s["vb_uuid"],
                "failover_log": [{"vb_uuid": u, "seqno": q} for u, q in s["failover_log"]],
                "last_applied_seqno": s["last_applied_seqno"],
                "consistent_seqno": s["consistent_seqno"],
                "manifest_uid": s["manifest_uid"],
                "purge_seqno": s["purge_seqno"],
                "open_snapshot_start": snap[0] if snap else None,
                "open_snapshot_end": snap[1] if snap else None,
                "position_run_id": s.get("run_id"),
                "state": json.dumps(s),
                "updated_at": None,
            }
        )
    df = spark.createDataFrame(rows, schema=schemas.STATE).withColumn(
        "updated_at", F.current_timestamp()
    )
    with_retry(table, lambda: replace_rows(df, table))


def unconsumed_frames(
    spark: SparkSession, names: BucketTables, states: dict[int, dict[str, Any]]
) -> tuple[DataFrame, set[int]]:
    """Bronze frames that may hold frames no silver run has consumed yet (with the
    ``run_version`` of their ingest run), and the vbuckets to walk again from their start.

    A vbucket is walked again when a new run brought frames that sort before the position
    silver reached in it: files of an older session that arrived after a newer session was
    applied. Walking its whole history again in session order gives what one run over all
    of it would have given; the MERGE guard and the idempotent deletes make the replay safe.
    """
    log = spark.table(names.ingest_log)
    events = spark.table(names.events)
    run_ids = [s["position_run_id"] for s in states.values()]
    if not states or any(r is None for r in run_ids):
        return transforms.walk_input(events, transforms.finished_runs(log)), set()
    # The runs from the oldest one a vbucket's position is in: the log's rows before it are
    # skipped by their statistics, so the read follows the runs not consumed, not the log's
    # age (until each vbucket was walked once since states kept their run's version, the
    # whole log is read, as before).
    floors = [s["state"].get("position_version") for s in states.values()]
    if all(f is not None for f in floors):
        log = log.where(F.col("run_version") >= min(floors))
    versions_df = transforms.finished_runs(log)
    versions = {r["ingest_run_id"]: r["run_version"] for r in versions_df.collect()}
    seen = min(s["state"].get("seen_version", 0) for s in states.values())
    late: set[int] = set()
    new_runs = [r for r, v in versions.items() if v > seen]
    if new_runs:
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
            for r in transforms.walk_input(events.where(of_runs(new_runs)), versions_df)
            .join(F.broadcast(saved), F.col("vb_key") == F.col("p_vb"))
            .where(position <= saved_position)
            .select("vb_key")
            .distinct()
            .collect()
        }
    oldest = min(versions.get(r, 0) for r in run_ids)
    recent = of_runs([r for r, v in versions.items() if v >= oldest])
    if not late:
        return transforms.walk_input(events, versions_df).where(recent), late
    # a late vbucket is walked again from its first frame: every finished run
    every_run = transforms.finished_runs(spark.table(names.ingest_log))
    wanted = recent | F.col("vb_key").isin(sorted(late))
    return transforms.walk_input(events, every_run).where(wanted), late


def of_runs(run_ids: list[str]) -> Column:
    """The bronze rows of these ingest runs, as a filter Delta skips files with: the run ids
    themselves, and their range (ids start with their UTC time, so a run's files hold one id
    and the range stays narrow) for a long list the exact test would not skip by."""
    if not run_ids:
        return F.lit(False)
    ids = sorted(run_ids)
    run = F.col("ingest_run_id")
    return run.between(ids[0], ids[-1]) & run.isin(ids)


def walk_vbuckets(
    spark: SparkSession,
    frames: DataFrame,
    states: dict[int, dict[str, Any]],
    again: set[int] | frozenset[int] = frozenset(),
    *,
    eager: bool = False,
) -> DataFrame:
    """Each vbucket's frames walked from its saved state (:func:`transforms.walk_frames`);
    the vbuckets in ``again`` start over from a fresh state."""
    state_rows = [(vb, json.dumps(s["state"])) for vb, s in states.items() if vb not in again]
    saved = spark.createDataFrame(state_rows, "vb_key INT, saved_state STRING")
    return transforms.walk_frames(frames, saved, eager=eager)


# --- the registry --------------------------------------------------------------------------


def read_registry(spark: SparkSession, bucket: str) -> Registry:
    """The registry's rows; none when the bucket has no registry yet."""
    table = BucketTables(bucket).registry
    if not spark.catalog.tableExists(table):
        return []
    return [r.asDict(recursive=True) for r in spark.table(table).collect()]


def _save_registry(spark: SparkSession, table: str, registry: Registry) -> None:
    df = spark.createDataFrame(
        [{**r, "updated_at": None} for r in registry], schema=schemas.REGISTRY
    ).withColumn("updated_at", F.current_timestamp())
    with_retry(table, lambda: replace_rows(df, table))


def update_registry(
    spark: SparkSession,
    bucket: str,
    controls: list[dict[str, Any]],
    properties: dict[str, str],
    change_cids: set[int],
    *,
    document_variant: bool = False,
) -> Registry:
    """Apply committed system events to the collection registry; create new tables (with
    ``document_variant``: :func:`ensure_collection_table`).

    A collection whose changes arrive without its create event (a stream that started after
    it, or files that arrive newest first) is registered as ``_unknown.collection_<id hex>``
    rather than losing its changes; when its create event arrives, it takes its name (and a
    scope registered by its id alone, ``scope_<id>``, takes the name its create event gives):
    :func:`_take_names` renames its tables, kill-safe.
    """
    table = BucketTables(bucket).registry
    stored = spark.table(table).collect()
    current = {r["collection_id"]: r.asDict(recursive=True) for r in stored}
    scopes = {0: "_default"}
    for r in current.values():  # a scope's name from its create event wins over its stand-in
        if scopes.get(r["scope_id"], _scope_stand_in(r["scope_id"])) == _scope_stand_in(
            r["scope_id"]
        ):
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
        kind = e["event"]
        if row is None and not (kind in NAMING_EVENTS and e["name"]):
            # a drop or modify before its create (which names it): known by its id for now
            row = current[cid] = _unknown_row(cid, bucket)
        elif row is None:
            scope = scopes.get(e["scope_id"], _scope_stand_in(e["scope_id"]))
            row = current[cid] = _registry_row(cid, e["scope_id"], scope, e["name"], bucket)
        elif row["scope_id"] == UNKNOWN_SCOPE_ID and kind in NAMING_EVENTS and e["name"]:
            scope = scopes.get(e["scope_id"], _scope_stand_in(e["scope_id"]))
            _rename(row, e["scope_id"], scope, e["name"], bucket)
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
    for row in current.values():  # a scope first known by its id learns its name
        sid = row["scope_id"]
        if sid != UNKNOWN_SCOPE_ID and scopes.get(sid, row["scope"]) != row["scope"]:
            _rename(row, sid, scopes[sid], row["name"], bucket)
    for cid in sorted(change_cids - set(current)):
        current[cid] = _unknown_row(cid, bucket)
        changed = True
    if any(row.get("renamed_from") for row in current.values()):
        _take_names(spark, table, list(current.values()))
        changed = True
    for row in current.values():
        if row["status"] in tables.WITH_TABLES:
            ensure_collection_table(
                spark, row["table_name"], properties, document_variant=document_variant
            )
    if changed or len(current) != len(stored):
        _save_registry(spark, table, list(current.values()))
    return list(current.values())


UNKNOWN_SCOPE_ID = -1
"""The scope id of a collection registered before its create event was seen."""
NAMING_EVENTS = ("create_collection", "flush_collection")
"""System events that carry a collection's name and scope (a flush re-sends its create)."""


def _unknown_row(cid: int, bucket: str) -> dict[str, Any]:
    """The registry row of a collection whose create event was not seen yet."""
    return _registry_row(cid, UNKNOWN_SCOPE_ID, "_unknown", f"collection_{cid:x}", bucket)


def _scope_stand_in(sid: int) -> str:
    """The name a scope is registered under until its create event is seen."""
    return f"scope_{sid}"


def _rename(row: dict[str, Any], sid: int, scope: str, name: str, bucket: str) -> None:
    """``row``'s collection takes the name ``scope.name``; its tables follow
    (:func:`_take_names`), from the name they have in the catalog now."""
    new = BucketTables(bucket).collection(scope, name)
    if new == row["table_name"]:
        row.update(scope_id=sid, scope=scope, name=name)
        return
    row["renamed_from"] = row.get("renamed_from") or row["table_name"]
    row.update(scope_id=sid, scope=scope, name=name, table_name=new)
    if row["renamed_from"] == new:
        row["renamed_from"] = None


def _take_names(spark: SparkSession, registry_table: str, registry: Registry) -> None:
    """The tables of each collection whose name changed (``renamed_from`` set) take the new
    name, exactly once and kill-safe: the registry with the new names (and ``renamed_from``)
    is saved before the first catalog change; each rename is done only when the old table is
    there and the new one is not; the views of the old name go (the new ones are made by
    :func:`ensure_collection_table` and :func:`ensure_projections`); ``renamed_from`` is
    cleared with the next save of the registry. A run killed anywhere in between finds
    ``renamed_from`` still set and finishes."""
    _save_registry(spark, registry_table, registry)
    for row in registry:
        old, new = row.get("renamed_from"), row["table_name"]
        if not old:
            continue
        moves = [
            (tables.all_rows(old), tables.all_rows(new)),
            (tables.history(old), tables.history(new)),
        ]
        if row["status"] not in tables.WITH_TABLES:  # retired: its archived tables
            _, _, old_view = old.partition(".")
            prefix = tables.archived(old_view, row["collection_id"], "")
            for source in archived_tables(spark, row, history=False, name=old) + archived_tables(
                spark, row, history=True, name=old
            ):
                rest = source.partition(".")[2][len(prefix) :]  # <day>[__history]
                day = rest.removesuffix(tables.HISTORY_SUFFIX)
                target = tables.archived(new, row["collection_id"], day) + rest[len(day) :]
                moves.append((source, target))
        for source, target in moves:
            if not spark.catalog.tableExists(source):
                continue  # renamed already (or never made: no history kept)
            if spark.catalog.tableExists(target):
                raise CollectionNameError(
                    f"collection {row['collection_id']} of {registry_table}: its table "
                    f"{source} is to be renamed {target}, which exists already; "
                    "the two tables need a look before a rename (no data was changed)"
                )
            rename = f"ALTER TABLE {source} RENAME TO {target}"
            delta_io.catalog_step(target, partial(spark.sql, rename), "TABLE_OR_VIEW_NOT_FOUND")
        for view in (tables.typed(old), old):
            delta_io.catalog_step(view, partial(spark.sql, f"DROP VIEW IF EXISTS {view}"), "")
        log.info("silver: collection %d took its name: %s (was %s)", row["collection_id"], new, old)
        row["renamed_from"] = None


def archived_tables(
    spark: SparkSession, row: dict[str, Any], *, history: bool, name: str | None = None
) -> list[str]:
    """The tables a retire archived for the collection of registry ``row`` (under its view
    name ``name``, default its own): its ``_all`` tables, or with ``history`` its history
    tables; several only if it was retired on several days (collection ids are not reused)."""
    database, _, view = (name or row["table_name"]).partition(".")
    prefix = tables.archived(view, row["collection_id"], "")
    found = [
        f"{database}.{t.name}"
        for t in spark.catalog.listTables(database)
        if t.name.startswith(prefix)
        and t.tableType != "VIEW"
        and t.name.endswith(tables.HISTORY_SUFFIX) == history
    ]
    return sorted(found)


def _registry_row(cid: int, sid: int, scope: str, name: str, bucket: str) -> dict[str, Any]:
    return {
        "collection_id": cid,
        "scope_id": sid,
        "scope": scope,
        "name": name,
        "table_name": BucketTables(bucket).collection(scope, name),
        "max_ttl": None,
        "history": False,
        "created_uid": None,
        "dropped_uid": None,
        "create_seqnos": {},
        "drop_seqnos": {},
        "flush_seqnos": {},
        "status": "live",
        "updated_at": None,
        "renamed_from": None,
    }


def _table_of(registry: Registry, cid: int) -> str | None:
    for r in registry:
        if r["collection_id"] == cid and r["status"] in tables.WITH_TABLES:
            return tables.all_rows(r["table_name"])
    return None


def retire_dropped(
    spark: SparkSession,
    bucket: str,
    registry: Registry,
    states: dict[int, dict[str, Any]],
    config: AppConfig,
) -> None:
    """A collection whose drop reached every vbucket is retired (archived or dropped).

    Kill-safe: the registry says ``retiring`` before the first catalog change and ``retired``
    after the last. A run killed in between leaves ``retiring``, which no step makes tables
    for and the next run finishes (each step is a no-op when already done)."""
    vbuckets = set(states)
    todo = [
        row
        for row in registry
        if row["status"] == "retiring"
        or (row["status"] == "dropped" and vbuckets <= set(row["drop_seqnos"]))
    ]
    if not todo:
        return
    table = BucketTables(bucket).registry
    if any(row["status"] == "dropped" for row in todo):
        for row in todo:
            row["status"] = "retiring"
        _save_registry(spark, table, registry)
    for row in todo:
        name = row["table_name"]
        if config.silver.retire == "archive":
            stamp = time.strftime("%Y%m%d", time.gmtime())
            archived = tables.archived(name, row["collection_id"], stamp)
            moves = [(tables.all_rows(name), archived)]
            if spark.catalog.tableExists(tables.history(name)):
                moves.append((tables.history(name), tables.history(archived)))
            for source, target in moves:
                if spark.catalog.tableExists(target):  # a concurrent run archived it
                    continue
                rename = f"ALTER TABLE {source} RENAME TO {target}"
                # a concurrent run that renamed it first: the source is gone, or (asked in
                # the other order) the target exists
                delta_io.catalog_step(
                    name,
                    partial(spark.sql, rename),
                    ("TABLE_OR_VIEW_NOT_FOUND", "TABLE_OR_VIEW_ALREADY_EXISTS"),
                )
        else:
            for table in (tables.all_rows(name), tables.history(name)):
                delta_io.catalog_step(name, partial(spark.sql, f"DROP TABLE IF EXISTS {table}"), "")
        for view in (tables.typed(name), name):
            delta_io.catalog_step(view, partial(spark.sql, f"DROP VIEW IF EXISTS {view}"), "")
        row["status"] = "retired"
    _save_registry(spark, table, registry)


# --- MERGEs and deletes --------------------------------------------------------------------


def apply_drops(
    spark: SparkSession, bucket: str, registry: Registry, controls: list[dict[str, Any]]
) -> int:
    """Drops and flushes: a collection's rows in the vbucket below the event's seqno go."""
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
    purges = spark.table(BucketTables(bucket).purges)
    rows = transforms.silver_rows(changes)
    if collection_ids is None:
        found = changes.select("collection_id").distinct().collect()
        collection_ids = [r["collection_id"] for r in found]
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
    if len(targets) == 1:
        counts = [merge(*targets[0])]
    else:
        # Every MERGE reads its source twice (the keys it touches, then the rows it writes),
        # and Delta copies a source that is not a plain Delta scan first, a job per MERGE,
        # lest the two reads differ. For several collections the newest rows of all of them
        # are copied once (a local checkpoint: fixed blocks, spilled to disk rather than
        # dropped, freed by Spark's cleaner once unreferenced; Delta refuses a cached source
        # without its own copy), and the MERGEs read that: a MERGE of a thousand rows took
        # 3-5 s with its copy, 1.3-1.8 s without (2 cores). One MERGE keeps Delta's own copy.
        rows = rows.localCheckpoint(eager=True)
        with delta_io.session_conf(spark, {MATERIALIZE_SOURCE: "none"}):
            if overlap > 1:
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
    rebuilt = 0
    for reg in registry:
        if reg["status"] not in tables.WITH_TABLES:
            continue
        table = tables.all_rows(reg["table_name"])
        batch = rows.where(F.col("_collection_id") == reg["collection_id"])
        affected = transforms.rolled_back_keys(spark.table(table), point_df, batch)
        if affected.isEmpty():
            continue
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
        if r["kind"] == "rollback":
            vb, seqno = r["vbucket"], r["rollback_seqno"]
            points[vb] = min(points.get(vb, seqno), seqno)
        elif r["kind"] == "system_event" and r["event"] in _END_KINDS:
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


def _merge_copied(spark: SparkSession, merge: Any) -> Any:
    """Execute a MERGE whose source is a local checkpoint already (no copy of it by Delta)."""
    with delta_io.session_conf(spark, {MATERIALIZE_SOURCE: "none"}):
        return merge.execute()


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

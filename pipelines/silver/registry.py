"""Silver's collection registry and the tables and views it names: the support tables (registry,
stream state, purge marks), each collection's ``_all`` table, view and typed projections, and
their renames and retirement, each kill-safe.

System events (docs/protocol/dcp.md §6.7) change the registry (:func:`update_registry`); a collection is
known by its id until its create event names it, and its tables follow a rename
(:func:`_take_names`). The MERGEs into these tables are :mod:`pipelines.silver.store`'s.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from dcp_cdc.config import AppConfig, ProjectionConfig
from pipelines import schemas, tables
from pipelines.errors import CollectionNameError
from pipelines.lake import delta_io
from pipelines.lake.delta_io import metric, replace_rows, with_retry
from pipelines.silver import transforms
from pipelines.silver.state import replace_from_driver, small_table_rows
from pipelines.silver.walk import RowKind
from pipelines.tables import BucketTables

log = logging.getLogger(__name__)

Registry = list[dict[str, Any]]
"""The registry's rows (:data:`pipelines.schemas.REGISTRY`) as dictionaries."""

# --- tables and views ----------------------------------------------------------------------


def ensure_support_tables(
    spark: SparkSession, bucket: str, properties: dict[str, str], *, live: bool = False
) -> None:
    """The registry, stream state and purge marks of ``bucket`` exist (with ``live``, the
    live layer's pending table too)."""
    names = BucketTables(bucket)
    delta_io.ensure_database(spark, names.registry)
    support = (
        (names.registry, schemas.REGISTRY),
        (names.stream_state, schemas.STATE),
        (names.purges, schemas.PURGES),
        *([(names.pending, schemas.PENDING)] if live else []),
    )

    def create(made: tuple[str, StructType]) -> None:
        table, schema = made
        by = schemas.PENDING_PARTITIONS if table == names.pending else ()
        made_with = {**delta_io.FREQUENT_COMMITS, **properties}
        delta_io.create_table(spark, table, schema, made_with, partitioned_by=by)

    delta_io.each_at_once(create, support)
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


@dataclass(frozen=True)
class Overlay:
    """What a collection's view overlays on its table with the live layer on
    (:func:`pipelines.silver.transforms.overlay_query`)."""

    pending: str
    purges: str
    collection_id: int

    @classmethod
    def of(cls, bucket: str, collection_id: int) -> Overlay:
        names = BucketTables(bucket)
        return cls(names.pending, names.purges, collection_id)


def view_query(table: str, columns: list[str], overlay: Overlay | None) -> str:
    """The query of the view of live documents over the ``_all`` table ``table`` (whose
    columns are ``columns``): its rows, or with ``overlay`` its rows overlaid with the
    pending ones; tombstones and expired documents left out."""
    rows = table
    if overlay is not None:
        overlaid = transforms.overlay_query(
            table, overlay.pending, overlay.purges, overlay.collection_id, columns
        )
        rows = f"({overlaid})"
    return f"SELECT * FROM {rows} WHERE {tables.LIVE_ROWS}"


def ensure_collection_table(
    spark: SparkSession,
    name: str,
    properties: dict[str, str],
    *,
    document_variant: bool = False,
    overlay: Overlay | None = None,
) -> None:
    """The ``_all`` table of the collection whose view is ``name``, and the view, exist, with
    every column of :data:`pipelines.schemas.SILVER` (a table of an earlier version gains
    those it lacks, and its view follows); the change data feed is on unless ``properties``
    say otherwise. With ``document_variant`` the table has
    :data:`pipelines.schemas.DOCUMENT_VARIANT` too: a table without it gains it, filled for
    the rows it holds (:func:`fill_document_variant`). Without, a table that has it keeps it
    (and the MERGEs keep it filled: :func:`transforms.merge_values`). With ``overlay`` the
    view shows the live layer's pending rows over the table (:func:`view_query`)."""
    table = tables.all_rows(name)
    schema = schemas.SILVER_VARIANT if document_variant else schemas.SILVER
    delta_io.create_table(
        spark,
        table,
        schema,
        {CHANGE_DATA_FEED: "true", **properties},
        cluster_by=("_vbucket", "key"),
    )
    # The view shows what the table had when it was made, and a table only gains columns: a
    # view with them all (a catalog lookup) says the table has them too, with no Delta read.
    # (A table that has the VARIANT keeps it when the setting is turned off: so does its view.)
    found = delta_io.view_metadata(spark, name)
    shown = found[1] if found is not None else []
    if (
        found is not None
        and set(schema.fieldNames()) <= set(shown) <= set(schemas.SILVER_VARIANT.fieldNames())
        and found[0] == view_query(table, shown, overlay)
    ):
        return
    delta_io.add_missing_columns(spark, table, schema)
    if document_variant and found is not None and schemas.DOCUMENT_VARIANT not in found[1]:
        # the view is made again after the fill: a run killed before it fills again
        fill_document_variant(spark, table)
    columns = spark.table(table).columns
    delta_io.ensure_view(spark, name, view_query(table, columns, overlay), columns)


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


# --- the registry --------------------------------------------------------------------------


def read_registry(spark: SparkSession, bucket: str) -> Registry:
    """The registry's rows; none when the bucket has no registry yet."""
    table = BucketTables(bucket).registry
    if not spark.catalog.tableExists(table):
        return []
    return small_table_rows(spark, table, schemas.REGISTRY)


def _save_registry(spark: SparkSession, table: str, registry: Registry) -> None:
    now = dt.datetime.now(dt.UTC)
    if replace_from_driver(
        spark, table, [{**r, "updated_at": now} for r in registry], schemas.REGISTRY
    ):
        return
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
    stored: Registry | None = None,
    ensured: set[str] | None = None,
    live: bool = False,
) -> tuple[Registry, bool]:
    """Apply committed system events to the collection registry; create new tables (with
    ``document_variant``: :func:`ensure_collection_table`). Returns the registry and whether
    it was saved.

    ``stored``: the registry's rows as the caller knows the table holds them (else read);
    ``ensured``: the collection tables the caller made or checked already, which are not
    checked again (and to which those checked now are added); ``live``: the views overlay
    the live layer's pending rows (:class:`Overlay`).

    A collection whose changes arrive without its create event (a stream that started after
    it, or files that arrive newest first) is registered as ``_unknown.collection_<id hex>``
    rather than losing its changes; when its create event arrives, it takes its name (and a
    scope registered by its id alone, ``scope_<id>``, takes the name its create event gives):
    :func:`_take_names` renames its tables, kill-safe.
    """
    table = BucketTables(bucket).registry
    if stored is None:
        stored = small_table_rows(spark, table, schemas.REGISTRY)
    current = {r["collection_id"]: r for r in stored}
    scopes = {0: "_default"}
    for r in current.values():  # a scope's name from its create event wins over its stand-in
        if scopes.get(r["scope_id"], _scope_stand_in(r["scope_id"])) == _scope_stand_in(
            r["scope_id"]
        ):
            scopes[r["scope_id"]] = r["scope"]
    if 0 not in current:
        current[0] = _registry_row(0, 0, "_default", "_default", bucket)
    events = sorted(
        (r for r in controls if r["kind"] == RowKind.SYSTEM_EVENT),
        key=lambda r: (r["vbucket"], r["by_seqno"]),
    )
    for e in events:
        if e["event"] == "create_scope" and e["scope_id"] is not None:
            scopes[e["scope_id"]] = e["name"]
    changed = _apply_events(current, scopes, events, bucket)
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
    wanted = [
        row
        for row in current.values()
        if row["status"] in tables.WITH_TABLES
        and (ensured is None or row["table_name"] not in ensured)
    ]
    made = partial(ensure_collection_table, spark, properties=properties)
    delta_io.each_at_once(
        lambda row: made(
            row["table_name"],
            document_variant=document_variant,
            overlay=Overlay.of(bucket, row["collection_id"]) if live else None,
        ),
        wanted,
    )
    if ensured is not None:
        ensured.update(row["table_name"] for row in wanted)
    saved = changed or len(current) != len(stored)
    if saved:
        _save_registry(spark, table, list(current.values()))
    return list(current.values()), saved


def _apply_events(
    current: dict[int, dict[str, Any]],
    scopes: dict[int, str],
    events: list[dict[str, Any]],
    bucket: str,
) -> bool:
    """The collection system ``events`` (in vbucket and seqno order) applied to the registry
    rows ``current`` (by collection id; ``scopes``: scope names by id); whether any was."""
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
    return changed


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


def retire_dropped(
    spark: SparkSession,
    bucket: str,
    registry: Registry,
    states: dict[int, dict[str, Any]],
    config: AppConfig,
) -> bool:
    """A collection whose drop reached every vbucket is retired (archived or dropped); returns
    whether one was (the registry and the catalog changed).

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
        return False
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
    return True

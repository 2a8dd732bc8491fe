"""Pure DataFrame → DataFrame steps of the silver apply (no reads, writes or collects).

:mod:`pipelines.silver.state`, :mod:`pipelines.silver.registry` and
:mod:`pipelines.silver.store` read the tables, run these and write what they give;
:mod:`pipelines.silver.job` says in which order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dcp_cdc.config import ProjectionColumn
from dcp_cdc.events import DATA_OPS
from dcp_cdc.protocol import HLC_COUNTER_MASK
from pipelines import schemas
from pipelines.bronze.transforms import vb_key
from pipelines.silver.walk import CHANGE_OF
from pipelines.silver.walk_columns import walk_vbuckets

WALK_OPS = [
    *DATA_OPS,
    "snapshot_marker",
    "oso_snapshot",
    "seqno_advanced",
    "system_event",
    "stream_end",
    "stream_request_response",
]

WALK_COLUMNS = [
    "op",
    "vbucket",
    "status",
    "opaque",
    "session_started_at",
    "session_id",
    "file_sequence",
    "offset",
    "by_seqno",
    "rev_seqno",
    "cas",
    "flags",
    "expiration",
    "collection_id",
    "key",
    "value",
    "xattrs",
    "is_json",
    "start_seqno",
    "end_seqno",
    "purge_seqno",
    "event",
    "scope_id",
    "name",
    "manifest_uid",
    "max_ttl",
    "history",
    "oso_flags",
    "rollback_seqno",
    "failover_log",
    "in_vb_uuid",
    "ingest_run_id",
    "run_version",
]
"""The columns of a frame the walk reads (with ``vb_key``, its saved state and the newest run
read: :func:`keyed_frames`)."""


# --- what the walk reads -------------------------------------------------------------------


def finished_runs(ingest_log: DataFrame) -> DataFrame:
    """``ingest_run_id → run_version`` of the bronze runs that finished."""
    return (
        ingest_log.where(F.col("status") == "ingested")
        .select("ingest_run_id", "run_version")
        .distinct()
    )


def walk_input(events: DataFrame, runs: DataFrame) -> DataFrame:
    """The bronze events the walk reads (of finished runs only), with the ``run_version`` of
    their ingest run and the stream they belong to (``vb_key``)."""
    return (
        events.where(F.col("op").isin(WALK_OPS))
        .join(F.broadcast(runs), on="ingest_run_id", how="inner")
        .withColumn("vb_key", vb_key())
    )


# --- the walk ------------------------------------------------------------------------------


WALK_GROUPS = 64
"""The groups the walk's ``applyInArrow`` gets at most: vbucket ``v`` is in group ``v % 64``.
With Couchbase's 1,024 vbuckets a group holds 16 of them; each group costs Spark an Arrow
stream each way and the function a call, which one vbucket's few frames a micro-batch brings
did not pay for."""


def keyed_frames(frames: DataFrame, saved: DataFrame, read_through: int | None) -> DataFrame:
    """The walk's input rows: the frames' walked columns and ``vb_key``, each with its
    vbucket's ``saved_state`` and ``late_after`` (``saved``; none: it starts fresh) and the
    newest run read (``read_through``)."""
    return (
        frames.select(*WALK_COLUMNS, "vb_key")
        .where(F.col("vb_key").isNotNull())
        .join(F.broadcast(saved), on="vb_key", how="left")
        .withColumn("read_through", F.lit(read_through).cast("long"))
    )


def walk_frames(
    frames: DataFrame,
    saved: DataFrame,
    *,
    eager: bool = False,
    read_through: int | None = None,
) -> DataFrame:
    """Each vbucket's frames walked (``applyInArrow``) from its ``saved_state`` (``saved``:
    ``vb_key``, ``saved_state`` JSON; a vbucket without one starts fresh), knowing the newest
    run read (``read_through``, :func:`pipelines.silver.walk.next_position`): the rules of
    :mod:`pipelines.silver.walk` over the group's columns
    (:func:`pipelines.silver.walk_columns.walk_vbuckets`, :data:`WALK_GROUPS` groups of
    vbuckets), each vbucket's versions summed up on its ``state`` row
    (:func:`pipelines.silver.walk_summary.summarize`). Rows of :data:`pipelines.schemas.WALKED`."""
    keyed = keyed_frames(frames, saved, read_through).withColumn(
        "_walk_group", F.col("vb_key") % WALK_GROUPS
    )
    out_schema = schemas.arrow_schema(schemas.WALKED)
    return keyed.groupBy("_walk_group").applyInArrow(
        lambda table: walk_vbuckets(table.drop_columns(["_walk_group"]), out_schema, eager),
        schemas.WALKED,
    )


# --- silver rows ---------------------------------------------------------------------------


def silver_rows(changes: DataFrame, run_column: str = "ingest_run_id") -> DataFrame:
    """Walked change rows → the silver table's columns, newest change per key only."""
    newest = Window.partitionBy("collection_id", "key").orderBy(
        F.col("by_seqno").desc(), F.col("rev_seqno").desc()
    )
    ranked = changes.withColumn("_rank", F.row_number().over(newest)).where(F.col("_rank") == 1)
    return version_rows(ranked, run_column)


def newest_rows(rows: DataFrame) -> DataFrame:
    """Silver rows (several per key: the live layer's pending rows) → the newest per
    collection and key, as :func:`silver_rows` chooses among changes."""
    newest = Window.partitionBy("_collection_id", "key").orderBy(
        F.col("_seqno").desc(), F.col("_rev_seqno").desc()
    )
    ranked = rows.withColumn("_rank", F.row_number().over(newest))
    return ranked.where(F.col("_rank") == 1).drop("_rank")


def version_rows(changes: DataFrame, run_column: str = "ingest_run_id") -> DataFrame:
    """Walked change rows → the silver table's columns, one row per change."""
    deleted = F.col("op") != "mutation"
    change = F.create_map(*[F.lit(x) for kv in CHANGE_OF.items() for x in kv])[F.col("op")]
    user_xattrs = F.map_filter("xattrs", lambda k, _: ~k.startswith("_"))
    return changes.select(
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
        modified_at("cas").alias("_modified_at"),
    )


def merge_values(table_columns: list[str]) -> dict[str, str | Column]:
    """What a MERGE writes into a silver table whose columns are ``table_columns``: each
    column of :func:`silver_rows` from the source row ``s``, and, when the table has it
    (``[silver] document_variant``), :data:`pipelines.schemas.DOCUMENT_VARIANT` parsed from
    ``s.doc``. Parsed in the MERGE's write, not in the source: only the rows written are
    parsed, the source (which Delta copies first) carries no VARIANT, and a table that has
    the column gets it filled whatever the setting says now (a column filled for some rows
    only would disagree with ``doc``). ``try_parse_json``: a value flagged JSON that is not gives null
    rather than failing the MERGE."""
    values: dict[str, str | Column] = {c: f"s.{c}" for c in schemas.SILVER.fieldNames()}
    if schemas.DOCUMENT_VARIANT in table_columns:
        values[schemas.DOCUMENT_VARIANT] = "try_parse_json(s.doc)"
    return values


def modified_at(cas: str) -> Column:
    """The time of a change by its CAS column ``cas`` (a signed long), as
    :func:`dcp_cdc.protocol.cas_time` says: the hybrid logical clock's nanoseconds with the
    counter bits masked off, to the microsecond (integer division: a double would lose the
    microseconds of a 61-bit value); null for CAS 0 and for CAS values of 2**63 and more
    (negative as a long)."""
    mask = ~HLC_COUNTER_MASK
    return F.expr(f"CASE WHEN {cas} > 0 THEN timestamp_micros(({cas} & {mask}) div 1000) END")


def projection_query(
    view: str, columns: list[ProjectionColumn], *, document_variant: bool = False
) -> str:
    """The query of a typed view over the collection view ``view``: ``key``, each of
    ``columns`` read from the document at its path as its type (null where the path is
    missing or its value does not convert), then ``_modified_at``, ``_seqno``, ``_vbucket``.
    The document is the view's :data:`pipelines.schemas.DOCUMENT_VARIANT` when it has one
    (``document_variant``), else ``doc`` parsed once per row, as a VARIANT; a binary document
    reads as nulls. The paths and names were checked by the configuration (no quote can reach
    the SQL)."""
    document = schemas.DOCUMENT_VARIANT if document_variant else "try_parse_json(doc)"
    typed = ", ".join(
        f"try_variant_get(_document, '{c.path}', '{c.type}') AS {c.name}" for c in columns
    )
    return (
        f"SELECT key, {typed}, _modified_at, _seqno, _vbucket "
        f"FROM (SELECT *, {document} AS _document FROM {view})"
    )


def merge_source(rows: DataFrame, collection_id: int, purges: DataFrame, table: str) -> DataFrame:
    """One collection's silver rows with the tombstone-purge mark of their vbucket in
    ``table`` (``_purged_through``, null where none; ``purges`` is the marks table)."""
    marks = purges.where(F.col("table_name") == table).select(
        F.col("vbucket").alias("_vbucket"),
        F.col("purged_through_seqno").alias("_purged_through"),
    )
    return rows.where(F.col("_collection_id") == collection_id).join(
        F.broadcast(marks), on="_vbucket", how="left"
    )


# --- the live layer ------------------------------------------------------------------------


TABLE_LABEL = "table"
"""The column of :func:`overlays_query`'s rows that names the table (its source's label)."""
_LABEL = f"`{TABLE_LABEL}`"


@dataclass(frozen=True)
class OverlaySource:
    """One collection's ``_all`` table in an overlay (:func:`overlays_query`): ``relation``
    (the table, maybe with a time-travel clause: ``silver.t_all VERSION AS OF 12``), ``name``
    (the table's name, by which its purge marks are found), the ``collection_id`` whose
    pending rows it gets and the ``label`` its rows carry in the ``table`` column."""

    relation: str
    name: str
    collection_id: int
    label: str = ""
    empty: bool = False
    """The table holds no row as ``relation`` reads it: only its pending rows are read."""


def overlay_query(
    table: str,
    pending: str,
    purges: str,
    collection_id: int,
    columns: list[str],
    *,
    name: str | None = None,
) -> str:
    """The rows of collection ``collection_id`` as its MERGEs would leave ``table`` (its
    ``_all`` table) once the live layer's rows in ``pending`` are compacted into it, in
    ``table``'s ``columns``: :func:`overlays_query` of one table. ``table``, ``pending`` and
    ``purges`` may be relations with a time-travel clause; ``name`` is then the ``_all``
    table's name."""
    source = OverlaySource(table, name or table, collection_id)
    return overlays_query([source], pending, purges, columns, labelled=False)


def overlays_query(
    sources: Sequence[OverlaySource],
    pending: str,
    purges: str,
    columns: list[str],
    *,
    labelled: bool = True,
) -> str:
    """The rows of every table of ``sources`` as the MERGEs would leave it once the live
    layer's rows in ``pending`` are compacted into it, in the tables' ``columns``
    (tombstones and expired rows included, as in the tables), and with ``labelled`` a
    ``table`` column of each source's label. One query reads ``pending`` and ``purges``
    once for all the tables, and each table once per side of the overlay.

    The rule is the MERGE's (:func:`pipelines.silver.store.merge_rows`), per collection: a
    key's newest pending row (by seqno) replaces the table's row when its seqno is higher,
    and is added when the table has no row for the key unless its seqno is at or below its
    vbucket's tombstone-purge mark in ``purges``. A pending row the table already holds
    (compacted, not yet removed from ``pending``) changes nothing, so a read between a
    compaction's MERGE and its removal of the rows sees each key once. ``pending`` is small
    (compaction keeps it so): both joins broadcast its rows, and the tables are read as
    plain scans; a source marked ``empty`` is not read at all (a table the live layer has
    not compacted into yet costs its reader no snapshot and no file listing)."""
    label = [_LABEL] if labelled else []
    picked = ", ".join(
        f"try_parse_json(doc) AS {c}" if c == schemas.DOCUMENT_VARIANT else c
        for c in dict.fromkeys([*columns, "key", "_seqno", "_vbucket"])
    )
    ids = ", ".join(str(int(s.collection_id)) for s in sources)
    src = ", ".join(
        f"({int(s.collection_id)}, {sql_text(s.name)}, {sql_text(s.label)})" for s in sources
    )
    read = ", ".join(dict.fromkeys([*columns, "key", "_seqno", "_vbucket"]))
    tables = " UNION ALL ".join(
        f"SELECT {read}, {int(s.collection_id)} AS _t_cid, "
        f"{sql_text(s.label)} AS {_LABEL} FROM {s.relation}"
        for s in sources
        if not s.empty
    )
    if not tables:  # no table to read: no row, in the tables' columns
        tables = (
            f"SELECT {picked}, CAST(NULL AS BIGINT) AS _t_cid, "
            f"CAST(NULL AS STRING) AS {_LABEL} FROM {pending} WHERE false"
        )
    newest = (
        f"SELECT *, row_number() OVER (PARTITION BY _collection_id, key"
        f" ORDER BY _seqno DESC, _rev_seqno DESC) AS _rank FROM {pending}"
        f" WHERE _collection_id IN ({ids})"
    )
    names = ", ".join(sql_text(s.name) for s in sources)
    out_t = ", ".join(f"t.{c}" for c in [*columns, *label])
    out_p = ", ".join(f"p.{c}" for c in [*columns, *label])
    return (
        f"WITH s AS (SELECT * FROM VALUES {src} AS s(_s_cid, _s_name, {_LABEL})), "
        f"p AS (SELECT /*+ BROADCAST(s) */ {picked}, _collection_id AS _p_cid, _s_name, "
        f"s.{_LABEL} FROM ({newest}) n JOIN s ON n._collection_id = s._s_cid "
        f"WHERE _rank = 1), "
        f"t AS ({tables}), "
        f"h AS (SELECT /*+ BROADCAST(p) */ p._p_cid AS _h_cid, p.key AS _h_key, "
        f"t._seqno AS _h_seqno FROM t JOIN p ON t._t_cid = p._p_cid AND t.key = p.key), "
        f"m AS (SELECT table_name AS _m_name, vbucket AS _m_vbucket, "
        f"purged_through_seqno AS _m_seqno FROM {purges} WHERE table_name IN ({names})) "
        f"SELECT /*+ BROADCAST(p) */ {out_t} FROM t "
        f"LEFT ANTI JOIN p ON t._t_cid = p._p_cid AND t.key = p.key AND p._seqno > t._seqno "
        f"UNION ALL "
        f"SELECT {out_p} FROM p "
        f"LEFT JOIN h ON h._h_cid = p._p_cid AND h._h_key = p.key "
        f"LEFT JOIN m ON m._m_name = p._s_name AND m._m_vbucket = p._vbucket "
        f"WHERE p._seqno > h._h_seqno "
        f"OR (h._h_seqno IS NULL AND (m._m_seqno IS NULL OR p._seqno > m._m_seqno))"
    )


def sql_text(value: str) -> str:
    """``value`` as a SQL string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


# --- rollbacks -----------------------------------------------------------------------------


def rolled_back_keys(rows: DataFrame, points: DataFrame, batch: DataFrame) -> DataFrame:
    """The keys of a collection table applied above their vbucket's rollback point
    (``points``: ``p_vb``, ``p_seqno``): ``key``, ``vb``, ``p_seqno``.

    A key whose row already is where the run's own changes take it (``batch``: the run's
    silver rows of the collection, newest per key) is left out: the row was written by an
    earlier attempt of this run, killed before it saved its position, and rewinding it only
    to apply the same change again would publish an older state in between. Same vb uuid and
    a seqno at or below the batch's: the row is on the branch the batch continues.
    """
    ahead = batch.select(
        F.col("key").alias("b_key"),
        F.col("_vb_uuid").alias("b_uuid"),
        F.col("_seqno").alias("b_seqno"),
    )
    above = rows.join(
        F.broadcast(points),
        (F.col("_vbucket") == F.col("p_vb")) & (F.col("_seqno") > F.col("p_seqno")),
    )
    return above.join(
        ahead,
        (F.col("key") == F.col("b_key"))
        & F.col("_vb_uuid").eqNullSafe(F.col("b_uuid"))
        & (F.col("_seqno") <= F.col("b_seqno")),
        how="left_anti",
    ).select("key", F.col("_vbucket").alias("vb"), "p_seqno")


def restored_rows(
    events: DataFrame,
    collection_id: int,
    points: DataFrame,
    branches: DataFrame,
    affected: DataFrame,
) -> DataFrame:
    """What each ``affected`` key returns to: its newest data event in bronze ``events`` at or
    below the rollback point whose vb uuid's branch (``branches``: ``b_vb``, ``b_uuid``,
    ``b_start``, ``b_end``) covers that seqno, as a silver row with ``_found``; a key with no
    such event did not exist at the point and gets a row of nulls (no ``_found``)."""
    history = (
        events.where(F.col("op").isin(*DATA_OPS) & (F.col("collection_id") == collection_id))
        .withColumn("vbucket", F.col("vbucket").cast("int"))
        .join(
            F.broadcast(points),
            (F.col("vbucket") == F.col("p_vb")) & (F.col("by_seqno") <= F.col("p_seqno")),
        )
        .join(
            F.broadcast(branches),
            (F.col("vbucket") == F.col("b_vb"))
            & (F.col("in_vb_uuid") == F.col("b_uuid"))
            & (F.col("by_seqno") >= F.col("b_start"))
            & (F.col("b_end").isNull() | (F.col("by_seqno") <= F.col("b_end"))),
        )
        .join(
            affected.select(F.col("key").alias("k"), F.col("vb").alias("a_vb")),
            (F.col("key").cast("string") == F.col("k")) & (F.col("vbucket") == F.col("a_vb")),
        )
    )
    restored = silver_rows(history).withColumn("_found", F.lit(True))
    return (
        affected.select("key")
        .join(restored, on="key", how="left")
        .select("key", *[c for c in restored.columns if c != "key"])
    )


# --- history (SCD type 2) ------------------------------------------------------------------

ENDS = "e_vb INT, e_seqno LONG, e_kind STRING, e_cas LONG"
"""The drops and flushes of a collection a run committed: vbucket, seqno, ``drop`` or
``flush``, and the CAS of the vbucket's last change before it (``e_cas``)."""

_END = T.StructType(
    [
        T.StructField("seqno", T.LongType()),
        T.StructField("kind", T.StringType()),
        T.StructField("at", T.TimestampType()),
    ]
)
_CLOSED = ("drop", "flush")


def history_fixes(rows: DataFrame, points: DataFrame, batch: DataFrame) -> DataFrame:
    """What the rollbacks ``points`` (``p_vb``, ``p_seqno``) do to a history table's ``rows``:
    a version above its point is on the abandoned branch and goes (``_abandoned``), unless the
    run's own versions (``batch``) have it with the same vb uuid (an earlier attempt of this
    run, killed before it saved its position, wrote it); a version ended by a drop or flush
    above the point is open again (``_reopen``: that event is undone too); a version ended by a
    version above the point is recomputed with its key. ``key``, ``_seqno``, ``_abandoned``,
    ``_reopen``."""
    mine = batch.select(
        F.col("key").alias("b_key"),
        F.col("_seqno").alias("b_seqno"),
        F.col("_vb_uuid").alias("b_uuid"),
    )
    above = F.col("_seqno") > F.col("p_seqno")
    return (
        rows.join(
            F.broadcast(points),
            (F.col("_vbucket") == F.col("p_vb"))
            & (above | (F.col("_valid_to_seqno") > F.col("p_seqno"))),
        )
        .join(
            mine,
            (F.col("key") == F.col("b_key"))
            & (F.col("_seqno") == F.col("b_seqno"))
            & F.col("_vb_uuid").eqNullSafe(F.col("b_uuid")),
            how="left_anti",
        )
        .select(
            "key",
            "_seqno",
            above.alias("_abandoned"),
            (~above & F.col("_ended_by").isin(*_CLOSED)).alias("_reopen"),
        )
    )


def open_at_ends(rows: DataFrame, ends: DataFrame) -> DataFrame:
    """The keys of a history table's ``rows`` with a version open at one of ``ends``
    (:data:`ENDS`): a drop or flush ends them."""
    return (
        rows.join(
            F.broadcast(ends),
            (F.col("_vbucket") == F.col("e_vb"))
            & (F.col("_seqno") < F.col("e_seqno"))
            & (F.col("_valid_to_seqno").isNull() | (F.col("_valid_to_seqno") > F.col("e_seqno"))),
        )
        .select("key")
        .distinct()
    )


def history_chain(stored: DataFrame, new: DataFrame, ends: DataFrame) -> DataFrame:
    """The history rows to write for a set of keys: ``stored`` (every stored version of the
    keys) and ``new`` (the run's versions, :func:`version_rows`) as one row per version
    (``key``, ``_seqno``; a version stored already keeps its row: replays add nothing), with
    each version's end recomputed (:data:`pipelines.schemas.HISTORY_CHAIN`), keeping only the
    rows that are new (``_stored`` false) or whose end changed.

    A version ends at the key's next version, or at a drop or flush of the collection in its
    vbucket before that: one of the run's ``ends`` (:data:`ENDS`), or one that ended a stored
    version of the key (kept in that row). A version after nothing, a deletion or such an end
    is an ``insert``; deletions and expirations keep their kind."""
    columns = schemas.HISTORY.fieldNames()
    chain = list(schemas.HISTORY_CHAIN)
    versions = _one_row_per_version(stored, new, columns, chain)
    run_ends = _ends_by_vbucket(ends)
    own_end = F.when(
        F.col("_ended_by").isin(*_CLOSED),
        F.struct(
            F.col("_valid_to_seqno").alias("seqno"),
            F.col("_ended_by").alias("kind"),
            F.col("_valid_to").alias("at"),
        ),
    )
    by_key = Window.partitionBy("key")
    in_order = by_key.orderBy("_seqno")
    ends_of_key = F.concat(
        F.collect_list(own_end).over(by_key),
        F.coalesce(F.col("_run_ends"), F.array().cast(T.ArrayType(_END))),
    )
    next_end = F.array_min(F.filter("_ends", lambda e: e["seqno"] > F.col("_seqno")))
    next_seqno = F.lead("_seqno").over(in_order)
    ended = F.col("_next_end").isNotNull() & (
        F.col("_next_seqno").isNull() | (F.col("_next_end.seqno") < F.col("_next_seqno"))
    )
    first = F.lag("_seqno").over(in_order).isNull()
    after_end = F.lag("_ended_by").over(in_order).isin(*_CLOSED)
    return (
        versions.join(F.broadcast(run_ends), F.col("_vbucket") == F.col("e_vb"), "left")
        .withColumn("_ends", ends_of_key)
        .withColumn("_next_end", next_end)
        .withColumn("_next_seqno", next_seqno)
        .withColumn("_next_at", F.lead("_modified_at").over(in_order))
        .withColumn(
            "_valid_to_seqno",
            F.when(ended, F.col("_next_end.seqno")).otherwise(F.col("_next_seqno")),
        )
        .withColumn(
            "_valid_to",
            # an event's time is its vbucket's last change before it: at least the version's
            F.when(ended, F.greatest("_next_end.at", "_modified_at")).otherwise(F.col("_next_at")),
        )
        .withColumn(
            "_ended_by",
            F.when(ended, F.col("_next_end.kind")).when(
                F.col("_next_seqno").isNotNull(), F.lit("change")
            ),
        )
        .withColumn(
            "_change",
            F.when(F.col("_deleted"), F.col("_change"))
            .when(first | F.lag("_deleted").over(in_order) | after_end, F.lit("insert"))
            .otherwise(F.lit("update")),
        )
        .where(~F.col("_stored") | ~F.struct(*chain).eqNullSafe(F.col("_was")))
        .select(*columns, "_stored")
    )


def _one_row_per_version(
    stored: DataFrame, new: DataFrame, columns: list[str], chain: list[str]
) -> DataFrame:
    """``stored`` and ``new`` history rows (in ``columns``) as one row per version (``key``,
    ``_seqno``; a version stored already keeps its row), ``_stored`` saying which, with
    ``_was``: the version's ``chain`` columns as they are."""
    fresh = new.select(
        *[
            F.col(c) if c in new.columns else F.lit(None).cast(schemas.HISTORY[c].dataType).alias(c)
            for c in columns
        ],
        F.lit(False).alias("_stored"),
    )
    one = Window.partitionBy("key", "_seqno").orderBy(F.col("_stored").desc())
    return (
        stored.select(*columns, F.lit(True).alias("_stored"))
        .unionByName(fresh)
        .withColumn("_n", F.row_number().over(one))
        .where(F.col("_n") == 1)
        .withColumn("_was", F.struct(*chain))
    )


def _ends_by_vbucket(ends: DataFrame) -> DataFrame:
    """The run's ``ends`` (:data:`ENDS`) as one row per vbucket: ``e_vb``, and ``_run_ends``,
    its ends as (``seqno``, ``kind``, ``at``: the time of the CAS before it)."""
    return ends.groupBy("e_vb").agg(
        F.collect_list(
            F.struct(
                F.col("e_seqno").alias("seqno"),
                F.col("e_kind").alias("kind"),
                modified_at("e_cas").alias("at"),
            )
        ).alias("_run_ends")
    )


# --- tombstone purge -----------------------------------------------------------------------


def old_tombstone(retention_hours: int) -> str:
    """The condition of a tombstone applied more than ``retention_hours`` ago."""
    return f"_deleted AND _applied_at < current_timestamp() - INTERVAL {retention_hours} HOURS"


def purge_marks(rows: DataFrame, table: str, condition: str) -> DataFrame:
    """The purge marks (:data:`pipelines.schemas.PURGES`) of removing ``table``'s rows that
    meet ``condition``: per vbucket, the highest seqno among them."""
    return (
        rows.where(condition)
        .groupBy(F.col("_vbucket").alias("vbucket"))
        .agg(F.max("_seqno").alias("purged_through_seqno"))
        .select(
            F.lit(table).alias("table_name"),
            "vbucket",
            "purged_through_seqno",
            F.current_timestamp().alias("purged_at"),
        )
    )

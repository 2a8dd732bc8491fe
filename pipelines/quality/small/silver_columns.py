"""Silver's side of the columnar check: the stream state, the registry's collection names,
and every row of the collection tables as the views show them (:func:`.read.silver_side`'s),
as one Arrow table. A key with a pending row of the live layer goes through the row overlay
(:func:`pipelines.silver.rows_read.overlay`); the others are the ``_all`` tables' rows as
they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession

from pipelines import tables
from pipelines.lake.delta_rs import read_rows, read_table, spark_rows
from pipelines.quality.silver_side import ROWS_COLUMNS
from pipelines.quality.small.read import silver_names
from pipelines.silver.rows_read import overlay
from pipelines.tables import BucketTables

Row = dict[str, Any]
_READ = tuple(dict.fromkeys([*ROWS_COLUMNS, "key", "_seqno", "_vbucket", "_rev_seqno"]))


@dataclass(frozen=True)
class SilverColumns:
    states: list[Row]
    rows: pa.Table  # ROWS_COLUMNS and table (the view's name)
    names: list[Row]


def silver_columns(spark: SparkSession, bucket: str, at: Mapping[str, int]) -> SilverColumns:
    """Silver's side of ``bucket`` at ``at`` (the versions the check pinned)."""
    names = BucketTables(bucket)
    states, known, sources = silver_names(spark, bucket, at)
    pending = pa.schema([_field(c) for c in _READ]).empty_table()
    purges: list[Row] = []
    if sources and spark.catalog.tableExists(names.pending):
        pending = read_table(spark, names.pending, _READ, at.get(names.pending))
        purges = read_rows(
            spark, names.purges, ("table_name", "vbucket", "purged_through_seqno"), at
        )
    parts = [
        _view_rows(
            read_table(spark, tables.all_rows(view), _READ, at.get(tables.all_rows(view))),
            view,
            cid,
            pending,
            purges,
        )
        for view, cid in sources
    ]
    schema = pa.schema([*(_field(c) for c in ROWS_COLUMNS), pa.field("table", pa.string())])
    rows = pa.concat_tables([p.cast(schema) for p in parts]) if parts else schema.empty_table()
    return SilverColumns(states, rows, known)


def _field(name: str) -> pa.Field:
    types = {"key": pa.string(), "_deleted": pa.bool_(), "_vbucket": pa.int32()}
    return pa.field(name, types.get(name, pa.int64()))


def _view_rows(
    table: pa.Table, view: str, cid: int, pending: pa.Table, purges: list[Row]
) -> pa.Table:
    """One collection's rows as its view shows them, labelled with ``table`` (``pending``:
    the live layer's pending rows, of every collection)."""
    mine = pending.filter(pc.fill_null(pc.equal(pending["_collection_id"], cid), False))
    labelled = table.select(list(ROWS_COLUMNS))
    labelled = labelled.append_column("table", pa.array([view] * table.num_rows, pa.string()))
    if not mine.num_rows:
        return labelled
    name = tables.all_rows(view)
    marks = [m for m in purges if m["table_name"] == name]
    by_vbucket = {m["vbucket"] for m in marks}
    if (
        len(by_vbucket) < len(marks)
        or mine["key"].null_count > 0
        or pc.count_distinct(table["key"]).as_py() < table.num_rows
    ):
        return pa.Table.from_pylist(  # a key twice: the row rule's repeats
            overlay(spark_rows(table), view, cid, spark_rows(mine), purges, ROWS_COLUMNS),
            schema=labelled.schema,
        )
    return _overlaid(labelled, view, mine, marks)


def _overlaid(labelled: pa.Table, view: str, mine: pa.Table, marks: list[Row]) -> pa.Table:
    """:func:`pipelines.silver.rows_read.overlay` over columns, for a table of unique keys
    and at most one purge mark a vbucket: its rows no newer pending row replaces, and each
    key's newest pending row where it is newer than the table's row, or the table has none
    and no purge mark at or above it."""
    newest = _newest_per_key(mine, view).cast(labelled.schema)
    replaced = labelled.join(
        newest.select(["key", "_seqno"]).rename_columns(["key", "_p_seqno"]),
        keys="key",
        join_type="left outer",
    )
    kept = pc.invert(pc.fill_null(pc.greater(replaced["_p_seqno"], replaced["_seqno"]), False))
    rows = replaced.filter(kept).select(labelled.column_names)
    against = newest.join(
        labelled.select(["key", "_seqno"]).rename_columns(["key", "_t_seqno"]),
        keys="key",
        join_type="left outer",
    )
    mark_table = pa.table(
        {
            "_vbucket": pa.array([m["vbucket"] for m in marks], pa.int32()),
            "_mark": pa.array([m["purged_through_seqno"] for m in marks], pa.int64()),
        }
    )
    against = against.join(mark_table, keys="_vbucket", join_type="left outer")
    newer = pc.fill_null(pc.greater(against["_seqno"], against["_t_seqno"]), False)
    unmarked = pc.or_(
        pc.is_null(against["_mark"]),
        pc.fill_null(pc.greater(against["_seqno"], against["_mark"]), False),
    )
    added = pc.or_(newer, pc.and_(pc.is_null(against["_t_seqno"]), unmarked))
    return pa.concat_tables([rows, against.filter(added).select(labelled.column_names)])


def _newest_per_key(pending: pa.Table, view: str) -> pa.Table:
    """Per key of ``pending`` (one collection's), its row of the highest ``_seqno`` then
    ``_rev_seqno`` (nulls lowest), labelled with ``view``."""
    order = pc.sort_indices(
        pending,
        sort_keys=[
            ("key", "ascending", "at_end"),
            ("_seqno", "descending", "at_end"),
            ("_rev_seqno", "descending", "at_end"),
        ],
    )
    pending = pending.take(order)
    keys = pending["key"].combine_chunks()
    first = np.ones(pending.num_rows, bool)
    if pending.num_rows > 1:
        same = pc.fill_null(pc.equal(keys.slice(1), keys.slice(0, pending.num_rows - 1)), False)
        first[1:] = ~np.asarray(same.to_numpy(zero_copy_only=False), bool)
    newest = pending.filter(pa.array(first)).select(list(ROWS_COLUMNS))
    return newest.append_column("table", pa.array([view] * newest.num_rows, pa.string()))

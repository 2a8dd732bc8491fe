"""Silver's side of the columnar check: the stream state, the registry's collection names,
and every row of the collection tables as the views show them (:func:`.read.silver_side`'s)
as Arrow tables, a share of the vbuckets at a time (:mod:`.shares`: each ``_all`` table is
streamed once into a local Arrow file per share when there are several). A key with a
pending row of the live layer is overlaid over columns (:func:`_overlaid`, the rule of
:func:`pipelines.silver.rows_read.overlay`); the others are the ``_all`` tables' rows.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession

from pipelines import tables
from pipelines.lake import table_entries
from pipelines.lake.delta_rs import plain_types, read_rows, read_table, spark_rows, table_batches
from pipelines.quality.silver_side import ROWS_COLUMNS
from pipelines.quality.small.items import newest_per
from pipelines.quality.small.read import silver_names
from pipelines.quality.small.shares import _Writers, silver_share
from pipelines.silver.rows_read import overlay
from pipelines.tables import BucketTables

Row = dict[str, Any]
READ_COLUMNS = tuple(dict.fromkeys([*ROWS_COLUMNS, "key", "_seqno", "_vbucket", "_rev_seqno"]))


@dataclass
class SilverShares:
    """Silver's side: the stream state's rows, the registry's names, and per share of the
    vbuckets its rows (:meth:`rows`)."""

    states: list[Row]
    names: list[Row]
    sources: list[tuple[str, int]]
    pending: pa.Table
    purges: list[Row]
    count: int
    views: list[_Writers | list[pa.Table]]

    def rows(self, i: int) -> pa.Table:
        """The rows of share ``i`` as the views show them: ROWS_COLUMNS and ``table``."""
        pending = self.pending
        if self.count > 1:
            pending = pending.filter(pa.array(silver_share(pending, self.count) == i))
        schema = pa.schema([*(_field(c) for c in ROWS_COLUMNS), pa.field("table", pa.string())])
        parts = []
        for (view, cid), held in zip(self.sources, self.views, strict=True):
            table = held[i] if isinstance(held, list) else held.read(i, READ_SCHEMA)
            parts.append(view_rows(table, view, cid, pending, self.purges).cast(schema))
        return pa.concat_tables(parts) if parts else schema.empty_table()

    def states_of(self, i: int) -> list[Row]:
        return [s for s in self.states if self.count == 1 or (s["vbucket"] or 0) % self.count == i]


@contextmanager
def silver_shares(
    spark: SparkSession, bucket: str, at: Mapping[str, int], count: int
) -> Iterator[SilverShares]:
    """Silver's side of ``bucket`` at ``at`` (the versions the check pinned), its rows
    spilled to local Arrow files per share when there are several (removed on exit)."""
    names = BucketTables(bucket)
    states, known, sources = silver_names(spark, bucket, at)
    pending = READ_SCHEMA.empty_table()
    purges: list[Row] = []
    if sources and table_entries.exists(spark, names.pending):
        pending = read_table(spark, names.pending, READ_COLUMNS, at.get(names.pending))
        purges = read_rows(
            spark, names.purges, ("table_name", "vbucket", "purged_through_seqno"), at
        )
    with tempfile.TemporaryDirectory(prefix="dcp-cdc-silver-") as folder:
        views: list[_Writers | list[pa.Table]] = []
        try:
            for n, (view, _) in enumerate(sources):
                name = tables.all_rows(view)
                if count == 1:
                    views.append([read_table(spark, name, READ_COLUMNS, at.get(name))])
                    continue
                writers = _Writers(Path(folder), f"silver{n}", count)
                views.append(writers)
                for batch in table_batches(spark, name, READ_COLUMNS, at.get(name)):
                    rows = plain_types(pa.Table.from_batches([batch])).cast(READ_SCHEMA)
                    writers.write(rows, silver_share(rows, count))
        finally:
            for held in views:
                if isinstance(held, _Writers):
                    held.close()
        yield SilverShares(states, known, sources, pending, purges, count, views)


def _field(name: str) -> pa.Field:
    types = {"key": pa.string(), "_deleted": pa.bool_(), "_vbucket": pa.int32()}
    return pa.field(name, types.get(name, pa.int64()))


READ_SCHEMA = pa.schema([_field(c) for c in READ_COLUMNS])


def view_rows(
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
    newest = newest_per(pending, ["key"], ["_seqno", "_rev_seqno"]).select(list(ROWS_COLUMNS))
    return newest.append_column("table", pa.array([view] * newest.num_rows, pa.string()))

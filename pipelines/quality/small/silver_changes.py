"""What silver's views changed since the last check: per changed (collection, key), its view
row then (``before``) and now (``after``), none where the view shows none. A view shows its
``_all`` table overlaid with the live layer's pending rows (:func:`.silver_columns.view_rows`,
the rule of :func:`pipelines.silver.rows_read.overlay`), so a key changes where its table row
changed (the table's change data feed, ``delta.enableChangeDataFeed``: the first change's
pre-image, the last one's post-image) or where it has a pending row then or now; the table
row of a pending key the feed does not name is read from the table (all of its rows, by
delta-rs: one pass over the key column's table, no Spark job).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession

from pipelines import tables
from pipelines.errors import FullCheckNeeded, TableReadError
from pipelines.lake.delta_rs import change_batches, read_rows, read_table
from pipelines.quality.silver_side import ROWS_COLUMNS
from pipelines.quality.small.items import _numbers
from pipelines.quality.small.silver_columns import READ_COLUMNS, READ_SCHEMA, view_rows
from pipelines.tables import BucketTables

Row = dict[str, Any]
_BEFORE = ("update_preimage", "delete")
_AFTER = ("insert", "update_postimage")


@dataclass
class SilverChanges:
    """The changed keys (``collection_id``, ``key``) and their view rows then and now
    (ROWS_COLUMNS and ``table``)."""

    keys: pa.Table
    before: pa.Table
    after: pa.Table


@dataclass
class _Side:
    """The live layer at one version: its pending rows and purge marks."""

    pending: pa.Table
    purges: list[Row]


def _live_layer(spark: SparkSession, bucket: str, at: Mapping[str, int]) -> _Side:
    names = BucketTables(bucket)
    if names.pending not in at:
        return _Side(READ_SCHEMA.empty_table(), [])
    try:
        pending = read_table(spark, names.pending, READ_COLUMNS, at[names.pending])
        purges = read_rows(
            spark, names.purges, ("table_name", "vbucket", "purged_through_seqno"), at
        )
    except TableReadError as exc:
        raise FullCheckNeeded(f"the live layer as the last check read it is gone: {exc}") from exc
    return _Side(pending.select(list(READ_COLUMNS)).cast(READ_SCHEMA), purges)


def silver_changes(
    spark: SparkSession,
    bucket: str,
    sources: Sequence[tuple[str, int]],
    then: Mapping[str, int],
    at: Mapping[str, int],
) -> SilverChanges:
    """The changes of the views of ``sources`` (view, collection id) between the versions
    ``then`` (the last check's) and ``at``; :class:`FullCheckNeeded` when a table is older
    than the last check read it or what it read then is gone."""
    was_layer, now_layer = _live_layer(spark, bucket, then), _live_layer(spark, bucket, at)
    befores, afters = [], []
    for view, cid in sources:
        name = tables.all_rows(view)
        start, end = then.get(name, -1), at.get(name)
        if end is None:
            continue
        if end < start:
            raise FullCheckNeeded(f"{name} is older than the last check read it")
        was_fed, now_fed = READ_SCHEMA.empty_table(), READ_SCHEMA.empty_table()
        fed = pa.array([], pa.string())
        if end > start:
            first, last = _feed(spark, name, start + 1, end)
            fed = pc.unique(first["key"].combine_chunks())
            was_fed, now_fed = _rows(first.filter(_pre(first))), _rows(last.filter(_post(last)))
        mine_was = _of(was_layer.pending, cid)
        mine_now = _of(now_layer.pending, cid)
        pending_keys = pa.concat_arrays(
            [c.combine_chunks() for c in (mine_was["key"], mine_now["key"])]
        )
        looked = pc.unique(pc.filter(pending_keys, pc.invert(pc.is_in(pending_keys, fed))))
        held = READ_SCHEMA.empty_table()
        if len(looked):
            rows = read_table(spark, name, READ_COLUMNS, end).select(list(READ_COLUMNS))
            held = rows.filter(pc.is_in(rows["key"], value_set=looked)).cast(READ_SCHEMA)
        changed = pc.unique(pa.concat_arrays([fed, looked]))
        keyed = pc.is_in
        was_table = pa.concat_tables([was_fed, held])
        now_table = pa.concat_tables([now_fed, held])
        befores.append(
            view_rows(
                was_table,
                view,
                cid,
                mine_was.filter(keyed(mine_was["key"], value_set=changed)),
                was_layer.purges,
            )
        )
        afters.append(
            view_rows(
                now_table,
                view,
                cid,
                mine_now.filter(keyed(mine_now["key"], value_set=changed)),
                now_layer.purges,
            )
        )
    return _changes(befores, afters)


def _rows(feed: pa.Table) -> pa.Table:
    return feed.select(list(READ_COLUMNS)).cast(READ_SCHEMA)


def _of(pending: pa.Table, cid: int) -> pa.Table:
    return pending.filter(pc.fill_null(pc.equal(pending["_collection_id"], cid), False))


def _pre(rows: pa.Table) -> pa.ChunkedArray:
    return pc.is_in(rows["_change_type"], value_set=pa.array(_BEFORE))


def _post(rows: pa.Table) -> pa.ChunkedArray:
    return pc.is_in(rows["_change_type"], value_set=pa.array(_AFTER))


def _feed(spark: SparkSession, name: str, start: int, end: int) -> tuple[pa.Table, pa.Table]:
    """Per key of the table's feed from ``start`` to ``end``, its first change and its last."""
    try:
        feed = change_batches(spark, name, READ_COLUMNS, start, end)
    except TableReadError as exc:
        raise FullCheckNeeded(f"the change data feed of {name} cannot be read: {exc}") from exc
    first, last = _ends(feed)
    return feed.take(pa.array(first, pa.int64())), feed.take(pa.array(last, pa.int64()))


def _changes(befores: list[pa.Table], afters: list[pa.Table]) -> SilverChanges:
    schema = _labelled()
    was = pa.concat_tables([t.cast(schema) for t in befores]) if befores else schema.empty_table()
    now = pa.concat_tables([t.cast(schema) for t in afters]) if afters else schema.empty_table()
    keys = pa.concat_tables(
        [
            t.select(["_collection_id", "key"]).rename_columns(["collection_id", "key"])
            for t in (was, now)
        ]
    )
    keys = keys.group_by(["collection_id", "key"]).aggregate([])
    return SilverChanges(keys, was, now)


def _labelled() -> pa.Schema:
    types = {"key": pa.string(), "_deleted": pa.bool_(), "_vbucket": pa.int32()}
    fields = [pa.field(c, types.get(c, pa.int64())) for c in ROWS_COLUMNS]
    return pa.schema([*fields, pa.field("table", pa.string())])


def _ends(feed: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """Per key of ``feed``, the row of its first change and of its last (by commit version,
    a pre-image before the post-image of its commit)."""
    if not feed.num_rows:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    kind = feed["_change_type"]
    rank = np.where(
        np.asarray(pc.is_in(kind, value_set=pa.array(_BEFORE)).to_numpy(zero_copy_only=False)),
        0,
        1,
    )
    order = pa.table(
        {
            "key": feed["key"],
            "v": feed["_commit_version"],
            "r": pa.array(rank),
            "i": pa.array(np.arange(feed.num_rows)),
        }
    ).sort_by([("key", "ascending"), ("v", "ascending"), ("r", "ascending")])
    keys = order["key"].combine_chunks()
    n = order.num_rows
    new = np.ones(n, bool)
    if n > 1:
        new[1:] = ~np.asarray(
            pc.fill_null(pc.equal(keys.slice(1), keys.slice(0, n - 1)), False).to_numpy(
                zero_copy_only=False
            ),
            bool,
        )
    rows = _numbers(order["i"])
    starts = np.flatnonzero(new)
    ends = np.r_[starts[1:] - 1, n - 1]
    return rows[starts], rows[ends]

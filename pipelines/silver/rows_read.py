"""Silver's rows as the views show them, read in the driver: each collection's ``_all`` table
overlaid with the live layer's pending rows by the rule of
:func:`pipelines.silver.transforms.overlays_query`, every table through delta-rs at a pinned
Delta version (:mod:`pipelines.lake.delta_rs`): no Spark job. What a small bucket's quality
check and ``dcp-cdc run``'s overview read (:func:`pipelines.silver.live.bucket_rows` is the
same read as one Spark query).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from pyspark.sql import SparkSession

from pipelines import tables
from pipelines.lake.delta_rs import read_rows
from pipelines.tables import BucketTables

Row = dict[str, Any]


def bucket_rows(
    spark: SparkSession,
    bucket: str,
    views: Sequence[tuple[str, int]],
    columns: Sequence[str],
    at: Mapping[str, int] | None = None,
) -> list[Row]:
    """Every row (tombstones and expired ones too) of the collections whose views and ids
    are ``views`` as the views show them, in ``columns`` and ``table`` (the view's name);
    each table at its version in ``at`` (else its latest)."""
    names = BucketTables(bucket)
    at = at or {}
    read = tuple(dict.fromkeys([*columns, "key", "_seqno", "_vbucket", "_rev_seqno"]))
    pending_read = tuple(dict.fromkeys([*read, "_collection_id"]))
    pending = purges = None
    if spark.catalog.tableExists(names.pending):
        pending = read_rows(spark, names.pending, pending_read, at)
        purges = read_rows(
            spark, names.purges, ("table_name", "vbucket", "purged_through_seqno"), at
        )
    rows: list[Row] = []
    for view, cid in views:
        table = read_rows(spark, tables.all_rows(view), read, at)
        if pending is None or purges is None:
            rows += [_labelled(r, view, columns) for r in table]
        else:
            rows += overlay(table, view, cid, pending, purges, columns)
    return rows


def view_rows(rows: Sequence[Row], now: int | None = None) -> list[Row]:
    """The rows the user views show (:data:`pipelines.tables.LIVE_ROWS`): live documents, not
    expired (a row of ``_deleted`` and ``_expiry``)."""
    now = int(time.time()) if now is None else now
    return [
        r
        for r in rows
        if r["_deleted"] is False
        and r["_expiry"] is not None
        and (r["_expiry"] == 0 or r["_expiry"] > now)
    ]


def _labelled(r: Row, view: str, columns: Sequence[str]) -> Row:
    return {**{c: r[c] for c in columns}, "table": view}


def overlay(
    table: Sequence[Row],
    view: str,
    cid: int,
    pending: Sequence[Row],
    purges: Sequence[Row],
    columns: Sequence[str],
) -> list[Row]:
    """:func:`pipelines.silver.transforms.overlays_query` of one collection: the table's rows
    a newer pending row does not replace, and each key's newest pending row where it is newer
    than the table's row, or the table has none and no purge mark at or above it."""
    newest = {}
    for key, rows in group(
        (p for p in pending if p["_collection_id"] == cid), lambda p: p["key"]
    ).items():
        newest[key] = max(rows, key=lambda p: (_order(p["_seqno"]), _order(p["_rev_seqno"])))
    held = group(table, lambda t: t["key"])
    out = []
    for t in table:
        p = newest.get(t["key"]) if t["key"] is not None else None
        if p is None or not _greater(p["_seqno"], t["_seqno"]):
            out.append(_labelled(t, view, columns))
    name = tables.all_rows(view)
    marks = group((m for m in purges if m["table_name"] == name), lambda m: m["vbucket"])
    for key, p in newest.items():
        tabled = [h["_seqno"] for h in held.get(key, [])] if key is not None else []
        mark_rows = marks.get(p["_vbucket"], []) if p["_vbucket"] is not None else []
        marked = [m["purged_through_seqno"] for m in mark_rows]
        for seqno in tabled or [None]:
            for mark in marked or [None]:
                unmarked = mark is None or _greater(p["_seqno"], mark)
                if _greater(p["_seqno"], seqno) or (seqno is None and unmarked):
                    out.append(_labelled(p, view, columns))
    return out


def group(rows: Iterable[Row], key: Callable[[Row], Any]) -> dict[Any, list[Row]]:
    """Rows by a key, in first-seen order (a null key is a group of its own)."""
    groups: dict[Any, list[Row]] = {}
    for row in rows:
        groups.setdefault(key(row), []).append(row)
    return groups


def _order(v: Any) -> tuple[int, Any]:
    """Descending order's key for ``row_number() OVER (ORDER BY v DESC)``: nulls last."""
    return (0, 0) if v is None else (1, v)


def _greater(a: Any, b: Any) -> bool:
    return a is not None and b is not None and a > b

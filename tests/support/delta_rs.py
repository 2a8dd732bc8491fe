"""Reading Delta tables with delta-rs (the ``deltalake`` package), as a user without Spark
would: through its SQL reader (``QueryBuilder``), which reads tables with deletion vectors
(silver's ``_all`` tables have them by default); ``DeltaTable.to_pyarrow_table`` refuses them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa


def read_delta(
    location: str | Path, columns: list[str] | None = None, version: int | None = None
) -> pa.Table:
    """The rows of the Delta table at ``location`` (its latest version, or ``version``)."""
    from deltalake import DeltaTable, QueryBuilder

    table = DeltaTable(str(location), version=version)
    names = ", ".join(f'"{c}"' for c in columns) if columns else "*"
    result = QueryBuilder().register("t", table).execute(f"SELECT {names} FROM t")
    return pa.table(result.read_all())


def rows(
    location: str | Path, columns: list[str] | None = None, version: int | None = None
) -> list[dict[str, Any]]:
    """:func:`read_delta` as a list of dicts."""
    return list(read_delta(location, columns, version).to_pylist())


_OVERLAY = ["_collection_id", "key", "_seqno", "_rev_seqno", "_vbucket"]


def silver_rows(silver_db: Path, columns: list[str]) -> list[dict[str, Any]]:
    """The rows of every collection in ``silver_db`` as :func:`silver_tables` reads them."""
    return [r for rows in silver_tables(silver_db, columns).values() for r in rows]


def silver_tables(silver_db: Path, columns: list[str]) -> dict[str, list[dict[str, Any]]]:
    """``_all`` table name -> its rows as the collection's view shows them, tombstones
    included, for every ``_all`` table in ``silver_db`` (a warehouse's ``silver.db``
    folder): the table overlaid with its bucket's live layer (``<bucket>__pending``) by the
    MERGE's rule, written here apart from the code it checks
    (``pipelines.silver.transforms.overlay_query``). A key's newest pending row (by
    ``_seqno``, then ``_rev_seqno``) replaces the table's row when its ``_seqno`` is higher,
    and is added when the table has no row for the key, unless its seqno is at or below its
    vbucket's tombstone-purge mark for that table. Each row has ``columns`` and the
    overlay's own (``_collection_id``, ``key``, ``_seqno``, ``_rev_seqno``, ``_vbucket``).
    A table with two rows of one key is an :class:`AssertionError`."""
    wanted = list(dict.fromkeys([*columns, *_OVERLAY]))
    found: dict[str, list[dict[str, Any]]] = {}
    for table in sorted(silver_db.glob("*_all")):
        bucket = table.name.split("__")[0]
        rows: dict[tuple[int, str], dict[str, Any]] = {}
        for r in _rows_if(table, wanted):
            if (r["_collection_id"], r["key"]) in rows:  # a MERGE keeps one row per key
                raise AssertionError(f"{table.name}: two rows of {r['key']!r}")
            rows[(r["_collection_id"], r["key"])] = r
        marks = _purge_marks(silver_db, bucket, table.name)
        for r in _pending_of(silver_db, bucket, table.name, wanted):
            held = rows.get((r["_collection_id"], r["key"]))
            if held is not None:
                if r["_seqno"] > held["_seqno"]:
                    rows[(r["_collection_id"], r["key"])] = r
            elif r["_seqno"] > marks.get(r["_vbucket"], -1):
                rows[(r["_collection_id"], r["key"])] = r
        found[table.name] = list(rows.values())
    return found


def _rows_if(location: Path, columns: list[str]) -> list[dict[str, Any]]:
    """:func:`rows` of the Delta table at ``location``, none when there is no such table."""
    return rows(location, columns) if (location / "_delta_log").is_dir() else []


def _pending_of(
    silver_db: Path, bucket: str, table: str, columns: list[str]
) -> list[dict[str, Any]]:
    """The newest pending row of each key of the collection whose ``_all`` table is
    ``table`` (its id from the bucket's registry)."""
    ids = [
        r["collection_id"]
        for r in _rows_if(silver_db / f"{bucket}__collections", ["collection_id", "table_name"])
        if r["table_name"].partition(".")[2] + "_all" == table
    ]
    newest: dict[str, dict[str, Any]] = {}
    for r in _rows_if(silver_db / f"{bucket}__pending", columns):
        if r["_collection_id"] not in ids:
            continue
        kept = newest.get(r["key"])
        if kept is None or (r["_seqno"], r["_rev_seqno"]) > (kept["_seqno"], kept["_rev_seqno"]):
            newest[r["key"]] = r
    return list(newest.values())


def _purge_marks(silver_db: Path, bucket: str, table: str) -> dict[int, int]:
    """vbucket -> the highest seqno of a tombstone the maintenance purge removed from
    ``table``."""
    marks = _rows_if(
        silver_db / f"{bucket}__tombstone_purges",
        ["table_name", "vbucket", "purged_through_seqno"],
    )
    return {
        r["vbucket"]: r["purged_through_seqno"]
        for r in marks
        if r["table_name"] == f"silver.{table}"
    }

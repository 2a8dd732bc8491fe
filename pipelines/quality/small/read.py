"""What the small check reads, in the driver: bronze's frames projected as
:func:`pipelines.quality.frames.base_frames` projects them, and silver's side as
:func:`pipelines.quality.silver_side.silver_frames` gives it (the stream state, every row of
the collection tables as their views show them, the collection names), each table through
delta-rs at the Delta version the check pinned (:mod:`pipelines.lake.delta_rs`): no Spark job.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession

from dcp_cdc.events import UnknownFrame
from pipelines import schemas, tables
from pipelines.errors import NotOnDriver
from pipelines.lake import table_entries
from pipelines.lake.delta_rs import read_rows, spark_rows
from pipelines.quality.frames import BASE_COLUMNS, KNOWN_OPCODES, REQUIRED
from pipelines.quality.silver_side import ROWS_COLUMNS
from pipelines.quality.small.sql import coalesce
from pipelines.silver.rows_read import bucket_rows
from pipelines.tables import BucketTables

Row = dict[str, Any]
_INT_RANGE = range(-(1 << 31), 1 << 31)
_KNOWN = frozenset(KNOWN_OPCODES)
_REQUIRED = tuple((c, None if ops is None else frozenset(ops)) for c, ops in REQUIRED.items())
_DERIVED = ("vbucket", "seqno", "null_columns", "unknown_opcode")
_COPIED = tuple(c for c in BASE_COLUMNS if c not in _DERIVED)
BASE_READ = tuple(
    dict.fromkeys(
        [*_COPIED, "vbucket", "opaque", "by_seqno", "commit_seqno", "abort_seqno", *REQUIRED]
    )
)
"""The columns of ``bronze.<bucket>_events`` the small check reads."""


def base_frames(events: Sequence[Row]) -> list[Row]:
    """:func:`pipelines.quality.frames.base_frames` of bronze's rows (:data:`BASE_READ`)."""
    out = []
    for e in events:
        if e["status"] is not None:
            vbucket = e["opaque"]
            if vbucket is not None and vbucket not in _INT_RANGE:
                raise NotOnDriver(f"a response's opaque {vbucket} is beyond an INT")
        else:
            vbucket = e["vbucket"]
        op, opcode = e["op"], e["opcode"]
        unknown: bool | None = True
        if op != UnknownFrame.op:
            unknown = None if opcode is None else opcode not in _KNOWN
        frame = {c: e[c] for c in _COPIED}
        frame.update(
            vbucket=vbucket,
            seqno=coalesce(e["by_seqno"], e["commit_seqno"], e["abort_seqno"]),
            null_columns=[c for c, ops in _REQUIRED if e[c] is None and (ops is None or op in ops)],
            unknown_opcode=unknown,
        )
        out.append(frame)
    return out


def base_frames_of(events: pa.Table) -> list[Row]:
    """:func:`base_frames` of bronze's columns (:data:`BASE_READ`): the four derived columns
    computed over Arrow, then one row per frame."""
    responds = pc.is_valid(events["status"])
    opaque = events["opaque"].cast(pa.int64())
    beyond = pc.or_(pc.less(opaque, _INT_RANGE.start), pc.greater_equal(opaque, _INT_RANGE.stop))
    wrong = opaque.filter(pc.fill_null(pc.and_(responds, beyond), False))
    if len(wrong):
        raise NotOnDriver(f"a response's opaque {wrong[0].as_py()} is beyond an INT")
    op, opcode = events["op"], events["opcode"]
    known = pc.is_in(opcode, value_set=pa.array(sorted(_KNOWN), opcode.type))
    by_opcode = pc.if_else(pc.is_null(opcode), pa.scalar(None, pa.bool_()), pc.invert(known))
    derived = {
        "vbucket": pc.if_else(responds, opaque, events["vbucket"].cast(pa.int64())),
        "seqno": pc.coalesce(events["by_seqno"], events["commit_seqno"], events["abort_seqno"]),
        "unknown_opcode": pc.if_else(
            pc.fill_null(pc.equal(op, UnknownFrame.op), False), True, by_opcode
        ),
    }
    table = events.select(list(_COPIED))
    for name, column in derived.items():
        table = table.append_column(name, column)
    rows = spark_rows(table)
    for row in rows:
        row["null_columns"] = []
    nulls = {c: _null_in(events, c, ops) for c, ops in _REQUIRED}
    for i in np.flatnonzero(np.logical_or.reduce(list(nulls.values()))).tolist():
        rows[i]["null_columns"] = [c for c, where in nulls.items() if where[i]]
    return rows


def _null_in(events: pa.Table, column: str, ops: frozenset[str] | None) -> np.ndarray:
    """Which frames of ``events`` have ``column`` null where their op requires it."""
    nulls = pc.is_null(events[column])
    if ops is not None:
        nulls = pc.and_(nulls, pc.is_in(events["op"], value_set=pa.array(sorted(ops))))
    return np.asarray(nulls.to_numpy(zero_copy_only=False), bool)


@dataclass(frozen=True)
class SilverSide:
    """:class:`pipelines.quality.silver_side.SilverFrames` as rows."""

    states: list[Row]
    rows: list[Row]
    names: list[Row]


_STATE = ("vbucket", "consistent_seqno", "last_applied_seqno", "vb_uuid", "failover_log")


def silver_names(
    spark: SparkSession, bucket: str, at: Mapping[str, int]
) -> tuple[list[Row], list[Row], list[tuple[str, int]]]:
    """The stream state's rows, the registry's collection names and the (view, collection
    id) of each table the registry names (not retired) that exists, of ``bucket`` at
    ``at``."""
    names = BucketTables(bucket)
    exists = partial(table_entries.exists, spark)
    states = read_rows(spark, names.stream_state, _STATE, at) if exists(names.stream_state) else []
    if not exists(names.registry):
        return states, [], []
    registry = read_rows(
        spark, names.registry, ("collection_id", "scope", "name", "table_name", "status"), at
    )
    known = [
        {
            "collection_id": r["collection_id"],
            "name": ".".join(p for p in (r["scope"], r["name"]) if p is not None),
        }
        for r in registry
    ]
    views = sorted(
        {
            (r["table_name"], r["collection_id"])
            for r in registry
            if r["status"] in tables.WITH_TABLES
        }
    )
    sources = [(view, cid) for view, cid in views if exists(tables.all_rows(view)) and exists(view)]
    return states, known, sources


def silver_side(spark: SparkSession, bucket: str, at: Mapping[str, int]) -> SilverSide:
    """Silver's side of ``bucket`` at ``at``: the registry's tables (not retired), each
    overlaid with the live layer's pending rows as :func:`pipelines.silver.live.bucket_rows`
    does; a table the registry names that is missing is left out."""
    states, known, sources = silver_names(spark, bucket, at)
    if not sources:
        return SilverSide(states, [], known)
    rows = bucket_rows(spark, bucket, sources, ROWS_COLUMNS, at)
    return SilverSide(states, rows, known)


def side_tables(
    spark: SparkSession, bucket: str, at: Mapping[str, int]
) -> tuple[list[Row], list[Row]]:
    """The quarantine's rows (file, offset, truncated, reason) and the ingest log's of
    ``bucket`` at ``at``; none of a table not made yet."""
    names = BucketTables(bucket)
    exists = partial(table_entries.exists, spark)
    quarantine = []
    if exists(names.quarantine):
        quarantine = read_rows(
            spark, names.quarantine, ("file", "offset", "truncated", "reason"), at
        )
    ingest_log = []
    if exists(names.ingest_log):
        ingest_log = read_rows(spark, names.ingest_log, schemas.INGEST_LOG.fieldNames(), at)
    return quarantine, ingest_log

"""The columnar check: a bucket's metric frames computed in the driver over Arrow columns,
no Spark job, the same rows as :func:`.compute.compute_small` (and so as Spark's check over
everything; tests/spark/test_quality_incremental.py checks the three on every scenario).

Bronze's items (a million frames and more) are handled as columns (:mod:`.items`,
:mod:`.item_history`); the control frames, snapshots, streams, failover logs and system
events, a few per vbucket, go through the row steps; silver's rows are columns
(:mod:`.silver_columns`) whose checksums are vectorized (:mod:`.hash_columns`). A bucket
whose bronze or silver holds nulls the row rules treat one by one raises
:class:`~pipelines.errors.NotOnDriver`: the check then takes the row or Spark path.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession

from pipelines import schemas
from pipelines.errors import NotOnDriver
from pipelines.lake.delta_rs import read_rows, read_table, spark_rows
from pipelines.quality.compute import Metrics
from pipelines.quality.small import history, measures, streams
from pipelines.quality.small.compute import SmallCheck
from pipelines.quality.small.hash_columns import checksum_columns
from pipelines.quality.small.item_history import History, bronze_history, dead_branch
from pipelines.quality.small.item_snapshots import duplicate_candidates, file_frames, snapshots
from pipelines.quality.small.items import _flags, _numbers, _present, split
from pipelines.quality.small.placement import place
from pipelines.quality.small.read import BASE_READ
from pipelines.quality.small.silver_columns import SilverColumns, silver_columns
from pipelines.tables import BucketTables

Row = dict[str, Any]


def compute_columnar(spark: SparkSession, bucket: str, at: Mapping[str, int]) -> SmallCheck:
    """The metric frames of ``bucket`` with its tables read at ``at``
    (:func:`pipelines.quality.job.pinned_versions`)."""
    names = BucketTables(bucket)
    exists = spark.catalog.tableExists
    bronze = split(read_table(spark, names.events, BASE_READ, at.get(names.events)))
    quarantine = []
    if exists(names.quarantine):
        quarantine = read_rows(
            spark, names.quarantine, ("file", "offset", "truncated", "reason"), at
        )
    ingest_log = []
    if exists(names.ingest_log):
        ingest_log = read_rows(spark, names.ingest_log, schemas.INGEST_LOG.fieldNames(), at)
    placed = place(bronze)
    snaps, per_stream = snapshots(bronze, placed)
    duplicates = streams.duplicate_seqnos(duplicate_candidates(bronze, placed))
    stream_rows = streams.stream_metrics(placed.frames, snaps, duplicates, per_stream)
    past = bronze_history(bronze, placed, snaps)
    silver = silver_columns(spark, bucket, at)
    _regular(silver.rows)
    coverage = measures.coverage_metrics(
        stream_rows, silver.states, _rolled(silver, past), history.cluster_branches(bronze.control)
    )
    reconciliation = _reconciliation(past, silver)
    files = measures.file_metrics(bronze.control, quarantine, ingest_log, file_frames(bronze.items))
    metrics = {
        "snapshot_completeness": Metrics(stream_rows, streams.STREAM_COLUMNS),
        "stream_coverage": Metrics(coverage, measures.COVERAGE_COLUMNS),
        "silver_reconciliation": Metrics(reconciliation, measures.RECONCILIATION_COLUMNS),
        "bronze_integrity": Metrics(files, measures.FILE_COLUMNS),
    }
    return SmallCheck(metrics, ingest_log)


def _regular(rows: pa.Table) -> None:
    for column in ("_collection_id", "_vbucket", "_seqno"):
        if rows[column].null_count:
            raise NotOnDriver(f"a silver row's {column} is null")


def _rolled(silver: SilverColumns, past: History) -> list[Row]:
    """:func:`.measures.rolled_rows` of the silver rows that may be rolled back (of a dead
    branch or a dead change), picked by columns."""
    rows = silver.rows
    vbucket, seqno = _numbers(rows["_vbucket"]), _numbers(rows["_seqno"])
    uuid, has_uuid = _numbers(rows["_vb_uuid"]), _present(rows["_vb_uuid"])
    maybe = dead_branch(vbucket, uuid, has_uuid, seqno, past.branches)
    if past.dead_changes:
        maybe |= np.isin(seqno, np.array([s for _, _, s in past.dead_changes], np.int64))
    picked = spark_rows(rows.filter(pa.array(maybe)))
    return measures.rolled_rows(picked, past.branches, past.dead_changes)


def _reconciliation(past: History, silver: SilverColumns) -> list[Row]:
    """:func:`.measures.reconciliation_metrics` over columns: per collection, bronze's live
    documents and silver's (count and checksum), and the rows that name a problem."""
    now = int(time.time())
    rows, live = silver.rows, past.live
    s_cid, s_vb = _numbers(rows["_collection_id"]), _numbers(rows["_vbucket"])
    expiry, has_expiry = _numbers(rows["_expiry"]), _present(rows["_expiry"])
    shown = (
        _flags(pc.equal(rows["_deleted"], False)) & has_expiry & ((expiry == 0) | (expiry > now))
    )
    drops = [(c, v) for (c, v), (dropped, _) in past.cuts.items() if dropped and v is not None]
    in_dropped = np.zeros(rows.num_rows, bool)
    if drops:
        marks = np.array([c * (1 << 32) + v for c, v in drops], np.int64)
        in_dropped = np.isin(s_cid * (1 << 32) + s_vb, marks)
    b_cid = _numbers(live["collection_id"])
    found = [*np.unique(b_cid), *np.unique(s_cid[shown]), *np.unique(s_cid[in_dropped])]
    per_collection = {}
    for cid in dict.fromkeys(int(c) for c in found):
        b, s = b_cid == cid, shown & (s_cid == cid)
        d = in_dropped & (s_cid == cid)
        expired = s & has_expiry & (expiry > 0) & (expiry <= now)
        named = spark_rows(
            rows.filter(pa.array(s | d)).select(["table"]).group_by("table").aggregate([])
        )
        described = measures.described(
            spark_rows(rows.filter(pa.array(expired))), spark_rows(rows.filter(pa.array(d))), now
        )
        per_collection[cid] = {
            "bronze_live": int(b.sum()),
            "bronze_checksum": checksum_columns(live["key"], live["seqno"], b),
            "silver_live": int(s.sum()),
            "silver_checksum": checksum_columns(rows["key"], rows["_seqno"], s),
            **described,
            "silver_table": min((r["table"] for r in named), default=None),
        }
    return measures.named_collections(per_collection, silver.names)

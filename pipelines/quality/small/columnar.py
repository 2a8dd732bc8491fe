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

import gc
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession

from pipelines.errors import NotOnDriver
from pipelines.lake.delta_rs import spark_rows, table_batches
from pipelines.quality.compute import Metrics
from pipelines.quality.measures import CHECKSUM_MODULUS
from pipelines.quality.small import history, measures, streams
from pipelines.quality.small.compute import SmallCheck
from pipelines.quality.small.hash_columns import checksum_columns
from pipelines.quality.small.item_history import History, bronze_history, dead_branch
from pipelines.quality.small.item_snapshots import (
    duplicate_candidates,
    file_frames,
    snapshot_groups,
)
from pipelines.quality.small.items import _flags, _numbers, _present, split
from pipelines.quality.small.keeping import Keeping
from pipelines.quality.small.placement import place
from pipelines.quality.small.read import BASE_READ, base_frames_of, side_tables
from pipelines.quality.small.shares import (
    SHARE_FRAMES,
    share_count,
    share_of_control,
    spilled_bronze,
)
from pipelines.quality.small.silver_columns import silver_shares
from pipelines.tables import BucketTables

Row = dict[str, Any]


def compute_columnar(
    spark: SparkSession,
    bucket: str,
    at: Mapping[str, int],
    *,
    share_frames: int = SHARE_FRAMES,
    keep: bool = False,
) -> SmallCheck:
    """The metric frames of ``bucket`` with its tables read at ``at``
    (:func:`pipelines.quality.job.pinned_versions`), a share of its vbuckets at a time
    (:mod:`.shares`: ``share_frames`` frames of bronze a share); ``keep``: with the state a
    later check starts from (:mod:`.carried`)."""
    with collections_paused():
        return _compute(spark, bucket, at, share_frames, keep)


@contextmanager
def collections_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused (reference counting still frees): the row
    steps make a few dicts per control frame, and on 1,024 vbuckets (10,000 control frames)
    its collections cost a fifth of the check (0.3 of 1.4 s, measured with gc on and off)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _compute(
    spark: SparkSession, bucket: str, at: Mapping[str, int], share_frames: int, keep: bool
) -> SmallCheck:
    names = BucketTables(bucket)
    quarantine, ingest_log = side_tables(spark, bucket, at)
    count = share_count(ingest_log, share_frames)
    now = int(time.time())
    stream_rows: list[Row] = []
    coverage: list[Row] = []
    files: Counter[Any] = Counter()
    sums: dict[int, _Sums] = {}
    batches = table_batches(spark, names.events, BASE_READ, at.get(names.events))
    kept = Keeping(now) if keep else None
    with (
        spilled_bronze(batches, count) as (control, held),
        silver_shares(spark, bucket, at, count) as silver,
    ):
        control_rows = base_frames_of(control)
        cluster = history.cluster_branches(control_rows)
        share = share_of_control(control, count)
        for i in range(count):
            columns = held[i] if isinstance(held, list) else held.read(i, control.schema)
            mine = np.flatnonzero(share == i).tolist()
            events = pa.concat_tables([control.take(pa.array(mine, pa.int64())), columns])
            bronze = split(events, [control_rows[j] for j in mine])
            del columns
            placed = place(bronze)
            snaps, per_stream, groups = snapshot_groups(bronze, placed)
            duplicates = streams.duplicate_seqnos(duplicate_candidates(bronze, placed))
            found = streams.stream_metrics(placed.frames, snaps, duplicates, per_stream)
            stream_rows += found
            past = bronze_history(bronze, placed, snaps, now)
            files.update(file_frames(bronze.items))
            if kept is not None:
                kept.streams(events, bronze, placed, snaps, groups, duplicates, past)
            del bronze, placed, snaps, events
            rows = silver.rows(i)
            _regular(rows)
            states = silver.states_of(i)
            maybe = _maybe_rolled(rows, past)
            rolled = measures.rolled_rows(maybe, past.branches, past.dead_changes)
            coverage += measures.coverage_metrics(found, states, rolled, cluster)
            _add_reconciliation(sums, past, rows, now)
            if kept is not None:
                kept.silver(rows, maybe, past)
    metrics = {
        "snapshot_completeness": Metrics(stream_rows, streams.STREAM_COLUMNS),
        "stream_coverage": Metrics(coverage, measures.COVERAGE_COLUMNS),
        "silver_reconciliation": Metrics(
            _reconciliation(sums, silver.names, now), measures.RECONCILIATION_COLUMNS
        ),
        "bronze_integrity": Metrics(
            measures.file_metrics(control_rows, quarantine, ingest_log, files),
            measures.FILE_COLUMNS,
        ),
    }
    state = None
    if kept is not None:
        state = kept.state(spark, bucket, at, control, files, sums, metrics)
    return SmallCheck(metrics, ingest_log, state)


def _regular(rows: pa.Table) -> None:
    for column in ("_collection_id", "_vbucket", "_seqno"):
        if rows[column].null_count:
            raise NotOnDriver(f"a silver row's {column} is null")


def _maybe_rolled(rows: pa.Table, past: History) -> list[Row]:
    """The silver rows that may be rolled back (of a dead branch or a dead change), picked by
    columns (:func:`.measures.rolled_rows` judges them)."""
    vbucket, seqno = _numbers(rows["_vbucket"]), _numbers(rows["_seqno"])
    uuid, has_uuid = _numbers(rows["_vb_uuid"]), _present(rows["_vb_uuid"])
    maybe = dead_branch(vbucket, uuid, has_uuid, seqno, past.branches)
    if past.dead_changes:
        maybe |= np.isin(seqno, np.array([s for _, _, s in past.dead_changes], np.int64))
    return spark_rows(rows.filter(pa.array(maybe)))


@dataclass
class _Sums:
    """One collection's reconciliation, summed over the shares."""

    bronze_live: int = 0
    bronze_checksum: int = 0
    silver_live: int = 0
    silver_checksum: int = 0
    expired: list[Row] = field(default_factory=list)
    dropped: list[Row] = field(default_factory=list)
    tables: dict[str, int] = field(default_factory=dict)
    """Per silver table, the rows of the collection shown or in a dropped vbucket."""


def _add_reconciliation(sums: dict[int, _Sums], past: History, rows: pa.Table, now: int) -> None:
    """A share's part of :func:`.measures.reconciliation_metrics`: per collection, bronze's
    live documents and silver's (count and checksum), and the rows that name a problem."""
    live = past.live
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
    for cid in dict.fromkeys(int(c) for c in found):
        b, s = b_cid == cid, shown & (s_cid == cid)
        d = in_dropped & (s_cid == cid)
        expired = s & has_expiry & (expiry > 0) & (expiry <= now)
        named = (
            rows.filter(pa.array(s | d))
            .select(["table"])
            .group_by("table")
            .aggregate([("table", "count")])
        )
        got = sums.setdefault(cid, _Sums())
        got.bronze_live += int(b.sum())
        got.bronze_checksum += checksum_columns(live["key"], live["seqno"], b)
        got.silver_live += int(s.sum())
        got.silver_checksum += checksum_columns(rows["key"], rows["_seqno"], s)
        got.expired += spark_rows(rows.filter(pa.array(expired)))
        got.dropped += spark_rows(rows.filter(pa.array(d)))
        for table, count in zip(
            named["table"].to_pylist(), named["table_count"].to_pylist(), strict=True
        ):
            got.tables[table] = got.tables.get(table, 0) + count


def _reconciliation(sums: dict[int, _Sums], names: list[Row], now: int) -> list[Row]:
    """The reconciliation rows of the collections the shares found or the registry names."""
    per_collection = {
        cid: {
            "bronze_live": got.bronze_live,
            "bronze_checksum": got.bronze_checksum % CHECKSUM_MODULUS,
            "silver_live": got.silver_live,
            "silver_checksum": got.silver_checksum % CHECKSUM_MODULUS,
            **measures.described(got.expired, got.dropped, now),
            "silver_table": min(got.tables, default=None),
        }
        for cid, got in sums.items()
    }
    return measures.named_collections(per_collection, names)

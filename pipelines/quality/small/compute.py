"""The metric frames of a small bucket's check, computed in the driver: bronze and silver read
through delta-rs at the pinned versions, every step over rows in Python, no Spark job. The
steps are :func:`pipelines.quality.compute.compute`'s over all of bronze, rule for rule, and
give the same rows (tests/spark/test_quality_incremental.py checks both on every scenario).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql import SparkSession

from pipelines.lake.delta_rs import read_rows
from pipelines.quality.compute import Metrics
from pipelines.quality.small import history, measures, streams
from pipelines.quality.small.carried import State
from pipelines.quality.small.read import BASE_READ, base_frames, side_tables, silver_side
from pipelines.silver.rows_read import view_rows
from pipelines.tables import BucketTables

Row = dict[str, Any]


@dataclass(frozen=True)
class SmallCheck:
    """The metric frames (all but ``landing_continuity``) and the ingest log's rows at the
    pinned version (``landing_continuity`` starts from them)."""

    metrics: dict[str, Metrics]
    ingest_log: list[Row]
    state: State | None = None
    """What a later check starts from (:mod:`.carried`), when this one kept it."""


def compute_small(spark: SparkSession, bucket: str, at: Mapping[str, int]) -> SmallCheck:
    """The metric frames of ``bucket`` with its tables read at ``at``
    (:func:`pipelines.quality.job.pinned_versions`)."""
    names = BucketTables(bucket)
    base = base_frames(read_rows(spark, names.events, BASE_READ, at))
    quarantine, ingest_log = side_tables(spark, bucket, at)
    frames = streams.stream_frames(base)
    snaps = streams.snapshots(frames)
    stream_rows = streams.stream_metrics(frames, snaps, streams.duplicate_seqnos(frames))
    branches = history.latest_branches(frames)
    alive, dead = history.split_history(
        history.history_items(frames), branches, history.rollbacks(frames)
    )
    committed = history.committed_items(alive, snaps)
    cuts = history.collection_cuts(committed)
    silver = silver_side(spark, bucket, at)
    rolled = measures.rolled_rows(silver.rows, branches, history.dead_changes(alive, dead))
    coverage = measures.coverage_metrics(
        stream_rows, silver.states, rolled, history.cluster_branches(base)
    )
    reconciliation = measures.reconciliation_metrics(
        history.live_of(history.newest_changes(committed, cuts)),
        view_rows(silver.rows),
        silver.rows,
        cuts,
        silver.names,
    )
    files = measures.file_metrics(base, quarantine, ingest_log)
    metrics = {
        "snapshot_completeness": Metrics(stream_rows, streams.STREAM_COLUMNS),
        "stream_coverage": Metrics(coverage, measures.COVERAGE_COLUMNS),
        "silver_reconciliation": Metrics(reconciliation, measures.RECONCILIATION_COLUMNS),
        "bronze_integrity": Metrics(files, measures.FILE_COLUMNS),
    }
    return SmallCheck(metrics, ingest_log)

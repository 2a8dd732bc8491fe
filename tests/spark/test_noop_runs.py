"""A step with nothing to do runs no Spark job: follow mode's micro-batch with nothing new
landed (its ingest keeps the ingest log between batches: pipelines/bronze/memory.py), and an
apply with nothing new since the last apply saved the stream state, also in a fresh process
(no memory: the mark the stream state's commit records, pipelines/silver/state.py). Jobs are
counted at the session's scheduler (tests/support/spark_jobs.py); the runs that have work
run some, so the count is shown to see them."""

from __future__ import annotations

import io
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from dcp_cdc.config import AppConfig
from dcp_cdc.simulator import SimulationResult
from pipelines.bronze import store
from pipelines.bronze.job import ingest_bucket
from pipelines.follow.loop import Follower
from pipelines.follow.progress import BucketProgress
from pipelines.lake.delta_io import table_version
from pipelines.silver.job import apply_bucket
from pipelines.tables import BucketTables
from tests.support.silver_runs import landed
from tests.support.spark_jobs import counted
from tests.support.truth import assert_equal_to_truth


def _landed(
    tmp_path: Path, bucket: str, warehouse: Path
) -> tuple[SimulationResult, list[Path], Path, AppConfig]:
    """A ``basic`` simulation, its capture files in session order (at least four), an empty
    landing and the configuration of ``bucket`` over it."""
    return landed(tmp_path, bucket, warehouse, scenario="basic", seed=4, ops=60)


def _without_times(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ingest log rows but for ``logged_at`` (the memory keeps its own rows without it)."""
    return sorted(({**r, "logged_at": None} for r in rows), key=repr)


def test_a_micro_batch_with_nothing_new_runs_no_spark_job(
    spark: SparkSession, spark_warehouse: Path, tmp_path: Path, bucket: str
) -> None:
    """Micro-batches of follow mode: one that brings files runs jobs, the next with nothing
    new none; after another writer's ingest the next batch reads the log again (ingesting
    nothing twice), and the one after runs none. What is kept is what the log holds."""
    result, files, landing, config = _landed(tmp_path, bucket, spark_warehouse)
    (b,) = config.buckets
    names = BucketTables(bucket)
    follower = Follower(spark, config, config.buckets, io.StringIO(), threading.Event())
    progress = BucketProgress(b, None)
    half = len(files) // 2
    for path in files[:half]:
        shutil.copy(path, landing)

    with counted(spark) as bringing:
        batch = follower.micro_batch(progress)
    assert batch.files == half and batch.frames and batch.merged
    assert bringing.count > 0
    memory = follower.ingest_memory[bucket]
    assert memory.version == table_version(spark, names.ingest_log)
    assert _without_times(memory.rows) == _without_times(
        store.read_log_rows(spark, names.ingest_log)
    )

    for _ in range(2):
        with counted(spark) as idle:
            batch = follower.micro_batch(progress)
        assert (batch.files, batch.frames) == (0, 0)
        assert idle.count == 0, idle.what

    # another writer ingests the rest: the log moved, so the next batch reads it again
    for path in files[half:]:
        shutil.copy(path, landing)
    assert ingest_bucket(spark, config, b).files == len(files) - half
    batch = follower.micro_batch(progress)
    assert batch.files == 0  # what the other writer ingested is known, not ingested again
    assert memory.version == table_version(spark, names.ingest_log)
    assert _without_times(memory.rows) == _without_times(
        store.read_log_rows(spark, names.ingest_log)
    )
    with counted(spark) as idle:
        follower.micro_batch(progress)
    assert idle.count == 0, idle.what

    apply_bucket(spark, config, b)  # the other writer's files (follow applies what it ingests)
    assert_equal_to_truth(spark, bucket, result)


def test_an_apply_with_nothing_new_runs_no_spark_job(
    spark: SparkSession, spark_warehouse: Path, tmp_path: Path, bucket: str
) -> None:
    """Applies without memory, as separate ``dcp-cdc apply`` processes run them: one after an
    apply that consumed everything runs no job. An ingest run planned and not finished moves
    the ingest log: the next apply does its work, consumes nothing of the run and records the
    log as it found it, so the one after runs no job; once the run finishes, the next apply
    applies it and silver equals the truth. (A changed setting makes the next apply do its
    work too: tests/spark/test_silver_apply.py's projection changed with no new change.)"""
    result, files, landing, config = _landed(tmp_path, bucket, spark_warehouse)
    (b,) = config.buckets
    half = len(files) // 2
    for path in files[:half]:
        shutil.copy(path, landing)
    ingest_bucket(spark, config, b)
    assert apply_bucket(spark, config, b).frames
    with counted(spark) as idle:
        summary = apply_bucket(spark, config, b)
    assert idle.count == 0, idle.what
    assert (summary.frames, summary.tables, summary.positions) == (0, {}, {})

    for path in files[half:]:
        shutil.copy(path, landing)

    def stop(point: str) -> None:
        if point == "planned":
            raise KeyboardInterrupt("stopped after planning")

    with pytest.raises(KeyboardInterrupt):
        ingest_bucket(spark, config, b, hook=stop)
    saved = BucketTables(bucket).stream_state
    before = table_version(spark, saved)
    assert apply_bucket(spark, config, b).changes == 0
    assert table_version(spark, saved) == before + 1  # it did its work: the log's mark saved
    with counted(spark) as idle:
        apply_bucket(spark, config, b)
    assert idle.count == 0, idle.what
    assert table_version(spark, saved) == before + 1  # nothing new: nothing saved

    assert ingest_bucket(spark, config, b).resumed  # finishes the run
    assert apply_bucket(spark, config, b).frames
    assert_equal_to_truth(spark, bucket, result)

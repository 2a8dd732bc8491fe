"""``dcp-cdc status`` reads its small tables with delta-rs, no JVM: on tables Spark wrote (a
simulated bucket ingested, applied and checked, one capture file missing so that later ones
are held back), each stage, the newest change, the last quality check and the held-back
files are what the Spark catalog's queries make of the same tables
(tests/support/status_spark_reference.py), timestamps to the microsecond; so are they read
through the catalog (:class:`~pipelines.status.spark_tables.SparkTables`, a shared catalog's
fallback). Again with what a user's ``[tables] properties`` may turn on: deletion vectors
(rows deleted from each table), and a checkpoint every other commit."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from dcp_cdc.config import AppConfig
from pipelines.bronze.job import ingest_bucket
from pipelines.quality.job import check_bucket
from pipelines.silver.job import apply_bucket
from pipelines.status.lag import BucketStatus
from pipelines.status.read import bucket_status, tables_for
from pipelines.status.spark_tables import SparkTables
from pipelines.status.tables_read import DeltaFiles, warehouse_location
from pipelines.tables import BucketTables
from tests.support import status_spark_reference as reference
from tests.support.silver_runs import drop_all, landing_with_gap, one_bucket

FEATURES = {"delta.enableDeletionVectors": "true", "delta.checkpointInterval": "2"}


@pytest.fixture
def bucket(spark: SparkSession, tmp_path: Path) -> Iterator[str]:
    """A fresh bucket name; its tables are dropped afterwards."""
    name = f"s{uuid.uuid4().hex[:8]}"
    yield name
    drop_all(spark, name, ("bronze", "silver", "quality"))


def _config(tmp_path: Path, warehouse: Path, name: str, **properties: str) -> AppConfig:
    """A landing of a simulated session's files but its third (sequence 2), whose later
    files are held back."""
    landing, _ = landing_with_gap(tmp_path, name, seed=11, at_least=6)
    tables = {"properties": {"delta.enableDeletionVectors": "false", **properties}}
    return one_bucket(landing, warehouse, name, spark={"shuffle_partitions": 2}, tables=tables)


def _as_spark_has_it(spark: SparkSession, config: AppConfig) -> BucketStatus:
    """The status read without a JVM, checked against the Spark catalog's queries and the
    catalog's reader."""
    b = config.buckets[0]
    assert isinstance(tables_for(config), DeltaFiles)  # the warehouse's own catalog
    status = bucket_status(config, b, cluster=False)
    names = BucketTables(b.name)
    silver, newest = reference.silver_stage(spark, names)
    assert status.stage("silver") == silver
    assert status.newest_change == newest
    assert status.stage("bronze") == reference.bronze_stage(spark, names)
    assert status.quality == reference.last_quality(spark, config, names)
    assert status.held_back == reference.held_back(spark, config, b, names)
    for moment in (status.stage("silver").moved_at, status.stage("bronze").moved_at, newest):
        assert moment is None or moment.tzinfo is dt.UTC
    if status.quality is not None:
        assert status.quality.checked_at.tzinfo is dt.UTC
    assert bucket_status(config, b, cluster=False, source=SparkTables(spark)) == status
    return status


def test_the_status_without_a_jvm_is_the_catalogs_stage_by_stage(
    spark: SparkSession, spark_warehouse: Path, tmp_path: Path, bucket: str
) -> None:
    config = _config(tmp_path, spark_warehouse, bucket)
    b = config.buckets[0]
    nothing = _as_spark_has_it(spark, config)
    assert [s.name for s in nothing.stages if s.known] == []
    assert nothing.quality is None and nothing.held_back == ()

    ingest_bucket(spark, config, b)
    ingested = _as_spark_has_it(spark, config)
    assert ingested.stage("bronze").positions and not ingested.stage("silver").known
    assert [h.missing for h in ingested.held_back] == [(2,)]

    apply_bucket(spark, config, b)
    check_bucket(spark, config, b)
    done = _as_spark_has_it(spark, config)
    assert done.stage("silver").positions and done.newest_change is not None
    assert done.quality is not None and done.quality.expectations > 0
    assert done.stage("silver").moved_at is not None and done.stage("bronze").moved_at


def _deletion_vectors(location: str) -> int:
    """How many files of the table's log carry a deletion vector."""
    found = 0
    for commit in sorted(Path(location, "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            add = json.loads(line).get("add")
            found += bool(add and add.get("deletionVector"))
    return found


def test_deletion_vectors_and_checkpoints(
    spark: SparkSession, spark_warehouse: Path, tmp_path: Path, bucket: str
) -> None:
    config = _config(tmp_path, spark_warehouse, bucket, **FEATURES)
    b = config.buckets[0]
    ingest_bucket(spark, config, b)
    apply_bucket(spark, config, b)
    report = check_bucket(spark, config, b)
    names = BucketTables(b.name)
    first = report.outcomes[0]
    deleted = {
        names.stream_state: "vbucket = 0",
        names.ingest_log: "status = 'ingested' AND file_sequence = 1",
        names.results: f"suite = '{first.suite}' AND expectation = '{first.name}'",
    }
    for table, where in deleted.items():
        spark.sql(f"OPTIMIZE {table}")  # one file: a row deleted leaves a deletion vector
        spark.sql(f"DELETE FROM {table} WHERE {where}")
        assert _deletion_vectors(warehouse_location(config, table)) > 0, table
    log = Path(warehouse_location(config, names.ingest_log), "_delta_log")
    assert list(log.glob("*.checkpoint.parquet")), "no checkpoint: raise the ingest log's commits"

    status = _as_spark_has_it(spark, config)
    silver = status.stage("silver").positions
    assert silver is not None and 0 not in silver and silver
    assert status.quality is not None
    assert status.quality.expectations == len(report.outcomes) - 1

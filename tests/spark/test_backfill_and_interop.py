"""A silver rebuild (the DAG's backfill) gives the same tables; another Delta implementation
(delta-rs, the ``deltalake`` package) reads the tables Spark wrote and gets the same rows."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from dcp_cdc.config import (
    AppConfig,
    BucketConfig,
    MaintenanceConfig,
    QualityConfig,
    SilverConfig,
)
from dcp_cdc.errors import ConfigError
from dcp_cdc.simulator import SimulationResult
from pipelines.silver.job import apply_bucket, purge_tombstones
from pipelines.tables import BucketTables, all_rows
from tests.support import delta_rs
from tests.support.silver_runs import drop_all, pipeline
from tests.support.truth import assert_equal_to_truth

# Scalar columns compared row by row between the two readers (doc_binary and xattrs too).
SILVER_COLUMNS = (
    "key",
    "doc",
    "_collection_id",
    "_vbucket",
    "_vb_uuid",
    "_seqno",
    "_rev_seqno",
    "_cas",
    "_flags",
    "_expiry",
    "_deleted",
    "_change",
    "_ingest_run_id",
)


@dataclass(frozen=True)
class Applied:
    bucket: str
    result: SimulationResult
    config: AppConfig


@pytest.fixture(scope="module")
def applied(
    spark: SparkSession, spark_warehouse: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Applied]:
    """One small ``mixed`` simulation (rollbacks, deletes, drops) in bronze and silver, shared
    by the tests here: reading it is free, and the rebuild test leaves it as it found it."""
    name = f"s{uuid.uuid4().hex[:8]}"
    result, config = pipeline(
        spark,
        tmp_path_factory.mktemp("sim"),
        spark_warehouse,
        name,
        scenario="mixed",
        seed=11,
        vbuckets=2,
        docs=40,
        ops=160,
    )
    yield Applied(name, result, config)
    drop_all(spark, name)


def _spark_rows(spark: SparkSession, table: str) -> set[tuple[Any, ...]]:
    return {
        (
            *(r[c] for c in SILVER_COLUMNS),
            r["doc_binary"],
            tuple(sorted((r["xattrs"] or {}).items())),
        )
        for r in spark.table(table).collect()
    }


def _delta_rs_rows(location: str) -> set[tuple[Any, ...]]:
    table = delta_rs.read_delta(location)
    return {
        (*(r[c] for c in SILVER_COLUMNS), r["doc_binary"], tuple(sorted(r["xattrs"] or [])))
        for r in table.to_pylist()
    }


def _location(spark: SparkSession, table: str) -> str:
    return str(spark.sql(f"DESCRIBE DETAIL {table}").collect()[0]["location"])


def _silver_tables(spark: SparkSession, bucket: str) -> list[tuple[str, str]]:
    rows = spark.table(BucketTables(bucket).registry).where("status != 'retired'").collect()
    return sorted((all_rows(r["table_name"]), f"{r['scope']}.{r['name']}") for r in rows)


def test_deltalake_reads_the_same_rows(spark: SparkSession, applied: Applied) -> None:
    """Silver tables after MERGEs, rollbacks and deletes (change data feed, liquid
    clustering, deletion vectors) and bronze events read the same through delta-rs's SQL
    reader; bronze, which has no deletion vectors, through its pyarrow reader too."""
    from deltalake import DeltaTable

    bucket = applied.bucket
    tables = _silver_tables(spark, bucket)
    assert len(tables) >= 2
    features = set()
    for table, _ in tables:
        location = _location(spark, table)
        features |= set(DeltaTable(location).protocol().reader_features or [])
        rows = _spark_rows(spark, table)
        assert rows and _delta_rs_rows(location) == rows, table
    assert "deletionVectors" in features  # [silver] deletion_vectors, on by default
    events = BucketTables(bucket).events
    spark_events = {
        (r["vbucket"], r["by_seqno"], r["op"], r["key"]) for r in spark.table(events).collect()
    }
    location = _location(spark, events)
    assert not DeltaTable(location).protocol().reader_features
    rs = DeltaTable(location).to_pyarrow_table(columns=["vbucket", "by_seqno", "op", "key"])
    assert {tuple(r.values()) for r in rs.to_pylist()} == spark_events


def test_rebuild_of_a_collection_after_a_purge_gives_the_same_table(
    spark: SparkSession, applied: Applied
) -> None:
    """The backfill empties the table and its purge marks, then walks all of bronze: the live
    documents and the tombstones (purged ones too) come back as they were."""
    from pyspark.sql import functions as F

    bucket, result, config = applied.bucket, applied.result, applied.config
    tables = _silver_tables(spark, bucket)
    before = {t: _spark_rows(spark, t) for t, _ in tables}
    table, collection = next(
        (t, c) for t, c in tables if any(r[SILVER_COLUMNS.index("_deleted")] for r in before[t])
    )
    now = config.model_copy(update={"silver": SilverConfig(tombstone_retention_hours=0)})
    assert sum(purge_tombstones(spark, now, config.buckets[0]).values()) > 0
    purged = {t: _spark_rows(spark, t) for t, _ in tables}
    spark.sql(f"DELETE FROM {table} WHERE _vbucket = 0")  # damage for the backfill to repair
    started = spark.sql("SELECT current_timestamp() AS t").collect()[0]["t"]

    summary = apply_bucket(spark, config, config.buckets[0], collection=collection, rebuild=True)
    assert summary.changes >= len(before[table])
    assert {t: _spark_rows(spark, t) for t in before} == {**purged, table: before[table]}
    oldest = spark.table(table).agg(F.min("_applied_at")).collect()[0][0]
    assert oldest >= started  # every row was written again: the table was emptied first
    assert_equal_to_truth(spark, bucket, result)

    with pytest.raises(ConfigError, match=r"'nope\.nope' is not a live collection"):
        apply_bucket(spark, config, BucketConfig(name=bucket), collection="nope.nope", rebuild=True)


def test_maintenance_purges_deletes_old_quality_results_optimizes_and_vacuums(
    spark: SparkSession, applied: Applied
) -> None:
    from pipelines.maintenance.job import maintain_bucket

    bucket, config = applied.bucket, applied.config
    spark.sql("CREATE DATABASE IF NOT EXISTS quality")
    results = BucketTables(bucket).results  # only its checked_at matters to the retention
    spark.sql(f"CREATE TABLE {results} (expectation STRING, checked_at TIMESTAMP) USING delta")
    spark.sql(
        f"INSERT INTO {results} VALUES ('old', current_timestamp() - INTERVAL 40 DAYS), "
        "('new', current_timestamp() - INTERVAL 1 DAYS)"
    )
    tables = [t for t, _ in _silver_tables(spark, bucket)]
    tombstones = sum(spark.table(t).where("_deleted").count() for t in tables)
    live = {t: spark.table(t).where("NOT _deleted").count() for t in tables}
    settings = config.model_copy(
        update={
            "silver": SilverConfig(tombstone_retention_hours=0),
            "maintenance": MaintenanceConfig(vacuum_retention_hours=0),
            "quality": QualityConfig(results_retention_days=30),
        }
    )
    try:
        summary = maintain_bucket(spark, settings, settings.buckets[0])
        assert sum(summary.purged.values()) == tombstones
        assert {t: spark.table(t).count() for t in tables} == live
        assert summary.quality_rows_deleted == 1
        assert [r["expectation"] for r in spark.table(results).collect()] == ["new"]
        events = BucketTables(bucket).events
        assert {events, results, *tables} <= set(summary.vacuumed)
        assert summary.optimized and set(summary.optimized) <= set(summary.vacuumed)
        assert all(removed >= added for removed, added in summary.optimized.values())
        for table in (events, *tables):  # VACUUM RETAIN 0 HOURS: only live files stay
            detail = spark.sql(f"DESCRIBE DETAIL {table}").collect()[0]
            folder = Path(detail["location"].removeprefix("file:"))
            assert len(list(folder.rglob("*.parquet"))) == detail["numFiles"], table
        assert spark.conf.get("spark.databricks.delta.retentionDurationCheck.enabled") != "false"
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {results}")

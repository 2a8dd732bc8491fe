"""Bronze ingest over simulator captures: counts, lineage, quarantine, exactly once, order."""

from __future__ import annotations

import json
import shutil
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from dcp_cdc.config import AppConfig, BucketConfig, IngestConfig
from dcp_cdc.decoder import decode_frame
from dcp_cdc.simulator import simulate
from pipelines.bronze.job import IngestSummary, ingest_bucket
from pipelines.tables import BucketTables
from tests.support.spark_jobs import counted


class Killed(RuntimeError):
    """Stands for the process dying at a given point of a run."""


def _config(landing: Path, warehouse: Path, bucket: str, **ingest: Any) -> AppConfig:
    return AppConfig(
        landing=str(landing),
        warehouse=str(warehouse),
        buckets=[BucketConfig(name=bucket)],
        ingest=IngestConfig(**ingest),
    )


@pytest.fixture
def bucket(spark: SparkSession) -> Any:
    name = f"b-{uuid.uuid4().hex[:8]}"
    yield name
    for table in BucketTables(name).bronze.values():
        spark.sql(f"DROP TABLE IF EXISTS {table}")


def _ingest(spark: SparkSession, config: AppConfig, **kw: Any) -> IngestSummary:
    return ingest_bucket(spark, config, config.buckets[0], **kw)


def _op_counts(spark: SparkSession, bucket: str) -> dict[str, int]:
    rows = spark.table(BucketTables(bucket).events).groupBy("op").count().collect()
    return {r["op"]: r["count"] for r in rows}


def _expected_counts(truth: Path) -> dict[str, int]:
    counts = json.loads(truth.read_text())["event_counts"]
    return {k: v for k, v in counts.items() if k not in ("malformed", "truncated")}


def test_counts_lineage_and_quarantine(
    spark: SparkSession, bucket: str, tmp_path: Path, spark_warehouse: Path
) -> None:
    result = simulate(
        tmp_path / "sim",
        scenario="mixed",
        seed=3,
        bucket=bucket,
        vbuckets=8,
        docs=150,
        ops=600,
        inject_malformed=1,
        max_file_bytes=40_000,
    )
    config = _config(tmp_path / "sim" / "landing", spark_warehouse, bucket, chunk_bytes=65536)
    summary = _ingest(spark, config)
    assert summary.files == len(result.files) and not summary.waiting

    assert _op_counts(spark, bucket) == _expected_counts(result.truth)

    names = BucketTables(bucket).bronze
    quarantined = spark.table(names["quarantine"]).orderBy("file", "offset").collect()
    expected = sorted((e["file"], e["offset"], e["reason"]) for e in result.expected_errors)
    assert sorted((Path(q["file"]).name, q["offset"], q["reason"]) for q in quarantined) == expected
    cut = next(q for q in quarantined if q["truncated"])
    cut_file = Path(cut["file"]).read_bytes()
    assert cut["raw"] == cut_file[cut["offset"] :] and cut["raw_length"] == len(cut["raw"])
    bad = next(q for q in quarantined if not q["truncated"])
    assert (
        bad["raw"]
        == Path(bad["file"]).read_bytes()[bad["offset"] : bad["offset"] + bad["frame_length"]]
    )

    # lineage: every 37th row's file and offset hold exactly the frame it describes
    events = spark.table(names["events"])
    sample = events.where(F.col("frame_index") % 37 == 0).collect()
    assert len(sample) > 20
    for row in sample:
        data = Path(row["file"]).read_bytes()
        event = decode_frame(data, row["offset"], collections=True)
        assert event.header.offset == row["offset"] and event.op == row["op"]
        assert getattr(event, "by_seqno", None) == row["by_seqno"]
        assert getattr(event, "key", None) == row["key"]
    # frame index: per file, 0..n-1 over well-formed and malformed frames in offset order
    per_file = events.groupBy("file").agg(
        F.count("*").alias("n"), F.max("frame_index").alias("top")
    )
    errors = Counter(q["file"] for q in quarantined if not q["truncated"])
    for r in per_file.collect():
        assert r["top"] == r["n"] - 1 + errors[r["file"]]

    # the snapshot each data event arrived in (docs/protocol/dcp.md §6.3): start <= seqno <= end
    data = events.where(F.col("op").isin("mutation", "deletion", "expiration") & ~F.col("in_oso"))
    assert data.where(F.col("in_snapshot_end").isNull()).count() == 0
    outside = data.where(
        (F.col("by_seqno") > F.col("in_snapshot_end"))
        | (F.col("by_seqno") < F.col("in_snapshot_start"))
    )
    assert outside.count() == 0
    assert data.where(F.col("in_vb_uuid").isNull()).count() == 0


def test_rerun_is_a_no_op(
    spark: SparkSession, bucket: str, tmp_path: Path, spark_warehouse: Path
) -> None:
    simulate(
        tmp_path / "sim", scenario="basic", seed=4, bucket=bucket, vbuckets=4, docs=60, ops=200
    )
    config = _config(tmp_path / "sim" / "landing", spark_warehouse, bucket)
    first = _ingest(spark, config)
    versions = {
        k: spark.sql(f"DESCRIBE HISTORY {t}").count()
        for k, t in BucketTables(bucket).bronze.items()
    }
    second = _ingest(spark, config)
    assert first.frames > 0 and second.run_version is None and second.frames == 0
    assert versions == {
        k: spark.sql(f"DESCRIBE HISTORY {t}").count()
        for k, t in BucketTables(bucket).bronze.items()
    }


@pytest.mark.parametrize("point", ["planned", "written", "events", "quarantine"])
def test_a_run_killed_midway_then_rerun_is_exactly_once(
    spark: SparkSession, bucket: str, tmp_path: Path, spark_warehouse: Path, point: str
) -> None:
    result = simulate(
        tmp_path / "sim",
        scenario="interrupted",
        seed=5,
        bucket=bucket,
        vbuckets=4,
        docs=80,
        ops=300,
        inject_malformed=1,
    )
    config = _config(tmp_path / "sim" / "landing", spark_warehouse, bucket)

    def die(at: str) -> None:
        if at == point:
            raise Killed(at)

    with pytest.raises(Killed):
        _ingest(spark, config, hook=die)
    resumed = _ingest(spark, config)
    assert resumed.resumed
    assert _op_counts(spark, bucket) == _expected_counts(result.truth)
    assert spark.table(BucketTables(bucket).quarantine).count() == len(result.expected_errors)
    assert _ingest(spark, config).run_version is None  # and then nothing is left to do


def test_out_of_order_arrival_and_carried_stream_state(
    spark: SparkSession, bucket: str, tmp_path: Path, spark_warehouse: Path
) -> None:
    kwargs = dict(scenario="rollback", seed=6, vbuckets=8, docs=150, ops=600, max_file_bytes=30_000)
    result = simulate(tmp_path / "sim", bucket=bucket, **kwargs)  # type: ignore[arg-type]
    files = sorted(result.files)
    assert len(files) >= 4
    landing = tmp_path / "landing"
    landing.mkdir()
    config = _config(landing, spark_warehouse, bucket)
    # files arrive out of order: the last first, then all but the second, then the second
    shutil.copy(files[-1], landing)
    assert _ingest(spark, config).run_version is None
    for f in files[2:]:
        shutil.copy(f, landing)
    shutil.copy(files[0], landing)
    first = _ingest(spark, config)
    assert first.files == 1 and len(first.waiting) == len(files) - 2
    shutil.copy(files[1], landing)
    second = _ingest(spark, config)
    assert second.files == len(files) - 1 and not second.waiting
    assert _op_counts(spark, bucket) == _expected_counts(result.truth)

    # the state carried across files and runs equals that of one run over everything
    other = f"{bucket}-x"
    simulate(tmp_path / "sim2", bucket=other, **kwargs)  # type: ignore[arg-type]
    try:
        _ingest(spark, _config(tmp_path / "sim2" / "landing", spark_warehouse, other))
        cols = [
            "file_sequence",
            "frame_index",
            "op",
            "in_snapshot_start",
            "in_snapshot_end",
            "in_snapshot_flags",
            "in_oso",
            "in_vb_uuid",
        ]
        staged = spark.table(BucketTables(bucket).events).select(cols)
        whole = spark.table(BucketTables(other).events).select(cols)
        assert staged.exceptAll(whole).count() == 0 and whole.exceptAll(staged).count() == 0
    finally:
        for table in BucketTables(other).bronze.values():
            spark.sql(f"DROP TABLE IF EXISTS {table}")


def test_a_file_changed_after_ingest_is_reported_not_reread(
    spark: SparkSession, bucket: str, tmp_path: Path, spark_warehouse: Path
) -> None:
    result = simulate(
        tmp_path / "sim", scenario="basic", seed=7, bucket=bucket, vbuckets=4, docs=40, ops=100
    )
    config = _config(tmp_path / "sim" / "landing", spark_warehouse, bucket)
    _ingest(spark, config)
    before = _op_counts(spark, bucket)
    with open(result.files[0], "ab") as fh:
        fh.write(b"\x80" * 10)
    again = _ingest(spark, config)
    assert again.changed == [str(result.files[0])] and again.run_version is None
    assert _op_counts(spark, bucket) == before
    log = spark.table(BucketTables(bucket).ingest_log).where("status = 'changed'").collect()
    assert len(log) == 1 and log[0]["file"] == str(result.files[0])


def _added_files(spark: SparkSession, table: str) -> list[dict[str, Any]]:
    """The ``add`` actions of ``table``'s log, in commit order."""
    location = spark.sql(f"DESCRIBE DETAIL {table}").first()["location"]  # type: ignore[index]
    adds = []
    for commit in sorted(Path(location.removeprefix("file:"), "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            adds += [json.loads(line)["add"]] if '"add"' in line else []
    return adds


def test_the_arrow_writer_gives_the_rows_and_statistics_of_sparks_writer(
    spark: SparkSession, bucket: str, tmp_path: Path, spark_warehouse: Path
) -> None:
    """The same captures ingested by each writer: the same rows, Parquet that Spark and
    delta-rs read, and per file the statistics Delta's own writer computes (which is what
    data skipping reads), but for the two columns that name the run."""
    from deltalake import DeltaTable

    simulate(
        tmp_path / "sim",
        scenario="mixed",
        seed=8,
        bucket=bucket,
        vbuckets=4,
        docs=80,
        ops=300,
        max_file_bytes=30_000,
    )
    run_columns = ("ingest_run_id", "ingested_at")
    rows, stats = {}, {}
    for writer in ("arrow", "spark"):
        config = _config(
            tmp_path / "sim" / "landing",
            spark_warehouse,
            bucket,
            writer=writer,
            on_driver_below_bytes=0,  # the decode tasks: a file each group, as Spark's writer
        )
        assert _ingest(spark, config).frames > 0
        table = BucketTables(bucket).events
        rows[writer] = Counter(
            json.dumps(r.asDict(recursive=True), default=repr, sort_keys=True)
            for r in spark.table(table).drop(*run_columns).collect()
        )
        stats[writer] = Counter()
        for add in _added_files(spark, table):
            parsed = json.loads(add["stats"])
            for part in ("minValues", "maxValues", "nullCount"):
                for column in run_columns:
                    parsed[part].pop(column, None)
            stats[writer][json.dumps(parsed, sort_keys=True)] += 1
        if writer == "arrow":
            location = spark.sql(f"DESCRIBE DETAIL {table}").first()["location"]  # type: ignore[index]
            assert DeltaTable(location).to_pyarrow_table().num_rows == rows[writer].total()
        for name in BucketTables(bucket).bronze.values():
            spark.sql(f"DROP TABLE {name}")
    assert rows["arrow"] == rows["spark"] and rows["arrow"].total() > 300
    assert stats["arrow"] == stats["spark"] and stats["arrow"].total() > 1


def _bronze_rows(spark: SparkSession, names: BucketTables) -> dict[str, Counter[str]]:
    """Each bronze table's rows but for what names the run and when it logged."""
    dropped = ("ingest_run_id", "ingested_at", "logged_at", "run_version")
    return {
        table: Counter(
            json.dumps(r.asDict(recursive=True), default=repr, sort_keys=True)
            for r in spark.table(table).drop(*dropped).collect()
        )
        for table in (names.events, names.quarantine, names.ingest_log)
    }


def test_a_run_ingested_in_the_driver_equals_the_tasks_run(
    spark: SparkSession, bucket: str, tmp_path: Path, spark_warehouse: Path
) -> None:
    """Below ``[ingest] on_driver_below_bytes`` the driver scans, decodes and writes the run
    itself: the same events, quarantine records and ingest log as Spark's tasks give."""
    simulate(
        tmp_path / "sim",
        scenario="mixed",
        seed=8,
        bucket=bucket,
        vbuckets=4,
        docs=80,
        ops=300,
        inject_malformed=1,
        max_file_bytes=30_000,
    )
    names = BucketTables(bucket)
    seen = {}
    for below in (0, 1 << 30):
        config = _config(
            tmp_path / "sim" / "landing", spark_warehouse, bucket, on_driver_below_bytes=below
        )
        assert _ingest(spark, config).frames > 300
        seen[below] = _bronze_rows(spark, names)
        for name in names.bronze.values():
            spark.sql(f"DROP TABLE {name}")
    assert seen[0] == seen[1 << 30]
    assert sum(seen[0][names.quarantine].values()) > 0  # malformed frames met both ways


def test_a_small_run_ingested_in_the_driver_runs_no_spark_job(
    spark: SparkSession, bucket: str, tmp_path: Path, spark_warehouse: Path
) -> None:
    """A run of few bytes (its tables made by an earlier run) runs no Spark job: the ingest
    log read by delta-rs, the files scanned, decoded and written in the driver, the commits
    the driver's own. With ``on_driver_below_bytes = 0``, Spark's tasks do it."""
    simulate(
        tmp_path / "sim",
        scenario="basic",
        seed=4,
        bucket=bucket,
        vbuckets=4,
        docs=40,
        ops=120,
        max_file_bytes=8_000,
    )
    files = sorted((tmp_path / "sim" / "landing").iterdir())
    half = len(files) // 2
    assert half >= 2
    for below in (1 << 30, 0):
        landing = tmp_path / f"landing-{below}"
        landing.mkdir()
        config = _config(landing, spark_warehouse, bucket, on_driver_below_bytes=below)
        for f in files[:half]:
            shutil.copy(f, landing)
        assert _ingest(spark, config).files == half
        for f in files[half:]:
            shutil.copy(f, landing)
        with counted(spark) as jobs:
            summary = _ingest(spark, config)
        assert summary.files == len(files) - half and summary.frames > 0
        if below:
            assert jobs.count == 0, jobs.what
        else:
            assert jobs.count > 0  # the tasks' way: the count sees them
        for name in BucketTables(bucket).bronze.values():
            spark.sql(f"DROP TABLE {name}")

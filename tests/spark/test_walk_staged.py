"""The walk in chunks (:mod:`pipelines.silver.walk_staged`): the driver walks a run of more
frames than ``[silver] walk_on_driver_below`` a share of the vbuckets at a time, from the
files the same process's ingest wrote."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from dcp_cdc.config import AppConfig, BucketConfig, SilverConfig
from dcp_cdc.simulator import simulate
from pipelines.bronze.job import ingest_bucket
from pipelines.bronze.landing import filesystem
from pipelines.bronze.memory import IngestMemory
from pipelines.lake import delta_io
from pipelines.silver import arrow_rows, state
from pipelines.silver.job import apply_bucket
from pipelines.silver.memory import ApplyMemory
from pipelines.silver.registry import ensure_support_tables
from pipelines.silver.walk import VERSION_KINDS
from pipelines.tables import BucketTables, all_rows
from tests.support.silver_runs import unconsumed_from_memory
from tests.support.spark_jobs import counted
from tests.support.truth import assert_equal_to_truth


def _rows(df: DataFrame) -> list[str]:
    return sorted(
        json.dumps(r.asDict(recursive=True), sort_keys=True, default=repr) for r in df.collect()
    )


def _exists(path: str, storage: dict[str, str]) -> bool:
    fs, where = filesystem(path, storage)
    return fs.get_file_info(where).type.name != "NotFound"


def test_a_walk_in_chunks_gives_the_rows_of_one_walk_and_runs_no_spark_job(
    spark: SparkSession, tmp_path: Path, bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A ``mixed`` capture (several sessions, a rollback, deletions, 8 vbuckets) ingested in
    two halves by one process: for each half, the walk in chunks of a third of its frames
    and the writing of its pending rows run no Spark job; its walked rows (read back by Spark
    from the staged files) and control rows equal those of one walk of them all (Spark's),
    from a fresh state and from the states the first half's apply saved; its pending files
    hold the newest change per key of the walk as silver rows; discarding it removes every
    file it wrote. The applies with that bound walk in chunks: the first, into a silver that
    holds nothing, commits its rows straight into the collection tables, the second appends
    to the pending table; silver equals the truth."""
    result = simulate(
        tmp_path / "sim", bucket=bucket, scenario="mixed", seed=11, vbuckets=8, docs=80, ops=320
    )
    landing = tmp_path / "landing"
    landing.mkdir()
    files = sorted(result.files)
    names = BucketTables(bucket)
    storage = dict(spark.sparkContext.getConf().getAll())
    memory = IngestMemory()
    chunked_runs = 0
    for half in (files[: len(files) // 2], files[len(files) // 2 :]):
        for f in half:
            (landing / f.name).write_bytes(f.read_bytes())
        plain = AppConfig(
            landing=str(landing),
            warehouse=str(tmp_path / "wh"),
            buckets=[BucketConfig(name=bucket)],
        )
        ingest_bucket(spark, plain, plain.buckets[0], memory=memory)
        ensure_support_tables(spark, bucket, plain.tables.properties, live=True)  # as an apply
        states = (
            state.read_states(spark, names.stream_state)
            if spark.catalog.tableExists(names.stream_state)
            else {}
        )
        kept = unconsumed_from_memory(spark, names, states, memory)
        assert kept.files is not None
        one_walk = state.walk_vbuckets(
            spark,
            kept.frames,
            states,
            late_after=kept.late_after,
            read_through=kept.read_through,
        ).localCheckpoint()
        frames = kept.frames.where(F.col("vb_key").isNotNull()).count()
        chunk = frames // 3
        config = plain.model_copy(update={"silver": SilverConfig(walk_on_driver_below=chunk)})
        with counted(spark) as jobs:
            staged = state.walked_in_chunks(
                spark,
                config,
                bucket,
                kept.files,
                states,
                late_after=kept.late_after,
                read_through=kept.read_through,
            )
            assert staged is not None
            pending = staged.write_pending(spark, bucket)
        assert jobs.count == 0, jobs.what
        assert staged.chunks >= 3, staged
        assert _rows(staged.frame(spark)) == _rows(one_walk)
        controls = one_walk.where(~F.col("kind").isin(*VERSION_KINDS))
        assert sorted(
            json.dumps(r, sort_keys=True, default=repr) for r in staged.controls
        ) == _rows(controls)
        assert pending is not None and pending.files and not pending.committed
        written = [
            pq.read_table(filesystem(f"{pending.location}/{f['path']}", storage)[1])
            for f in pending.files
        ]
        newest = arrow_rows.silver_rows(
            one_walk.toArrow(), staged.collections, dt.datetime.now(dt.UTC)
        )
        assert newest is not None

        def keyed(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
            return sorted((r["_collection_id"], r["key"], r["_seqno"], r["doc"]) for r in rows)

        got = [r for t in written for r in t.drop_columns(["_applied_at"]).to_pylist()]
        assert keyed(got) == keyed(newest.to_pylist())
        assert sum(t.num_rows for t in written) == newest.num_rows > 50
        paths = [f"{pending.location}/{f['path']}" for f in pending.files] + [staged.staging]
        staged.discard()
        assert not any(_exists(p, storage) for p in paths)
        with caplog.at_level("INFO", logger="dcp_cdc.silver"):
            caplog.clear()
            summary = apply_bucket(
                spark, config, config.buckets[0], memory=ApplyMemory(ingest=memory)
            )
        chunked_runs += any("walked by the driver in" in r.getMessage() for r in caplog.records)
        if chunked_runs == 1:  # into a silver of no row: straight into the tables, no MERGE
            assert "append" in summary.steps and "merge" not in summary.steps, summary.steps
            assert delta_io.table_size(spark, names.pending)[0] == 0
            assert all(delta_io.table_size(spark, all_rows(t))[0] for t in summary.tables)
        one_walk.unpersist()
    assert chunked_runs == 2
    assert_equal_to_truth(spark, bucket, result)
    assert not list((tmp_path / "wh").rglob("_staged_walk_*"))  # the applies' staging is gone


def test_an_apply_in_chunks_into_a_silver_with_rows_appends_to_the_pending_table(
    spark: SparkSession, tmp_path: Path, bucket: str
) -> None:
    """Two applies of a ``basic`` capture, both walked in chunks: the first commits its rows
    straight into the empty collection tables, the second (silver holds rows, no drop nor
    rollback) appends its rows to the pending table in one commit of the driver's, and
    the files that commit took stay when the walk's files are discarded: the views equal the
    truth, and the pending table's rows read back whole."""
    result = simulate(
        tmp_path / "sim", bucket=bucket, scenario="basic", seed=4, vbuckets=4, docs=80, ops=320
    )
    landing = tmp_path / "landing"
    landing.mkdir()
    files = sorted(result.files)
    config = AppConfig(
        landing=str(landing),
        warehouse=str(tmp_path / "wh"),
        buckets=[BucketConfig(name=bucket)],
        silver=SilverConfig(walk_on_driver_below=40),
    )
    names = BucketTables(bucket)
    memory = IngestMemory()
    steps = []
    for half in (files[: len(files) // 2], files[len(files) // 2 :]):
        for f in half:
            (landing / f.name).write_bytes(f.read_bytes())
        ingest_bucket(spark, config, config.buckets[0], memory=memory)
        summary = apply_bucket(spark, config, config.buckets[0], memory=ApplyMemory(ingest=memory))
        steps.append(summary.steps)
    assert all("append" in s and "merge" not in s for s in steps), steps
    pending = delta_io.table_size(spark, names.pending)[0]
    assert pending > 0
    assert spark.table(names.pending).count() > 0  # every file the log names is there
    assert_equal_to_truth(spark, bucket, result)
    assert not list((tmp_path / "wh").rglob("_staged_walk_*"))


@pytest.mark.parametrize("scenario", ["collection-lifecycle", "rollback"])
def test_a_first_apply_in_chunks_with_a_drop_or_a_rollback_goes_straight_into_the_tables(
    spark: SparkSession, tmp_path: Path, bucket: str, scenario: str
) -> None:
    """One apply, walked in chunks, of a whole capture holding collection drops and creates
    (``collection-lifecycle``) or a failover's rollback (``rollback``) into a silver that
    holds nothing: nothing to cut or retract, so it commits its rows straight into the
    collection tables (no MERGE), the dropped collections' tables retired as a MERGE would
    leave them; the views equal the truth."""
    result = simulate(
        tmp_path / "sim", bucket=bucket, scenario=scenario, seed=5, vbuckets=4, docs=60, ops=240
    )
    landing = tmp_path / "landing"
    landing.mkdir()
    for f in result.files:
        (landing / f.name).write_bytes(f.read_bytes())
    config = AppConfig(
        landing=str(landing),
        warehouse=str(tmp_path / "wh"),
        buckets=[BucketConfig(name=bucket)],
        silver=SilverConfig(walk_on_driver_below=40),
    )
    memory = IngestMemory()
    ingest_bucket(spark, config, config.buckets[0], memory=memory)
    summary = apply_bucket(spark, config, config.buckets[0], memory=ApplyMemory(ingest=memory))
    assert "append" in summary.steps and "merge" not in summary.steps, summary.steps
    assert summary.changes > 0
    assert delta_io.table_size(spark, BucketTables(bucket).pending)[0] == 0
    assert_equal_to_truth(spark, bucket, result)

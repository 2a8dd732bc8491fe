"""Follow mode's memory of silver between micro-batches (pipelines/silver/memory.py): what it
keeps is what the tables hold, it is used while they are at the versions it wrote, read again
when another writer moved them, and silver equals the truth either way."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from dcp_cdc.config import AppConfig, BucketConfig
from dcp_cdc.simulator import simulate
from pipelines.bronze import store
from pipelines.bronze.job import ingest_bucket
from pipelines.bronze.memory import IngestMemory
from pipelines.lake.delta_io import table_version
from pipelines.silver import state, transforms
from pipelines.silver.job import apply_bucket
from pipelines.silver.memory import ApplyMemory, Recall
from pipelines.silver.registry import read_registry
from pipelines.tables import BucketTables
from tests.support.silver_runs import landed
from tests.support.spark_jobs import counted
from tests.support.truth import assert_equal_to_truth


def _by_name(rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {r["collection_id"]: {k: v for k, v in r.items() if k != "updated_at"} for r in rows}


@pytest.mark.long  # five applies, two minutes; make test runs follow mode with memory in
# tests/spark/test_metrics_export.py
def test_memory_keeps_what_the_tables_hold_and_reads_again_after_another_writer(
    spark: SparkSession,
    spark_warehouse: Path,
    tmp_path: Path,
    bucket: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Collections are created, dropped and retired across four micro-batches of files in
    session order; before the third one's, a batch run (another writer, no memory) applies.
    The memory-backed runs read the stream state only when it is not theirs (the first, and
    the one after the other writer's that has something to apply), what they keep equals the
    tables, and silver equals the truth."""
    result, files, landing, config = landed(
        tmp_path, bucket, spark_warehouse, scenario="collection-lifecycle", seed=3, ops=120
    )
    (b,) = config.buckets
    names = BucketTables(bucket)
    reads: list[str] = []
    real_read = state.read_states

    def counted(spark: SparkSession, table: str) -> dict[int, dict[str, Any]]:
        reads.append(table)
        return real_read(spark, table)

    monkeypatch.setattr(state, "read_states", counted)
    log_reads: list[int] = []
    real_finished = transforms.finished_runs

    def finished(log: Any) -> Any:
        log_reads.append(1)
        return real_finished(log)

    monkeypatch.setattr(transforms, "finished_runs", finished)
    memory = ApplyMemory(ingest=IngestMemory())
    quarter = -(-len(files) // 4)
    batches = [files[i : i + quarter] for i in range(0, len(files), quarter)]
    read_by_batch, kept_registry = [], 0
    for i, batch in enumerate(batches):
        for path in batch:
            shutil.copy(path, landing)
        ingest_bucket(spark, config, b, memory=memory.ingest)
        if i == 2:
            apply_bucket(spark, config, b)  # the other writer: its run commits the state
            log_reads.clear()  # it reads the log: it has no memory
        before = len(reads)
        apply_bucket(spark, config, b, memory=memory)
        read_by_batch.append(len(reads) - before)
        if i == 2:  # the other writer consumed the batch: this run returned at once
            continue
        # what is kept at the table's version is what the table holds
        assert memory.states is not None
        assert memory.states.version == table_version(spark, names.stream_state), i
        assert memory.states.rows == real_read(spark, names.stream_state), i
        # (none after a run that retired a collection: renamed tables are read again)
        if memory.registry is not None:
            kept_registry += 1
            assert memory.registry.version == table_version(spark, names.registry), i
            assert _by_name(memory.registry.rows) == _by_name(read_registry(spark, bucket)), i
    # the first run reads, each next one keeps; the one after the other writer's has nothing
    # new (the other writer consumed that batch) and reads nothing, and the next reads again
    assert read_by_batch == [1, 0, 0, 1]
    assert kept_registry >= 2
    assert not log_reads  # the runs to walk came from the ingest's memory of its log
    assert_equal_to_truth(spark, bucket, result)


def test_a_failed_run_forgets(
    spark: SparkSession,
    spark_warehouse: Path,
    tmp_path: Path,
    bucket: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run that fails after its MERGEs forgets what it kept; the next run reads the tables
    and finishes the batch."""
    result = simulate(
        tmp_path / "sim", bucket=bucket, scenario="basic", seed=4, vbuckets=2, docs=30, ops=60
    )
    config = AppConfig(
        landing=str(result.out / "landing"),
        warehouse=str(spark_warehouse),
        buckets=[BucketConfig(name=bucket)],
    )
    (b,) = config.buckets
    memory = ApplyMemory()
    ingest_bucket(spark, config, b)

    def fail(*_: Any) -> None:
        raise RuntimeError("killed before the state is saved")

    with monkeypatch.context() as m:
        m.setattr(state, "save_states", fail)
        with pytest.raises(RuntimeError, match="killed before"):
            apply_bucket(spark, config, b, memory=memory)
    assert memory == ApplyMemory()
    apply_bucket(spark, config, b, memory=memory)
    assert memory.states is not None
    assert_equal_to_truth(spark, bucket, result)


def test_the_runs_to_walk_come_from_the_ingest_log_kept_without_a_spark_job(
    spark: SparkSession, spark_warehouse: Path, tmp_path: Path, bucket: str
) -> None:
    """Between two ingests an apply consumed the first one's frames: the frames left to walk,
    found from the ingest log's rows at hand, are those found by reading the log, and finding
    them runs no Spark job. After an apply of the second, only runs holding frames not
    consumed are left to read."""
    _, files, landing, config = landed(tmp_path, bucket, spark_warehouse, seed=8, ops=80)
    (b,) = config.buckets
    names = BucketTables(bucket)
    half = len(files) // 2
    for path in files[:half]:
        shutil.copy(path, landing)
    ingest_bucket(spark, config, b)
    apply_bucket(spark, config, b)
    for path in files[half:]:
        shutil.copy(path, landing)
    ingest_bucket(spark, config, b)
    states = state.read_states(spark, names.stream_state)
    rows = store.read_log_rows(spark, names.ingest_log)
    assert {r["status"] for r in rows} >= {"planned", "ingested"}
    with counted(spark) as jobs:
        kept = state.unconsumed_frames(spark, names, states, log_rows=rows)
    assert jobs.count == 0, jobs.what
    read = state.unconsumed_frames(spark, names, states)

    def frames(df: Any) -> list[tuple[Any, ...]]:
        return sorted(
            (
                tuple(r)
                for r in df.select(
                    "ingest_run_id",
                    "run_version",
                    "vbucket",
                    "by_seqno",
                    "op",
                    "file_sequence",
                    "offset",
                ).collect()
            ),
            key=repr,
        )

    assert kept.late_after == read.late_after is not None
    assert kept.read_through == read.read_through == max(r["run_version"] for r in rows)
    assert frames(kept.frames) == frames(read.frames)
    assert frames(kept.frames)  # the second ingest's frames are left to walk
    # once an apply consumed them, the next read holds only the runs of frames not consumed
    # (open snapshots'), not the runs of each vbucket's last change
    apply_bucket(spark, config, b)
    states = state.read_states(spark, names.stream_state)
    left = state.unconsumed_frames(spark, names, states)
    read_runs = {r[0] for r in left.frames.select("ingest_run_id").distinct().collect()}
    held = {s["position_run_id"] for s in states.values() if s["state"]["open_snapshot"]}
    assert read_runs <= held


def _scans(df: Any) -> str:
    """The physical plan of ``df``, where its scans name their file index."""
    return str(df._jdf.queryExecution().executedPlan().toString())


def _walked_frames(df: Any) -> list[tuple[Any, ...]]:
    columns = ("ingest_run_id", "run_version", "vbucket", "by_seqno", "op", "offset", "value")
    return sorted((tuple(r) for r in df.select(*columns).collect()), key=repr)


def test_the_frames_of_runs_this_process_ingested_are_read_from_the_files_it_committed(
    spark: SparkSession, spark_warehouse: Path, tmp_path: Path, bucket: str
) -> None:
    """Follow mode: the apply reads the runs its own ingest committed from the data files
    that commit added (no scan of the Delta table), and gets the frames a read of the table
    gives. Another writer's commit to the events table since (an OPTIMIZE) makes it read
    the table; silver equals the truth."""
    result, files, landing, config = landed(tmp_path, bucket, spark_warehouse, seed=8, ops=80)
    (b,) = config.buckets
    names = BucketTables(bucket)
    ingest = IngestMemory()
    memory = ApplyMemory(ingest=ingest)
    half = len(files) // 2
    for path in files[:half]:
        shutil.copy(path, landing)
    ingest_bucket(spark, config, b, memory=ingest)
    apply_bucket(spark, config, b, memory=memory)
    for path in files[half:]:
        shutil.copy(path, landing)
    ingest_bucket(spark, config, b, memory=ingest)
    recall = Recall(spark, names, memory)
    states = state.read_states(spark, names.stream_state)
    rows = recall.log_rows()
    via_files = state.unconsumed_frames(
        spark, names, states, log_rows=rows, run_files=recall.run_files
    )
    via_table = state.unconsumed_frames(spark, names, states, log_rows=rows)
    runs = sorted({r[0] for r in via_table.frames.select("ingest_run_id").distinct().collect()})
    kept = recall.run_files(runs)
    assert runs and kept, "the second ingest's run is kept with its files"
    assert {Path(p.removeprefix("file:")).name for p in via_files.frames.inputFiles()} == {
        Path(p).name for p in kept
    }
    assert "InMemoryFileIndex" in _scans(via_files.frames)  # the files, by their paths
    assert "InMemoryFileIndex" not in _scans(via_table.frames)  # Delta's index of the table
    assert _walked_frames(via_files.frames) == _walked_frames(via_table.frames)
    spark.sql(f"OPTIMIZE {names.events}")  # another writer's commit: files kept may be gone
    assert recall.run_files(runs) is None
    apply_bucket(spark, config, b, memory=memory)
    assert_equal_to_truth(spark, bucket, result)

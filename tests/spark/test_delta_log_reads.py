"""What pipelines/lake/delta_io.py reads of a table's log without a Spark job: its size and
an app's transaction version come from the version's checksum (Delta's own ``numOfFiles``,
``sizeInBytes`` and ``transactions`` reconstruct the state, Spark jobs, although the checksum
holds them), equal to what the reconstructed state says, and without a checksum from the
state; ``commit_files`` commits on it and stays idempotent and exclusive per app version."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from pipelines.lake import delta_io, file_commits, table_entries
from tests.support.spark_jobs import counted

APP = "dcp-cdc-test"


@pytest.fixture
def table(spark: SparkSession) -> Iterator[tuple[str, Path]]:
    """An empty Delta table of one INT column, and its folder."""
    spark.sql("CREATE DATABASE IF NOT EXISTS log_reads")
    name = f"log_reads.t{uuid.uuid4().hex[:8]}"
    spark.sql(f"CREATE TABLE {name} (a INT) USING delta")
    location, _ = delta_io.location_and_properties(spark, name)
    yield name, Path(location.removeprefix("file:"))
    spark.sql(f"DROP TABLE IF EXISTS {name}")


def _file(folder: Path, value: int) -> list[dict[str, Any]]:
    """A Parquet file of one row in ``folder``, as ``commit_files`` takes it."""
    path = f"part-{uuid.uuid4().hex}.parquet"
    pq.write_table(pa.table({"a": pa.array([value], pa.int32())}), folder / path)
    stat = (folder / path).stat()
    stats = json.dumps({"numRecords": 1, "minValues": {"a": value}, "maxValues": {"a": value}})
    return [
        {
            "path": path,
            "size": stat.st_size,
            "modification_time": int(stat.st_mtime * 1000),
            "stats": stats,
        }
    ]


def _reconstructed(spark: SparkSession, name: str) -> tuple[int, int, int | None]:
    """Files, bytes and the app's version as Delta's reconstructed state has them."""
    jvm: Any = spark._jvm
    nothing = jvm.scala.Option.empty()
    snapshot = delta_io._delta_log(spark, name).update(False, nothing, nothing)
    found = snapshot.transactions().get(APP)
    return (
        int(snapshot.numOfFiles()),
        int(snapshot.sizeInBytes()),
        int(found.get()) if found.isDefined() else None,
    )


def test_commits_size_and_transactions_need_no_spark_job(
    spark: SparkSession, table: tuple[str, Path]
) -> None:
    name, folder = table
    with counted(spark) as jobs:
        assert delta_io.committed_version(spark, name, APP) is None
        committed = [
            file_commits.commit_files(spark, name, _file(folder, v), app_id=APP, version=v)
            for v in (1, 2, 3)
        ]
        again = file_commits.commit_files(spark, name, _file(folder, 9), app_id=APP, version=2)
        size = delta_io.table_size(spark, name)
        version = delta_io.committed_version(spark, name, APP)
        at_two = delta_io.committed_version_at(spark, name, APP, 2)
    assert jobs.count == 0, jobs.what
    assert committed == [True, True, True] and again is False
    assert version == 3 and at_two == 2  # versions 1-3 of the table hold apps 1-3
    assert (*size, version) == _reconstructed(spark, name)
    assert size[0] == 3
    assert sorted(r["a"] for r in spark.table(name).collect()) == [1, 2, 3]


def test_without_a_checksum_the_state_answers(spark: SparkSession, table: tuple[str, Path]) -> None:
    """A version without its ``.crc`` (a writer that keeps none) is read from the state."""
    name, folder = table
    for v in (1, 2):
        file_commits.commit_files(spark, name, _file(folder, v), app_id=APP, version=v)
    for crc in (folder / "_delta_log").glob("*.crc"):
        crc.unlink()
    jvm: Any = spark._jvm
    jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()  # a fresh read of the log
    assert delta_io.committed_version(spark, name, APP) == 2
    assert delta_io.table_size(spark, name)[0] == 2
    assert file_commits.commit_files(spark, name, _file(folder, 3), app_id=APP, version=3)
    assert file_commits.commit_files(spark, name, _file(folder, 3), app_id=APP, version=3) is False
    assert sorted(r["a"] for r in spark.table(name).collect()) == [1, 2, 3]


def test_two_transactions_of_one_app_conflict(spark: SparkSession, table: tuple[str, Path]) -> None:
    """Both read the app's version from the checksum; the second to commit conflicts, as it
    would had both asked Delta's ``txnVersion``."""
    name, _ = table
    jvm: Any = spark._jvm
    log = delta_io._delta_log(spark, name)
    first, second = log.startTransaction(), log.startTransaction()
    assert file_commits._txn_version(first, APP) == file_commits._txn_version(second, APP) == -1
    none = jvm.scala.Option.empty()
    write = getattr(jvm.org.apache.spark.sql.delta, "DeltaOperations$Write")(
        jvm.org.apache.spark.sql.SaveMode.Append, *[none] * 8
    )

    def txn() -> Any:
        actions = jvm.java.util.ArrayList()
        action = {"txn": {"appId": APP, "version": 1, "lastUpdated": 1}}
        actions.add(jvm.org.apache.spark.sql.delta.actions.Action.fromJson(json.dumps(action)))
        return jvm.scala.jdk.javaapi.CollectionConverters.asScala(actions).toSeq()

    first.commit(txn(), write)
    with pytest.raises(Exception, match="DELTA_CONCURRENT_TRANSACTION"):
        second.commit(txn(), write)


def _state(vb: int, seqno: int) -> dict[str, Any]:
    """A vbucket's state as the walk leaves it (the fields ``save_states`` reads)."""
    return {
        "vb_uuid": 1000 + vb,
        "failover_log": [[1000 + vb, 0]],
        "last_applied_seqno": seqno,
        "consistent_seqno": seqno,
        "manifest_uid": 2,
        "purge_seqno": 0,
        "open_snapshot": [seqno + 1, seqno + 5] if vb % 2 else None,
        "run_id": f"run-{seqno}",
    }


@pytest.fixture
def state_table(spark: SparkSession) -> Iterator[str]:
    from pipelines import schemas

    spark.sql("CREATE DATABASE IF NOT EXISTS log_reads")
    name = f"log_reads.state{uuid.uuid4().hex[:8]}"
    delta_io.create_table(spark, name, schemas.STATE, {"delta.enableDeletionVectors": "false"})
    yield name
    spark.sql(f"DROP TABLE IF EXISTS {name}")


def test_the_stream_state_is_saved_without_a_spark_job(
    spark: SparkSession, state_table: str
) -> None:
    """Three saves, each of every vbucket, the last with a new vbucket: each replaces the
    table's rows in one commit recording its mark, runs no Spark job, and reads back as
    saved."""
    from pipelines.silver import state

    saved: dict[int, dict[str, Any]] = {}
    for i, vbuckets in enumerate(([0, 1, 2], [0, 1, 2], [0, 1, 2, 3])):
        old = state.read_states(spark, state_table)
        before = delta_io.table_version(spark, state_table)
        with counted(spark) as jobs:
            saved = state.save_states(
                spark, state_table, old, {vb: _state(vb, 10 * (i + 1)) for vb in vbuckets}, f"m{i}"
            )
        assert jobs.count == 0, jobs.what
        assert delta_io.table_version(spark, state_table) == before + 1
        assert delta_io.last_commit_metadata(spark, state_table) == f"m{i}"
    rows = spark.table(state_table).collect()
    assert sorted(r["vbucket"] for r in rows) == [0, 1, 2, 3]
    back = state.read_states(spark, state_table)
    assert {vb: s["state"] for vb, s in back.items()} == {
        vb: json.loads(json.dumps(s)) for vb, s in saved.items()
    }
    one = next(r for r in rows if r["vbucket"] == 1)
    assert (one["open_snapshot_start"], one["open_snapshot_end"]) == (31, 35)
    assert [tuple(e) for e in one["failover_log"]] == [(1001, 0)]
    assert one["position_run_id"] == "run-30" and one["updated_at"] is not None


def test_without_the_files_in_the_checksum_the_state_is_saved_by_spark(
    spark: SparkSession, state_table: str
) -> None:
    """A table whose checksum does not list its files (here: none) is overwritten by Spark;
    the file written for the commit that did not happen is removed."""
    from pipelines.silver import state

    folder = Path(delta_io.table_location(spark, state_table).removeprefix("file:"))
    for crc in (folder / "_delta_log").glob("*.crc"):
        crc.unlink()
    jvm: Any = spark._jvm
    jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()
    state.save_states(spark, state_table, {}, {5: _state(5, 7)}, "m")
    assert [r["vbucket"] for r in spark.table(state_table).collect()] == [5]
    assert delta_io.last_commit_metadata(spark, state_table) == "m"
    # the driver's file (part-<uuid>.snappy.parquet) is gone; Spark's are part-NNNNN-...-c000
    on_disk = sorted(p.name for p in folder.glob("*.parquet"))
    assert on_disk and all(name.endswith("-c000.snappy.parquet") for name in on_disk), on_disk


def test_location_and_properties_come_from_the_log(
    spark: SparkSession, table: tuple[str, Path]
) -> None:
    name, folder = table
    spark.sql(f"ALTER TABLE {name} SET TBLPROPERTIES ('delta.dataSkippingNumIndexedCols' = '3')")
    file_commits.commit_files(spark, name, _file(folder, 1), app_id=APP, version=1)
    with counted(spark) as jobs:
        location, properties = delta_io.location_and_properties(spark, name)
    assert jobs.count == 0, jobs.what
    detail = spark.sql(f"DESCRIBE DETAIL {name}").first()
    assert detail is not None
    assert (location, properties) == (detail["location"], dict(detail["properties"]))
    assert properties["delta.dataSkippingNumIndexedCols"] == "3"
    assert Path(location.removeprefix("file:")) == folder


def test_the_ingest_log_is_appended_without_a_spark_job(spark: SparkSession) -> None:
    """Two commits of the ingest log (``store.log_rows``): no Spark job; the log reads back
    the rows appended, with their statistics (a read by run version skips the other file)."""
    from pipelines import schemas
    from pipelines.bronze import store

    spark.sql("CREATE DATABASE IF NOT EXISTS log_reads")
    name = f"log_reads.log{uuid.uuid4().hex[:8]}"
    delta_io.create_table(spark, name, schemas.INGEST_LOG, {})
    try:
        with counted(spark) as jobs:
            first = store.log_rows(spark, name, [{"file": "a.dcp", "size": 3}], 1, "planned")
            second = store.log_rows(spark, name, [{"file": "a.dcp", "frames": 9}], 1, "ingested")
        assert jobs.count == 0, jobs.what
        rows = store.read_log_rows(spark, name)
        assert sorted((r["status"], r["file"], r["size"], r["frames"]) for r in rows) == [
            ("ingested", "a.dcp", None, 9),
            ("planned", "a.dcp", 3, None),
        ]
        assert all(r["logged_at"] is not None and r["run_version"] == 1 for r in rows)
        assert [r["status"] for r in first + second] == ["planned", "ingested"]
        scanned = spark.table(name).where("status = 'ingested'")
        assert scanned.count() == 1
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {name}")


def test_files_of_other_columns_are_not_committed(
    spark: SparkSession, table: tuple[str, Path]
) -> None:
    """A table whose columns are not the files' (a log from before a column was added):
    nothing is committed, the caller writes through Spark."""
    from pyspark.sql import types as T

    name, folder = table
    wider = T.StructType([T.StructField("a", T.IntegerType()), T.StructField("b", T.LongType())])
    version = delta_io.table_version(spark, name)
    assert file_commits.append_files(spark, name, _file(folder, 1), wider) is False
    assert file_commits.replace_files(spark, name, _file(folder, 1), wider) is False
    assert delta_io.table_version(spark, name) == version
    narrow = T.StructType([T.StructField("a", T.IntegerType())])
    assert file_commits.append_files(spark, name, _file(folder, 2), narrow)
    assert [r["a"] for r in spark.table(name).collect()] == [2]


def test_table_locations_are_the_catalogs_per_database(
    spark: SparkSession, table: tuple[str, Path]
) -> None:
    """One catalog call per database gives each existing table's location, the one its log
    gives; a missing table, a view and a table of a missing database have none. The version
    read at a location is the table's."""
    name, folder = table
    other = f"log_reads.o{uuid.uuid4().hex[:8]}"
    view = f"log_reads.v{uuid.uuid4().hex[:8]}"
    spark.sql(f"CREATE TABLE {other} (a INT) USING delta")
    spark.sql(f"CREATE VIEW {view} AS SELECT a FROM {name}")
    try:
        file_commits.commit_files(spark, name, _file(folder, 1), app_id=APP, version=1)
        asked = [name, other, view, "log_reads.missing", "no_such_database.t", name.upper()]
        with counted(spark) as jobs:
            found = table_entries.locations(spark, asked)
            versions = {t: delta_io.location_version(spark, loc) for t, loc in found.items()}
        assert jobs.count == 0, jobs.what
        assert set(found) == {name, other, name.upper()}
        assert found[name] == found[name.upper()] == delta_io.table_location(spark, name)
        assert found[other] == delta_io.table_location(spark, other)
        assert Path(found[name].removeprefix("file:")) == folder
        assert versions == {name: 1, other: 0, name.upper(): 1}
        assert table_entries.locations(spark, []) == {}
        # names alone: the view too, not a temporary view of a name asked for
        spark.range(1).createOrReplaceTempView("missing")
        listed = table_entries.names(spark, [*asked, "log_reads.odd-name", "log_reads.t*"])
        assert listed == {name, other, view, name.upper()}
        assert table_entries.names(spark, []) == set()
    finally:
        spark.catalog.dropTempView("missing")
        spark.sql(f"DROP VIEW IF EXISTS {view}")
        spark.sql(f"DROP TABLE IF EXISTS {other}")


def test_tables_known_answer_for_the_block_and_its_thread_only(
    spark: SparkSession, table: tuple[str, Path]
) -> None:
    """Within ``tables_known``, a table's location and its log's reads come from the entries
    given (here another table's location, to tell them apart), a view of them exists; outside
    the block, and in another thread inside it, the catalog answers."""
    name, folder = table
    other = f"log_reads.o{uuid.uuid4().hex[:8]}"
    spark.sql(f"CREATE TABLE {other} (a INT) USING delta")
    try:
        file_commits.commit_files(spark, name, _file(folder, 1), app_id=APP, version=1)
        elsewhere = delta_io.table_location(spark, other)
        view = "log_reads.not_in_the_catalog"
        with table_entries.known({name: elsewhere, view: None}):
            assert delta_io.table_location(spark, name) == elsewhere
            assert delta_io.table_version(spark, name) == 0  # the other table's log
            assert delta_io.table_size(spark, name) == (0, 0)
            assert table_entries.exists(spark, view)
            assert not table_entries.exists(spark, "log_reads.missing")
            with ThreadPoolExecutor(1) as pool:
                assert pool.submit(delta_io.table_version, spark, name).result() == 1
                assert not pool.submit(table_entries.exists, spark, view).result()
        assert delta_io.table_location(spark, name) != elsewhere
        assert delta_io.table_version(spark, name) == 1
        assert not table_entries.exists(spark, view)
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {other}")

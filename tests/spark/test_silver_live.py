"""The live layer (``[silver] live_layer``): applies append to one pending table per bucket,
the views overlay it on the collection tables, a compaction MERGEs it into them."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from dcp_cdc.config import AppConfig, SilverConfig
from dcp_cdc.simulator import SimulationResult
from pipelines import schemas, tables
from pipelines.lake import delta_io
from pipelines.silver import live
from pipelines.silver.registry import read_registry
from pipelines.silver.transforms import OverlaySource, overlay_query, overlays_query
from pipelines.tables import BucketTables
from tests.support.silver_runs import (
    drop_all,
    empty_landing,
    ingest_and_apply,
    land,
    one_bucket,
)
from tests.support.truth import assert_equal_to_truth

# --- the overlay's rule, on explicit rows ----------------------------------------------------


def _row(
    key: str, seqno: int, *, deleted: bool = False, cid: int = 8, vb: int = 0
) -> dict[str, Any]:
    """A silver row whose document says where it came from."""
    return {
        "key": key,
        "doc": None if deleted else f'{{"seqno": {seqno}}}',
        "doc_binary": None,
        "xattrs": None,
        "_collection_id": cid,
        "_vbucket": vb,
        "_vb_uuid": 1,
        "_seqno": seqno,
        "_rev_seqno": 1,
        "_cas": seqno,
        "_flags": 0,
        "_expiry": 0,
        "_deleted": deleted,
        "_change": "delete" if deleted else "upsert",
        "_applied_at": None,
        "_ingest_run_id": "r",
        "_modified_at": None,
    }


def test_the_overlay_shows_each_key_once_by_the_merges_rule(spark: SparkSession) -> None:
    """A pending row replaces the table's when newer, is ignored when older, changes nothing
    when the table holds it already (compacted, not yet removed), is added for a new key
    unless at or below its vbucket's purge mark, and only its own collection's count."""
    table = [
        _row("newer-pending", 5),
        _row("older-pending", 9),
        _row("compacted", 6),
        _row("updated-below-mark", 2),
        _row("deleted-pending", 3),
        _row("table-only", 4),
    ]
    pending = [
        _row("newer-pending", 7),
        _row("older-pending", 7),
        _row("compacted", 6),
        _row("new-key", 3),
        _row("new-key", 8),
        _row("new-key-below-mark", 4),
        _row("updated-below-mark", 4),
        _row("deleted-pending", 10, deleted=True),
        _row("other-collection", 11, cid=9),
    ]
    spark.createDataFrame(table, schemas.SILVER).createOrReplaceTempView("ov_table")
    spark.createDataFrame(
        [r | {"_batch": 1} for r in pending], schemas.PENDING
    ).createOrReplaceTempView("ov_pending")
    marks = [
        {
            "table_name": "silver.b__s__c_all",
            "vbucket": 0,
            "purged_through_seqno": 5,
            "purged_at": None,
        }
    ]
    spark.createDataFrame(marks, schemas.PURGES).createOrReplaceTempView("ov_purges")
    query = overlay_query(
        "ov_table",
        "ov_pending",
        "ov_purges",
        8,
        schemas.SILVER.fieldNames(),
        name="silver.b__s__c_all",
    )
    rows = spark.sql(query).collect()
    keys = [r["key"] for r in rows]
    assert len(keys) == len(set(keys))
    assert {r["key"]: (r["_seqno"], r["_deleted"]) for r in rows} == {
        "newer-pending": (7, False),
        "older-pending": (9, False),
        "compacted": (6, False),
        "new-key": (8, False),
        "updated-below-mark": (4, False),
        "deleted-pending": (10, True),
        "table-only": (4, False),
    }
    shown = spark.sql(f"SELECT key FROM ({query}) WHERE {tables.LIVE_ROWS}").collect()
    assert "deleted-pending" not in {r["key"] for r in shown}


def test_one_overlay_of_several_tables_keeps_each_collections_rule(spark: SparkSession) -> None:
    """One query over several collections' tables equals each collection's own overlay,
    labelled with its table: a key in two collections is two rows, each by its own table's
    rows, pending rows and purge marks. A table marked empty is not read (a name that
    resolves to nothing), and its collection still shows its pending rows."""
    first = [_row("both", 5), _row("first-only", 4)]
    second = [_row("both", 9, cid=9), _row("tombstone", 1, cid=9, deleted=True)]
    pending = [
        _row("both", 7),
        _row("both", 8, cid=9),
        _row("new-first", 3),
        _row("new-second", 7, cid=9),
        _row("new-second-below-mark", 5, cid=9),
        _row("third", 11, cid=10),
        _row("elsewhere", 12, cid=11),
    ]
    spark.createDataFrame(first, schemas.SILVER).createOrReplaceTempView("ovs_first")
    spark.createDataFrame(second, schemas.SILVER).createOrReplaceTempView("ovs_second")
    spark.createDataFrame([], schemas.SILVER).createOrReplaceTempView("ovs_third")
    spark.createDataFrame(
        [r | {"_batch": 1} for r in pending], schemas.PENDING
    ).createOrReplaceTempView("ovs_pending")
    marks = [{"table_name": "ovs_second", "vbucket": 0, "purged_through_seqno": 5}]
    spark.createDataFrame(
        [m | {"purged_at": None} for m in marks], schemas.PURGES
    ).createOrReplaceTempView("ovs_purges")
    columns = ["key", "_collection_id", "_vbucket", "_seqno", "_deleted"]
    sources = [
        OverlaySource("ovs_first", "ovs_first", 8, "one"),
        OverlaySource("ovs_second", "ovs_second", 9, "two"),
        OverlaySource("ovs_third", "ovs_third", 10, "three"),
    ]
    alone = sorted(
        (s.label, r["key"], r["_seqno"])
        for s in sources
        for r in spark.sql(
            overlay_query(s.relation, "ovs_pending", "ovs_purges", s.collection_id, columns)
        ).collect()
    )
    assert alone == [
        ("one", "both", 7),
        ("one", "first-only", 4),
        ("one", "new-first", 3),
        ("three", "third", 11),
        ("two", "both", 9),
        ("two", "new-second", 7),
        ("two", "tombstone", 1),
    ]

    def together(sources: list[OverlaySource]) -> list[tuple[str, str, int]]:
        query = overlays_query(sources, "ovs_pending", "ovs_purges", columns)
        return sorted((r["table"], r["key"], r["_seqno"]) for r in spark.sql(query).collect())

    unread = OverlaySource("no_such_table", "ovs_third", 10, "three", empty=True)
    assert together(sources) == together([*sources[:2], unread]) == alone
    assert together([unread]) == [("three", "third", 11)]


# --- applies through the live layer -----------------------------------------------------------


def _config(landing: Path, warehouse: Path, bucket: str, **silver: Any) -> AppConfig:
    return one_bucket(landing, warehouse, bucket, silver=SilverConfig(live_layer=True, **silver))


def _simulated(
    tmp_path: Path, bucket: str, **sim: Any
) -> tuple[SimulationResult, list[Path], Path]:
    """A simulation of ``bucket`` (``basic`` on 4 vbuckets unless ``sim`` says otherwise),
    its files by name, and an empty landing."""
    result, landing = empty_landing(
        tmp_path, bucket, **({"scenario": "basic", "vbuckets": 4} | sim)
    )
    return result, sorted(result.files), landing


@pytest.mark.parametrize(
    "scenario",
    [
        # 4-5 minutes in make test's two workers: make test's rollback through the layer is
        # test_a_rollback_with_nothing_to_retract_appends_and_one_with_rows_merges
        pytest.param("rollback", marks=pytest.mark.long),
        pytest.param("collection-lifecycle", marks=pytest.mark.long),
        pytest.param("mixed", marks=pytest.mark.long),
    ],
)
def test_runs_through_the_live_layer_equal_the_truth_before_and_after_compaction(
    spark: SparkSession, spark_warehouse: Path, tmp_path: Path, bucket: str, scenario: str
) -> None:
    """The files in four runs, a compaction every second append: the views equal the truth
    (rollbacks and drops compact first and take the MERGE path), and after a last compaction
    the ``_all`` tables alone equal it, with nothing left pending."""
    result, files, landing = _simulated(
        tmp_path, bucket, scenario=scenario, seed=21, docs=60, ops=300, max_file_bytes=15_000
    )
    assert len(files) >= 4
    config = _config(landing, spark_warehouse, bucket, compact_files=2)
    quarter = -(-len(files) // 4)
    appended = 0
    for start in range(0, len(files), quarter):
        land(landing, files[start : start + quarter])
        appended += "append" in ingest_and_apply(spark, config).steps
    assert appended, "some run took the live layer"
    assert_equal_to_truth(spark, bucket, result)
    live.compact(spark, bucket, read_registry(spark, bucket))
    assert delta_io.table_size(spark, BucketTables(bucket).pending)[0] == 0
    assert_equal_to_truth(spark, bucket, result, compacted=True)


def test_a_rollback_with_nothing_to_retract_appends_and_one_with_rows_merges(
    spark: SparkSession, spark_warehouse: Path, tmp_path: Path, bucket: str
) -> None:
    """A bucket's first apply meets a rollback while silver holds no row: nothing to retract,
    so it appends like any other apply. Once silver holds rows, a rollback compacts and takes
    the MERGE path (its rows above the rollback point are retracted). The views equal the
    truth after each."""
    result, files, landing = _simulated(tmp_path, bucket, scenario="rollback", seed=3, docs=40)
    config = _config(landing, spark_warehouse, bucket)
    land(landing, files)
    first = ingest_and_apply(spark, config)
    assert first.rollbacks and "append" in first.steps, first.steps
    assert "rollbacks_drops" not in first.steps and first.rebuilt_keys == 0
    assert_equal_to_truth(spark, bucket, result)

    other = f"{bucket}_again"
    again, again_files, again_landing = _simulated(
        tmp_path / "again", other, scenario="rollback", seed=3, docs=40, max_file_bytes=6_000
    )
    assert len(again_files) >= 4
    config = _config(again_landing, spark_warehouse, other)
    try:
        quarter = len(again_files) // 4  # the backfill: the failover comes in the rest
        land(again_landing, again_files[:quarter])
        assert not ingest_and_apply(spark, config).rollbacks
        land(again_landing, again_files[quarter:])
        meets = ingest_and_apply(spark, config)
        assert meets.rollbacks and "rollbacks_drops" in meets.steps, meets.steps
        assert "append" not in meets.steps
        assert_equal_to_truth(spark, other, again)
    finally:
        drop_all(spark, other)


def test_a_first_apply_on_the_merge_path_retracts_nothing_for_its_rollback(
    spark: SparkSession,
    spark_warehouse: Path,
    tmp_path: Path,
    bucket: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the live layer off, a bucket's first apply that meets a rollback MERGEs its
    changes into empty tables: silver held no row above the rollback point, and the walk
    already left out what the rollback abandoned, so the apply looks nothing up in bronze to
    retract (its rebuild from bronze is not called) and the views equal the truth."""
    from pipelines.silver import store

    def no_rebuild(*args: Any, **kwargs: Any) -> int:
        raise AssertionError("a rollback was retracted from a silver that held nothing")

    monkeypatch.setattr(store, "rebuild_rolled_back", no_rebuild)
    result, files, landing = _simulated(tmp_path, bucket, scenario="rollback", seed=3, docs=40)
    config = one_bucket(landing, spark_warehouse, bucket, silver=SilverConfig(live_layer=False))
    land(landing, files)
    first = ingest_and_apply(spark, config)
    assert first.rollbacks and "merge" in first.steps and first.rebuilt_keys == 0, first.steps
    assert_equal_to_truth(spark, bucket, result)


def test_an_apply_through_the_live_layer_commits_to_no_collection_table(
    spark: SparkSession, spark_warehouse: Path, tmp_path: Path, bucket: str
) -> None:
    """Changes to three collections: one commit to the pending table and one to the stream
    state, none to a collection table, until the compaction MERGEs them in."""
    result, files, landing = _simulated(
        tmp_path, bucket, seed=5, docs=90, ops=400, collections=3, max_file_bytes=20_000
    )
    config = _config(landing, spark_warehouse, bucket)
    half = len(files) // 2
    land(landing, files[:half])
    ingest_and_apply(spark, config)  # the tables exist
    names = BucketTables(bucket)
    collections = [
        tables.all_rows(r["table_name"])
        for r in read_registry(spark, bucket)
        if r["status"] == "live"
    ]
    watched = [*collections, names.pending, names.stream_state]
    before = {t: delta_io.table_version(spark, t) for t in watched}
    land(landing, files[half:])
    summary = ingest_and_apply(spark, config)
    assert len(summary.tables) >= 2, summary.tables  # several collections changed
    after = {t: delta_io.table_version(spark, t) for t in watched}
    assert {t: after[t] - before[t] for t in watched} == {
        **dict.fromkeys(collections, 0),
        names.pending: 1,
        names.stream_state: 1,
    }
    assert_equal_to_truth(spark, bucket, result)
    merged = live.compact(spark, bucket, read_registry(spark, bucket))
    assert set(merged) >= set(summary.tables)
    assert_equal_to_truth(spark, bucket, result, compacted=True)


def test_turning_the_live_layer_off_compacts_what_it_left(
    spark: SparkSession, spark_warehouse: Path, tmp_path: Path, bucket: str
) -> None:
    """An apply with the layer off MERGEs the pending rows an earlier apply left before its
    own, and the views show the tables alone again."""
    result, files, landing = _simulated(
        tmp_path, bucket, seed=6, docs=40, ops=150, max_file_bytes=15_000
    )
    half = len(files) // 2
    land(landing, files[:half])
    on = _config(landing, spark_warehouse, bucket)
    ingest_and_apply(spark, on)
    assert live.has_pending(spark, bucket)
    land(landing, files[half:])
    off = one_bucket(landing, spark_warehouse, bucket, silver=SilverConfig(live_layer=False))
    summary = ingest_and_apply(spark, off)
    assert "compact" in summary.steps and "merge" in summary.steps
    assert not live.has_pending(spark, bucket)
    assert_equal_to_truth(spark, bucket, result, compacted=True)
    view = read_registry(spark, bucket)[0]["table_name"]
    assert BucketTables(bucket).pending not in (delta_io.view_text(spark, view) or "")


def test_a_compaction_beside_appends_removes_only_the_rows_it_merged(
    spark: SparkSession, spark_warehouse: Path, tmp_path: Path, bucket: str
) -> None:
    """Follow mode compacts in a thread while its micro-batches append. Here a thread appends
    again and again while compactions run: no compaction meets a commit conflict, an append
    committed during a compaction's removal stays pending, and the views equal the truth;
    a last compaction leaves nothing pending and the tables alone equal it."""
    result, files, landing = _simulated(tmp_path, bucket, seed=7, docs=40, ops=120)
    config = _config(landing, spark_warehouse, bucket)
    land(landing, files)
    ingest_and_apply(spark, config)
    pending = BucketTables(bucket).pending
    # rows the views show already: appended again, they change no view
    again = spark.table(pending).drop("_batch").localCheckpoint()
    stop, failed = threading.Event(), []

    def appending() -> None:
        while not stop.is_set():
            try:
                live.append_pending(spark, bucket, again)
            except BaseException as exc:  # checked below
                failed.append(exc)
                return

    thread = threading.Thread(target=appending)
    thread.start()
    try:
        for _ in range(12):
            live.compact(spark, bucket, read_registry(spark, bucket))
            if _removals_beside_appends(spark, pending):
                break
    finally:
        stop.set()
        thread.join()
    assert not failed, failed
    assert _removals_beside_appends(spark, pending), "no append committed during a removal"
    assert_equal_to_truth(spark, bucket, result)
    live.compact(spark, bucket, read_registry(spark, bucket))
    assert delta_io.table_size(spark, pending)[0] == 0
    assert_equal_to_truth(spark, bucket, result, compacted=True)


def _removals_beside_appends(spark: SparkSession, table: str) -> int:
    """The compactions' removals (DELETE commits) of ``table`` during which another commit
    landed: their version is beyond the one after the version they read."""
    history = DeltaTable.forName(spark, table).history().where("operation = 'DELETE'")
    return history.where("version > readVersion + 1").count()


def test_the_tables_each_batch_commits_to_checkpoint_every_100_commits_unless_set(
    spark: SparkSession, spark_warehouse: Path, tmp_path: Path, bucket: str
) -> None:
    """Bronze's tables and silver's support tables (the pending table partitioned by its
    appends' stamps) get ``delta.checkpointInterval = 100``; a value in ``[tables]
    properties`` wins."""
    from pipelines.bronze.store import ensure_tables
    from pipelines.silver.registry import ensure_support_tables

    config = _config(tmp_path / "landing", spark_warehouse, bucket)
    names = ensure_tables(spark, config, bucket)
    ensure_support_tables(spark, bucket, config.tables.properties, live=True)
    frequent = [*names.bronze.values(), names.stream_state, names.registry, names.purges]
    for table in [*frequent, names.pending]:
        detail = spark.sql(f"DESCRIBE DETAIL {table}").first()
        assert detail is not None
        assert detail["properties"].get("delta.checkpointInterval") == "100", table
    assert spark.sql(f"DESCRIBE DETAIL {names.pending}").first()["partitionColumns"] == [  # type: ignore[index]
        "_batch"
    ]

    other = f"{bucket}_set"
    try:
        properties = {**config.tables.properties, "delta.checkpointInterval": "7"}
        ensure_support_tables(spark, other, properties)
        detail = spark.sql(f"DESCRIBE DETAIL {BucketTables(other).stream_state}").first()
        assert detail is not None and detail["properties"]["delta.checkpointInterval"] == "7"
    finally:
        drop_all(spark, other)

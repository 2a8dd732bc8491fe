"""Silver apply rules beyond "equals the truth": order independence of MERGE batches,
tombstone purge without resurrection, eager apply, and two runs at once."""

from __future__ import annotations

import datetime as dt
import decimal
import functools
import json
import re
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dcp_cdc.config import AppConfig, BucketConfig, ProjectionConfig, SilverConfig
from dcp_cdc.errors import DcpError
from dcp_cdc.simulator import SimulationResult, simulate
from pipelines import schemas, tables
from pipelines.bronze.job import ingest_bucket
from pipelines.bronze.memory import IngestMemory
from pipelines.errors import CommitConflictError
from pipelines.lake import delta_io, faults
from pipelines.silver import arrow_rows, live, state, store, transforms, walk_input
from pipelines.silver.job import apply_bucket, purge_tombstones
from pipelines.silver.memory import ApplyMemory
from pipelines.silver.registry import CHANGE_DATA_FEED
from pipelines.tables import BucketTables, all_rows
from tests.support import delta_rs
from tests.support.silver_runs import drop_all, pipeline, unconsumed_from_memory
from tests.support.spark_jobs import counted
from tests.support.truth import assert_equal_to_truth, silver_live, truth_live

# what a MERGE decides; _applied_at and _ingest_run_id say when and by whom
_COMPARED = [
    "key",
    "doc",
    "doc_binary",
    "xattrs",
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
]


def _tables(spark: SparkSession, bucket: str) -> dict[str, set[tuple[Any, ...]]]:
    registry = spark.table(BucketTables(bucket).registry).where("status != 'retired'").collect()
    out = {}
    for reg in registry:
        rows = spark.table(all_rows(reg["table_name"])).select(*_COMPARED).collect()
        out[reg["table_name"]] = {tuple(_hashable(v) for v in r) for r in rows}
    return out


def _shown(spark: SparkSession, bucket: str) -> dict[str, int]:
    """Rows (tombstones too) of each collection as its view reads them: its ``_all`` table
    overlaid with the live layer's pending rows (a purge compacts them first)."""
    registry = spark.table(BucketTables(bucket).registry).where("status != 'retired'").collect()
    return {
        reg["table_name"]: live.current_rows(
            spark, bucket, reg["table_name"], reg["collection_id"]
        ).count()
        for reg in registry
    }


def _hashable(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted(value.items()))
    return bytes(value) if isinstance(value, bytearray) else value


# --- MERGE: batches in any order, some twice ---------------------------------------------


@pytest.fixture(scope="module")
def walked_changes(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The committed changes of a `mixed` simulation (deletes, expirations, xattrs, binary
    bodies, several collections), walked once; and the tables they were merged into."""
    tmp = tmp_path_factory.mktemp("order")
    bucket = "order_prop"
    simulate(
        tmp, bucket=bucket, scenario="ttl", seed=5, vbuckets=4, collections=1, docs=80, ops=400
    )
    config = AppConfig(
        landing=str(tmp / "landing"),
        warehouse=str(tmp / "wh"),
        buckets=[BucketConfig(name=bucket)],
        silver=SilverConfig(live_layer=False),  # the tables the MERGEs below must equal
    )
    ingest_bucket(spark, config, config.buckets[0])
    apply_bucket(spark, config, config.buckets[0])
    states = state.read_states(spark, BucketTables(bucket).stream_state)
    frames = state.unconsumed_frames(spark, BucketTables(bucket), {}).frames
    walked = state.walk_vbuckets(spark, frames, {})
    changes = walked.where(F.col("kind") == "change").localCheckpoint()
    registry = [
        r.asDict(recursive=True) for r in spark.table(BucketTables(bucket).registry).collect()
    ]
    expected = _tables(spark, bucket)
    assert states and changes.count() > 300
    yield changes, registry, expected, bucket
    drop_all(spark, bucket)


def _empty_tables(spark: SparkSession, registry: list[dict[str, Any]]) -> None:
    for reg in registry:
        spark.sql(f"DELETE FROM {all_rows(reg['table_name'])}")


@pytest.mark.long
@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_merge_batches_in_any_order_and_some_twice_give_the_same_tables(
    spark: SparkSession, walked_changes: Any, data: st.DataObject
) -> None:
    """docs/protocol/dcp.md §7.1: the newest change per key wins whatever the batching and arrival order."""
    changes, registry, expected, bucket = walked_changes
    batches = data.draw(st.integers(2, 3), label="batches")
    salt = data.draw(st.integers(0, 2**31 - 1), label="split")
    order = data.draw(st.permutations(range(batches)), label="order")
    twice = data.draw(st.sets(st.sampled_from(range(batches)), max_size=2), label="twice")
    split: DataFrame = changes.withColumn(
        "_batch", F.pmod(F.hash("key", "by_seqno", F.lit(salt)), F.lit(batches))
    )
    _empty_tables(spark, registry)
    for b in [*order, *sorted(twice)]:
        store.merge_changes(spark, bucket, registry, split.where(F.col("_batch") == b))
    assert _tables(spark, bucket) == expected


# --- tombstone purge -----------------------------------------------------------------------


def test_the_drivers_silver_rows_are_sparks(spark: SparkSession, walked_changes: Any) -> None:
    """The live layer's append from the driver makes its rows by the rule Spark's
    ``silver_rows`` follows (deletions, expirations, xattrs, binary bodies): the same rows,
    but for the time they are stamped applied."""
    changes, registry, _, _ = walked_changes
    cids = {r["collection_id"] for r in registry}
    now = dt.datetime.now(dt.UTC)
    arrow = arrow_rows.silver_rows(changes.toArrow(), cids, now)
    assert arrow is not None and arrow.num_rows > 50
    by_spark = transforms.silver_rows(changes).where(F.col("_collection_id").isin(sorted(cids)))
    by_arrow = spark.createDataFrame(arrow, schema=schemas.SILVER)
    columns = [c for c in schemas.SILVER.fieldNames() if c != "_applied_at"]

    def rows(df: DataFrame) -> list[tuple[Any, ...]]:
        return sorted(
            (tuple(_hashable(v) for v in r) for r in df.select(*columns).collect()), key=repr
        )

    assert rows(by_arrow) == rows(by_spark)
    assert {p.as_py() for p in arrow["_applied_at"].unique()} == {now}


def _replay_old_mutations(spark: SparkSession, bucket: str, keys: list[str]) -> DataFrame:
    """Bronze mutations of ``keys`` as walked changes: an old event arriving again."""
    return (
        spark.table(BucketTables(bucket).events)
        .where((F.col("op") == "mutation") & F.col("key").cast("string").isin(keys))
        .withColumn("vbucket", F.col("vbucket").cast("int"))
    )


@pytest.mark.long
def test_purged_tombstones_still_refuse_older_changes(
    spark: SparkSession, spark_warehouse: Path, tmp_path: Path
) -> None:
    bucket = "purge_test"
    try:
        result, config = pipeline(
            spark,
            tmp_path,
            spark_warehouse,
            bucket,
            scenario="basic",
            seed=3,
            vbuckets=4,
            docs=60,
            ops=400,
            settings={"silver": SilverConfig(live_layer=False)},  # the tombstones in `_all`
        )
        config = config.model_copy(
            update={"silver": SilverConfig(live_layer=False, tombstone_retention_hours=0)}
        )
        registry = [
            r.asDict(recursive=True) for r in spark.table(BucketTables(bucket).registry).collect()
        ]
        table = next(all_rows(r["table_name"]) for r in registry if r["collection_id"] == 0)
        deleted = [r["key"] for r in spark.table(table).where("_deleted").collect()]
        assert len(deleted) >= 5

        purged = purge_tombstones(spark, config, config.buckets[0])

        assert sum(purged.values()) >= len(deleted)
        assert spark.table(table).where("_deleted").count() == 0
        marks = (
            spark.table(BucketTables(bucket).purges).where(F.col("table_name") == table).collect()
        )
        assert {m["vbucket"] for m in marks} <= {0, 1, 2, 3} and marks
        store.merge_changes(spark, bucket, registry, _replay_old_mutations(spark, bucket, deleted))
        assert_equal_to_truth(spark, bucket, result)  # nothing came back

        # without the marks, the same replay would bring the deleted documents back
        spark.sql(f"DELETE FROM {BucketTables(bucket).purges}")
        store.merge_changes(spark, bucket, registry, _replay_old_mutations(spark, bucket, deleted))
        back = {k for (_, k) in silver_live(spark, bucket)}
        assert set(deleted) <= back
    finally:
        drop_all(spark, bucket)


def test_purge_keeps_tombstones_younger_than_the_retention(
    spark: SparkSession, spark_warehouse: Path, tmp_path: Path
) -> None:
    bucket = "purge_young"
    try:
        _, config = pipeline(
            spark,
            tmp_path,
            spark_warehouse,
            bucket,
            scenario="basic",
            seed=4,
            vbuckets=2,
            docs=40,
            ops=200,
        )
        before = _shown(spark, bucket)
        assert sum(before.values()) > 0
        assert purge_tombstones(spark, config, config.buckets[0]) == {}  # 168 h by default
        assert _shown(spark, bucket) == before
    finally:
        drop_all(spark, bucket)


# --- eager apply -----------------------------------------------------------------------------


def test_eager_apply_shows_the_open_snapshot_and_then_converges(
    spark: SparkSession, spark_warehouse: Path, tmp_path: Path
) -> None:
    """`interrupted` ends mid-snapshot: eager apply shows the tail at once; the default keeps
    silver at the consistent point (the truth)."""
    bucket = "eager_test"
    try:
        result = simulate(
            tmp_path, bucket=bucket, scenario="interrupted", seed=2, vbuckets=4, docs=60, ops=300
        )
        config = AppConfig(
            landing=str(tmp_path / "landing"),
            warehouse=str(spark_warehouse),
            buckets=[BucketConfig(name=bucket)],
            silver=SilverConfig(eager_apply=True),
        )
        ingest_bucket(spark, config, config.buckets[0])
        summary = apply_bucket(spark, config, config.buckets[0])
        assert summary.open_snapshots >= 1
        eager_rows = silver_live(spark, bucket)
        open_state = spark.table(BucketTables(bucket).stream_state).where(
            "open_snapshot_end IS NOT NULL"
        )
        tail = {
            r["vbucket"]: (r["consistent_seqno"], r["last_applied_seqno"])
            for r in open_state.collect()
        }
        assert any(applied > consistent for consistent, applied in tail.values())
        beyond = [
            r
            for r in eager_rows.values()
            if r["_vbucket"] in tail and r["_seqno"] > tail[r["_vbucket"]][0]
        ]
        assert beyond  # rows past the consistent point are visible
        with pytest.raises(AssertionError):
            assert_equal_to_truth(spark, bucket, result)
    finally:
        drop_all(spark, bucket)


# --- two runs at once --------------------------------------------------------------------------


def test_two_apply_runs_at_once_leave_correct_tables(
    spark: SparkSession, spark_warehouse: Path, tmp_path: Path
) -> None:
    """Both runs read the same bronze and race for every commit: each either finishes or
    fails with a typed DcpError naming the table; a run afterwards gives the truth."""
    bucket = "race_test"
    try:
        result = simulate(
            tmp_path,
            bucket=bucket,
            scenario="collection-lifecycle",
            seed=8,
            vbuckets=4,
            docs=60,
            ops=300,
        )
        config = AppConfig(
            landing=str(tmp_path / "landing"),
            warehouse=str(spark_warehouse),
            buckets=[BucketConfig(name=bucket)],
        )
        ingest_bucket(spark, config, config.buckets[0])
        outcomes: list[object] = []
        barrier = threading.Barrier(2)

        def one_run() -> None:
            barrier.wait()
            try:
                outcomes.append(apply_bucket(spark, config, config.buckets[0]))
            except BaseException as exc:  # collected and checked below
                outcomes.append(exc)

        threads = [threading.Thread(target=one_run) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        failures = [o for o in outcomes if isinstance(o, BaseException)]
        assert all(isinstance(f, DcpError) for f in failures), [
            f"{type(f).__name__}: {str(f)[:800]}" for f in failures
        ]
        assert len(failures) < 2
        apply_bucket(spark, config, config.buckets[0])
        assert_equal_to_truth(spark, bucket, result)
    finally:
        drop_all(spark, bucket)


def test_a_table_that_vanishes_during_an_apply_fails_it_typed_and_a_later_run_gives_the_truth(
    spark: SparkSession, spark_warehouse: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a concurrent run that retires or renames a collection's table does to this one: the
    table is gone between this run's read of the registry and its MERGE. The run fails with a
    typed error naming the table (not Spark's TABLE_OR_VIEW_NOT_FOUND); once the table is back,
    the next run gives the truth."""
    bucket = "vanish_test"
    result = simulate(
        tmp_path / "sim", bucket=bucket, seed=3, vbuckets=4, docs=60, ops=300, max_file_bytes=20_000
    )
    files = list(result.files)
    assert len(files) >= 2
    landing = tmp_path / "landing"
    landing.mkdir()
    config = AppConfig(  # the MERGE per collection (the live layer commits to no such table)
        landing=str(landing),
        warehouse=str(spark_warehouse),
        buckets=[BucketConfig(name=bucket)],
        silver=SilverConfig(live_layer=False),
    )
    half = len(files) // 2
    try:
        for batch in (files[:half], files[half:]):
            for f in batch:
                (landing / f.name).write_bytes(f.read_bytes())
            ingest_bucket(spark, config, config.buckets[0])
            if batch is files[:half]:
                apply_bucket(spark, config, config.buckets[0])  # the tables exist
        moved: list[str] = []
        point = faults.point

        def rename_away(step: str, name: str) -> None:
            if step == "commit" and name.endswith(tables.ALL_SUFFIX) and not moved:
                moved.append(name)
                spark.sql(f"ALTER TABLE {name} RENAME TO {name}_gone")
            point(step, name)

        monkeypatch.setattr(faults, "point", rename_away)
        with pytest.raises(CommitConflictError, match=r"gone from the catalog") as failed:
            apply_bucket(spark, config, config.buckets[0])
        assert moved and moved[0] in str(failed.value)
        monkeypatch.setattr(faults, "point", point)
        spark.sql(f"ALTER TABLE {moved[0]}_gone RENAME TO {moved[0]}")
        apply_bucket(spark, config, config.buckets[0])
        assert_equal_to_truth(spark, bucket, result)
    finally:
        drop_all(spark, bucket)


# --- change data feed ----------------------------------------------------------------------


def _change_feed_kinds(spark: SparkSession, table: str) -> set[str]:
    """The change kinds of ``table``'s change feed, read as the README shows."""
    rows = spark.sql(f"SELECT DISTINCT _change_type FROM table_changes('{table}', 0)")
    return {r["_change_type"] for r in rows.collect()}


@pytest.mark.parametrize("change_data_feed", [True, pytest.param(False, marks=pytest.mark.long)])
def test_change_data_feed_setting_and_equal_tables(
    spark: SparkSession, spark_warehouse: Path, tmp_path: Path, change_data_feed: bool
) -> None:
    """``[silver] change_data_feed`` decides whether new ``_all`` tables carry Delta's change
    feed; on, a MERGE's updates come with their before and after images; either way silver
    equals the truth."""
    bucket = f"cdf_{str(change_data_feed).lower()}"
    try:
        result, _ = pipeline(
            spark,
            tmp_path,
            spark_warehouse,
            bucket,
            settings={"silver": SilverConfig(change_data_feed=change_data_feed)},
            scenario="basic",
            seed=6,
            vbuckets=4,
            docs=60,
            ops=400,
        )
        registry = [
            r.asDict(recursive=True) for r in spark.table(BucketTables(bucket).registry).collect()
        ]
        # again in two MERGEs, older changes first: the second one updates rows
        frames = state.unconsumed_frames(spark, BucketTables(bucket), {}).frames
        changes = state.walk_vbuckets(spark, frames, {}).where(F.col("kind") == "change")
        changes = changes.localCheckpoint()
        middle = changes.approxQuantile("by_seqno", [0.5], 0)[0]
        _empty_tables(spark, registry)
        for half in (F.col("by_seqno") <= middle, F.col("by_seqno") > middle):
            store.merge_changes(spark, bucket, registry, changes.where(half))
        assert_equal_to_truth(spark, bucket, result)
        table = next(all_rows(r["table_name"]) for r in registry if r["collection_id"] == 0)
        properties = dict(spark.sql(f"SHOW TBLPROPERTIES {table}").collect())
        assert properties.get(CHANGE_DATA_FEED) == str(change_data_feed).lower()
        if change_data_feed:
            assert {"insert", "update_preimage", "update_postimage"} <= _change_feed_kinds(
                spark, table
            )
        else:
            with pytest.raises(AnalysisException, match="DELTA_MISSING_CHANGE_DATA"):
                _change_feed_kinds(spark, table)
    finally:
        drop_all(spark, bucket)


# --- a table of an earlier version ---------------------------------------------------------


@pytest.mark.long
def test_a_table_made_before_modified_at_gains_it_and_its_view_shows_it(
    spark: SparkSession, spark_warehouse: Path, tmp_path: Path
) -> None:
    """A collection table and view made by a version without ``_modified_at``: the next
    apply adds the column (at the end) and makes the view again, and the rows it applies
    carry the time of their CAS."""
    bucket = "upgrade_test"
    view = BucketTables(bucket).collection("_default", "_default")
    table = all_rows(view)
    earlier = T.StructType([f for f in schemas.SILVER.fields if f.name != "_modified_at"])
    try:
        delta_io.ensure_database(spark, table)
        delta_io.create_table(spark, table, earlier, {}, cluster_by=("_vbucket", "key"))
        delta_io.ensure_view(spark, view, f"SELECT * FROM {table} WHERE {tables.LIVE_ROWS}")
        assert "_modified_at" not in spark.table(view).columns
        result, _ = pipeline(
            spark, tmp_path, spark_warehouse, bucket, scenario="basic", seed=8, vbuckets=2
        )
        assert spark.table(table).columns == schemas.SILVER.fieldNames()
        assert spark.table(view).columns == schemas.SILVER.fieldNames()
        assert_equal_to_truth(spark, bucket, result)  # _modified_at included
    finally:
        drop_all(spark, bucket)


# --- typed projections ---------------------------------------------------------------------

_PROJECTED = [  # name, path, type: every kind of path and most types
    ("kind", "$.type", "string"),
    ("id", "$.id", "bigint"),
    ("price", "$.price", "double"),
    ("active", "$.active", "boolean"),
    ("city", "$.address.city", "string"),
    ("lat", "$.address.geo.lat", "decimal(9,5)"),
    ("first_tag", "$.tags[0]", "string"),
    ("stars", "$.reviews[0].stars", "int"),
    ("nothing", "$.no.such", "string"),
]


def _at_path(doc: Any, path: str) -> Any:
    for step in re.findall(r"\.(\w+)|\[(\d+)\]", path):
        name, index = step
        if name and isinstance(doc, dict):
            doc = doc.get(name)
        elif index and isinstance(doc, list) and int(index) < len(doc):
            doc = doc[int(index)]
        else:
            return None
    return doc


def _as(value: Any, kind: str) -> Any:
    if value is None:
        return None
    if kind.startswith("decimal"):
        return decimal.Decimal(str(value))
    return {"string": str, "bigint": int, "int": int, "double": float, "boolean": bool}[kind](value)


def _assert_typed_view_equals_truth(
    spark: SparkSession, view: str, result: SimulationResult
) -> dict[str, dict[str, Any]]:
    """The typed view ``view`` of ``_PROJECTED`` over ``_default._default`` has a row per live
    document of the truth, each column the truth's document read at its path (null where it
    is missing, and for binary documents); returns the rows by key."""
    names = [n for n, _, _ in _PROJECTED]
    assert spark.table(view).columns == ["key", *names, "_modified_at", "_seqno", "_vbucket"]
    got = {r["key"]: r.asDict() for r in spark.table(view).collect()}
    truth = {k: d for (cid, k), d in truth_live(result).items() if cid == 0}
    assert set(got) == set(truth)
    for key, d in truth.items():
        doc = json.loads(d["value"]) if d["is_json"] else None
        expected = {n: _as(_at_path(doc, p), t) for n, p, t in _PROJECTED}
        assert {n: got[key][n] for n in names} == expected, key
        assert (got[key]["_seqno"], got[key]["_vbucket"]) == (d["seqno"], d["vbucket"])
    return got


def test_a_projection_gives_typed_columns_equal_to_the_truth(
    spark: SparkSession, spark_warehouse: Path, tmp_path: Path
) -> None:
    """``[[buckets.projections]]``: a typed view whose columns are the truth's documents read
    at their paths (null where a path is missing, and for binary documents); changing the
    projection makes the view again at the next run, even one with no new change."""
    bucket = "typed_test"
    projection = ProjectionConfig(
        collection="_default._default",
        columns=[{"name": n, "path": p, "type": t} for n, p, t in _PROJECTED],
    )
    view = tables.typed(BucketTables(bucket).collection("_default", "_default"))
    try:
        result, config = pipeline(
            spark,
            tmp_path,
            spark_warehouse,
            bucket,
            settings={"buckets": [BucketConfig(name=bucket, projections=[projection])]},
            scenario="basic",
            seed=9,
            vbuckets=4,
            docs=80,
            ops=300,
        )

        got = _assert_typed_view_equals_truth(spark, view, result)
        truth = {k: d for (cid, k), d in truth_live(result).items() if cid == 0}
        binary = sum(not d["is_json"] for d in truth.values())
        assert binary and binary < len(truth)  # both kinds of document were read
        assert any(r["stars"] is not None for r in got.values())
        assert any(r["first_tag"] is None for r in got.values() if r["kind"] is not None)

        fewer = projection.model_copy(update={"columns": projection.columns[:2]})
        config.buckets[0] = config.buckets[0].model_copy(update={"projections": [fewer]})
        apply_bucket(spark, config, config.buckets[0])  # nothing new to apply
        assert spark.table(view).columns == [
            "key",
            "kind",
            "id",
            "_modified_at",
            "_seqno",
            "_vbucket",
        ]
    finally:
        drop_all(spark, bucket)


# --- documents as VARIANT ------------------------------------------------------------------


def _variant_rows(spark: SparkSession, table: str) -> list[dict[str, Any]]:
    """Every row of ``table`` (tombstones too): key, collection, doc, doc_variant as JSON."""
    variant = F.to_json(schemas.DOCUMENT_VARIANT).alias("variant_json")
    return [
        r.asDict()
        for r in spark.table(table).select("key", "_collection_id", "doc", variant).collect()
    ]


def _assert_variant_is_doc(spark: SparkSession, bucket: str) -> int:
    """Every row of every live collection table has ``doc_variant`` equal to its ``doc``
    parsed, null where ``doc`` is (binary documents, tombstones); returns the rows seen."""
    registry = spark.table(BucketTables(bucket).registry).where("status != 'retired'").collect()
    seen = 0
    for reg in registry:
        table = all_rows(reg["table_name"])
        assert spark.table(table).columns == schemas.SILVER_VARIANT.fieldNames()
        assert spark.table(reg["table_name"]).columns == schemas.SILVER_VARIANT.fieldNames()
        for row in _variant_rows(spark, table):
            if row["doc"] is None:
                assert row["variant_json"] is None, row["key"]
            else:
                assert row["variant_json"] is not None, row["key"]
                assert json.loads(row["variant_json"]) == json.loads(row["doc"]), row["key"]
            seen += 1
    return seen


@pytest.mark.long
@pytest.mark.parametrize("live_layer", [True, False], ids=["live-layer", "merges"])
def test_document_variant_equals_the_truth_when_turned_on_and_off(
    spark: SparkSession, spark_warehouse: Path, tmp_path: Path, live_layer: bool
) -> None:
    """``[silver] document_variant``, turned on between two runs and off again before a third
    (files of a ``rollback`` capture arriving a third at a time): the tables made without it
    gain ``doc_variant``, filled for the rows they held, and the typed view reads it; turned
    off, the tables keep it and the MERGEs keep it filled. At the end every live document's
    ``doc_variant`` is the truth's document, the typed view equals the truth, and delta-rs
    still reads ``doc`` from a table with the ``variantType`` feature. Through the live layer
    the first run's rows wait in the pending table, and the compaction that turning the
    setting on brings fills their variant as it MERGEs them; MERGEs per collection fill the
    rows of the table with an UPDATE."""
    bucket = f"variant_{'live' if live_layer else 'merges'}"
    out = tmp_path / "sim"
    result = simulate(
        out,
        bucket=bucket,
        scenario="rollback",
        seed=12,
        vbuckets=4,
        docs=80,
        ops=300,
        max_file_bytes=20_000,
    )
    files = list(result.files)
    assert len(files) >= 3
    landing = tmp_path / "landing"
    landing.mkdir()
    projection = ProjectionConfig(
        collection="_default._default",
        columns=[{"name": n, "path": p, "type": t} for n, p, t in _PROJECTED],
    )
    names = BucketTables(bucket)
    view = names.collection("_default", "_default")
    typed = tables.typed(view)
    third = len(files) // 3
    batches = (files[:third], files[third : 2 * third], files[2 * third :])
    try:
        for run, (batch, variant) in enumerate(zip(batches, (False, True, False), strict=True)):
            for f in batch:
                (landing / f.name).write_bytes(f.read_bytes())
            config = AppConfig(
                landing=str(landing),
                warehouse=str(spark_warehouse),
                buckets=[BucketConfig(name=bucket, projections=[projection])],
                silver=SilverConfig(document_variant=variant, live_layer=live_layer),
            )
            ingest_bucket(spark, config, config.buckets[0])
            summary = apply_bucket(spark, config, config.buckets[0])
            assert summary.changes, "every third of the files brings changes"
            if run == 0:
                assert schemas.DOCUMENT_VARIANT not in spark.table(all_rows(view)).columns
                assert "try_parse_json(doc)" in (delta_io.view_text(spark, typed) or "")
            elif run == 1:
                assert _assert_variant_is_doc(spark, bucket)
                operations = {
                    r["operation"]
                    for r in spark.sql(f"DESCRIBE HISTORY {all_rows(view)}").collect()
                }
                # the rows of the first run were filled
                assert ("MERGE" if live_layer else "UPDATE") in operations
                assert "try_parse_json" not in (delta_io.view_text(spark, typed) or "")
        assert "try_parse_json" not in (delta_io.view_text(spark, typed) or "")
        assert_equal_to_truth(spark, bucket, result)
        _assert_typed_view_equals_truth(spark, typed, result)
        if live_layer:  # what the last run left pending: into the tables read below
            registry = [r.asDict(recursive=True) for r in spark.table(names.registry).collect()]
            live.compact(spark, bucket, registry)
        assert _assert_variant_is_doc(spark, bucket)
        shown = silver_live(spark, bucket)
        truth = truth_live(result)
        variants = {
            (r["_collection_id"], r["key"]): r["variant_json"]
            for reg in spark.table(BucketTables(bucket).registry).collect()
            if reg["status"] != "retired"
            for r in _variant_rows(spark, all_rows(reg["table_name"]))
        }
        for ident, d in truth.items():
            got = variants[ident]
            if d["is_json"]:
                assert json.loads(got) == json.loads(d["value"]), ident
            else:
                assert got is None, ident
        assert set(shown) == set(truth)
        location = str(spark.sql(f"DESCRIBE DETAIL {all_rows(view)}").first()["location"])
        assert "variantType" in (DeltaTable(location).protocol().reader_features or [])
        read = {r["key"]: r["doc"] for r in delta_rs.rows(location, ["key", "doc"])}
        assert read == {r["key"]: r["doc"] for r in _variant_rows(spark, all_rows(view))}
    finally:
        drop_all(spark, bucket)


@pytest.mark.long
def test_an_older_sessions_files_arriving_after_a_newer_one_walk_their_vbuckets_again(
    spark: SparkSession,
    spark_warehouse: Path,
    tmp_path: Path,
    bucket: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The newest session's files are ingested and applied first; the older sessions' files
    arrive in the next run. The walk finds their frames before the vbuckets' saved positions
    (pipelines/silver/state.py, late_vbuckets), those vbuckets are walked again from their
    first frame, and silver equals the truth; a further apply changes nothing."""
    from dcp_cdc.capture import read_capture_header

    result = simulate(
        tmp_path / "sim", bucket=bucket, scenario="mixed", seed=4, vbuckets=2, docs=20, ops=60
    )
    sessions = {read_capture_header(f)[0].started_at or "": f for f in result.files}
    newest = max(sessions)
    assert len(sessions) > 1
    landing = tmp_path / "landing"
    landing.mkdir()
    config = AppConfig(
        landing=str(landing), warehouse=str(spark_warehouse), buckets=[BucketConfig(name=bucket)]
    )
    for newer in (True, False):
        for f in result.files:
            if (read_capture_header(f)[0].started_at == newest) is newer:
                (landing / f.name).write_bytes(f.read_bytes())
        ingest_bucket(spark, config, config.buckets[0])
        with caplog.at_level("INFO", logger="dcp_cdc.silver"):
            apply_bucket(spark, config, config.buckets[0])
    walked_again = [r.getMessage() for r in caplog.records if "walked again" in r.getMessage()]
    assert len(walked_again) == 1, walked_again  # the second run only, once
    assert_equal_to_truth(spark, bucket, result)
    again = apply_bucket(spark, config, config.buckets[0])
    assert again.changes == 0 and not again.rollbacks


def test_the_state_rows_sum_up_the_walks_versions_as_spark_aggregates_them(
    spark: SparkSession, tmp_path: Path, bucket: str
) -> None:
    """The run's summary from the walk's state rows (pipelines/silver/walk_summary.py) against
    Spark's aggregates over every walked version: the keys per collection and the collections
    exactly, the CAS count and sum exactly, each CAS quantile within a percent of its rank
    (vbuckets of hundreds of changes give their CAS times as points)."""
    from dcp_cdc.protocol import HLC_COUNTER_MASK
    from pipelines.observe.freshness import PROBABILITIES
    from pipelines.silver import walk_summary

    simulate(tmp_path, bucket=bucket, scenario="mixed", seed=6, vbuckets=2, docs=300, ops=900)
    config = AppConfig(
        landing=str(tmp_path / "landing"),
        warehouse=str(tmp_path / "wh"),
        buckets=[BucketConfig(name=bucket)],
    )
    ingest_bucket(spark, config, config.buckets[0])
    frames = state.unconsumed_frames(spark, BucketTables(bucket), {}).frames
    walked = state.walk_vbuckets(spark, frames, {}).localCheckpoint()
    states = [r.asDict(recursive=True) for r in walked.where(F.col("kind") == "state").collect()]
    summed = walk_summary.collected(states)
    changes = walked.where(F.col("kind") == "change")
    keys = {
        r["collection_id"]: r["n"]
        for r in changes.groupBy("collection_id").agg(F.count_distinct("key").alias("n")).collect()
    }
    versions = walked.where(F.col("kind").isin("change", "ended_change"))
    cids = {r["collection_id"] for r in versions.select("collection_id").distinct().collect()}
    seconds = F.expr(f"CASE WHEN cas > 0 THEN (cas & {~HLC_COUNTER_MASK}) / 1e9 END")
    cas = sorted(r["s"] for r in changes.select(seconds.alias("s")).collect() if r["s"])
    assert len(keys) >= 3 and summed.keys == keys
    assert summed.version_cids == cids
    assert min(s["cas_count"] for s in states) > walk_summary.POINTS  # points, not values
    assert summed.times["cas_count"] == len(cas)
    assert summed.times["cas_sum"] == pytest.approx(sum(cas))
    for p, value in zip(PROBABILITIES, summed.times["cas_quantiles"], strict=True):
        rank = sum(1 for c in cas if c <= value) / len(cas)
        assert abs(rank - p) <= 0.01 or (p == 0 and value == cas[0]), (p, rank)


def test_the_drivers_walk_gives_the_rows_sparks_walk_gives(
    spark: SparkSession, tmp_path: Path, bucket: str
) -> None:
    """``[silver] walk_on_driver_below``: a run of few frames is walked in the driver by the
    function Spark's workers run; from a fresh state and from the states an apply of half of
    the files saved (a ``mixed`` capture: several sessions, a rollback, deletions), the rows
    equal those of Spark's walk; at the bound, Spark walks. Read from the files the same
    process's ingest wrote (:mod:`pipelines.silver.walk_input`, as ``dcp-cdc run`` and follow
    mode do), the walk's input rows equal Spark's read of the table and the walk runs no Spark
    job; the applies through that memory leave silver equal to the truth."""
    result = simulate(
        tmp_path / "sim", bucket=bucket, scenario="mixed", seed=9, vbuckets=4, docs=60, ops=240
    )
    landing = tmp_path / "landing"
    landing.mkdir()
    config = AppConfig(
        landing=str(landing), warehouse=str(tmp_path / "wh"), buckets=[BucketConfig(name=bucket)]
    )
    files = sorted(result.files)
    names = BucketTables(bucket)
    storage = dict(spark.sparkContext.getConf().getAll())
    memory = IngestMemory()  # one process's: the first run's files are kept for the second

    def rows(df: DataFrame) -> list[tuple[Any, ...]]:
        return sorted((tuple(_hashable(v) for v in r) for r in df.collect()), key=repr)

    for half in (files[: len(files) // 2], files[len(files) // 2 :]):
        for f in half:
            (landing / f.name).write_bytes(f.read_bytes())
        ingest_bucket(spark, config, config.buckets[0], memory=memory)
        states = (
            state.read_states(spark, names.stream_state)
            if spark.catalog.tableExists(names.stream_state)
            else {}
        )
        unconsumed = state.unconsumed_frames(spark, names, states)
        frames = unconsumed.frames.localCheckpoint()
        count = frames.where(F.col("vb_key").isNotNull()).count()

        walk = functools.partial(
            state.walk_vbuckets,
            spark,
            frames,
            states,
            late_after=unconsumed.late_after,
            read_through=unconsumed.read_through,
        )
        on_driver = walk(on_driver_below=count + 1)
        assert "LocalTableScan" in on_driver._jdf.queryExecution().executedPlan().toString()
        at_the_bound = walk(on_driver_below=count)
        assert (
            "FlatMapGroupsInArrow" in at_the_bound._jdf.queryExecution().executedPlan().toString()
        )
        walked = rows(on_driver)
        assert walked == rows(walk(on_driver_below=0)) == rows(at_the_bound)
        assert len(walked) > 100 and count > 100

        kept = unconsumed_from_memory(spark, names, states, memory)
        assert kept.files is not None and kept.files.paths
        saved = {vb: (json.dumps(s["state"]), kept.late_after) for vb, s in states.items()}
        saved_df = spark.createDataFrame(
            [(vb, s, late) for vb, (s, late) in saved.items()],
            "vb_key INT, saved_state STRING, late_after LONG",
        )
        from_spark = transforms.keyed_frames(frames, saved_df, kept.read_through).toArrow()
        with counted(spark) as jobs:
            from_files = walk_input.keyed_rows(kept.files, saved, kept.read_through, storage)
            bound = walk_input.row_count(kept.files, storage) + 1  # every op's rows, not read
            in_driver = state.walked_from_files(
                spark,
                kept.files,
                states,
                eager=False,
                late_after=unconsumed.late_after,
                read_through=unconsumed.read_through,
                on_driver_below=bound,
            )
        assert jobs.count == 0, jobs.what
        assert in_driver is not None
        assert from_files is not None and from_files.num_rows == count
        assert from_files.schema.types == from_spark.schema.types  # not nullability
        assert _arrow_rows(from_files) == _arrow_rows(from_spark)
        assert rows(spark.createDataFrame(in_driver, schema=schemas.WALKED)) == walked
        apply_bucket(spark, config, config.buckets[0], memory=ApplyMemory(ingest=memory))
    assert_equal_to_truth(spark, bucket, result)


def _arrow_rows(table: pa.Table) -> list[str]:
    return sorted(json.dumps(r, sort_keys=True, default=repr) for r in table.to_pylist())

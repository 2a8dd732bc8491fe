"""What a killed run leaves, resumed in-process: a table creation killed between its
first Delta commit and its catalog entry (item 1), and an apply killed after its MERGEs,
before it saved its position (item 7). The real ``kill -9`` of a job's process group is
``tests/e2e/test_kill.py``'s."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from dcp_cdc.config import AppConfig, BucketConfig
from dcp_cdc.simulator import simulate
from pipelines.bronze.job import ingest_bucket
from pipelines.errors import TableLocationError
from pipelines.lake import delta_io
from pipelines.silver import state
from pipelines.silver.job import apply_bucket
from tests.spark.conftest import Warehouse
from tests.support import kill_harness as kh
from tests.support.silver_runs import drop_all
from tests.support.truth import assert_equal_to_truth

SCHEMA = T.StructType([T.StructField("id", T.LongType()), T.StructField("name", T.StringType())])


@pytest.fixture
def no_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The race waits of a creation (seconds) are skipped: no concurrent run here."""
    monkeypatch.setattr(delta_io.time, "sleep", lambda _: None)


def _orphan(spark: SparkSession, table: str, rows: list[tuple[int, str]] = ()) -> str:  # type: ignore[assignment]
    """What a creation killed before its catalog entry leaves: version 0 at the table's
    managed location (and ``rows`` after it), no catalog entry."""
    location = delta_io.managed_location(spark, table)
    DeltaTable.createIfNotExists(spark).location(location).addColumns(SCHEMA).execute()
    if rows:
        spark.createDataFrame(rows, SCHEMA).write.format("delta").mode("append").save(location)
    assert not spark.catalog.tableExists(table)
    return location


def test_creation_killed_before_its_catalog_entry_is_created_again(
    spark: SparkSession, warehouse: Warehouse, no_waits: None
) -> None:
    table = f"{warehouse.database}.t"
    _orphan(spark, table)
    delta_io.create_table(spark, table, SCHEMA, {"delta.appendOnly": "false"})
    spark.createDataFrame([(1, "a")], SCHEMA).writeTo(table).append()
    assert [tuple(r) for r in spark.table(table).collect()] == [(1, "a")]
    props = {r["key"]: r["value"] for r in spark.sql(f"SHOW TBLPROPERTIES {table}").collect()}
    assert props["delta.appendOnly"] == "false"  # created by this run, as it asked


def test_a_location_holding_data_is_never_cleared(
    spark: SparkSession, warehouse: Warehouse, no_waits: None
) -> None:
    table = f"{warehouse.database}.t"
    location = _orphan(spark, table, [(1, "kept")])
    with pytest.raises(TableLocationError, match="holds more than an interrupted creation"):
        delta_io.create_table(spark, table, SCHEMA, {})
    assert spark.read.format("delta").load(location).count() == 1


def test_a_view_is_replaced_only_when_its_query_differs(
    spark: SparkSession, warehouse: Warehouse, monkeypatch: pytest.MonkeyPatch
) -> None:
    table, view = f"{warehouse.database}.t", f"{warehouse.database}.v"
    delta_io.create_table(spark, table, SCHEMA, {})
    spark.createDataFrame([(1, "a"), (2, "b")], SCHEMA).writeTo(table).append()
    steps: list[str] = []
    monkeypatch.setattr(delta_io.faults, "point", lambda step, name: steps.append(step))
    query = f"SELECT * FROM {table} WHERE id > 1"
    assert delta_io.view_text(spark, view) is None
    delta_io.ensure_view(spark, view, query)
    assert delta_io.view_text(spark, view) == query
    delta_io.ensure_view(spark, view, query)  # as it is: no catalog step
    assert steps == ["catalog", "cataloged"]
    delta_io.ensure_view(spark, view, query.replace("> 1", ">= 1"))  # an older definition
    assert steps == ["catalog", "cataloged"] * 2
    assert spark.table(view).count() == 2
    spark.sql(f"DROP VIEW {view}")  # dropped behind our back: made again
    delta_io.ensure_view(spark, view, query)
    assert [tuple(r) for r in spark.table(view).collect()] == [(2, "b")]
    assert delta_io.view_text(spark, table) is None  # a table is not a view


@pytest.mark.long
def test_a_rerun_after_a_killed_apply_publishes_no_older_state(
    spark: SparkSession, spark_warehouse: Path, tmp_path: Path, monkeypatch: Any
) -> None:
    """The killed run MERGEd every table (a batch with a rollback) and died before saving its
    position; the re-run walks the same batch: it must not rewind the keys the killed run
    already brought to the batch's changes, so no version of any table moves a key back."""
    bucket = f"r{tmp_path.name[-8:].replace('_', '').replace('-', '')}".lower()
    result = simulate(
        tmp_path / "sim", bucket=bucket, scenario="rollback", seed=5, vbuckets=2, docs=40, ops=120
    )
    config = AppConfig(
        landing=str(result.out / "landing"),
        warehouse=str(spark_warehouse),
        buckets=[BucketConfig(name=bucket)],
    )
    try:
        _apply_killed_then_again(spark, config, result, tmp_path, monkeypatch)
    finally:
        drop_all(spark, bucket)


def _apply_killed_then_again(
    spark: SparkSession, config: AppConfig, result: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    bucket = config.buckets[0].name
    ingest_bucket(spark, config, config.buckets[0])

    def killed(*args: Any) -> None:
        raise KeyboardInterrupt("killed before saving the position")

    with monkeypatch.context() as m:
        m.setattr(state, "save_states", killed)
        with pytest.raises(KeyboardInterrupt):
            apply_bucket(spark, config, config.buckets[0])
    summary = apply_bucket(spark, config, config.buckets[0])
    assert summary.rollbacks, "the scenario must roll back inside the batch"
    setup = kh.Setup(tmp_path, Path(), Path(config.warehouse), result, bucket)
    assert kh.regressions(setup) == []
    assert_equal_to_truth(spark, bucket, result)


def _silver_catalog(spark: SparkSession, bucket: str) -> set[tuple[str, str]]:
    """The bucket's silver tables and views, named without the bucket."""
    prefix = bucket.replace("-", "_")
    return {
        (t.name[len(prefix) :], t.tableType)
        for t in spark.catalog.listTables("silver")
        if t.name.startswith(prefix)
    }


@pytest.mark.long
def test_a_retire_killed_before_the_registry_is_saved_is_finished_by_the_next_run(
    spark: SparkSession, spark_warehouse: Path, tmp_path: Path, monkeypatch: Any
) -> None:
    """A dropped collection is retired (its table archived, its views dropped); the run is
    killed right after the retire dropped its typed view, before the registry said so. The
    next run must finish the retire, not make the collection's table again (empty): the
    catalog ends as one uninterrupted run leaves it."""
    from pipelines.lake import faults

    names = {
        w: f"rt{w}{tmp_path.name[-6:]}".replace("_", "").replace("-", "").lower() for w in "ab"
    }
    results = {
        w: simulate(
            tmp_path / w,
            bucket=name,
            scenario="collection-lifecycle",
            seed=4,
            vbuckets=2,
            docs=60,
            ops=150,
        )
        for w, name in names.items()
    }
    configs = {
        w: AppConfig(
            landing=str(results[w].out / "landing"),
            warehouse=str(spark_warehouse),
            buckets=[BucketConfig(name=names[w])],
        )
        for w in names
    }

    def killed() -> None:
        raise KeyboardInterrupt("killed after the retire, before the registry is saved")

    try:
        for w in names:
            ingest_bucket(spark, configs[w], configs[w].buckets[0])
        apply_bucket(spark, configs["a"], configs["a"].buckets[0])  # uninterrupted
        with monkeypatch.context() as m:
            m.setenv(faults.KILL_AT_ENV, "catalog:silver.*__typed")
            m.setattr(faults, "kill_now", killed)
            with pytest.raises(KeyboardInterrupt):
                apply_bucket(spark, configs["b"], configs["b"].buckets[0])
        apply_bucket(spark, configs["b"], configs["b"].buckets[0])
        assert_equal_to_truth(spark, names["b"], results["b"])
        uninterrupted = _silver_catalog(spark, names["a"])
        assert any("__dropped_" in n for n, _ in uninterrupted)  # a retire happened
        assert _silver_catalog(spark, names["b"]) == uninterrupted
        statuses = {r["status"] for r in spark.table(f"silver.{names['b']}__collections").collect()}
        assert "retiring" not in statuses and "retired" in statuses
    finally:
        for name in names.values():
            drop_all(spark, name)

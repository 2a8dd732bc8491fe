"""``dcp-cdc sql`` on the shared session: a statement Spark cannot analyse is one line on
stderr naming the error's class (exit 2), never PySpark's log of the JVM's stack or a
traceback; a missing table says whether its bucket has not been applied yet or the name is
wrong."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from pipelines.app import cli


def _sql(config: Path, query: str, capfd: pytest.CaptureFixture[str]) -> tuple[int, str]:
    status = cli.main(["sql", "--config", str(config), query], out=io.StringIO())
    return status, capfd.readouterr().err


def test_a_query_spark_cannot_analyse_is_one_typed_line(
    spark: SparkSession,
    spark_warehouse: Path,
    bucket: str,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
) -> None:
    config = tmp_path / "conf.toml"
    config.write_text(
        f'landing = "{tmp_path / "landing"}"\nwarehouse = "{spark_warehouse}"\n'
        f'[spark]\nshuffle_partitions = 2\n[[buckets]]\nname = "{bucket}"\n'
    )
    live = f"silver.{bucket}___default___default"
    capfd.readouterr()

    # before the first apply: the bucket has no silver table yet
    status, err = _sql(config, f"SELECT count(*) FROM {live}", capfd)
    assert status == 2
    assert err.splitlines() == [
        f"dcp-cdc sql: error: TableNotFoundError: {live} does not exist yet: bucket "
        f"{bucket!r} has not been applied yet (silver holds none of its tables): run "
        "`dcp-cdc ingest` and `dcp-cdc apply` first, or let its DAG run"
    ]

    # once it has: a wrong name gets the closest names
    spark.sql("CREATE DATABASE IF NOT EXISTS silver")
    spark.sql(f"CREATE TABLE {live}_all (key STRING) USING delta")
    status, err = _sql(config, f"SELECT count(*) FROM {live}_al", capfd)
    assert status == 2
    assert err.splitlines() == [
        f"dcp-cdc sql: error: TableNotFoundError: {live}_al: no such table or view in the "
        f"catalog; did you mean {live}_all? (`dcp-cdc tables` lists the "
        f"{_in_catalog(spark)} there are)"
    ]

    # any other statement Spark refuses: its reason, in one line
    status, err = _sql(config, f"SELECT nope FROM {live}_all", capfd)
    assert status == 2
    [line] = err.splitlines()
    assert line.startswith("dcp-cdc sql: error: QueryError: [UNRESOLVED_COLUMN")
    assert "`nope`" in line

    status, err = _sql(config, f"SELECT count(*) AS n FROM {live}_all", capfd)
    assert (status, err) == (0, "")


def _in_catalog(spark: SparkSession) -> int:
    """How many tables and views the layers' databases hold (other tests' too)."""
    return sum(
        len(spark.catalog.listTables(layer))
        for layer in ("bronze", "silver", "quality")
        if spark.catalog.databaseExists(layer)
    )

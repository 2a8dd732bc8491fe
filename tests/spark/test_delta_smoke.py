"""Delta Lake works in the sessions pipelines.lake.spark_session builds, with no network.

MERGE with all three clause kinds (metrics and resulting table), time travel, history, the
catalog, and a table registered by one Spark process found by the next one.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipelines.lake.delta_io import static_plan_session
from pipelines.lake.spark_session import METASTORE_DIR_NAME, find_delta_jars

if TYPE_CHECKING:
    from tests.spark.conftest import Warehouse


DOC_SCHEMA = T.StructType(
    [
        T.StructField("key", T.StringType(), nullable=False),
        T.StructField("value", T.StringType(), nullable=True),
        T.StructField("rev", T.LongType(), nullable=False),
    ]
)
CHANGE_SCHEMA = T.StructType([*DOC_SCHEMA.fields, T.StructField("deleted", T.BooleanType(), False)])

INITIAL_DOCS = [("k1", "a", 1), ("k2", "b", 1), ("k3", "c", 1)]
CHANGES = [
    ("k1", "a2", 2, False),  # matched: update
    ("k2", None, 2, True),  # matched: delete
    ("k4", "d", 1, False),  # not matched: insert
    ("k5", None, 1, True),  # not matched, deleted: nothing to do
]
EXPECTED_AFTER_MERGE = [("k1", "a2", 2), ("k3", "c", 1), ("k4", "d", 1)]


def _write_initial(spark: SparkSession, path: str) -> None:
    docs = spark.createDataFrame(INITIAL_DOCS, schema=DOC_SCHEMA)
    docs.write.format("delta").save(path)


def _merge_changes(spark: SparkSession, path: str) -> DataFrame:
    changes = spark.createDataFrame(CHANGES, schema=CHANGE_SCHEMA)
    return (
        DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(changes.alias("s"), "t.key = s.key")
        .whenMatchedDelete(condition="s.deleted")
        .whenMatchedUpdate(set={"value": "s.value", "rev": "s.rev"})
        .whenNotMatchedInsert(
            condition="NOT s.deleted",
            values={"key": "s.key", "value": "s.value", "rev": "s.rev"},
        )
        .execute()
    )


def _rows(docs: DataFrame) -> list[tuple[object, ...]]:
    return [tuple(row) for row in docs.select("key", "value", "rev").orderBy("key").collect()]


def test_merge_updates_deletes_and_inserts(spark: SparkSession, warehouse: Warehouse) -> None:
    path = warehouse.table_path("docs")
    _write_initial(spark, path)

    metrics = _merge_changes(spark, path).collect()

    assert [row.asDict() for row in metrics] == [
        {
            "num_affected_rows": 3,
            "num_updated_rows": 1,
            "num_deleted_rows": 1,
            "num_inserted_rows": 1,
        }
    ]
    assert _rows(spark.read.format("delta").load(path)) == EXPECTED_AFTER_MERGE


def test_time_travel_and_history(spark: SparkSession, warehouse: Warehouse) -> None:
    path = warehouse.table_path("docs")
    _write_initial(spark, path)
    _merge_changes(spark, path)

    version_0 = spark.read.format("delta").option("versionAsOf", 0).load(path)
    assert _rows(version_0) == INITIAL_DOCS
    assert _rows(spark.read.format("delta").load(path)) == EXPECTED_AFTER_MERGE

    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").orderBy("version").collect()
    assert [(h.version, h.operation) for h in history] == [(0, "WRITE"), (1, "MERGE")]
    merge_metrics = history[1].operationMetrics
    assert merge_metrics["numTargetRowsUpdated"] == "1"
    assert merge_metrics["numTargetRowsDeleted"] == "1"
    assert merge_metrics["numTargetRowsInserted"] == "1"


def test_catalog_table_is_delta_under_the_test_warehouse(
    spark: SparkSession, warehouse: Warehouse
) -> None:
    docs = spark.createDataFrame(INITIAL_DOCS, schema=DOC_SCHEMA)
    docs.write.format("delta").saveAsTable("docs")

    assert spark.catalog.tableExists(f"{warehouse.database}.docs")
    detail = spark.sql("DESCRIBE DETAIL docs").collect()[0]
    assert detail.format == "delta"
    assert detail.location.removeprefix("file:").startswith(str(warehouse.path))
    assert _rows(spark.table(f"{warehouse.database}.docs")) == INITIAL_DOCS


def test_session_settings(spark: SparkSession, spark_warehouse: Path) -> None:
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    assert spark.conf.get("spark.sql.execution.arrow.pyspark.enabled") == "true"
    assert spark.conf.get("spark.sql.catalogImplementation") == "hive"
    assert spark.conf.get("spark.sql.shuffle.partitions") == "2"
    assert "spark.jars.packages" not in dict(spark.sparkContext.getConf().getAll())
    # The embedded metastore and Derby's log live in the warehouse, not in the working directory.
    assert (spark_warehouse / METASTORE_DIR_NAME / "service.properties").is_file()
    assert (spark_warehouse / "derby.log").is_file()


def test_a_static_plan_session_interprets_when_asked_and_leaves_its_parent_alone(
    spark: SparkSession,
) -> None:
    """``static_plan_session``: AQE off; ``interpreted``, no stage compiled to Java (no ``*(n)``
    whole-stage marks in the plan), the same rows; the caller's session keeps its settings."""

    def query(session: SparkSession) -> tuple[str, list[Any]]:
        df = session.range(50).selectExpr("id % 7 AS k", "id * 3 AS v").groupBy("k").sum("v")
        return df._jdf.queryExecution().executedPlan().toString(), sorted(df.collect())

    compiling = static_plan_session(spark)
    compiling.conf.set("spark.sql.codegen.wholeStage", "true")  # as the product's sessions have
    interpreting = static_plan_session(spark, interpreted=True)
    compiled_plan, compiled = query(compiling)
    interpreted_plan, interpreted = query(interpreting)
    assert "*(1) HashAggregate" in compiled_plan
    assert "*(" not in interpreted_plan
    assert interpreted == compiled and len(compiled) == 7
    assert interpreting.conf.get("spark.sql.codegen.factoryMode") == "NO_CODEGEN"
    assert interpreting.conf.get("spark.sql.adaptive.enabled") == "false"
    assert spark.conf.get("spark.sql.codegen.factoryMode") == "FALLBACK"
    assert spark.conf.get("spark.sql.adaptive.enabled") == "true"


def test_arrow_round_trip(spark: SparkSession) -> None:
    frame = pd.DataFrame({"key": ["k1", "k2"], "rev": [1, 2]})
    docs = spark.createDataFrame(frame).select("key", (F.col("rev") * 10).alias("rev"))
    back: Any = docs.toPandas()
    assert back.to_dict("list") == {"key": ["k1", "k2"], "rev": [10, 20]}


def test_jars_match_the_python_packages() -> None:
    """The resolved jars are the Delta release the pinned delta-spark package expects."""
    delta_version = importlib.metadata.version("delta-spark")
    names = {jar.name for jar in find_delta_jars()}
    assert f"delta-spark_2.13-{delta_version}.jar" in names
    assert f"delta-storage-{delta_version}.jar" in names
    # apache-airflow-providers-apache-spark brings pyspark-client, which writes into the same
    # pyspark/ folder: harmless only while both are the same release.
    try:
        client_version = importlib.metadata.version("pyspark-client")
    except importlib.metadata.PackageNotFoundError:
        return
    assert client_version == importlib.metadata.version("pyspark")


def test_the_sessions_jvm_maps_spark_from_the_class_data_archive(spark: SparkSession) -> None:
    """``make setup`` writes the archive (:mod:`pipelines.lake.jvm_archive`), and a local
    session's JVM takes Spark's classes from it: thousands of classes come from the shared
    archive, where the JDK's own archive alone holds about 1,300."""
    from pyspark import SparkContext

    from pipelines.lake import jvm_archive

    path = jvm_archive.archive_path()
    assert path is not None and path.is_file(), f"no class-data archive at {path}: make setup"
    gateway = SparkContext._gateway
    assert gateway is not None
    counters = subprocess.run(
        ["jcmd", str(gateway.proc.pid), "PerfCounter.print"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    shared = dict(
        line.split("=", 1) for line in counters.splitlines() if line.startswith("java.cls.shared")
    )
    assert int(shared["java.cls.sharedLoadedClasses"]) > 5000, shared
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    args = jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    assert f"-XX:SharedArchiveFile={path}" in list(args.getInputArguments())

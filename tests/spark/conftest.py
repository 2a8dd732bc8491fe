"""One Spark session for all of tests/spark, and a throw-away warehouse for each test.

Starting a JVM costs seconds, so the session is shared; isolation comes from the per-test
``warehouse``: its own folder for path-based Delta tables and its own catalog database (the
current database for the test), dropped afterwards, and the per-test ``bucket``: a fresh name
whose bronze and silver tables are dropped afterwards.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

HERE = Path(__file__).resolve().parent

# The shared session runs for the whole suite, so its planner code gets hot: full (C2) JIT pays
# for itself (C1 only made one silver test 146 s instead of 114 s). Test data is tiny, so
# whole-stage code generation costs more in Janino compiles than it saves in rows (107 s); the
# product's sessions keep it, and tests/e2e and tests/dags run those.
TEST_SPARK_CONF = {
    "spark.driver.extraJavaOptions": "-XX:+UseSerialGC",
    "spark.sql.codegen.wholeStage": "false",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.spark)


@pytest.fixture(scope="session")
def spark_warehouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shared session's warehouse: its metastore_db and derby.log land here."""
    return tmp_path_factory.mktemp("spark-warehouse")


@pytest.fixture(scope="session")
def spark(spark_warehouse: Path) -> Iterator[SparkSession]:
    from pipelines.spark_session import build_spark_session

    session = build_spark_session(
        "dcp-cdc-tests",
        spark_warehouse,
        master="local[2]",
        shuffle_partitions=2,
        extra_conf=TEST_SPARK_CONF,
    )
    yield session
    session.stop()


@pytest.fixture
def bucket(spark: SparkSession) -> Iterator[str]:
    """A fresh bucket name (plain: its identifier is itself); its tables are dropped after."""
    from tests.support.silver_runs import drop_all

    name = f"s{uuid.uuid4().hex[:8]}"
    yield name
    drop_all(spark, name)


@dataclass(frozen=True, slots=True)
class Warehouse:
    """A test's own corner of the shared session: a folder and a catalog database in it."""

    path: Path
    database: str

    def table_path(self, name: str) -> str:
        """Where a path-based (uncatalogued) Delta table called ``name`` goes."""
        return str(self.path / "paths" / name)


@pytest.fixture
def warehouse(spark: SparkSession, tmp_path: Path) -> Iterator[Warehouse]:
    database = f"test_{uuid.uuid4().hex[:12]}"
    path = tmp_path / "warehouse"
    spark.sql(f"CREATE DATABASE {database} LOCATION '{path / 'catalog'}'")
    spark.catalog.setCurrentDatabase(database)
    try:
        yield Warehouse(path=path, database=database)
    finally:
        spark.catalog.setCurrentDatabase("default")
        spark.sql(f"DROP DATABASE IF EXISTS {database} CASCADE")

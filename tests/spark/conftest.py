"""One Spark session for all of tests/spark, and a throw-away warehouse for each test.

Starting a JVM costs seconds, so the session is shared; isolation comes from the per-test
``warehouse``: its own folder for path-based Delta tables and its own catalog database (the
current database for the test), dropped afterwards.
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

# Test data is tiny and every JVM is short-lived: C1-only JIT and the serial collector start
# and warm up faster on two cores than the server defaults.
TEST_SPARK_CONF = {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"}


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

"""One Spark session for all of tests/spark (one per pytest-xdist worker), and a throw-away
warehouse for each test.

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
    from pipelines.lake.spark_session import build_spark_session

    session = build_spark_session(
        "dcp-cdc-tests",
        spark_warehouse,
        master="local[2]",
        shuffle_partitions=2,
        extra_conf=TEST_SPARK_CONF,
    )
    yield session
    session.stop()
    _shut_down_gateway()


def _shut_down_gateway() -> None:
    """Closes py4j's connections and ends the JVM now, inside the fixture's teardown.

    Left to the interpreter's exit, each connection's ``__del__`` logs "Closing down
    clientserver connection" at INFO after pytest has closed its capture; a root handler that
    was given the captured stream (Airflow's, when tests/dags import it in this process,
    sets INFO on the root) then fails with "I/O operation on closed file" after the summary.
    Here the lines go to the last test's capture instead, and the JVM's memory is freed.
    """
    import gc

    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is None:
        return
    gateway.shutdown()
    gateway.close()
    proc = getattr(gateway, "proc", None)
    if proc is not None and proc.stdin is not None:
        proc.stdin.close()  # the JVM's launcher exits at the end of its stdin
        proc.wait(timeout=60)
    SparkContext._gateway = None
    SparkContext._jvm = None
    del gateway
    gc.collect()  # connections still referenced only by cycles log their close now


# Settings a test's in-process job may not leave changed on the shared session: a job applies
# its config's [spark] runtime settings to the session it is given (build_spark_session), so a
# test config without the session's own would slow or change every test after it on the worker.
GUARDED_SETTINGS = {"spark.sql.shuffle.partitions": "2", "spark.sql.session.timeZone": "UTC"}


@pytest.fixture(autouse=True)
def _session_settings_unchanged(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fails the test that changed a :data:`GUARDED_SETTINGS` value, and puts it back."""
    yield
    if "spark" not in request.fixturenames:
        return
    session: SparkSession = request.getfixturevalue("spark")
    changed = {
        key: got for key, want in GUARDED_SETTINGS.items() if (got := session.conf.get(key)) != want
    }
    for key in changed:
        session.conf.set(key, GUARDED_SETTINGS[key])
    assert not changed, f"the test left the shared Spark session's settings changed: {changed}"


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

"""Delta Lake I/O habits every job shares: retry on typed commit conflicts, race-safe create
of tables, views and catalog entries, replace all rows, idempotent appends, merge metrics.

Imports without pyspark or delta (they are imported where used), so job modules can import
it at top level and still print their help without a JVM.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from pipelines.errors import CommitConflictError
from pipelines.tables import database

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

MAX_COMMIT_ATTEMPTS = 5
_T = TypeVar("_T")


def with_retry(what: str, action: Callable[[], _T]) -> _T:
    """Run a Delta write, retrying when a concurrent writer won the commit (typed conflicts)."""
    from delta import exceptions as dx

    conflicts = (
        dx.DeltaConcurrentModificationException,
        dx.ConcurrentWriteException,
        dx.MetadataChangedException,
        dx.ProtocolChangedException,
        dx.ConcurrentAppendException,
        dx.ConcurrentDeleteReadException,
        dx.ConcurrentDeleteDeleteException,
        dx.ConcurrentTransactionException,
    )
    for attempt in range(1, MAX_COMMIT_ATTEMPTS + 1):
        try:
            return action()
        except conflicts as exc:
            if attempt == MAX_COMMIT_ATTEMPTS:
                raise CommitConflictError(
                    f"{what}: a concurrent writer committed first {attempt} times in a row "
                    f"({type(exc).__name__}); nothing of this step was written, run again"
                ) from exc
            time.sleep(0.2 * attempt)
    raise AssertionError("unreachable")


def ensure_database(spark: SparkSession, table: str) -> None:
    """The database (layer) ``table`` is in exists."""
    spark.sql(f"CREATE DATABASE IF NOT EXISTS {database(table)}")


def create_table(
    spark: SparkSession,
    table: str,
    schema: StructType,
    properties: Mapping[str, str],
    *,
    cluster_by: Iterable[str] = (),
) -> None:
    """Create ``table`` with ``schema`` unless it exists (:func:`create_race_safe`);
    ``properties`` are its Delta table properties, ``cluster_by`` its liquid clustering keys."""
    from delta.tables import DeltaTable

    builder = DeltaTable.createIfNotExists(spark).tableName(table).addColumns(schema)
    if cluster_by:
        builder = builder.clusterBy(*cluster_by)
    for key, value in properties.items():
        builder = builder.property(key, value)
    create_race_safe(table, builder)


def create_race_safe(table: str, builder: Any) -> None:
    """``createIfNotExists`` that tolerates a concurrent run creating the same table. Delta
    reports that race as a protocol change (retried by :func:`with_retry`); the catalog as
    "already exists", or the location as "not empty" while the other commit is under way:
    wait, and ask again (the table exists by then and creating it is a no-op)."""
    from pyspark.errors import AnalysisException

    races = ("TABLE_OR_VIEW_ALREADY_EXISTS", "DELTA_CREATE_TABLE_WITH_NON_EMPTY_LOCATION")
    for attempt in range(1, MAX_COMMIT_ATTEMPTS + 1):
        try:
            with_retry(table, builder.execute)
            return
        except AnalysisException as exc:
            if exc.getCondition() not in races:
                raise
            if attempt == MAX_COMMIT_ATTEMPTS:
                raise CommitConflictError(
                    f"{table}: a concurrent run was still creating it after {attempt} attempts "
                    f"({exc.getCondition()}); run again"
                ) from exc
            time.sleep(0.5 * attempt)


def catalog_step(name: str, step: Callable[[], object], race: str) -> None:
    """A catalog change a concurrent run may make first: its ``race`` error (the other run's
    effect) means done; a second such error in a row fails with a clear message."""
    from pyspark.errors import AnalysisException

    for attempt in (1, 2):
        try:
            step()
            return
        except AnalysisException as exc:
            if exc.getCondition() != race:
                raise
            if attempt == 2:
                raise CommitConflictError(
                    f"{name}: a concurrent run kept changing it in the catalog ({race}); run again"
                ) from exc


def replace_rows(df: DataFrame, table: str) -> None:
    """All of ``table``'s rows become ``df``'s, in one Delta commit. An overwrite by filter
    keeps the catalog entry as it is (``saveAsTable`` would alter it, which the Hive metastore
    refuses for Delta's placeholder schema and logs as an error)."""
    from pyspark.sql import functions as F

    df.writeTo(table).overwrite(F.lit(True))


def append(df: DataFrame, table: str) -> None:
    """Append ``df``'s rows to the Delta table ``table``."""
    df.write.format("delta").mode("append").saveAsTable(table)


def append_once(df: DataFrame, table: str, *, app_id: str, version: int) -> None:
    """Append ``df`` unless a write of ``(app_id, version)`` already committed to ``table``
    (Delta's idempotent writes): a repeated run skips what an earlier attempt wrote."""
    (
        df.write.format("delta")
        .mode("append")
        .option("txnAppId", app_id)
        .option("txnVersion", version)
        # Each task writes its own files already: an optimized write would only add a shuffle.
        .option("optimizeWrite", "false")
        .saveAsTable(table)
    )


def committed_version(spark: SparkSession, table: str, app_id: str) -> int | None:
    """The latest ``txnVersion`` of ``app_id`` that committed to the Delta table ``table``
    (the version :func:`append_once` skips at and below), or None if none did: what tells a
    resumed run whether its killed attempt's write committed. Read from the table's snapshot
    (its log's transaction actions), as Delta does before an idempotent write."""
    jvm: Any = spark._jvm
    location = spark.sql(f"DESCRIBE DETAIL {table}").first()["location"]  # type: ignore[index]
    delta_log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, location)
    nothing = jvm.scala.Option.empty()
    found = delta_log.update(False, nothing, nothing).transactions().get(app_id)
    return int(found.get()) if found.isDefined() else None


def metric(metrics: DataFrame | None, name: str) -> int:
    """One number of the metrics a MERGE, UPDATE or DELETE returns (0 when it returned none)."""
    if metrics is None:
        return 0
    rows = metrics.collect()
    return int(rows[0][name]) if rows and name in rows[0].asDict() else 0

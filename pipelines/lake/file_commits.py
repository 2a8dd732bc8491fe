"""Commits of Parquet files this process wrote itself (the decode tasks, the driver), one
Delta transaction each, without Spark's writer: an idempotent append under an app's
version (:func:`commit_files`), a plain append (:func:`append_files`) and a replacement of
every file (:func:`replace_files`). What they read of the table comes from the checksum of
the version they commit on (:mod:`pipelines.lake.delta_io`), not from the state Delta
rebuilds with Spark jobs; each is retried over a concurrent writer's commit."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from pipelines.lake.delta_io import (
    _app_version,
    _checksum,
    _delta_log,
    _nothing,
    _typed_conflicts,
    with_retry,
)


def commit_files(
    spark: SparkSession,
    table: str,
    files: Iterable[Mapping[str, Any]],
    *,
    app_id: str,
    version: int,
) -> bool:
    """Commit Parquet files already in ``table``'s folder (rows of ``schemas.WRITTEN``) as
    one append, unless ``(app_id, version)`` already committed to it: :func:`append_once` for
    files the tasks wrote themselves (:mod:`pipelines.bronze.writer`). Returns whether this
    call committed. Idempotence is Delta's own: the transaction reads the app's version from
    the snapshot it commits on and writes it with the files (a ``txn`` action), so of two
    attempts of one run only one commits; a concurrent writer's commit is retried over."""
    adds = [json.dumps({"add": _add(f)}) for f in files]
    txn = json.dumps(
        {"txn": {"appId": app_id, "version": version, "lastUpdated": int(time.time() * 1000)}}
    )
    jvm: Any = spark._jvm

    def commit() -> bool:
        delta_log = _delta_log(spark, table)
        transaction = delta_log.startTransaction()
        if _txn_version(transaction, app_id) >= version:
            return False
        _commit(jvm, transaction, [], [*adds, txn], overwrite=False)
        return True

    return with_retry(table, lambda: _typed_conflicts(commit))


def replace_files(
    spark: SparkSession,
    table: str,
    files: Iterable[Mapping[str, Any]],
    schema: StructType,
    *,
    user_metadata: str | None = None,
) -> bool:
    """All of ``table``'s rows become those of ``files`` (Parquet files already in its
    folder, rows of ``schemas.WRITTEN``), in one commit recording ``user_metadata``, without a
    Spark job: the files removed are those the checksum of the version it commits on lists
    (Delta keeps them there for a table of up to 50 files). False, and nothing committed,
    when the checksum does not list them, the table's columns are not ``schema``'s (the
    files') or it maps column names: then :func:`replace_rows` is the way. The
    transaction reads the whole table, so a concurrent commit to it conflicts (and this one
    is tried again over it)."""
    adds = [json.dumps({"add": _add(f)}) for f in files]
    jvm: Any = spark._jvm

    def commit() -> bool:
        transaction = _delta_log(spark, table).startTransaction()
        snapshot = transaction.snapshot()
        checksum = _checksum(snapshot)
        if checksum is None or not checksum.allFiles().isDefined():
            return False
        if not _writable_as(snapshot, schema):
            return False
        transaction.readWholeTable()
        now = int(time.time() * 1000)
        current = checksum.allFiles().get()
        removes = [current.apply(i).removeWithTimestamp(now, True) for i in range(current.size())]
        _commit(jvm, transaction, removes, adds, overwrite=True, user_metadata=user_metadata)
        return True

    return with_retry(table, lambda: _typed_conflicts(commit))


def append_files(
    spark: SparkSession,
    table: str,
    files: Iterable[Mapping[str, Any]],
    schema: StructType,
    partitions: Mapping[str, str] | None = None,
) -> bool:
    """Append Parquet files already in ``table``'s folder (rows of ``schemas.WRITTEN``) in
    one commit, without a Spark job (Spark's append runs one, and its commit more). False,
    and nothing committed, when the table's columns are not ``schema``'s (the files' and
    the ``partitions`` columns'), it is not partitioned by the columns of ``partitions``
    (each partition column's value, as the files' paths name it) or it maps column names:
    then :func:`append` is the way."""
    values = dict(partitions or {})
    adds = [json.dumps({"add": _add(f) | {"partitionValues": values}}) for f in files]
    jvm: Any = spark._jvm

    def commit() -> bool:
        transaction = _delta_log(spark, table).startTransaction()
        snapshot = transaction.snapshot()
        columns = snapshot.metadata().partitionColumns()
        if [str(columns.apply(i)) for i in range(columns.size())] != list(values):
            return False
        if not _writable_as(snapshot, schema):
            return False
        _commit(jvm, transaction, [], adds, overwrite=False)
        return True

    return with_retry(table, lambda: _typed_conflicts(commit))


def _commit(
    jvm: Any,
    transaction: Any,
    actions: list[Any],
    as_json: list[str],
    *,
    overwrite: bool,
    user_metadata: str | None = None,
) -> None:
    """Commit ``actions`` (Delta action objects) and ``as_json`` (actions as JSON) in
    ``transaction``, recorded in the history as a WRITE (append, or ``overwrite``) with
    ``user_metadata``. py4j cannot use Scala's default arguments, so every optional one of
    ``DeltaOperations.Write`` is given: mode, partitionBy, predicate, userMetadata and 5 more
    in delta-spark 4.4 (tests/spark/test_delta_log_reads.py commits through each caller)."""
    listed = jvm.java.util.ArrayList()
    for action in actions:
        listed.add(action)
    for action in as_json:
        listed.add(jvm.org.apache.spark.sql.delta.actions.Action.fromJson(action))
    none = jvm.scala.Option.empty()
    metadata = none if user_metadata is None else jvm.scala.Some(user_metadata)
    mode = jvm.org.apache.spark.sql.SaveMode
    write = getattr(jvm.org.apache.spark.sql.delta, "DeltaOperations$Write")(
        mode.Overwrite if overwrite else mode.Append, none, none, metadata, *[none] * 5
    )
    transaction.commit(jvm.scala.jdk.javaapi.CollectionConverters.asScala(listed).toSeq(), write)


def _writable_as(snapshot: Any, schema: StructType) -> bool:
    """Whether files of ``schema`` can join the table as they are: the table has the same
    columns (names and types, in order) and does not map column names (its files would hold
    physical names, which Spark's writer knows)."""
    mapping = snapshot.metadata().configuration().get("delta.columnMapping.mode")
    if mapping.isDefined() and mapping.get() != "none":
        return False
    table = StructType.fromJson(json.loads(snapshot.metadata().schemaString()))
    return [(f.name, f.dataType) for f in table.fields] == [
        (f.name, f.dataType) for f in schema.fields
    ]


def _add(f: Mapping[str, Any]) -> dict[str, Any]:
    """The ``add`` action of a written file (a row of ``schemas.WRITTEN``)."""
    return {
        "path": f["path"],
        "partitionValues": {},
        "size": f["size"],
        "modificationTime": f["modification_time"],
        "dataChange": True,
        "stats": f["stats"],
    }


def _txn_version(transaction: Any, app_id: str) -> int:
    """``transaction.txnVersion(app_id)`` (-1: none), read from the checksum of the snapshot
    it commits on when that lists the transactions (``txnVersion`` reconstructs the state,
    Spark jobs, for them). The app is recorded as read all the same, so that a concurrent
    commit of the same app conflicts with this one, as with ``txnVersion``."""
    checksum = _checksum(transaction.snapshot())
    if checksum is None or not checksum.setTransactions().isDefined():
        return int(transaction.txnVersion(app_id))
    transaction.readTxn().addOne(app_id)
    found = _app_version(transaction.snapshot(), app_id)
    return -1 if found is None else found


LOOK_BACK = (4, 32, 256)
"""How many of a table's latest commits :func:`files_of_app_versions` reads, window after
window (each window one read of the log), before it gives up."""


def files_of_app_versions(
    spark: SparkSession, table: str, app_id: str, versions: Iterable[int]
) -> dict[int, list[str]] | None:
    """The data files (paths relative to the table) that the commits of ``app_id`` at
    ``versions`` (``txn`` versions: :func:`commit_files`, an idempotent append) added to
    ``table``, read from its latest commits back (no Spark job). None when they are not all
    there as added: a commit since the oldest of them removed files (an OPTIMIZE may have
    rewritten theirs) or is another writer's data change, or one is older than
    :data:`LOOK_BACK` commits (the table is then read as a whole)."""
    wanted = set(versions)
    if not wanted:
        return {}
    delta_log = _delta_log(spark, table)
    latest = int(delta_log.update(False, _nothing(spark), _nothing(spark)).version())
    found: dict[int, list[str]] = {}
    upto = latest
    for span in LOOK_BACK:
        start = max(latest - span + 1, 0)
        if start > upto:
            continue
        changes = delta_log.getChanges(start, upto, _nothing(spark), False)
        commits = {}
        while changes.hasNext():
            commit = changes.next()
            commits[int(commit._1())] = list(_iterate(commit._2().iterator()))
        if sorted(commits) != list(range(start, upto + 1)):
            return None  # a commit's file is gone from the log (its retention)
        for _, actions in sorted(commits.items(), reverse=True):
            added = _app_adds(actions, app_id)
            if added is None:
                return None
            version, paths = added
            if version in wanted:
                found[version] = paths
            if version is not None and version <= min(wanted):
                return found if wanted <= found.keys() else None
        upto = start - 1
        if upto < 0:
            break
    return None


def _iterate(iterator: Any) -> Iterable[Any]:
    while iterator.hasNext():
        yield iterator.next()


def _app_adds(actions: list[Any], app_id: str) -> tuple[int | None, list[str]] | None:
    """A commit's ``txn`` version of ``app_id`` (None: none) and the files it added; None
    when it removed files, or changed data without a ``txn`` of ``app_id``."""
    version, adds, changes_data = None, [], False
    for action in actions:
        kind = action.getClass().getSimpleName()
        if kind == "SetTransaction" and action.appId() == app_id:
            version = int(action.version())
        elif kind == "AddFile":
            adds.append(str(action.path()))
            changes_data |= bool(action.dataChange())
        elif kind in ("RemoveFile", "AddCDCFile"):
            return None
    if changes_data and version is None:
        return None
    return version, adds

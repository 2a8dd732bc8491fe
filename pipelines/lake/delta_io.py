"""Delta Lake I/O habits every job shares: retry on typed commit conflicts, race-safe create
of tables, views and catalog entries, replace all rows, idempotent appends, merge metrics.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlparse

from delta import exceptions as dx
from delta.tables import DeltaTable
from py4j.protocol import Py4JJavaError
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from pipelines.errors import CommitConflictError, TableLocationError
from pipelines.lake import faults, table_entries
from pipelines.tables import database

MAX_COMMIT_ATTEMPTS = 5

FREQUENT_COMMITS = {"delta.checkpointInterval": "100"}
"""Properties of the small tables every run, micro-batch or check commits to (bronze's,
silver's stream state, registry, purge marks and pending rows, the quality results and the
check's state), under ``[tables] properties``. Delta
writes a checkpoint every 10 commits by default, inside the commit that reaches it: 6 Spark
jobs, 1.1-3 s on 2 cores for a table of a few rows where a commit takes 0.3 s; those commits
set follow mode's freshness p95. Every 100 commits, a scan of such a table after 60-80 commits
cost the same in a running process (0.88 s) and 0.15 s more in a fresh one."""

_T = TypeVar("_T")
_NON_EMPTY = "DELTA_CREATE_TABLE_WITH_NON_EMPTY_LOCATION"
_FIRST_COMMIT = f"{0:020d}.json"

log = logging.getLogger("dcp_cdc.delta_io")


_HELD: dict[tuple[int, str], tuple[str, str | None, int]] = {}
"""(session, key) -> (the value held, the value before the first holder, how many hold it)."""
_HELD_LOCK = threading.Lock()


@contextlib.contextmanager
def session_conf(spark: SparkSession, conf: Mapping[str, str]) -> Iterator[None]:
    """``conf`` set on the session for the block, then what was there before.

    Blocks may overlap in threads sharing the session (MERGEs of two applies at once): the
    setting is restored when the last of them ends, not by each, which would restore another
    block's value for good (a ``materializeSource=none`` left behind failed every later
    single-table MERGE of the session). Overlapping blocks must want the same value.
    """
    session = id(spark)
    with _HELD_LOCK:
        for key, value in conf.items():
            held = _HELD.get((session, key))
            if held is not None and held[0] != value:
                raise RuntimeError(
                    f"Spark setting {key} is held at {held[0]!r} by another block of this "
                    f"session; cannot set {value!r} beside it"
                )
        for key, value in conf.items():
            held = _HELD.get((session, key))
            if held is None:
                _HELD[(session, key)] = (value, spark.conf.get(key, None), 1)
                spark.conf.set(key, value)
            else:
                _HELD[(session, key)] = (value, held[1], held[2] + 1)
    try:
        yield
    finally:
        with _HELD_LOCK:
            for key in conf:
                value, before, holders = _HELD[(session, key)]
                if holders > 1:
                    _HELD[(session, key)] = (value, before, holders - 1)
                    continue
                del _HELD[(session, key)]
                if before is None:
                    spark.conf.unset(key)
                else:
                    spark.conf.set(key, before)


_CONFLICTS = (
    "DeltaConcurrentModificationException",
    "ConcurrentWriteException",
    "MetadataChangedException",
    "ProtocolChangedException",
    "ConcurrentAppendException",
    "ConcurrentDeleteReadException",
    "ConcurrentDeleteDeleteException",
    "ConcurrentTransactionException",
)
"""Delta's commit conflicts (``delta.exceptions``): another writer committed first; the
write is tried again on the new version."""


def with_retry(what: str, action: Callable[[], _T]) -> _T:
    """Run a Delta write, retrying when a concurrent writer won the commit (typed conflicts).
    The write is a fault point (:mod:`pipelines.lake.faults`): ``commit:WHAT``, ``committed:WHAT``."""
    faults.point("commit", what)
    result = _retry(what, action)
    faults.point("committed", what)
    return result


def _retry(what: str, action: Callable[[], _T]) -> _T:
    conflicts = tuple(getattr(dx, name) for name in _CONFLICTS)
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
    """The database (layer) ``table`` is in exists. ``IF NOT EXISTS`` also adopts the folder
    of a creation killed between making it and its catalog entry."""
    name = database(table)
    if spark.catalog.databaseExists(name):  # a catalog lookup; CREATE ... IF NOT EXISTS is a
        return  # statement to parse, plan and run, paid by every run of every job
    faults.point("database", name)
    spark.sql(f"CREATE DATABASE IF NOT EXISTS {name}")
    faults.point("databased", name)


def create_table(
    spark: SparkSession,
    table: str,
    schema: StructType,
    properties: Mapping[str, str],
    *,
    cluster_by: Iterable[str] = (),
    partitioned_by: Iterable[str] = (),
) -> None:
    """Create ``table`` with ``schema`` unless it exists (:func:`create_race_safe`);
    ``properties`` are its Delta table properties, ``cluster_by`` its liquid clustering keys,
    ``partitioned_by`` its partition columns."""
    if spark.catalog.tableExists(table):
        return
    builder = DeltaTable.createIfNotExists(spark).tableName(table).addColumns(schema)
    if cluster_by:
        builder = builder.clusterBy(*cluster_by)
    if partitioned_by:
        builder = builder.partitionedBy(*partitioned_by)
    for key, value in properties.items():
        builder = builder.property(key, value)
    location = managed_location(spark, table)
    first_commit = _local_path(f"{location}/_delta_log/{_FIRST_COMMIT}")
    faults.point("create", table)
    stop = faults.watch("create-committed", table, lambda: Path(first_commit).exists())
    try:
        create_race_safe(spark, table, builder, location)
    finally:
        stop()
    faults.point("created", table)


def managed_location(spark: SparkSession, table: str) -> str:
    """Where the catalog puts the managed table ``table`` (``DB.NAME``): its database's
    location and the name, as Spark's session catalog does."""
    db, _, name = table.partition(".")
    return f"{spark.catalog.getDatabase(db).locationUri.rstrip('/')}/{name.lower()}"


def _local_path(uri: str) -> str:
    parsed = urlparse(uri)
    return parsed.path if parsed.scheme in ("", "file") else uri


def create_race_safe(
    spark: SparkSession, table: str, builder: Any, location: str | None = None
) -> None:
    """``createIfNotExists`` that tolerates a concurrent run creating the same table, and
    resumes a creation that was killed.

    Delta reports a concurrent creation as a protocol change (retried), or as "already exists"
    when the other run's catalog entry lands between its check and its own; the catalog as
    "already exists", or the location as "not empty" while the other run is between its
    first commit and its catalog entry: wait, and ask again (the table exists by then and
    creating it is a no-op). A location still "not empty" after the waits, of a table the
    catalog still does not know, is what a creation killed in that gap leaves: when it holds
    nothing but a log whose only commit is version 0 without data files (or no commit yet),
    it is cleared and the table created (:func:`clear_interrupted_creation`).
    """
    races = ("TABLE_OR_VIEW_ALREADY_EXISTS", "DELTA_TABLE_ALREADY_EXISTS", _NON_EMPTY)
    cleared = False
    attempt = 0
    while True:
        attempt += 1
        try:
            _retry(table, builder.execute)
            return
        except AnalysisException as exc:
            if exc.getCondition() not in races:
                raise
            if attempt >= MAX_COMMIT_ATTEMPTS:
                if exc.getCondition() == _NON_EMPTY and location and not cleared:
                    cleared = clear_interrupted_creation(spark, table, location)
                    if cleared:
                        continue
                raise CommitConflictError(
                    f"{table}: a concurrent run was still creating it after {attempt} attempts "
                    f"({exc.getCondition()}); run again"
                ) from exc
            time.sleep(0.5 * attempt)


def clear_interrupted_creation(spark: SparkSession, table: str, location: str) -> bool:
    """Delete what a creation of ``table`` killed before its catalog entry left at
    ``location``; ``True`` when the next creation may succeed.

    Called only after the waits of :func:`create_race_safe` (about 5 s): a live concurrent
    creator registers its table within milliseconds of its first commit, so by then one
    would have. Deleted only when the catalog still does not know ``table`` and the location
    holds nothing but ``_delta_log`` with no commit after version 0, and version 0 adds no
    data file: whoever wrote it, nothing is lost. (The one window left: a creator stalled
    for longer than the waits, registering between this check and the delete; its next
    read then fails, typed, and no data is lost.) Anything more at the location raises
    :class:`~pipelines.errors.TableLocationError`.
    """
    if spark.catalog.tableExists(table):
        return True  # registered by now: creating it again is a no-op
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    path = jvm.org.apache.hadoop.fs.Path(location)
    fs = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    entries = sorted(s.getPath().getName() for s in fs.listStatus(path))
    logged = (
        sorted(
            s.getPath().getName()
            for s in fs.listStatus(jvm.org.apache.hadoop.fs.Path(path, "_delta_log"))
        )
        if "_delta_log" in entries
        else []
    )
    versions = [n for n in logged if n[:20].isdigit() and not n.startswith(".")]
    first: list[dict[str, Any]] = []
    if _FIRST_COMMIT in versions:
        stream = fs.open(jvm.org.apache.hadoop.fs.Path(path, f"_delta_log/{_FIRST_COMMIT}"))
        try:
            text = jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
        finally:
            stream.close()
        first = [json.loads(line) for line in text.splitlines() if line.strip()]
    interrupted = (
        entries == ["_delta_log"]
        and all(n.startswith(_FIRST_COMMIT.removesuffix(".json")) for n in versions)
        and not any("add" in action or "remove" in action for action in first)
    )
    if not interrupted:
        raise TableLocationError(
            f"{table}: the catalog does not know it, but its location {location} holds more "
            f"than an interrupted creation leaves (entries {entries[:5]}, log {versions[:5]}); "
            "register it, or move it away, then run again"
        )
    log.warning(
        "%s: clearing %s, left by a creation interrupted before its catalog entry "
        "(log %s, no data files)",
        table,
        location,
        versions or "without a commit",
    )
    fs.delete(path, True)
    return True


_UPGRADED: set[tuple[str, str, str]] = set()
"""(Spark application, table, schema) this process saw with every column of the schema."""


def add_missing_columns(spark: SparkSession, table: str, schema: StructType) -> None:
    """``table``, made by an earlier version, gets the columns of ``schema`` it lacks, at the
    end (Delta appends match columns by name, so their place does not matter). Checked once
    per process and table: a table only gains columns (one dropped and created again since
    is created by this version, with all of them)."""
    seen = (spark.sparkContext.applicationId, table, schema.simpleString())
    if seen in _UPGRADED:
        return
    have = set(spark.table(table).columns)
    missing = [f for f in schema.fields if f.name not in have]
    if missing:
        columns = ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in missing)
        catalog_step(
            table,
            lambda: spark.sql(f"ALTER TABLE {table} ADD COLUMNS ({columns})"),
            race="FIELD_ALREADY_EXISTS",
        )
    _UPGRADED.add(seen)


def ensure_view(
    spark: SparkSession, view: str, query: str, columns: Sequence[str] | None = None
) -> None:
    """The view ``view`` exists and is ``query``: created, or replaced when its text differs
    (a view of an earlier version) or, with ``columns``, when its columns are not those (a
    ``SELECT *`` view keeps the columns its table had when it was made, so a column added to
    the table since needs the view made again); left alone when it is already so, which a
    catalog lookup tells (replacing it would analyse ``query`` and alter the catalog, every
    run). A :func:`catalog_step`: ``catalog:VIEW``, ``cataloged:VIEW``."""
    found = view_metadata(spark, view)
    if found is not None and found[0] == query and (columns is None or found[1] == [*columns]):
        return
    catalog_step(
        view,
        lambda: spark.sql(f"CREATE OR REPLACE VIEW {view} AS {query}"),
        "TABLE_OR_VIEW_ALREADY_EXISTS",
    )


def view_text(spark: SparkSession, view: str) -> str | None:
    """The query of the view ``view`` (``DB.NAME``) as the catalog keeps it; None when there
    is no such view (no table of that name, or a table that is not a view)."""
    found = view_metadata(spark, view)
    return found[0] if found is not None else None


def view_metadata(spark: SparkSession, view: str) -> tuple[str, list[str]] | None:
    """The query and the column names of the view ``view`` (``DB.NAME``) as the catalog keeps
    them (no analysis); None when there is no such view."""
    jvm: Any = spark._jvm
    db, _, name = view.partition(".")
    catalog = spark._jsparkSession.sessionState().catalog()
    ident = jvm.org.apache.spark.sql.catalyst.TableIdentifier(name, jvm.scala.Some(db))
    if not catalog.tableExists(ident):
        return None
    metadata = catalog.getTableRawMetadata(ident)
    text = metadata.viewText()
    if not text.isDefined():
        return None
    return str(text.get()), [str(c) for c in metadata.schema().fieldNames()]


def catalog_step(name: str, step: Callable[[], object], race: str | tuple[str, ...]) -> None:
    """A catalog change a concurrent run may make first: its ``race`` error (the other run's
    effect; one of several when a tuple) means done; a second such error in a row fails with
    a clear message. A fault point (:mod:`pipelines.lake.faults`): ``catalog:NAME``,
    ``cataloged:NAME``."""
    races = (race,) if isinstance(race, str) else race
    faults.point("catalog", name)
    for attempt in (1, 2):
        try:
            step()
            break
        except AnalysisException as exc:
            if exc.getCondition() not in races:
                raise
            if attempt == 2:
                raise CommitConflictError(
                    f"{name}: a concurrent run kept changing it in the catalog ({race}); run again"
                ) from exc
    faults.point("cataloged", name)


_VANISHED = {
    "TABLE_OR_VIEW_NOT_FOUND": "relationName",
    "DELTA_MISSING_DELTA_TABLE": "tableName",
    "DELTA_TABLE_NOT_FOUND": "tableName",
}
"""The conditions of a table that is not (or no longer) in the catalog, and the parameter
that names it."""


def vanished_table(exc: BaseException) -> str | None:
    """The table (``layer.name``) ``exc`` says the catalog does not hold, or None when
    ``exc`` is about something else."""
    if not isinstance(exc, AnalysisException):
        return None
    key = _VANISHED.get(exc.getCondition() or "")
    name = (exc.getMessageParameters() or {}).get(key or "")
    if not name:
        return None
    parts = [part.strip("`").lower() for part in name.split(".")]
    return ".".join(parts[1:] if len(parts) > 2 and parts[0] == "spark_catalog" else parts)


def replace_rows(df: DataFrame, table: str, *, user_metadata: str | None = None) -> None:
    """All of ``table``'s rows become ``df``'s, in one Delta commit (with ``user_metadata``
    in its ``commitInfo``: :func:`last_commit_metadata` reads it back). An overwrite by
    filter keeps the catalog entry as it is (``saveAsTable`` would alter it, which the Hive
    metastore refuses for Delta's placeholder schema and logs as an error)."""
    writer = df.writeTo(table)
    if user_metadata is not None:
        writer = writer.option("userMetadata", user_metadata)
    writer.overwrite(F.lit(True))


def append(df: DataFrame, table: str) -> None:
    """Append ``df``'s rows to the Delta table ``table``."""
    faults.point("commit", table)
    df.write.format("delta").mode("append").saveAsTable(table)
    faults.point("committed", table)


def append_once(df: DataFrame, table: str, *, app_id: str, version: int) -> None:
    """Append ``df`` unless a write of ``(app_id, version)`` already committed to ``table``
    (Delta's idempotent writes): a repeated run skips what an earlier attempt wrote."""
    faults.point("commit", table)
    (
        df.write.format("delta")
        .mode("append")
        .option("txnAppId", app_id)
        .option("txnVersion", version)
        # Each task writes its own files already: an optimized write would only add a shuffle.
        .option("optimizeWrite", "false")
        .saveAsTable(table)
    )
    faults.point("committed", table)


def _typed_conflicts(action: Callable[[], _T]) -> _T:
    """Run ``action``, which calls Delta through py4j: a commit conflict comes back as the
    ``delta.exceptions`` class :func:`with_retry` retries on, not as a bare Java error."""
    try:
        return action()
    except Py4JJavaError as exc:
        java = exc.java_exception
        name = java.getClass().getSimpleName()
        if name in _CONFLICTS:
            raise getattr(dx, name)(message=str(java.getMessage())) from exc
        raise


_JAVA_CLASSES: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def java_class(spark: SparkSession, name: str) -> Any:
    """The JVM class ``name`` (``org.apache.spark.sql.delta.DeltaLog``), looked up once per
    JVM gateway: py4j resolves each package of a dotted name with a call into the JVM."""
    jvm: Any = spark._jvm
    known = _JAVA_CLASSES.setdefault(jvm, {})
    found = known.get(name)
    if found is None:
        found = jvm
        for part in name.split("."):
            found = getattr(found, part)
        known[name] = found
    return found


def _nothing(spark: SparkSession) -> Any:
    """Scala's ``None`` (``Option.empty()``)."""
    return java_class(spark, "scala.Option").empty()


def _delta_log(spark: SparkSession, table: str) -> Any:
    known = table_entries.location(table)
    if known is not None:  # the location the catalog gave (table_entries.known): the same log
        delta_log = java_class(spark, "org.apache.spark.sql.delta.DeltaLog")
        return delta_log.forTable(spark._jsparkSession, known)
    db, _, name = table.partition(".")
    some = java_class(spark, "scala.Some")(db)
    ident = java_class(spark, "org.apache.spark.sql.catalyst.TableIdentifier")(name, some)
    delta_log = java_class(spark, "org.apache.spark.sql.delta.DeltaLog")
    return delta_log.forTable(spark._jsparkSession, ident)


def location_and_properties(spark: SparkSession, table: str) -> tuple[str, dict[str, str]]:
    """The Delta table ``table``'s location (a URI) and its table properties, from its log:
    no Spark job (``DESCRIBE DETAIL`` reconstructs the state for its counts)."""
    nothing = _nothing(spark)
    delta_log = _delta_log(spark, table)
    configuration = delta_log.update(False, nothing, nothing).metadata().configuration()
    converters = java_class(spark, "scala.jdk.javaapi.CollectionConverters")
    properties = converters.asJava(configuration)
    return str(delta_log.dataPath().toString()), {str(k): str(v) for k, v in properties.items()}


def committed_version(spark: SparkSession, table: str, app_id: str) -> int | None:
    """The latest ``txnVersion`` of ``app_id`` that committed to the Delta table ``table``
    (the version :func:`append_once` skips at and below), or None if none did: what tells a
    resumed run whether its killed attempt's write committed. Read from the table's snapshot
    (its log's transaction actions), as Delta does before an idempotent write."""
    nothing = _nothing(spark)
    return _app_version(_delta_log(spark, table).update(False, nothing, nothing), app_id)


def committed_version_at(
    spark: SparkSession, table: str, app_id: str, version: int | None
) -> int | None:
    """:func:`committed_version` as of the table's Delta ``version`` (None: its latest)."""
    if version is None:
        return committed_version(spark, table, app_id)
    nothing = _nothing(spark)
    snapshot = _delta_log(spark, table).getSnapshotAt(version, nothing, nothing, False)
    return _app_version(snapshot, app_id)


def table_location(spark: SparkSession, table: str) -> str:
    """The Delta table ``table``'s location (a URI), from its log: no Spark job (``DESCRIBE
    DETAIL`` reconstructs the state for its counts); the one :func:`.table_entries.known`
    holds."""
    return table_entries.location(table) or str(_delta_log(spark, table).dataPath().toString())


def _checksum(snapshot: Any) -> Any | None:
    """The snapshot's checksum (its version's ``.crc``: what incremental commits keep of the
    table's state), or None when the version has none."""
    found = snapshot.checksumOpt()
    return found.get() if found.isDefined() else None


def _app_version(snapshot: Any, app_id: str) -> int | None:
    """The ``txn`` version of ``app_id`` in ``snapshot``: from its checksum when that lists
    the transactions, else from the state Delta reconstructs (Spark jobs over the log: a
    snapshot's ``transactions`` reconstructs it although the checksum has them)."""
    checksum = _checksum(snapshot)
    if checksum is not None and checksum.setTransactions().isDefined():
        listed = checksum.setTransactions().get()
        for i in range(listed.size()):
            txn = listed.apply(i)
            if txn.appId() == app_id:
                return int(txn.version())
        return None
    found = snapshot.transactions().get(app_id)
    return int(found.get()) if found.isDefined() else None


def foreign_commits(
    spark: SparkSession, table: str, app_id: str, after: int, upto: int
) -> list[int]:
    """The versions in (``after``, ``upto``] of the Delta table ``table`` that change its data
    without a transaction of ``app_id``: writes by anything else (a rewrite that changes no
    data, e.g. OPTIMIZE, is not one). Read from the log, no Spark job."""
    if upto <= after:
        return []
    changes = _delta_log(spark, table).getChanges(after + 1, upto, _nothing(spark), False)
    foreign = []
    while changes.hasNext():
        commit = changes.next()
        actions = commit._2().iterator()
        ours = changes_data = False
        while actions.hasNext():
            action = actions.next()
            kind = action.getClass().getSimpleName()
            if kind == "SetTransaction" and action.appId() == app_id:
                ours = True
            elif kind in ("AddFile", "RemoveFile", "AddCDCFile") and action.dataChange():
                changes_data = True
        if changes_data and not ours:
            foreign.append(int(commit._1()))
    return foreign


def location_version(spark: SparkSession, location: str) -> int:
    """The latest committed version of the Delta table at ``location`` (a URI, as
    :func:`.table_entries.entries` gives), from its log: no catalog call, no Spark job."""
    nothing = _nothing(spark)
    delta_log = java_class(spark, "org.apache.spark.sql.delta.DeltaLog")
    snapshot = delta_log.forTable(spark._jsparkSession, location).update(False, nothing, nothing)
    return int(snapshot.version())


def table_version(spark: SparkSession, table: str) -> int:
    """The latest committed version of the Delta table ``table`` (``DB.NAME``), from its log
    (no Spark job)."""
    nothing = _nothing(spark)
    return int(_delta_log(spark, table).update(False, nothing, nothing).version())


def last_commit_metadata(spark: SparkSession, table: str) -> str | None:
    """The ``userMetadata`` of the latest commit of the Delta table ``table``, or None when
    it has none: one read of that commit's file in the table's log (no Spark job)."""
    nothing = _nothing(spark)
    delta_log = _delta_log(spark, table)
    version = delta_log.update(False, nothing, nothing).version()
    names = java_class(spark, "org.apache.spark.sql.delta.util.FileNames")
    commit = names.unsafeDeltaFile(delta_log.logPath(), version)
    history = java_class(spark, "org.apache.spark.sql.delta.DeltaHistoryManager")
    info = history.getCommitInfoOpt(delta_log.store(), commit, delta_log.newDeltaHadoopConf())
    if not info.isDefined() or not info.get().userMetadata().isDefined():
        return None
    return str(info.get().userMetadata().get())


def table_size(spark: SparkSession, table: str, version: int | None = None) -> tuple[int, int]:
    """The files and bytes of the Delta table ``table`` at ``version`` (else its latest),
    from its log: its checksum file when there is one (no Spark job; a snapshot's
    ``numOfFiles`` and ``sizeInBytes`` reconstruct its state, Spark jobs, although the
    checksum has them)."""
    nothing = _nothing(spark)
    delta_log = _delta_log(spark, table)
    if version is None:
        snapshot = delta_log.update(False, nothing, nothing)
    else:
        snapshot = delta_log.getSnapshotAt(version, nothing, nothing, False)
    checksum = _checksum(snapshot)
    if checksum is not None:
        return int(checksum.numFiles()), int(checksum.tableSizeBytes())
    return int(snapshot.numOfFiles()), int(snapshot.sizeInBytes())


def metric(metrics: DataFrame | None, name: str) -> int:
    """One number of the metrics a MERGE, UPDATE or DELETE returns (0 when it returned none)."""
    if metrics is None:
        return 0
    rows = metrics.collect()
    return int(rows[0][name]) if rows and name in rows[0].asDict() else 0


INTERPRETED_CONF = {
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
}
"""Spark's expressions and operators evaluated as they are, with no Java source generated and
compiled for them (Spark's own fallback path when code generation fails, chosen here)."""


def static_plan_session(spark: SparkSession, *, interpreted: bool = False) -> SparkSession:
    """A session of ``spark``'s context with adaptive query execution off, for a few dozen
    small queries over about as many Delta tables (a check's metric frames, a bucket's
    overview). AQE plans each query stage again, and every planning of a Delta scan lists
    the table's files with a Spark job (with deletion vectors, twice): in a warm check of
    2,500 frames, silver's read over 5 collections ran about 75 such jobs in 7.5 s with AQE,
    39 in 4.3 s without; the overview of ``make run``'s bucket takes 12 s with AQE, 6 s
    without. Its own session, so that an apply or a micro-batch running beside it keeps
    AQE.

    ``interpreted`` (tables of a few thousand rows): also :data:`INTERPRETED_CONF`. Each
    query stage otherwise has its Java code generated and compiled (Janino, on the driver,
    before the first row), which on small tables costs more than the rows: ``make run``'s
    check (3,169 frames) took 26-28 s interpreted, 33-37 s compiled (quiet, 2 cores, at
    ``1dd8e36``)."""
    session = spark.newSession()
    session.conf.set("spark.sql.adaptive.enabled", "false")
    for key, value in (INTERPRETED_CONF if interpreted else {}).items():
        session.conf.set(key, value)
    return session


TABLE_THREADS = 4
"""Tables a step makes or checks at once (bronze's, silver's support tables, a registry
update's collection tables)."""


def each_at_once(ensure: Callable[[_T], None], items: Sequence[_T]) -> None:
    """``ensure`` each item's table, up to :data:`TABLE_THREADS` at once: a table's CREATE
    (and a view) are a dozen catalog and Delta log round trips on the driver, which threads
    overlap (the catalog serialises its own calls): five collection tables and their views
    took 8.8 s one at a time, 3.5 s four at once (2 cores). Every call ends before an error
    is raised."""
    if len(items) <= 1:
        for item in items:
            ensure(item)
        return
    with ThreadPoolExecutor(min(TABLE_THREADS, len(items)), "delta-tables") as pool:
        futures = [pool.submit(ensure, item) for item in items]
        wait(futures)
        for future in futures:
            future.result()

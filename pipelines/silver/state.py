"""Silver's stream state per vbucket (``__stream_state``) and the bronze frames a run walks
from it: which frames no run has consumed yet, and which vbuckets are walked again from their
start because older frames arrived late.

Each save of the stream state records in its commit what the apply consumed
(:func:`consumed_mark`): an apply that finds the same mark on the latest commit has nothing new
to walk and returns before any Spark job (:func:`nothing_new`).

The walk itself is :func:`pipelines.silver.transforms.walk_frames`; the MERGEs of what it
gives are :mod:`pipelines.silver.store`'s.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Callable
from typing import Any, NamedTuple

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dcp_cdc.config import AppConfig, BucketConfig
from pipelines import schemas
from pipelines.bronze.writer import remove_written, write_rows
from pipelines.lake import delta_io, delta_rs, file_commits
from pipelines.lake.delta_io import last_commit_metadata, replace_rows, table_version, with_retry
from pipelines.silver import transforms, walk_columns, walk_input, walk_staged
from pipelines.silver.walk import RowKind, next_position
from pipelines.silver.walk_input import RunFiles
from pipelines.tables import BucketTables


def small_table_rows(spark: SparkSession, table: str, schema: T.StructType) -> list[dict[str, Any]]:
    """A small table's rows (of ``schema``: the stream state, the registry), none from a table
    of no file (before a bucket's first apply), without Spark jobs
    (:func:`pipelines.lake.delta_rs.small_rows`)."""
    return delta_rs.small_rows(spark, table, schema.fieldNames())


def read_states(spark: SparkSession, table: str) -> dict[int, dict[str, Any]]:
    """vbucket → its saved state and position run; none from a table of no file (before the
    first apply), without Spark jobs (:func:`pipelines.lake.delta_rs.small_rows`)."""
    return {
        r["vbucket"]: {"state": json.loads(r["state"]), "position_run_id": r["position_run_id"]}
        for r in delta_rs.small_rows(spark, table, ("vbucket", "state", "position_run_id"))
    }


def consumed_mark(
    spark: SparkSession, names: BucketTables, config: AppConfig, bucket: BucketConfig
) -> str | None:
    """What an apply that starts now consumes, as its save of the stream state records it
    (the commit's ``userMetadata``): the ingest log's Delta version before the apply reads
    the log (every run finished by then is walked), and a digest of the settings that shape
    an apply (``[silver]``, ``[tables] properties``, the bucket's projections and history).
    None when there is no ingest log yet. A look at the log's Delta log: no Spark job."""
    if not spark.catalog.tableExists(names.ingest_log):
        return None
    settings = {
        "silver": config.silver.model_dump(mode="json"),
        "tables": config.tables.properties,
        "projections": [p.model_dump(mode="json") for p in bucket.projections],
        "history": bucket.history,
    }
    text = json.dumps(settings, sort_keys=True, separators=(",", ":"))
    mark = {
        "ingest_log_version": table_version(spark, names.ingest_log),
        "settings": hashlib.sha256(text.encode()).hexdigest()[:16],
    }
    return json.dumps(mark, sort_keys=True, separators=(",", ":"))


def nothing_new(spark: SparkSession, names: BucketTables, mark: str | None) -> bool:
    """Whether an apply with ``mark`` (:func:`consumed_mark`) has nothing to do: the stream
    state's latest commit is an apply's that recorded the same mark, so no ingest run
    finished since and the settings are the same; walking again would consume nothing and
    commit nothing. Any other commit to the stream state since (an apply that recorded none)
    makes it False. One read of that commit in the table's Delta log: no Spark job."""
    return mark is not None and last_commit_metadata(spark, names.stream_state) == mark


def save_states(
    spark: SparkSession,
    table: str,
    old: dict[int, dict[str, Any]],
    new: dict[int, dict[str, Any]],
    mark: str | None = None,
) -> dict[int, dict[str, Any]]:
    """Every vbucket's state (``new``'s, else ``old``'s) in one commit, recording ``mark``
    (:func:`consumed_mark`) in it; returns what it wrote (vbucket -> state with its
    ``run_id``)."""
    merged = {vb: s["state"] | {"run_id": s["position_run_id"]} for vb, s in old.items()}
    merged.update(new)
    rows = []
    for vb, s in sorted(merged.items()):
        snap = s.get("open_snapshot")
        rows.append(
            {
                "vbucket": vb,
                "vb_uuid": s["vb_uuid"],
                "failover_log": [{"vb_uuid": u, "seqno": q} for u, q in s["failover_log"]],
                "last_applied_seqno": s["last_applied_seqno"],
                "consistent_seqno": s["consistent_seqno"],
                "manifest_uid": s["manifest_uid"],
                "purge_seqno": s["purge_seqno"],
                "open_snapshot_start": snap[0] if snap else None,
                "open_snapshot_end": snap[1] if snap else None,
                "position_run_id": s.get("run_id"),
                "state": json.dumps(s),
                "updated_at": None,
            }
        )
    now = dt.datetime.now(dt.UTC)
    for row in rows:
        row["updated_at"] = now
    if not replace_from_driver(spark, table, rows, schemas.STATE, mark):
        df = spark.createDataFrame(rows, schema=schemas.STATE)
        with_retry(table, lambda: replace_rows(df, table, user_metadata=mark))
    return merged


def replace_from_driver(
    spark: SparkSession,
    table: str,
    rows: list[dict[str, Any]],
    schema: T.StructType,
    mark: str | None = None,
) -> bool:
    """A small table's rows (of ``schema``: the stream state, the registry) written by this
    process into one Parquet file of the table and committed in place of its files
    (:func:`file_commits.replace_files`): no Spark job, where an overwrite runs five (the
    state Delta reconstructs for its scan, the write). False when the table's checksum does
    not list its files (nothing committed, the file removed)."""
    location = delta_io.table_location(spark, table)
    storage = dict(spark.sparkContext.getConf().getAll())
    written = write_rows(rows, schemas.arrow_schema(schema), location, storage)
    if file_commits.replace_files(spark, table, written, schema, user_metadata=mark):
        return True
    remove_written(written, location, storage)
    return False


class Unconsumed(NamedTuple):
    """What an apply walks (:func:`unconsumed_frames`)."""

    frames: DataFrame
    """The bronze frames to walk, with the ``run_version`` of their ingest run."""
    late_after: int | None
    """The ingest-log version after which a finished run's frame that sorts at or before its
    vbucket's saved position is late (None: no vbucket has a position to be late against)."""
    read_through: int | None
    """The newest run read (its ``run_version``; None: not known without a Spark job): every
    run of a vbucket's from its position up to it is in ``frames``."""
    files: RunFiles | None = None
    """The data files ``frames`` are read from, when this process's ingest wrote them all
    (:mod:`pipelines.silver.walk_input` reads them without Spark); None: read the table."""


def unconsumed_frames(
    spark: SparkSession,
    names: BucketTables,
    states: dict[int, dict[str, Any]],
    again: set[int] | frozenset[int] = frozenset(),
    *,
    log_rows: list[dict[str, Any]] | None = None,
    run_files: Callable[[dict[str, int]], list[str] | None] | None = None,
) -> Unconsumed:
    """Bronze frames that may hold frames no silver run has consumed yet (with the
    ``run_version`` of their ingest run): the finished runs from the oldest vbucket's
    ``position_version`` on (:func:`pipelines.silver.walk.next_position`), and every frame of
    the vbuckets in ``again`` (walked again from their start). ``log_rows``: the ingest log's
    rows as follow mode's ingest keeps them (:class:`pipelines.bronze.memory.IngestMemory`),
    read instead of the log (no Spark job finds the runs); None: the log is read.
    ``run_files``: the events table's data files of some runs (run id -> run version), when
    the ingest's memory keeps them or the table's latest commits say
    (:meth:`pipelines.silver.memory.Recall.run_files`): the runs' frames are read from those
    files, without Delta's jobs that find them in the table.

    A frame is late when it belongs to files of an older session that arrived after a newer
    session was applied. The walk finds them as it reads (:func:`late_vbuckets`): the late
    runs are among the runs read, since ``late_after`` is the oldest version every vbucket has
    seen. Such a vbucket is walked again from its first frame, in session order, which gives
    what one run over all of it would have given; the MERGE guard and the idempotent deletes
    make the replay safe.
    """
    events = spark.table(names.events)
    run_ids = [s["position_run_id"] for s in states.values()]
    if not states or any(r is None for r in run_ids):
        finished = finished_runs_of(log_rows) if log_rows is not None else None
        newest = max(finished.values(), default=None) if finished else None
        every = transforms.walk_input(events, _finished(spark, names, log_rows))
        return Unconsumed(every, None, newest, _run_files(run_files, finished))
    # The runs from the oldest one a vbucket's position is in: the log's rows before it are
    # skipped by their statistics, so the read follows the runs not consumed, not the log's
    # age (until each vbucket was walked once since states kept their run's version, the
    # whole log is read, as before).
    floors = [s["state"].get("position_version") for s in states.values()]
    floor = min(floors) if all(f is not None for f in floors) else None
    if log_rows is not None:
        versions = {
            run: version
            for run, version in finished_runs_of(log_rows).items()
            if floor is None or version >= floor
        }
        versions_df = _runs_frame(spark, versions)
    else:
        log = spark.table(names.ingest_log)
        if floor is not None:
            log = log.where(F.col("run_version") >= floor)
        versions_df = transforms.finished_runs(log)
        versions = {r["ingest_run_id"]: r["run_version"] for r in versions_df.collect()}
    late_after = min(s["state"].get("seen_version", 0) for s in states.values())
    # a position saved before position_version: from the oldest run a position is in
    oldest = min(versions.get(r, 0) for r in run_ids) if floor is None else floor
    recent = [r for r, v in versions.items() if v >= oldest]
    newest = max((versions[r] for r in recent), default=None)
    if not again:
        files = _run_files(run_files, {r: versions[r] for r in recent})
        if files is not None:
            events = _files_frame(spark, files.paths)
        frames = transforms.walk_input(events, versions_df).where(of_runs(recent))
        return Unconsumed(frames, late_after, newest, files)
    # a vbucket walked again starts from its first frame: every finished run
    every_run = _finished(spark, names, log_rows)
    wanted = of_runs(recent) | F.col("vb_key").isin(sorted(again))
    return Unconsumed(transforms.walk_input(events, every_run).where(wanted), late_after, newest)


def _run_files(
    run_files: Callable[[dict[str, int]], list[str] | None] | None, versions: dict[str, int] | None
) -> RunFiles | None:
    """The data files of the runs ``versions`` names, when the ingest's memory keeps them."""
    if run_files is None or versions is None:
        return None
    paths = run_files(versions)
    return None if paths is None else RunFiles(paths, versions)


def _files_frame(spark: SparkSession, paths: list[str]) -> DataFrame:
    """The events of these data files of the events table (its columns as the ingest writes
    them, :data:`schemas.EVENTS`)."""
    if not paths:
        return spark.createDataFrame([], schemas.EVENTS)
    return spark.read.schema(schemas.EVENTS).parquet(*paths)


def idle_positions(
    states: dict[int, dict[str, Any]], walked: dict[int, dict[str, Any]], read_through: int | None
) -> dict[int, dict[str, Any]]:
    """The saved state of each vbucket the walk got no frame of (not in ``walked``), its
    position moved past ``read_through``: none of the runs read holds a frame of it, so none
    is left to consume up to there, and the next apply's read need not start at its last
    change (an idle vbucket would hold every other vbucket's read back). ``{}`` when the
    newest run read is not known."""
    if read_through is None:
        return {}
    idle = {}
    for vb, s in states.items():
        if vb in walked:
            continue
        saved = s["state"]
        run, version = next_position(None, None, saved, read_through)
        seen = max(saved.get("seen_version", 0), read_through)
        idle[vb] = saved | {"run_id": run, "position_version": version, "seen_version": seen}
    return idle


def finished_runs_of(log_rows: list[dict[str, Any]]) -> dict[str, int]:
    """``ingest_run_id → run_version`` of the finished runs among the ingest log's rows
    (:func:`transforms.finished_runs`' rule, over rows at hand)."""
    return {
        r["ingest_run_id"]: r["run_version"]
        for r in log_rows
        if r["status"] == "ingested" and r["ingest_run_id"] is not None
    }


def _finished(
    spark: SparkSession, names: BucketTables, log_rows: list[dict[str, Any]] | None
) -> DataFrame:
    """Every finished run: from ``log_rows`` when given (a local relation), else the log."""
    if log_rows is None:
        return transforms.finished_runs(spark.table(names.ingest_log))
    return _runs_frame(spark, finished_runs_of(log_rows))


def _runs_frame(spark: SparkSession, versions: dict[str, int]) -> DataFrame:
    return spark.createDataFrame(
        sorted(versions.items()), "ingest_run_id STRING, run_version BIGINT"
    )


def late_vbuckets(found: list[dict[str, Any]]) -> set[int]:
    """The vbuckets whose walk (collected ``found`` rows) met late frames: walk them again."""
    return {r["vbucket"] for r in found if r["kind"] == RowKind.STATE and r["late"]}


def of_runs(run_ids: list[str]) -> Column:
    """The bronze rows of these ingest runs, as a filter Delta skips files with: the run ids
    themselves, and their range (ids start with their UTC time, so a run's files hold one id
    and the range stays narrow) for a long list the exact test would not skip by."""
    if not run_ids:
        return F.lit(False)
    ids = sorted(run_ids)
    run = F.col("ingest_run_id")
    return run.between(ids[0], ids[-1]) & run.isin(ids)


def walk_vbuckets(
    spark: SparkSession,
    frames: DataFrame,
    states: dict[int, dict[str, Any]],
    again: set[int] | frozenset[int] = frozenset(),
    *,
    eager: bool = False,
    late_after: int | None = None,
    read_through: int | None = None,
    on_driver_below: int = 0,
) -> DataFrame:
    """Each vbucket's frames walked from its saved state (:func:`transforms.walk_frames`);
    the vbuckets in ``again`` start over from a fresh state. ``late_after`` and
    ``read_through``: see :class:`Unconsumed` (None: no vbucket is checked for late frames;
    the newest run read is not known).

    Fewer than ``on_driver_below`` frames (``[silver] walk_on_driver_below``) are walked here,
    in the driver, by the same function over one Arrow table of them
    (:func:`pipelines.silver.walk_columns.walk_vbuckets`): one Spark job collects them, and
    the walked rows are a local DataFrame. Spark's way costs a shuffle into the walk's groups
    and its Python workers' Arrow streams each way (3,046 frames in a warm session on a
    loaded machine: 7.4-11 s that way, 4.1-7.4 s here; what is left is the read of the
    frames). Whether there are that many is counted first, by a job that reads the
    filter's columns only and stops at the bound: at that many frames or more Spark walks
    them, and the frames' documents were never brought to the driver. When the data files of
    ``frames`` are known (:attr:`Unconsumed.files`), :func:`walked_from_files` walks them in
    the driver with no Spark job at all."""
    state_rows = _state_rows(states, again, late_after)
    saved = spark.createDataFrame(state_rows, "vb_key INT, saved_state STRING, late_after LONG")
    if on_driver_below > 0:
        keyed = transforms.keyed_frames(frames, saved, read_through)
        if keyed.select("vb_key").limit(on_driver_below).count() < on_driver_below:
            few = keyed.toArrow()
            walked = walk_columns.walk_vbuckets(few, schemas.arrow_schema(schemas.WALKED), eager)
            return spark.createDataFrame(walked, schema=schemas.WALKED)
    return transforms.walk_frames(frames, saved, eager=eager, read_through=read_through)


def walked_from_files(
    spark: SparkSession,
    files: RunFiles,
    states: dict[int, dict[str, Any]],
    *,
    eager: bool,
    late_after: int | None,
    read_through: int | None,
    on_driver_below: int,
) -> pa.Table | None:
    """The walk of :func:`walk_vbuckets` in the driver, over ``files`` read here
    (:func:`pipelines.silver.walk_input.keyed_rows`): no Spark job. None when the files hold
    ``on_driver_below`` rows or more (or 0 is set), or their rows are not for this way."""
    if on_driver_below <= 0:
        return None
    storage = dict(spark.sparkContext.getConf().getAll())
    if walk_input.row_count(files, storage) >= on_driver_below:
        return None
    saved_of = {vb: (state, late) for vb, state, late in _state_rows(states, (), late_after)}
    few = walk_input.keyed_rows(files, saved_of, read_through, storage)
    if few is None:
        return None
    return walk_columns.walk_vbuckets(few, schemas.arrow_schema(schemas.WALKED), eager)


def walked_in_chunks(
    spark: SparkSession,
    config: AppConfig,
    bucket: str,
    files: RunFiles,
    states: dict[int, dict[str, Any]],
    *,
    late_after: int | None,
    read_through: int | None,
) -> walk_staged.StagedWalk | None:
    """The walk of :func:`walked_from_files` for any number of frames: the driver's, in
    chunks of ``[silver] walk_on_driver_below`` frames (:mod:`pipelines.silver.walk_staged`).
    None when the files' rows are not for the driver's way."""
    saved_of = {vb: (state, late) for vb, state, late in _state_rows(states, (), late_after)}
    return walk_staged.walk_in_chunks(
        spark,
        bucket,
        files,
        saved_of,
        eager=config.silver.eager_apply,
        read_through=read_through,
        chunk_rows=config.silver.walk_on_driver_below,
    )


def _state_rows(
    states: dict[int, dict[str, Any]],
    again: set[int] | frozenset[int] | tuple[()],
    late_after: int | None,
) -> list[tuple[int, str, int | None]]:
    """``(vbucket, saved state JSON, late_after)`` of each vbucket not walked ``again``."""
    return [(vb, json.dumps(s["state"]), late_after) for vb, s in states.items() if vb not in again]

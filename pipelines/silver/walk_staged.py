"""A walk of more frames than the driver holds at once (``[silver] walk_on_driver_below``),
done by the driver all the same, a share of the vbuckets at a time, from the run's files.

A vbucket's walk needs its own frames only (:func:`pipelines.silver.walk_columns.walk_vbuckets`
walks each vbucket alone, and a key lives in one vbucket), so the frames can be split by
stream (``vb_key``) into *chunks* of about that many frames and each chunk walked alone: the
same rows as one walk of them all. :func:`walk_in_chunks`:

1. reads the run's data files once, a Parquet batch at a time (:mod:`pipelines.silver.walk_input`),
   and writes each chunk's frames into an Arrow file of its own in a local temporary folder;
2. for each chunk: reads it back, walks it from its vbuckets' saved states, keeps its control
   rows (the rows :class:`pipelines.silver.job.Found` reads), writes its walked rows as
   Parquet into a staging folder beside the bucket's silver tables (Spark reads them when a
   step of the apply needs them as a DataFrame), and, with the live layer, its newest row
   per key as silver rows into a new partition of the pending table
   (:func:`pipelines.silver.arrow_rows.silver_rows`), written and not committed.

The apply then commits the pending files in one append (:func:`pipelines.silver.live.append_staged`)
and no Spark job runs; the driver holds one chunk at a time, so its memory follows
``walk_on_driver_below``, not the run. :meth:`StagedWalk.discard` removes the staged files,
and the pending ones no commit took.

Spark's walk of the same frames (``groupBy().applyInArrow``) sorts and converts every row in
the JVM both ways: on 2 cores, 1M frames take it about 28 s of wall time and 50 s of task
time, the driver here about 14 s.
"""

from __future__ import annotations

import datetime as dt
import logging
import secrets
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession

from pipelines import schemas
from pipelines.bronze.landing import filesystem
from pipelines.bronze.writer import remove_written, write_table
from pipelines.lake import delta_io, delta_rs
from pipelines.silver import arrow_rows, walk_columns, walk_input
from pipelines.silver.walk import VERSION_KINDS, RowKind
from pipelines.silver.walk_input import READ_COLUMNS, RunFiles
from pipelines.tables import BucketTables

log = logging.getLogger("dcp_cdc.silver")

READ_BATCH_ROWS = 65_536
"""Rows of each Parquet batch read in step 1."""


@dataclass
class PendingFiles:
    """Silver rows written into a new partition of the pending table, not committed."""

    stamp: int
    """The partition's ``_batch`` value."""
    location: str
    """The pending table's folder (the files' paths start with the partition's)."""
    files: list[dict[str, Any]] = field(default_factory=list)
    """The files as :func:`pipelines.bronze.writer.write_table` gives them (paths in the
    partition's folder)."""
    collections: set[int] = field(default_factory=set)
    """The collections whose changes the files hold."""
    committed: bool = False


@dataclass
class StagedWalk:
    """What :func:`walk_in_chunks` gives: the walked rows as a Spark DataFrame over the
    staged files, the control rows, and the pending files (None: not written)."""

    walked: DataFrame
    controls: list[dict[str, Any]]
    pending: PendingFiles | None
    staging: str
    staged: list[dict[str, Any]]
    storage: dict[str, str]
    chunks: int

    def discard(self) -> None:
        """Remove the staged walked rows, and the pending files unless committed."""
        remove_written(self.staged, self.staging, self.storage)
        fs, root = filesystem(self.staging, self.storage)
        fs.delete_dir_contents(root, missing_dir_ok=True)
        fs.delete_dir(root)
        pending = self.pending
        if pending is not None and not pending.committed:
            remove_written(pending.files, pending.location, self.storage)


def walk_in_chunks(
    spark: SparkSession,
    bucket: str,
    files: RunFiles,
    saved: Mapping[int, tuple[str, int | None]],
    *,
    eager: bool,
    read_through: int | None,
    chunk_rows: int,
    pending: bool,
) -> StagedWalk | None:
    """The module's walk of ``files``' runs, each vbucket from its saved state (``saved``:
    ``vb_key -> (state JSON, late_after)``), in chunks of about ``chunk_rows`` frames;
    ``pending``: also write the pending table's rows. None when the files' rows are not for
    the driver's way (:func:`pipelines.silver.walk_input.stream_rows`): nothing is left
    written then."""
    storage = dict(spark.sparkContext.getConf().getAll())
    total = walk_input.row_count(files, storage)
    chunks = max(1, -(-total // max(1, chunk_rows)))
    names = BucketTables(bucket)
    stamp = secrets.randbits(63)
    silver_root = delta_io.table_location(spark, names.stream_state).rstrip("/").rsplit("/", 1)[0]
    staging = f"{silver_root}/_staged_walk_{bucket}_{stamp}"
    out_schema = schemas.arrow_schema(schemas.WALKED)
    local = Path(tempfile.mkdtemp(prefix="dcp-cdc-walk-"))
    try:
        parts = _split(files, storage, chunks, local)
        if parts is None:
            return None
        rows = None
        if pending:
            rows = PendingFiles(stamp, delta_io.table_location(spark, names.pending).rstrip("/"))
        controls: list[dict[str, Any]] = []
        staged: list[dict[str, Any]] = []
        applied_at = dt.datetime.now(dt.UTC)
        try:
            for part in parts:
                with pa.memory_map(str(part)) as source:
                    chunk = pa.ipc.open_file(source).read_all()
                keyed = walk_input.with_states(chunk, saved, read_through)
                del chunk
                walked = walk_columns.walk_vbuckets(keyed, out_schema, eager)
                del keyed
                part.unlink()
                kinds = pa.array(VERSION_KINDS)
                controls += delta_rs.spark_rows(
                    walked.filter(pc.invert(pc.is_in(walked["kind"], kinds)))
                )
                staged += write_table(walked, staging, storage)
                if rows is not None:
                    rows = _pending_rows(walked, rows, applied_at, storage)
        except BaseException:
            remove_written(staged, staging, storage)
            if rows is not None:
                remove_written(rows.files, rows.location, storage)
            raise
    finally:
        shutil.rmtree(local, ignore_errors=True)
    frame = (  # the folder, not each file: listing it is the driver's, not a job
        spark.read.schema(schemas.WALKED).parquet(staging)
        if staged
        else spark.createDataFrame([], schemas.WALKED)
    )
    log.info(
        "silver: %d frames of bucket %s walked by the driver in %d chunks", total, bucket, chunks
    )
    return StagedWalk(frame, controls, rows, staging, staged, storage, chunks)


def _split(
    files: RunFiles, storage: Mapping[str, str], chunks: int, local: Path
) -> list[Path] | None:
    """Step 1: the walked frames of ``files``' runs (:func:`walk_input.stream_rows`), chunk
    ``vb_key % chunks`` of them into ``local/<chunk>.arrow``; the files written, in chunk
    order. None when the rows are not for the driver's way."""
    target = schemas.arrow_schema(schemas.EVENTS)
    read_schema = pa.schema([target.field(c) for c in READ_COLUMNS])
    writers: dict[int, pa.ipc.RecordBatchFileWriter] = {}
    try:
        for path in files.paths:
            fs, where = filesystem(path, storage)
            with fs.open_input_file(where) as handle:
                parquet = pq.ParquetFile(handle)
                for batch in parquet.iter_batches(READ_BATCH_ROWS, columns=READ_COLUMNS):
                    table = pa.Table.from_batches([batch]).select(READ_COLUMNS).cast(read_schema)
                    streamed = walk_input.stream_rows(table, files.versions)
                    if streamed is None:
                        return None
                    _route(streamed, chunks, writers, local)
    finally:
        for writer in writers.values():
            writer.close()
    return [local / f"{c}.arrow" for c in sorted(writers)]


def _route(
    streamed: pa.Table,
    chunks: int,
    writers: dict[int, pa.ipc.RecordBatchFileWriter],
    local: Path,
) -> None:
    """Each row of ``streamed`` to its chunk's file (``vb_key % chunks``)."""
    if not streamed.num_rows:
        return
    of_chunk = np.mod(streamed["vb_key"].to_numpy(), chunks)
    for c in np.unique(of_chunk).tolist():
        part = streamed.filter(pa.array(of_chunk == c))
        writer = writers.get(c)
        if writer is None:
            writer = pa.ipc.new_file(str(local / f"{c}.arrow"), streamed.schema)
            writers[c] = writer
        writer.write_table(part)


def _pending_rows(
    walked: pa.Table, rows: PendingFiles, applied_at: dt.datetime, storage: Mapping[str, str]
) -> PendingFiles | None:
    """The chunk's newest change per key as silver rows, written into ``rows``' partition;
    None (and what was written removed) when a key or document is not UTF-8
    (:func:`arrow_rows.silver_rows`): Spark's append of the walked rows does it then."""
    changes = walked.filter(pc.equal(walked["kind"], RowKind.CHANGE.value))
    cids = set(pc.unique(changes["collection_id"]).to_pylist())
    silver = arrow_rows.silver_rows(changes, cids, applied_at)
    if silver is None:
        remove_written(rows.files, rows.location, storage)
        return None
    if silver.num_rows:
        folder = f"{schemas.PENDING_PARTITIONS[0]}={rows.stamp}"
        written = write_table(silver, f"{rows.location}/{folder}", storage)
        rows.files += [{**f, "path": f"{folder}/{f['path']}"} for f in written]
        rows.collections |= cids
    return rows

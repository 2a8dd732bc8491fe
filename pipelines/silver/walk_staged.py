"""A walk of more frames than the driver holds at once (``[silver] walk_on_driver_below``),
done by the driver all the same, a share of the vbuckets at a time, from the run's files.

A vbucket's walk needs its own frames only (:func:`pipelines.silver.walk_columns.walk_vbuckets`
walks each vbucket alone, and a key lives in one vbucket), so the frames can be split by
stream (``vb_key``) into *chunks* and each chunk walked alone: the same rows as one walk of
them all. A chunk holds about ``walk_on_driver_below`` frames and :data:`CHUNK_BYTES` of the
files' bytes at most (the documents are most of them). :func:`walk_in_chunks`:

1. reads the run's data files once, a Parquet batch at a time
   (:func:`pipelines.silver.walk_input.stream_rows`), and writes each chunk's frames into an
   Arrow file of its own in a local temporary folder;
2. for each chunk: reads it back, walks it from its vbuckets' saved states, keeps its control
   rows (the rows :class:`pipelines.silver.batch.Found` reads), and writes into the local
   folder its walked rows and its newest change per key as silver rows
   (:func:`pipelines.silver.arrow_rows.silver_rows`).

The apply then chooses where the silver rows go, once its registry names the tables
(:class:`StagedWalk`): into the collection tables themselves when silver holds nothing yet
(:meth:`StagedWalk.commit_to_tables`: an initial load, where a MERGE into empty tables is an
append), else into one partition of the pending table (:meth:`StagedWalk.write_pending`);
either way committed by the driver, with no Spark job. Only a step that needs the walked
rows as a DataFrame (the MERGE path: a drop, a rollback with rows to retract, history) has
them written as Parquet beside the silver tables for Spark (:meth:`StagedWalk.frame`). The
driver holds one chunk at a time: its memory follows the chunk, not the run.
:meth:`StagedWalk.discard` removes the local folder, the staged Parquet, and files no commit
took.
"""

from __future__ import annotations

import datetime as dt
import logging
import secrets
import shutil
import tempfile
from collections.abc import Iterator, Mapping
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
from pipelines.errors import CommitConflictError
from pipelines.lake import delta_io, delta_rs, file_commits
from pipelines.silver import arrow_rows, walk_columns, walk_input
from pipelines.silver.walk import VERSION_KINDS, RowKind
from pipelines.silver.walk_input import READ_COLUMNS, RunFiles
from pipelines.tables import BucketTables

log = logging.getLogger("dcp_cdc.silver")

READ_BATCH_ROWS = 65_536
"""Rows of each Parquet batch read in step 1."""
CHUNK_BYTES = 64 * 1024 * 1024
"""The most of the run's data files' bytes (compressed, as on disk) a chunk holds."""


@dataclass
class PendingFiles:
    """Silver rows written into a new partition of the pending table, not committed."""

    stamp: int
    """The partition's ``_batch`` value."""
    location: str
    """The pending table's folder (the files' paths start with the partition's)."""
    files: list[dict[str, Any]] = field(default_factory=list)
    """The files as :func:`pipelines.bronze.writer.write_table` gives them."""
    written: range = range(0)
    """Their entries in :attr:`StagedWalk.written`."""
    committed: bool = False


@dataclass
class StagedWalk:
    """What :func:`walk_in_chunks` gives: the control rows, and the chunks' walked and silver
    rows in local Arrow files, written where the apply chooses."""

    controls: list[dict[str, Any]]
    chunks: int
    local: Path
    walked_parts: list[Path]
    silver_parts: list[Path] | None
    """None: a key or document is not UTF-8 (:func:`arrow_rows.silver_rows`), and Spark's
    append of the walked rows takes them."""
    collections: set[int]
    """The collections of the silver rows."""
    storage: dict[str, str]
    staging: str
    """Where :meth:`frame` writes the walked rows for Spark."""
    written: list[tuple[str, list[dict[str, Any]]]] = field(default_factory=list)
    """(folder, files) of every file written outside ``local``, for :meth:`discard`."""
    committed: set[int] = field(default_factory=set)
    """Indexes into ``written`` of the files a commit took."""
    _frame: DataFrame | None = None

    def frame(self, spark: SparkSession) -> DataFrame:
        """The walked rows as a DataFrame: written (once) as Parquet into :attr:`staging`."""
        if self._frame is None:
            files = [f for part in self.walked_parts for f in _write(part, self.staging, self)]
            self._frame = (  # the folder, not each file: listing it is the driver's
                spark.read.schema(schemas.WALKED).parquet(self.staging)
                if files
                else spark.createDataFrame([], schemas.WALKED)
            )
        return self._frame

    def write_pending(self, spark: SparkSession, bucket: str) -> PendingFiles | None:
        """The silver rows written into a new partition of the pending table, not committed
        (:meth:`commit_pending`); None when they are not for this way (not UTF-8)."""
        if self.silver_parts is None:
            return None
        stamp = secrets.randbits(63)
        root = delta_io.table_location(spark, BucketTables(bucket).pending).rstrip("/")
        folder = f"{schemas.PENDING_PARTITIONS[0]}={stamp}"
        pending = PendingFiles(stamp, root)
        first = len(self.written)
        for part in self.silver_parts:
            written = _write(part, f"{root}/{folder}", self)
            pending.files += [{**f, "path": f"{folder}/{f['path']}"} for f in written]
        pending.written = range(first, len(self.written))
        return pending

    def commit_pending(self, spark: SparkSession, bucket: str, pending: PendingFiles) -> bool:
        """``pending``'s files appended to the pending table in one commit by this process
        (:func:`pipelines.lake.file_commits.append_files`): the live layer's append, no Spark
        job. False when the pending table is not of :data:`schemas.PENDING`'s columns and
        partitions (nothing committed; :meth:`discard` removes the files)."""
        table = BucketTables(bucket).pending
        partition = {schemas.PENDING_PARTITIONS[0]: str(pending.stamp)}
        pending.committed = file_commits.append_files(
            spark, table, pending.files, schemas.PENDING, partition
        )
        if pending.committed:
            self.committed |= set(pending.written)
        return pending.committed

    def commit_to_tables(self, spark: SparkSession, tables_of: Mapping[int, str]) -> bool:
        """Each collection's silver rows appended to its ``_all`` table (``tables_of``:
        collection id -> table), a commit per table by the driver: what a MERGE into an empty
        table writes. False, with nothing committed, when ``tables_of`` lacks a collection of
        the rows or a table is not of silver's plain columns (``[silver] document_variant``
        adds one)."""
        if self.silver_parts is None or not self.collections <= set(tables_of):
            return False
        plain = [(f.name, f.dataType) for f in schemas.SILVER]
        for cid in self.collections:
            if [(f.name, f.dataType) for f in spark.table(tables_of[cid]).schema] != plain:
                return False
        for cid in sorted(self.collections):
            table = tables_of[cid]
            root = delta_io.table_location(spark, table).rstrip("/")
            first = len(self.written)
            files = [f for part in self.silver_parts for f in _write(part, root, self, only=cid)]
            if not file_commits.append_files(spark, table, files, schemas.SILVER):
                raise CommitConflictError(
                    f"{table}: changed while the apply committed its first rows (the tables "
                    "before it took theirs); run again: the next apply appends to the live layer"
                )
            self.committed |= set(range(first, len(self.written)))
        return True

    def discard(self) -> None:
        """Remove the local folder, the staged Parquet, and the files no commit took."""
        shutil.rmtree(self.local, ignore_errors=True)
        for i, (folder, files) in enumerate(self.written):
            if i not in self.committed:
                remove_written(files, folder, self.storage)
        fs, root = filesystem(self.staging, self.storage)
        fs.delete_dir_contents(root, missing_dir_ok=True)
        if fs.get_file_info(root).type.name != "NotFound":
            fs.delete_dir(root)


def walk_in_chunks(
    spark: SparkSession,
    bucket: str,
    files: RunFiles,
    saved: Mapping[int, tuple[str, int | None]],
    *,
    eager: bool,
    read_through: int | None,
    chunk_rows: int,
) -> StagedWalk | None:
    """The module's walk of ``files``' runs, each vbucket from its saved state (``saved``:
    ``vb_key -> (state JSON, late_after)``), in chunks of about ``chunk_rows`` frames. None
    when the files' rows are not for the driver's way
    (:func:`pipelines.silver.walk_input.stream_rows`): nothing is left written then."""
    storage = dict(spark.sparkContext.getConf().getAll())
    total = walk_input.row_count(files, storage)
    size = sum(_size(path, storage) for path in files.paths)
    chunks = max(1, -(-total // max(1, chunk_rows)), -(-size // CHUNK_BYTES))
    silver_root = delta_io.table_location(spark, BucketTables(bucket).stream_state)
    staging = (
        f"{silver_root.rstrip('/').rsplit('/', 1)[0]}/_staged_walk_{bucket}_{secrets.randbits(63)}"
    )
    local = Path(tempfile.mkdtemp(prefix="dcp-cdc-walk-"))
    out_schema = schemas.arrow_schema(schemas.WALKED)
    staged = StagedWalk([], chunks, local, [], [], set(), storage, staging)
    try:
        parts = _split(files, storage, chunks, local)
        if parts is None:
            staged.discard()
            return None
        applied_at = dt.datetime.now(dt.UTC)
        for part in parts:
            keyed = walk_input.with_states(_read(part), saved, read_through)
            part.unlink()
            walked = walk_columns.walk_vbuckets(keyed, out_schema, eager)
            del keyed
            kinds = pa.array(VERSION_KINDS)
            staged.controls += delta_rs.spark_rows(
                walked.filter(pc.invert(pc.is_in(walked["kind"], kinds)))
            )
            staged.walked_parts.append(_save(walked, local / f"walked-{part.stem}.arrow"))
            if staged.silver_parts is not None:
                _silver_rows(walked, applied_at, staged, local / f"silver-{part.stem}.arrow")
    except BaseException:
        staged.discard()
        raise
    log.info(
        "silver: %d frames of bucket %s walked by the driver in %d chunks", total, bucket, chunks
    )
    return staged


def _size(path: str, storage: Mapping[str, str]) -> int:
    fs, where = filesystem(path, storage)
    return int(fs.get_file_info(where).size or 0)


def _read(path: Path) -> pa.Table:
    with pa.memory_map(str(path)) as source:
        return pa.ipc.open_file(source).read_all()


def _save(table: pa.Table, path: Path) -> Path:
    with pa.ipc.new_file(str(path), table.schema) as writer:
        writer.write_table(table)
    return path


def _write(
    part: Path, folder: str, staged: StagedWalk, *, only: int | None = None
) -> list[dict[str, Any]]:
    """A local Arrow file's rows (``only``: of that ``_collection_id``) written as Parquet
    into ``folder``, recorded for :meth:`StagedWalk.discard`."""
    table = _read(part)
    if only is not None:
        table = table.filter(pc.equal(table["_collection_id"], only))
    if not table.num_rows:
        return []
    files = write_table(table, folder, staged.storage)
    staged.written.append((folder, files))
    return files


def _split(
    files: RunFiles, storage: Mapping[str, str], chunks: int, local: Path
) -> list[Path] | None:
    """Step 1: the walked frames of ``files``' runs (:func:`walk_input.stream_rows`), chunk
    ``vb_key % chunks`` of them into ``local/<chunk>.arrow``; the files written, in chunk
    order. None when the rows are not for the driver's way."""
    writers: dict[int, pa.ipc.RecordBatchFileWriter] = {}
    try:
        for streamed in _streamed(files, storage):
            if streamed is None:
                return None
            _route(streamed, chunks, writers, local)
    finally:
        for writer in writers.values():
            writer.close()
    return [local / f"{c}.arrow" for c in sorted(writers)]


def _streamed(files: RunFiles, storage: Mapping[str, str]) -> Iterator[pa.Table | None]:
    target = schemas.arrow_schema(schemas.EVENTS)
    read_schema = pa.schema([target.field(c) for c in READ_COLUMNS])
    for path in files.paths:
        fs, where = filesystem(path, storage)
        with fs.open_input_file(where) as handle:
            parquet = pq.ParquetFile(handle)
            for batch in parquet.iter_batches(READ_BATCH_ROWS, columns=READ_COLUMNS):
                table = pa.Table.from_batches([batch]).select(READ_COLUMNS).cast(read_schema)
                yield walk_input.stream_rows(table, files.versions)


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


def _silver_rows(walked: pa.Table, applied_at: dt.datetime, staged: StagedWalk, to: Path) -> None:
    """The chunk's newest change per key as silver rows, into ``to``; a key or document not
    UTF-8 ends the silver rows of the whole walk (``silver_parts`` None)."""
    changes = walked.filter(pc.equal(walked["kind"], RowKind.CHANGE.value))
    cids = set(pc.unique(changes["collection_id"]).to_pylist())
    silver = arrow_rows.silver_rows(changes, cids, applied_at)
    if silver is None:
        staged.silver_parts = None
        return
    if silver.num_rows:
        assert staged.silver_parts is not None
        staged.silver_parts.append(_save(silver, to))
        staged.collections |= cids

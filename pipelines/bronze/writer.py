"""Bronze's columnar write: the decode tasks write the events' Parquet files themselves.

Spark's own Delta writer turns each Arrow batch the Python tasks hand it back into rows and
writes them one at a time (14-19 µs an event on 2 cores, most of it ``writeNull`` for the
columns a data row leaves empty). Here the task that decoded a batch writes it with pyarrow's
columnar Parquet writer into the table's folder, and gives the driver one row per file: its
path, size and Delta statistics (``schemas.WRITTEN``). The driver commits all of a run's
files in one Delta transaction (:func:`pipelines.lake.file_commits.commit_files`), with the run's
``txnAppId``/``txnVersion`` as Spark's idempotent append has it: until that commit the files
are not in the table, and a killed run leaves only files no snapshot names (VACUUM removes
them).

The statistics are those Delta's writer computes (``numRecords`` and, for the table's
``delta.dataSkippingStatsColumns``, ``minValues``/``maxValues``/``nullCount``), with its
rules: strings cut to 32 UTF-16 units with a tie-breaker on the maximum, timestamps to the
millisecond, nothing for binary. Readers skip files with them as with Spark's own.

No Spark import here: pyarrow only, run inside the executors, unit-testable.
"""

from __future__ import annotations

import datetime as dt
import json
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pipelines.bronze.landing import filesystem

STRING_PREFIX = 32
"""UTF-16 units Delta keeps of a string statistic (``dataSkippingStringPrefixLength``)."""
_ASCII_MAX = "\x7f"
_UTF8_MAX = "\U0010ffff"
ROW_GROUP_ROWS = 1 << 20
"""Rows buffered into one Parquet row group (Spark's writer: 128 MiB of row group)."""
DICTIONARY_COLUMNS = (
    *("op", "opcode", "datatype", "bucket", "session_started_at", "session_id", "file"),
    *("file_sequence", "ingest_run_id", "ingested_at", "collection_id", "vbucket"),
)
"""Columns with few distinct values a file: dictionary-encoded. The others (bodies, keys,
seqnos, CAS) are plain, as a dictionary would only fall back after costing a pass."""


def truncate_min(value: str, length: int = STRING_PREFIX) -> str:
    """Delta's minimum string statistic: the first ``length`` UTF-16 units, a surrogate pair
    kept whole (``StatisticsCollection.truncateMinStringAgg``)."""
    units = value.encode("utf-16-le")
    if len(units) // 2 <= length:
        return value
    take = length
    if _is_high(units, length - 1) and _is_low(units, length):
        take += 1
    return units[: 2 * take].decode("utf-16-le")


def truncate_max(value: str, length: int = STRING_PREFIX) -> str | None:
    """Delta's maximum string statistic: a prefix and a tie-breaker (U+007F when the first
    unit cut is below it, else U+10FFFF) that sorts after every string with that prefix;
    None when none fits in twice ``length`` (``truncateMaxStringAgg``)."""
    units = value.encode("utf-16-le")
    n = len(units) // 2
    if n <= length:
        return value
    current = len(truncate_min(value, length).encode("utf-16-le")) // 2
    utf8_max = _UTF8_MAX.encode("utf-16-le")
    while current <= 2 * length:
        if current >= n:
            return value
        if current + 1 < n and units[2 * current : 2 * current + 4] == utf8_max:
            current += 2
            continue
        prefix = units[: 2 * current].decode("utf-16-le", errors="surrogatepass")
        unit = int.from_bytes(units[2 * current : 2 * current + 2], "little")
        return prefix + (_ASCII_MAX if unit < 0x7F else _UTF8_MAX)
    return None


def _is_high(units: bytes, i: int) -> bool:
    return 0xD800 <= int.from_bytes(units[2 * i : 2 * i + 2], "little") <= 0xDBFF


def _is_low(units: bytes, i: int) -> bool:
    return 0xDC00 <= int.from_bytes(units[2 * i : 2 * i + 2], "little") <= 0xDFFF


def _timestamp(micros: int) -> str:
    """A timestamp statistic as Delta writes it: UTC, cut to the millisecond."""
    at = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=micros)
    return at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"


@dataclass
class _ColumnStats:
    kind: str  # "number", "string", "timestamp", or "" (a null count only)
    nulls: int = 0
    low: Any = None
    high: Any = None

    def add(self, column: pa.ChunkedArray | pa.Array) -> None:
        self.nulls += column.null_count
        if not self.kind or column.null_count == len(column):
            return
        if self.kind == "timestamp":
            column = column.cast(pa.int64())
        bounds = pc.min_max(column)
        low, high = bounds["min"].as_py(), bounds["max"].as_py()
        if self.kind == "string":  # Delta (like Arrow) orders strings by their UTF-8 bytes
            low, high = low.encode(), high.encode()
        self.low = low if self.low is None else min(self.low, low)
        self.high = high if self.high is None else max(self.high, high)

    def bounds(self) -> tuple[Any, Any]:
        """The (min, max) statistics, each None when Delta writes none."""
        if self.low is None:
            return None, None
        if self.kind == "string":
            return truncate_min(self.low.decode()), truncate_max(self.high.decode())
        if self.kind == "timestamp":
            return _timestamp(self.low), _timestamp(self.high)
        return self.low, self.high


def _kind(dtype: pa.DataType) -> str:
    if pa.types.is_integer(dtype) or pa.types.is_floating(dtype):
        return "number"
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
        return "string"
    if pa.types.is_timestamp(dtype):
        return "timestamp"
    return ""  # binary and nested columns: a null count only, as Delta


@dataclass
class FileStats:
    """Delta statistics of one file, gathered batch by batch."""

    schema: pa.Schema
    columns: Sequence[str]
    records: int = 0
    by_column: dict[str, _ColumnStats] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.by_column = {c: _ColumnStats(_kind(self.schema.field(c).type)) for c in self.columns}

    def add(self, batch: pa.RecordBatch | pa.Table) -> None:
        self.records += batch.num_rows
        for name, stats in self.by_column.items():
            stats.add(batch.column(name))

    def to_json(self) -> str:
        """The ``stats`` of the file's ``add`` action."""
        low: dict[str, Any] = {}
        high: dict[str, Any] = {}
        for name, stats in self.by_column.items():
            lo, hi = stats.bounds()
            if lo is not None:
                low[name] = lo
            if hi is not None:
                high[name] = hi
        nulls = {name: stats.nulls for name, stats in self.by_column.items()}
        return json.dumps(
            {"numRecords": self.records, "minValues": low, "maxValues": high, "nullCount": nulls},
            separators=(",", ":"),
        )


@dataclass(frozen=True)
class Target:
    """Where and how a task writes a table's files: the table's location (a path or URI),
    its Arrow schema, the columns it keeps statistics of, and the object-store settings."""

    location: str
    schema: pa.Schema
    stats_columns: tuple[str, ...]
    storage: Mapping[str, str] = field(default_factory=dict)
    constants: Mapping[str, Any] = field(default_factory=dict)
    """Columns with one value for the whole run (``ingest_run_id``, ``ingested_at``),
    appended to every batch."""


def write_files(
    batches: Iterable[pa.RecordBatch], target: Target, *, row_group_rows: int = ROW_GROUP_ROWS
) -> Iterator[dict[str, Any]]:
    """Write ``batches`` (the table's columns but ``target.constants``) into one new Parquet
    file in ``target``'s folder; yield its row of ``schemas.WRITTEN`` once it is closed, or
    nothing when no batch had a row. A failure removes the file (a retried task writes a new
    one under another name) and is raised again."""
    fs, root = filesystem(target.location, target.storage)
    if isinstance(fs, pafs.LocalFileSystem):  # a partition's folder, made by its first file
        fs.create_dir(root, recursive=True)
    name = f"part-{uuid.uuid4()}.snappy.parquet"
    path = f"{root.rstrip('/')}/{name}"
    stats = FileStats(target.schema, target.stats_columns)
    writer: pq.ParquetWriter | None = None
    pending: list[pa.RecordBatch] = []
    pending_rows = 0

    def flush() -> None:
        nonlocal writer, pending_rows
        if not pending:
            return
        table = pa.Table.from_batches(pending, schema=target.schema)
        if writer is None:
            writer = pq.ParquetWriter(
                path,
                target.schema,
                filesystem=fs,
                compression="snappy",
                use_dictionary=[c for c in DICTIONARY_COLUMNS if c in target.schema.names],
                write_statistics=list(target.stats_columns),
            )
        writer.write_table(table, row_group_size=row_group_rows)
        pending.clear()
        pending_rows = 0

    try:
        for batch in batches:
            if not batch.num_rows:
                continue
            full = _with_constants(batch, target)
            stats.add(full)
            pending.append(full)
            pending_rows += full.num_rows
            if pending_rows >= row_group_rows:
                flush()
        flush()
        if writer is None:
            return
        writer.close()
    except BaseException:
        if writer is not None:
            writer.close()
            fs.delete_file(path)
        raise
    info = fs.get_file_info(path)
    yield {
        "path": name,
        "size": info.size,
        "modification_time": int(info.mtime_ns // 1_000_000) if info.mtime_ns else _now_ms(),
        "num_records": stats.records,
        "stats": stats.to_json(),
    }


def write_rows(
    rows: Sequence[Mapping[str, Any]],
    schema: pa.Schema,
    location: str,
    storage: Mapping[str, str],
) -> list[dict[str, Any]]:
    """``rows`` (dicts of ``schema``'s columns) written by this process into one new Parquet
    file in the table folder ``location``, with statistics of the columns Delta keeps them
    of: what a small table's write from the driver commits
    (:func:`pipelines.lake.file_commits.append_files`, ``replace_files``) instead of a Spark job.
    Its row of ``schemas.WRITTEN`` (none for no rows)."""
    return write_table(pa.Table.from_pylist(list(rows), schema=schema), location, storage)


def write_table(table: pa.Table, location: str, storage: Mapping[str, str]) -> list[dict[str, Any]]:
    """:func:`write_rows` of an Arrow ``table``."""
    stats = tuple(f.name for f in table.schema if _kind(f.type))
    target = Target(location, table.schema, stats, storage)
    return list(write_files(table.to_batches(), target))


def remove_written(
    files: Iterable[Mapping[str, Any]], location: str, storage: Mapping[str, str]
) -> None:
    """Delete files :func:`write_rows` wrote into ``location`` that no commit took."""
    fs, root = filesystem(location, storage)
    for f in files:
        fs.delete_file(f"{root.rstrip('/')}/{f['path']}")


def _with_constants(batch: pa.RecordBatch, target: Target) -> pa.RecordBatch:
    if not target.constants:
        return batch
    arrays = list(batch.columns)
    for name, value in target.constants.items():
        dtype = target.schema.field(name).type
        arrays.append(pa.repeat(pa.scalar(value, dtype), batch.num_rows))
    return pa.RecordBatch.from_arrays(arrays, schema=target.schema)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000

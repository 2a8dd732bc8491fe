"""The walk's input rows read in this process from the Parquet files its ingest just wrote
(pyarrow, no Spark job), for an apply that follows an ingest in the same process (``dcp-cdc
run``, follow mode) and walks few frames in the driver.

The ingest's memory knows which data files of the events table hold the runs the apply reads
(:meth:`pipelines.bronze.memory.IngestMemory.run_files`, while no other writer committed to
the table). :func:`keyed_rows` reads those files and gives the rows
:func:`pipelines.silver.transforms.keyed_frames` gives over
:func:`pipelines.silver.transforms.walk_input` of the same runs, column for column
(:data:`KEYED`): the walked ops of those runs with their ``run_version``, each frame's stream
(``vb_key``, :func:`pipelines.bronze.transforms.vb_key`'s rule), its vbucket's saved state and
the newest run read. A read of the table instead costs Spark a job and, the first time in a
process, the seconds of its Parquet scan's warm-up.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import types as T

from pipelines import schemas
from pipelines.bronze.landing import filesystem
from pipelines.silver.transforms import WALK_COLUMNS, WALK_OPS

KEYED = T.StructType(
    [
        T.StructField("vb_key", T.IntegerType()),
        *[
            schemas.EVENTS[c] if c != "run_version" else T.StructField(c, T.LongType())
            for c in WALK_COLUMNS
        ],
        T.StructField("saved_state", T.StringType()),
        T.StructField("late_after", T.LongType()),
        T.StructField("read_through", T.LongType()),
    ]
)
"""The columns of :func:`pipelines.silver.transforms.keyed_frames`, in its order."""
_INT32 = (-(2**31), 2**31 - 1)


@dataclass(frozen=True)
class RunFiles:
    """The events table's data files that hold the runs an apply reads, and each of those
    runs' ``run_version`` (the runs to read: other runs' rows in the files are not read)."""

    paths: list[str]
    versions: dict[str, int]


def row_count(files: RunFiles, storage: Mapping[str, str]) -> int:
    """The rows of the files (every op and run), from their Parquet footers."""
    total = 0
    for path in files.paths:
        fs, where = filesystem(path, storage)
        total += pq.ParquetFile(fs.open_input_file(where)).metadata.num_rows
    return total


def keyed_rows(
    files: RunFiles,
    saved: Mapping[int, tuple[str, int | None]],
    read_through: int | None,
    storage: Mapping[str, str],
) -> pa.Table | None:
    """The walk's input rows (:data:`KEYED`) of ``files``' runs, each with its vbucket's
    saved state (``saved``: ``vb_key -> (state JSON, late_after)``; a vbucket without one
    starts fresh). None when a response's opaque does not fit an int, which Spark's rule
    refuses: the caller reads the table then, and Spark says what it says."""
    read = [_read(path, READ_COLUMNS, storage) for path in files.paths]
    table = pa.concat_tables(read) if read else schemas.arrow_schema(schemas.EVENTS).empty_table()
    streamed = stream_rows(table.select(READ_COLUMNS), files.versions)
    return None if streamed is None else with_states(streamed, saved, read_through)


READ_COLUMNS = [c for c in WALK_COLUMNS if c != "run_version"]
"""The events table's columns the walk reads (``run_version`` comes from the runs)."""


def stream_rows(table: pa.Table, versions: Mapping[str, int]) -> pa.Table | None:
    """Of events rows (:data:`READ_COLUMNS`), the walked ops of the runs ``versions`` names,
    with each frame's stream (``vb_key``) first and its run's ``run_version``: the columns of
    :data:`KEYED` before the saved state's. None when a response's opaque does not fit an
    int (see :func:`keyed_rows`)."""
    runs = pa.array(sorted(versions), pa.string())  # typed: there may be none
    table = table.filter(
        pc.and_(
            pc.is_in(table["op"], pa.array(WALK_OPS)),
            pc.is_in(table["ingest_run_id"], runs),
        )
    )
    responses = pc.is_valid(table["status"])
    opaque = pc.filter(table["opaque"], responses)
    if len(opaque) and (pc.min(opaque).as_py() < _INT32[0] or pc.max(opaque).as_py() > _INT32[1]):
        return None
    # a frame's opaque is any 32-bit value: cast without a check, chosen for responses only
    opaques = pc.cast(table["opaque"], pa.int32(), safe=False)
    vb_key = pc.if_else(responses, opaques, table["vbucket"])
    table = table.filter(pc.is_valid(vb_key))
    vb_key = pc.drop_null(vb_key)
    version_of = pa.array([versions[r] for r in runs.to_pylist()], pa.int64())
    run_version = pc.take(version_of, pc.index_in(table["ingest_run_id"], runs))
    out = {"vb_key": vb_key, **{c: table[c] for c in READ_COLUMNS}, "run_version": run_version}
    target = schemas.arrow_schema(KEYED)
    fields = [f for f in target if f.name in out]
    return pa.table([out[f.name] for f in fields], schema=pa.schema(fields))


def with_states(
    table: pa.Table, saved: Mapping[int, tuple[str, int | None]], read_through: int | None
) -> pa.Table:
    """:func:`stream_rows`' rows with their vbucket's saved state and ``late_after``
    (``saved``) and the newest run read: rows of :data:`KEYED`."""
    keys = table["vb_key"].to_pylist()
    states = [saved.get(k) for k in keys]
    n = table.num_rows
    out = {
        **{name: table[name] for name in table.column_names},
        "saved_state": pa.array([s[0] if s else None for s in states], pa.string()),
        "late_after": pa.array([s[1] if s else None for s in states], pa.int64()),
        "read_through": pa.nulls(n, pa.int64())
        if read_through is None
        else pa.array([read_through] * n, pa.int64()),
    }
    target = schemas.arrow_schema(KEYED)
    return pa.table([out[f.name] for f in target], schema=target)


def _read(path: str, columns: list[str], storage: Mapping[str, str]) -> pa.Table:
    fs, where = filesystem(path, storage)
    table = pq.read_table(where, columns=columns, filesystem=fs).select(columns)
    target = schemas.arrow_schema(schemas.EVENTS)
    return table.cast(pa.schema([target.field(c) for c in columns]))
